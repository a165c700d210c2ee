"""A payment charged once, whatever the retries: ``attempt.step`` with an effect key.

It runs offline: a PTB Application polls ``FakeBotApi`` and charges ``FakePaymentApi``. The
handler fails once after charging, as a crash would. Its retry gets the recorded charge back
and replies with it. The payment API saw one charge.
"""

import asyncio
import tempfile
from typing import Any, Dict

from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi, FakePaymentApi, charge_async

PAYMENTS = FakePaymentApi()
failed_once = False


async def buy(update: Update, context: FencedCallbackContext) -> None:
    global failed_once
    attempt = context.require_attempt()

    async def charge(key: str) -> Dict[str, Any]:  # the key is the same in every attempt
        charged = await charge_async(PAYMENTS.url, key, amount=100, reference=str(update.update_id))
        return {"id": charged["id"]}  # what the retry needs, as JSON

    receipt = await attempt.step("charge", charge)  # recorded at once, fenced
    if not failed_once:
        failed_once = True
        raise RuntimeError("a crash after the charge")  # the retry must not charge again
    attempt.outbox.reply_text(f"paid: {receipt['id']}")  # sent iff the completion commits


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder, PAYMENTS, FakeBotApi() as telegram:
        store = SQLiteUpdateStore(f"{folder}/shop.db")
        processor = FencedUpdateProcessor(store, retry=lambda error, attempt: 0.1)
        builder = (Application.builder().token(telegram.token).base_url(telegram.base_url)
                   .context_types(ContextTypes(context=FencedCallbackContext)))
        app = processor.install(builder).build()
        app.add_handler(CommandHandler("buy", buy))
        async with app:
            await app.start()
            await app.updater.start_polling(poll_interval=0)  # type: ignore[union-attr]
            telegram.inject_message(chat_id=1, text="/buy")
            for _ in range(300):
                if telegram.sent_messages:
                    break
                await asyncio.sleep(0.05)
            await app.updater.stop()  # type: ignore[union-attr]
            await app.stop()
        store.close()
        print("bot said:", [message["text"] for message in telegram.sent_messages])
        print("charges:", len(PAYMENTS.charges))


if __name__ == "__main__":
    asyncio.run(main())
