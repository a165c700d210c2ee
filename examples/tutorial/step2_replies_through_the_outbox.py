"""Tutorial step 2: replies through the outbox.

The ``/note`` handler queues its reply on ``attempt.outbox`` inside the fenced transaction. The
reply is sent if and only if that transaction commits. The first attempt fails after queueing
its reply: that reply is never sent. The retry commits, and its reply goes out once, although
Telegram fails the first send. Run it with
``python examples/tutorial/step2_replies_through_the_outbox.py``.
"""

import asyncio
import sqlite3
import tempfile
from pathlib import Path

from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes

from ptb_fence import Exhaustion, SQLiteUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi


async def note(update: Update, context: FencedCallbackContext) -> None:
    attempt = context.require_attempt()
    text = " ".join(context.args or [])

    def write(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO notes VALUES (?, ?)", (attempt.update_id, text))
        attempt.outbox.reply_text(f"noted: {text}")  # commits with the row, or not at all
        if attempt.attempt == 1:
            raise RuntimeError("the first attempt fails")  # rolls back the row and the reply

    await attempt.run_in_transaction(write, complete=True)


def gave_up(exhaustion: Exhaustion) -> None:
    print(f"gave up on update {exhaustion.update_id}: {exhaustion.error}")


async def main(path: str) -> None:
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute("CREATE TABLE notes (update_id INTEGER PRIMARY KEY, text TEXT)")
    processor = FencedUpdateProcessor(
        store, handle_exhaustion=gave_up,
        retry=lambda error, attempt: 0.2,  # retry after 0.2 s (default: 5 s, 20 s, 80 s, ...)
    )
    with FakeBotApi(first_update_id=1000) as telegram:
        builder = (Application.builder().token(telegram.token).base_url(telegram.base_url)
                   .context_types(ContextTypes(context=FencedCallbackContext)))
        app = processor.install(builder).build()
        app.add_handler(CommandHandler("note", note))
        telegram.fail_next("sendMessage", error_code=500)  # Telegram fails the first send
        async with app:
            assert app.updater is not None
            await app.start()
            await app.updater.start_polling(poll_interval=0)
            telegram.inject_message(chat_id=1, text="/note buy milk")
            while not telegram.sent_messages:  # the outbox sends it again after the 500
                await asyncio.sleep(0.05)
            await app.updater.stop()
            await app.stop()
        print("attempts:", processor.stats().attempts_started)
        print("sendMessage requests:", len(telegram.calls_to("sendMessage")))
        print("bot said:", [message["text"] for message in telegram.sent_messages])
    with store.transaction() as conn:
        print("notes:", conn.execute("SELECT * FROM notes").fetchall())
    store.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        asyncio.run(main(str(Path(scratch) / "tutorial.db")))
