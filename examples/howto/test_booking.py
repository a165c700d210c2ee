"""A booking bot tested through the whole stack against FakeBotApi (run it with pytest)."""

import asyncio
from typing import Any, Callable

import pytest
from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Message, Update
from telegram.error import BadRequest
from telegram.ext import Application, CallbackQueryHandler, CommandHandler, ContextTypes

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi


async def book(update: Update, context: FencedCallbackContext) -> None:
    keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("10:00", callback_data="10")]])
    context.require_attempt().outbox.reply_text("When?", reply_markup=keyboard)


async def picked(update: Update, context: FencedCallbackContext) -> None:
    query = update.callback_query
    assert query is not None and isinstance(query.message, Message)
    await query.answer()  # a call with a deadline: answered directly
    context.require_attempt().outbox.edit_message_text(
        f"Booked {query.data}:00.", chat_id=query.message.chat.id,
        message_id=query.message.message_id)


async def until(what: Callable[[], Any]) -> None:
    for _ in range(500):  # 10 s
        if what():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


def test_booking(tmp_path: Any) -> None:
    asyncio.run(booking(str(tmp_path / "bot.db")))


async def booking(path: str) -> None:
    store = SQLiteUpdateStore(path)
    processor = FencedUpdateProcessor(store, handle_exhaustion=print)
    with FakeBotApi() as telegram:
        builder = (Application.builder().token(telegram.token).base_url(telegram.base_url)
                   .context_types(ContextTypes(context=FencedCallbackContext)))
        app = processor.install(builder).build()
        app.add_handlers([CommandHandler("book", book), CallbackQueryHandler(picked)])
        telegram.fail_next("sendMessage", error_code=500)  # Telegram fails once
        telegram.cut_next("sendMessage", after_effect=False)  # then loses the request
        telegram.delay("answerCallbackQuery", 0.2)  # a slow answer
        async with app:
            assert app.updater is not None
            await app.start()
            await app.updater.start_polling(poll_interval=0)
            telegram.inject_message(chat_id=1, text="/book")
            await until(lambda: telegram.last_keyboard(1))  # the outbox sent it again
            shown = telegram.last_keyboard(1)  # {"message_id": ..., "text": "When?", ...}
            assert shown is not None
            telegram.hold("editMessageText")  # requests wait until release
            telegram.press_button(1, "10")  # by callback data, or by the button's text
            await until(lambda: telegram.calls_to("editMessageText"))
            assert "Booked" not in str(telegram.effective_calls)  # held: not seen yet
            telegram.release("editMessageText")
            await until(lambda: telegram.last_keyboard(1) is None)  # the edit removed it
            with pytest.raises(BadRequest, match="not modified"):  # as Telegram answers
                await app.bot.edit_message_text("Booked 10:00.", 1, shown["message_id"])
            await app.updater.stop()
            await app.stop()
    store.close()
    assert len(telegram.calls_to("sendMessage")) == 3  # every request, failed ones too
    # what took effect (what the user saw): the reply once, the press answered, the edit
    seen = [call.method for call in telegram.effective_calls if call.method[:3] != "get"]
    assert seen == ["deleteWebhook", "sendMessage", "answerCallbackQuery", "editMessageText"]
