"""Tutorial step 4: durable jobs.

Step 3's booking conversation now sends a reminder before the slot. The handler that books
schedules it as a durable job, in the commit that books. The bot stops before the reminder
is due, as a deploy would stop it. A new process starts on the same database and sends the
reminder. Run it with ``python examples/tutorial/step4_durable_jobs.py``.
"""

import asyncio
import sqlite3
import tempfile
import warnings
from pathlib import Path
from typing import Awaitable, Callable

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Message, Update
from telegram.ext import (Application, CallbackQueryHandler, CommandHandler, ContextTypes,
                          ConversationHandler)
from telegram.warnings import PTBUserWarning

from ptb_fence import Exhaustion, SQLiteUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedPersistence, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi

SLOT = 0
REMIND_AFTER = 3.0  # seconds. A real bot would remind some minutes before the slot.
# PTB notes that per_message=False tracks presses per chat and user, which is what we want.
warnings.filterwarnings("ignore", message="If 'per_message=False'", category=PTBUserWarning)


async def remind(context: FencedCallbackContext) -> None:
    """The reminder. A module-level function: a new process finds it by its name."""
    job = context.job
    assert job is not None and job.chat_id is not None and isinstance(job.data, dict)
    context.require_attempt().outbox.send_message(
        chat_id=job.chat_id, text=f"Reminder: your slot at {job.data['slot']} is soon.")


async def book(update: Update, context: FencedCallbackContext) -> int:
    keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("10:00", callback_data="10:00"),
                                      InlineKeyboardButton("11:00", callback_data="11:00")]])
    context.require_attempt().outbox.reply_text("Which slot?", reply_markup=keyboard)
    return SLOT


async def picked(update: Update, context: FencedCallbackContext) -> int:
    query, attempt = update.callback_query, context.require_attempt()
    assert query is not None and isinstance(query.message, Message)
    assert context.job_queue is not None
    await query.answer()  # a call with a deadline: answered directly, first thing
    slot, user_id = str(query.data), query.from_user.id
    chat_id, message_id = query.message.chat.id, query.message.message_id
    # The reminder commits with this update. A failed or stale attempt schedules nothing.
    context.job_queue.run_once(remind, REMIND_AFTER, data={"slot": slot}, chat_id=chat_id)

    def write(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO bookings VALUES (?, ?)", (user_id, slot))
        attempt.outbox.edit_message_text(f"Booked {slot}. I will remind you.",
                                         chat_id=chat_id, message_id=message_id)

    context.next_conversation_state(ConversationHandler.END)
    await attempt.run_in_transaction(write, complete=True)
    return ConversationHandler.END


def gave_up(exhaustion: Exhaustion) -> None:
    print(f"gave up on update {exhaustion.update_id}: {exhaustion.error}")


async def run_bot(path: str, user: Callable[[], Awaitable[None]], telegram: FakeBotApi) -> None:
    """One bot process: start, let the ``user`` act and wait, stop."""
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bookings (user_id INTEGER, slot TEXT)")
    # durable_jobs=True: the Application's job_queue keeps its jobs in the store
    processor = FencedUpdateProcessor(store, handle_exhaustion=gave_up, strict_chat_order=True,
                                      durable_jobs=True)
    builder = (Application.builder().token(telegram.token).base_url(telegram.base_url)
               .context_types(ContextTypes(context=FencedCallbackContext)))
    app = processor.install(builder).persistence(FencedPersistence(store)).build()
    app.add_handler(ConversationHandler(
        entry_points=[CommandHandler("book", book)],
        states={SLOT: [CallbackQueryHandler(picked)]},
        fallbacks=[], name="booking", persistent=True, per_message=False))
    async with app:
        assert app.updater is not None and app.job_queue is not None
        await app.start()
        await app.updater.start_polling(poll_interval=0)
        await user()
        await app.updater.stop()
        await app.stop()
        print("jobs waiting:", [job.name for job in app.job_queue.jobs()])
    store.close()


async def wait_for(condition: Callable[[], object]) -> None:
    while not condition():
        await asyncio.sleep(0.05)


async def main(path: str) -> None:
    with FakeBotApi(first_update_id=1000) as telegram:
        async def book_a_slot() -> None:
            telegram.inject_message(chat_id=1, text="/book")
            await wait_for(lambda: telegram.last_keyboard(1))
            telegram.press_button(1, "11:00")
            await wait_for(lambda: telegram.calls_to("editMessageText"))

        await run_bot(path, book_a_slot, telegram)
        edits = telegram.calls_to("editMessageText")
        print("first process said:", [call["text"] for call in edits])
        sent = len(telegram.sent_messages)

        async def wait_for_the_reminder() -> None:
            await wait_for(lambda: len(telegram.sent_messages) > sent)

        # A new process, before the reminder is due: it knows the job only from the store.
        await run_bot(path, wait_for_the_reminder, telegram)
        reminders = telegram.sent_messages[sent:]
        print("second process said:", [message["text"] for message in reminders])


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        asyncio.run(main(str(Path(scratch) / "tutorial.db")))
