"""Tutorial step 1: a first fenced write.

A real PTB ``Application`` polls ``FakeBotApi`` (a fake Bot API on localhost: no token, no
network). The ``/note`` handler writes a row inside a fenced transaction. The same commit marks
the update done. Run it with ``python examples/tutorial/step1_fenced_write.py``.
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
    attempt = context.require_attempt()  # this handler's claim on the update
    text = " ".join(context.args or [])

    def write(conn: sqlite3.Connection) -> None:  # runs only while this attempt owns the update
        conn.execute("INSERT INTO notes VALUES (?, ?)", (attempt.update_id, text))

    # The row and "this update is done" land in one commit.
    await attempt.run_in_transaction(write, complete=True)


def gave_up(exhaustion: Exhaustion) -> None:  # an update whose every attempt failed
    print(f"gave up on update {exhaustion.update_id}: {exhaustion.error}")


async def main(path: str) -> None:
    store = SQLiteUpdateStore(path)  # creates its update table in this file
    with store.transaction() as conn:  # your own tables live in the same database
        conn.execute("CREATE TABLE notes (update_id INTEGER PRIMARY KEY, text TEXT)")
    processor = FencedUpdateProcessor(store, handle_exhaustion=gave_up)
    with FakeBotApi(first_update_id=1000) as telegram:
        builder = (Application.builder().token(telegram.token).base_url(telegram.base_url)
                   .context_types(ContextTypes(context=FencedCallbackContext)))
        app = processor.install(builder).build()
        app.add_handler(CommandHandler("note", note))
        async with app:
            assert app.updater is not None
            await app.start()
            await app.updater.start_polling(poll_interval=0)
            telegram.inject_message(chat_id=1, text="/note buy milk")
            telegram.inject_message(chat_id=1, text="/note call mum")
            while processor.stats().attempts_ended["completed"] < 2:
                await asyncio.sleep(0.05)
            await app.updater.stop()
            await app.stop()
    with store.transaction() as conn:
        print("notes:", conn.execute("SELECT * FROM notes ORDER BY update_id").fetchall())
    store.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        asyncio.run(main(str(Path(scratch) / "tutorial.db")))
