"""FencedPersistence with ``arbitrary_callback_data`` in a real PTB Application (FakeBotApi,
SQLite and PostgreSQL): a keyboard an update sends (with ``context.bot`` or queued through
``attempt.outbox``) is written with the update's completion, one row per keyboard; a new
Application on the same store (a restart) resolves a press of it to the original object; a
failed attempt's keyboard is not written (its retry's is)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, List

import pytest
from telegram import InlineKeyboardButton, InlineKeyboardMarkup
from telegram.ext import (
    Application,
    CallbackQueryHandler,
    CommandHandler,
    InvalidCallbackData,
    PersistenceInput,
)

from ptb_fence import MemoryUpdateStore, StateKey
from ptb_fence.ptb import FencedPersistence, FencedUpdateProcessor
from ptb_fence.ptb._state_session import decode_state
from ptb_fence.testing import FakeBotApi

from ptb_support import build, polling, run


@dataclasses.dataclass(frozen=True)
class Choice:
    """Not JSON: only the callback-data cache can carry it."""

    name: str
    attempt: int


def _keyboard(*choices: Choice) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup([[InlineKeyboardButton(c.name, callback_data=c)
                                  for c in choices]])


def _keyboard_rows(store: Any) -> List[Any]:
    return [(k, e) for k, e in store.list_state(kind="callback")]


def test_callback_data_is_fenced_by_default_and_followed_only_with_the_cache() -> None:
    assert FencedPersistence(MemoryUpdateStore()).store_data == PersistenceInput()
    store = MemoryUpdateStore()
    with FakeBotApi() as fake:
        plain = build(FencedUpdateProcessor(store), fake,
                      Application.builder().persistence(FencedPersistence(store)))
        async def start_and_stop() -> None:
            await plain.initialize()  # no arbitrary_callback_data: nothing to fence, no error
            await plain.shutdown()

        run(start_and_stop())


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_keyboard_of_a_completed_update_resolves_after_a_restart(shared_stores: Any) -> None:
    """Application 1: ``/menu`` sends a keyboard with ``context.bot`` and fails its first
    attempt after sending it; its retry sends another and completes. ``/queued`` queues one
    through ``attempt.outbox``. Only the two completed updates' keyboards have rows.
    Application 2 (a restart, empty cache) receives the presses: its CallbackQueryHandler
    sees the original objects; a press of the failed attempt's keyboard stays
    ``InvalidCallbackData``."""
    seen: List[Any] = []

    async def menu(update: Any, context: Any) -> None:
        number = context.attempt.attempt
        await context.bot.send_message(update.effective_chat.id, f"menu {number}",
                                       reply_markup=_keyboard(Choice("a", number)))
        if number == 1:
            raise RuntimeError("fails after sending its keyboard")

    async def queued(update: Any, context: Any) -> None:
        context.attempt.outbox.reply_text("queued", reply_markup=_keyboard(Choice("b", 0)))

    async def pressed(update: Any, context: Any) -> None:
        seen.append(update.callback_query.data)

    def app_for(store: Any, fake: FakeBotApi) -> Any:
        processor = FencedUpdateProcessor(store, retry=lambda error, attempt: 0.02)
        app = build(processor, fake, Application.builder().arbitrary_callback_data(True)
                    .persistence(FencedPersistence(store)))
        app.add_handler(CommandHandler("menu", menu))
        app.add_handler(CommandHandler("queued", queued))
        app.add_handler(CallbackQueryHandler(pressed))
        return app

    with FakeBotApi() as fake:
        store = shared_stores()
        sent: List[Any] = []

        async def first() -> None:
            app = app_for(store, fake)
            async with polling(app):
                fake.inject_message(chat_id=5, text="/menu")
                for _ in range(300):
                    shown = fake.last_keyboard(5)
                    if shown is not None and shown["text"] == "menu 2" and _keyboard_rows(store):
                        break
                    await asyncio.sleep(0.02)
                sent.append(fake.last_keyboard(5))
                fake.inject_message(chat_id=6, text="/queued")
                for _ in range(300):
                    if fake.last_keyboard(6) is not None:
                        break
                    await asyncio.sleep(0.02)
                sent.append(fake.last_keyboard(6))

        run(first())
        menu_data = sent[0]["inline_keyboard"][0][0]["callback_data"]
        queued_data = sent[1]["inline_keyboard"][0][0]["callback_data"]
        rows = dict(_keyboard_rows(store))
        assert set(rows) == {StateKey("callback", "", menu_data[:32]),
                             StateKey("callback", "", queued_data[:32])}
        access_time, buttons = decode_state(rows[StateKey("callback", "", menu_data[:32])].value)
        assert buttons == {menu_data[32:]: Choice("a", 2)} and access_time > 0

        restarted = shared_stores()

        async def second() -> None:
            async with polling(app_for(restarted, fake)):
                fake.press_button(5, menu_data)
                fake.press_button(6, queued_data)
                # a keyboard no completed update sent (as the failed attempt's was)
                fake.inject_callback_query(5, "f" * 32 + "0" * 32)
                for _ in range(300):
                    if len(seen) == 3:
                        return
                    await asyncio.sleep(0.02)

        run(second())
    assert Choice("a", 2) in seen and Choice("b", 0) in seen
    invalid = [d for d in seen if isinstance(d, InvalidCallbackData)]
    assert len(invalid) == 1 and invalid[0].callback_data == "f" * 32 + "0" * 32


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_keyboard_queued_in_a_fenced_transaction_commits_with_it(shared_stores: Any) -> None:
    """A keyboard queued through ``attempt.outbox`` inside a fenced transaction (not the
    completing one) is written by that transaction with the call, so a handler that fails
    after it (its only attempt) still leaves a keyboard whose press resolves after a
    restart; a keyboard held for the failed completion is not written."""
    seen: List[Any] = []

    async def menu(update: Any, context: Any) -> None:
        outbox = context.attempt.outbox

        def write(conn: Any) -> None:
            outbox.reply_text("in the transaction", reply_markup=_keyboard(Choice("t", 1)))

        await context.attempt.run_in_transaction(write)
        outbox.reply_text("held", reply_markup=_keyboard(Choice("h", 1)))
        raise RuntimeError("fails after its transaction committed")

    async def pressed(update: Any, context: Any) -> None:
        seen.append(update.callback_query.data)

    def app_for(store: Any, fake: FakeBotApi) -> Any:
        processor = FencedUpdateProcessor(store, max_attempts=1)
        app = build(processor, fake, Application.builder().arbitrary_callback_data(True)
                    .persistence(FencedPersistence(store)))
        app.add_handler(CommandHandler("menu", menu))
        app.add_handler(CallbackQueryHandler(pressed))
        return app

    with FakeBotApi() as fake:
        store = shared_stores()
        shown: List[Any] = []

        async def first() -> None:
            async with polling(app_for(store, fake)):
                fake.inject_message(chat_id=5, text="/menu")
                for _ in range(300):
                    if fake.last_keyboard(5) is not None:
                        break
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.2)  # the failed attempt ends
                shown.append(fake.last_keyboard(5))

        run(first())
        assert [m["text"] for m in fake.sent_messages] == ["in the transaction"]
        data = shown[0]["inline_keyboard"][0][0]["callback_data"]
        assert [k for k, _ in _keyboard_rows(store)] == [StateKey("callback", "", data[:32])]

        async def second() -> None:
            async with polling(app_for(shared_stores(), fake)):
                fake.press_button(5, data)
                for _ in range(300):
                    if seen:
                        return
                    await asyncio.sleep(0.02)

        run(second())
    assert seen == [Choice("t", 1)]
