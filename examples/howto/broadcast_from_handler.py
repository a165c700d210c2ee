"""A broadcast started by a handler lands with its update: a failed try starts nothing.

It runs offline: a PTB Application over SQLite, with ``FakeBotApi`` as Telegram. The
``/announce`` handler loads the subscribers, starts a broadcast through ``context.attempt``
and replies through the outbox. Its first try fails after starting the broadcast, as a
timeout of your own database would. That try wrote nothing. The retry starts the broadcast
once, and each subscriber gets the message once.
"""

import asyncio
import tempfile
from collections import Counter
from typing import Any, List

from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi

SUBSCRIBERS = [101, 102, 103]
tries: List[int] = []


async def announce(update: Update, context: FencedCallbackContext) -> None:
    attempt = context.require_attempt()
    tries.append(attempt.attempt)
    attempt.broadcast(f"announce-{update.update_id}", SUBSCRIBERS, text="We launched")
    attempt.outbox.reply_text("Sending it to your subscribers")
    if len(tries) == 1:
        raise TimeoutError("the first try fails after starting the broadcast")


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder, FakeBotApi() as telegram:
        processor = FencedUpdateProcessor(SQLiteUpdateStore(f"{folder}/bot.db"),
                                          retry=lambda error, attempt: 0.1)
        builder = (Application.builder().token(telegram.token).base_url(telegram.base_url)
                   .context_types(ContextTypes(context=FencedCallbackContext)))
        app: Any = processor.install(builder).build()
        app.add_handler(CommandHandler("announce", announce))
        telegram.inject_message(7, "/announce")
        async with app:
            await app.start()
            await app.updater.start_polling(poll_interval=0.0, timeout=1)
            for _ in range(300):
                await asyncio.sleep(0.1)
                news = [m for m in telegram.sent_messages if m["text"] == "We launched"]
                if len(news) == len(SUBSCRIBERS):
                    break
            await app.updater.stop()
            await app.stop()
        copies = Counter(m["chat_id"] for m in telegram.sent_messages)
        print("tries of /announce:", tries)
        print("subscribers reached:", sum(1 for chat in SUBSCRIBERS if copies[chat]),
              "- most copies to one chat:", max(copies.values()))
        print("replies to the admin:", copies[7])


if __name__ == "__main__":
    asyncio.run(main())
