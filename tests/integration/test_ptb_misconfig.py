"""Misconfigurations a new user makes, each caught at start (an error where the combination
cannot work, a WARNING naming the fix where it can): real PTB Applications against FakeBotApi,
real SQLite files."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import urllib.error
import urllib.request
from typing import Any, List

import pytest
from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Message, Update
from telegram.ext import (
    Application,
    CallbackQueryHandler,
    CommandHandler,
    ContextTypes,
    ConversationHandler,
    MessageHandler,
    PicklePersistence,
    filters,
)

from ptb_fence import MemoryUpdateStore, SQLiteUpdateStore, UpdateIntake, webhook_app
from ptb_fence.ptb import FencedCallbackContext, FencedPersistence, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import FAST, build, polling, run, wait_for


def _warnings(caplog: Any, needle: str) -> List[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and needle in r.getMessage()]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_pickle_persistence_under_a_fenced_processor_warns_naming_fenced_persistence(
    tmp_path: Any, caplog: Any
) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))

    async def scenario(fake: FakeBotApi) -> None:
        builder = Application.builder().persistence(PicklePersistence(str(tmp_path / "p.pickle")))
        app = build(FencedUpdateProcessor(store, handle_exhaustion=print, **FAST), fake, builder)
        with caplog.at_level(logging.WARNING, logger="ptb_fence"):
            async with app:
                pass

    try:
        with FakeBotApi() as fake:
            run(scenario(fake))
    finally:
        store.close()
    warned = _warnings(caplog, "PicklePersistence under a FencedUpdateProcessor")
    assert len(warned) == 1, caplog.text
    assert "FencedPersistence(store)" in warned[0] and "ptb-fence persistence import" in warned[0]


async def _ask(update: Update, context: Any) -> int:
    return 1


def test_fenced_persistence_warns_about_a_conversation_that_is_not_persistent(
    tmp_path: Any, caplog: Any
) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))

    async def scenario(fake: FakeBotApi) -> None:
        builder = (Application.builder().persistence(FencedPersistence(store))
                   .context_types(ContextTypes(context=FencedCallbackContext)))
        app = build(FencedUpdateProcessor(store, handle_exhaustion=print, **FAST), fake, builder)
        app.add_handler(ConversationHandler(  # PTB's default: persistent=False
            [CommandHandler("book", _ask)], {1: [MessageHandler(filters.TEXT, _ask)]}, [],
            name="booking"))
        app.add_handler(ConversationHandler(
            [CommandHandler("feedback", _ask)], {1: [MessageHandler(filters.TEXT, _ask)]}, [],
            name="feedback", persistent=True))
        with caplog.at_level(logging.WARNING, logger="ptb_fence"):
            async with app:
                pass

    try:
        with FakeBotApi() as fake:
            run(scenario(fake))
    finally:
        store.close()
    warned = _warnings(caplog, "is not persistent")
    assert len(warned) == 1 and "'booking'" in warned[0], caplog.text
    assert "persistent=True" in warned[0]


@pytest.mark.parametrize("form", ["run_webhook", "updater.start_webhook"])
def test_a_webhook_without_secret_token_is_refused_unless_opted_out_by_name(
    tmp_path: Any, form: str
) -> None:
    """Refused before anything starts, saying how to set it; allow_no_secret_token=True
    starts it, and a post without the secret header is then recorded (the opt-out holds)."""
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    handled: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        handled.append(update.update_id)

    def refused(fake: FakeBotApi, port: int) -> str:
        app = build(FencedUpdateProcessor(store, handle_exhaustion=print, **FAST), fake)
        if form == "run_webhook":
            with pytest.raises(ValueError) as raised:
                app.run_webhook(listen="127.0.0.1", port=port, url_path="hook",
                                webhook_url=f"http://127.0.0.1:{port}/hook", stop_signals=None)
            return str(raised.value)

        async def start() -> str:
            async with app:
                assert app.updater is not None
                with pytest.raises(ValueError) as raised:
                    await app.updater.start_webhook(listen="127.0.0.1", port=port,
                                                    url_path="hook")
                return str(raised.value)

        return str(run(start()))

    async def opted_out(fake: FakeBotApi, port: int) -> None:
        app = build(FencedUpdateProcessor(store, handle_exhaustion=print, **FAST), fake)
        app.add_handler(MessageHandler(filters.ALL, on_message))
        async with app:
            await app.start()
            assert app.updater is not None
            await app.updater.start_webhook(listen="127.0.0.1", port=port, url_path="hook",
                                            allow_no_secret_token=True)
            body = json.dumps(fake.new_message_update(1, "hi")).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/hook", data=body,
                                             headers={"Content-Type": "application/json"})
            status = await asyncio.to_thread(lambda: urllib.request.urlopen(request).status)
            assert status == 200
            await wait_for("handled", lambda: len(handled) == 1, 10)
            await app.updater.stop()
            await app.stop()

    try:
        with FakeBotApi() as fake:
            port = _free_port()
            message = refused(fake, port)
            assert "secret_token" in message and "allow_no_secret_token=True" in message
            assert "secrets.token_urlsafe(32)" in message
            assert fake.webhook["url"] == ""  # nothing started, setWebhook never called
            run(opted_out(fake, _free_port()))
    finally:
        store.close()


def test_webhook_app_without_secret_token_says_how_to_set_it_and_opts_out_by_name() -> None:
    intake = UpdateIntake(MemoryUpdateStore(), handle=lambda u: None)
    with pytest.raises(ValueError) as raised:
        webhook_app(intake)
    assert "secrets.token_urlsafe(32)" in str(raised.value)
    assert "allow_no_secret_token=True" in str(raised.value)
    app = webhook_app(intake, allow_no_secret_token=True)
    answered: List[str] = []
    body = json.dumps({"update_id": 5, "message": {
        "message_id": 1, "date": 0, "chat": {"id": 1, "type": "private"}, "text": "x"}}).encode()
    environ = {"REQUEST_METHOD": "POST", "CONTENT_LENGTH": str(len(body)),
               "wsgi.input": __import__("io").BytesIO(body)}
    reply = b"".join(app(environ, lambda status, headers: answered.append(status)))
    assert answered == ["200 OK"] and reply == b"accepted\n"


def test_a_direct_send_in_a_fenced_handler_warns_once_per_handler_and_method(
    tmp_path: Any, caplog: Any
) -> None:
    """reply_text and send_message from a handler: one WARNING each (not per update) naming
    attempt.outbox and the handler; query.answer() (a call with a deadline), the outbox's own
    sends and a job's send say nothing."""
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    done: List[int] = []

    async def greet(update: Update, context: FencedCallbackContext) -> None:
        assert update.message is not None
        sent = await update.message.reply_text("hello")
        await context.bot.send_message(update.message.chat_id, "again")  # sendMessage again
        await context.bot.delete_message(update.message.chat_id, sent.message_id)
        keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("ok", callback_data="ok")]])
        context.require_attempt().outbox.reply_text("pick", reply_markup=keyboard)
        done.append(update.update_id)

    async def pressed(update: Update, context: FencedCallbackContext) -> None:
        query = update.callback_query
        assert query is not None and isinstance(query.message, Message)
        await query.answer("noted")
        done.append(update.update_id)

    async def scenario(fake: FakeBotApi) -> None:
        builder = Application.builder().context_types(ContextTypes(context=FencedCallbackContext))
        app = build(FencedUpdateProcessor(store, handle_exhaustion=print, **FAST), fake, builder)
        app.add_handlers([CommandHandler("hi", greet), CallbackQueryHandler(pressed)])
        with caplog.at_level(logging.WARNING, logger="ptb_fence"):
            async with polling(app):
                for chat in (1, 2, 3):
                    fake.inject_message(chat_id=chat, text="/hi")
                await wait_for("greeted", lambda: len(done) == 3, 10)
                await wait_for("keyboards", lambda: fake.last_keyboard(3) is not None, 10)
                fake.press_button(3, "ok")
                await wait_for("pressed", lambda: len(done) == 4, 10)
                await app.bot.send_message(9, "outside any attempt")

    try:
        with FakeBotApi() as fake:
            run(scenario(fake))
    finally:
        store.close()
    warned = _warnings(caplog, "directly inside a fenced attempt")
    assert sorted(m.split(" sent ")[1].split()[0] for m in warned) == [
        "deleteMessage", "sendMessage"], warned
    assert all("greet" in m and "attempt.outbox" in m for m in warned), warned
    assert "test_ptb_misconfig.py:" in warned[0], warned
