"""A reminder that survives a restart: a durable job scheduled by a handler.

It runs offline: a PTB Application polls ``FakeBotApi`` over SQLite. ``/remind`` schedules a
reminder two seconds ahead, in the handler. The bot stops right away, as a deploy would stop
it, and a new Application on the same database sends the reminder.
"""

import asyncio
import tempfile
from typing import Any

from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi


async def remind(context: FencedCallbackContext) -> None:  # module level: found after a restart
    job = context.job
    assert job is not None and job.chat_id is not None and isinstance(job.data, dict)
    context.require_attempt().outbox.send_message(chat_id=job.chat_id, text=job.data["text"])


async def set_reminder(update: Update, context: FencedCallbackContext) -> None:
    assert context.job_queue is not None and update.effective_chat is not None
    context.job_queue.run_once(remind, 2.0, data={"text": "time to stretch"},
                               chat_id=update.effective_chat.id)  # commits with this update
    context.require_attempt().outbox.reply_text("I will remind you in 2 seconds")


def build(path: str, telegram: FakeBotApi) -> Any:
    processor = FencedUpdateProcessor(SQLiteUpdateStore(path), durable_jobs=True,
                                      sweep_every_seconds=1.0)
    builder = (Application.builder().token(telegram.token).base_url(telegram.base_url)
               .context_types(ContextTypes(context=FencedCallbackContext)))
    app = processor.install(builder).build()
    app.add_handler(CommandHandler("remind", set_reminder))
    return app


async def run_for(app: Any, seconds: float) -> None:
    async with app:
        await app.start()
        await app.updater.start_polling(poll_interval=0)
        await asyncio.sleep(seconds)
        await app.updater.stop()
        await app.stop()


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder, FakeBotApi() as telegram:
        telegram.inject_message(chat_id=1, text="/remind")
        await run_for(build(f"{folder}/bot.db", telegram), 1.0)  # stopped before it is due
        print("before the restart:", [m["text"] for m in telegram.sent_messages])
        await run_for(build(f"{folder}/bot.db", telegram), 4.0)  # a new process sends it
        print("after the restart:", [m["text"] for m in telegram.sent_messages])


if __name__ == "__main__":
    asyncio.run(main())
