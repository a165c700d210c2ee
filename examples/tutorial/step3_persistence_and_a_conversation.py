"""Tutorial step 3: FencedPersistence and a conversation.

A persistent ``ConversationHandler`` asks for a slot with an inline keyboard. The bot stops
after the question, as a deploy or a crash would stop it. A new process starts on the same
database, and the user's press continues the conversation there. The conversation state, the
booking row and the reply commit together. Run it with
``python examples/tutorial/step3_persistence_and_a_conversation.py``.
"""

import asyncio
import sqlite3
import tempfile
import warnings
from pathlib import Path
from typing import Callable

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Message, Update
from telegram.ext import (Application, CallbackQueryHandler, CommandHandler, ContextTypes,
                          ConversationHandler)
from telegram.warnings import PTBUserWarning

from ptb_fence import Exhaustion, SQLiteUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedPersistence, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi

SLOT = 0
# PTB notes that per_message=False tracks presses per chat and user, which is what we want.
warnings.filterwarnings("ignore", message="If 'per_message=False'", category=PTBUserWarning)


async def book(update: Update, context: FencedCallbackContext) -> int:
    assert context.user_data is not None
    context.user_data["asked"] = update.update_id  # committed with this update
    keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("10:00", callback_data="10:00"),
                                      InlineKeyboardButton("11:00", callback_data="11:00")]])
    context.require_attempt().outbox.reply_text("Which slot?", reply_markup=keyboard)
    return SLOT


async def picked(update: Update, context: FencedCallbackContext) -> int:
    query, attempt = update.callback_query, context.require_attempt()
    assert query is not None and isinstance(query.message, Message)
    await query.answer()  # a call with a deadline: answered directly, first thing
    slot, user_id = str(query.data), query.from_user.id
    chat_id, message_id = query.message.chat.id, query.message.message_id

    def write(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO bookings VALUES (?, ?)", (user_id, slot))
        attempt.outbox.edit_message_text(f"Booked {slot}.", chat_id=chat_id,
                                         message_id=message_id)

    # Declare the next state first: it then commits in the same transaction as the row.
    context.next_conversation_state(ConversationHandler.END)
    await attempt.run_in_transaction(write, complete=True)
    return ConversationHandler.END


def gave_up(exhaustion: Exhaustion) -> None:
    print(f"gave up on update {exhaustion.update_id}: {exhaustion.error}")


async def run_bot(path: str, telegram: FakeBotApi, act: Callable[[], object],
                  done: Callable[[], bool]) -> None:
    """One bot process: start, let the user act, wait until ``done``, stop."""
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bookings (user_id INTEGER, slot TEXT)")
    # strict_chat_order: a chat's updates run one at a time, in order, in every process
    processor = FencedUpdateProcessor(store, handle_exhaustion=gave_up, strict_chat_order=True)
    builder = (Application.builder().token(telegram.token).base_url(telegram.base_url)
               .context_types(ContextTypes(context=FencedCallbackContext)))
    app = processor.install(builder).persistence(FencedPersistence(store)).build()
    app.add_handler(ConversationHandler(
        entry_points=[CommandHandler("book", book)],
        states={SLOT: [CallbackQueryHandler(picked)]},
        fallbacks=[], name="booking", persistent=True, per_message=False))
    async with app:
        assert app.updater is not None
        await app.start()
        await app.updater.start_polling(poll_interval=0)
        act()
        while not done():
            await asyncio.sleep(0.05)
        await app.updater.stop()
        await app.stop()
    with store.transaction() as conn:
        print("bookings:", conn.execute("SELECT * FROM bookings").fetchall())
    store.close()


async def main(path: str) -> None:
    with FakeBotApi(first_update_id=1000) as telegram:
        await run_bot(path, telegram, lambda: telegram.inject_message(chat_id=1, text="/book"),
                      lambda: telegram.last_keyboard(1) is not None)
        print("first process said:", [message["text"] for message in telegram.sent_messages])
        # A new process: it knows the conversation only from the store.
        await run_bot(path, telegram, lambda: telegram.press_button(1, "11:00"),
                      lambda: telegram.last_keyboard(1) is None)
        edits = telegram.calls_to("editMessageText")
        print("second process said:", [call["text"] for call in edits])
        print("presses answered:", len(telegram.answered_callback_queries))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        asyncio.run(main(str(Path(scratch) / "tutorial.db")))
