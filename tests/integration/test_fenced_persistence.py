"""FencedPersistence in a real PTB Application (FakeBotApi, SQLite): what it refuses at
construction and at ``initialize()`` (each message naming the fix), the WARNINGs at start for
what cannot be fenced, and, for updates handled by polling, that the state commits with the
update: a conversation continues from the store, a failed attempt's changes are not seen by
its retry, handlers work on private copies, PTB's flush writes nothing."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Dict, List

import pytest
from telegram.ext import (
    Application,
    CallbackContext,
    CommandHandler,
    ContextTypes,
    ConversationHandler,
    MessageHandler,
    PersistenceInput,
    filters,
)

from ptb_fence import MemoryUpdateStore, SQLiteUpdateStore, StateKey
from ptb_fence.ptb import DurableUpdateProcessor, FencedPersistence, FencedUpdateProcessor
from ptb_fence.ptb._state_session import conversation_state_key, decode_state
from ptb_fence.testing import FakeBotApi

from broken_stores import FencedOnlyStore
from ptb_support import build, polling, run

TOKEN = "123456:ABCdef"


def _conversation(**options: Any) -> ConversationHandler:
    async def start(update: Any, context: Any) -> int:
        return 1

    return ConversationHandler(
        entry_points=[CommandHandler("start", start)],
        states={1: [MessageHandler(filters.TEXT, start)]},
        fallbacks=[],
        name="talk",
        persistent=True,
        **options,
    )


# -- refusals ------------------------------------------------------------------------------------
def test_a_store_without_state_and_callback_data_are_refused_at_construction() -> None:
    with pytest.raises(TypeError, match="read_state, write_state, list_state"):
        FencedPersistence(FencedOnlyStore())
    with pytest.raises(ValueError, match=r"PersistenceInput\(callback_data=False\)"):
        FencedPersistence(MemoryUpdateStore(), store_data=PersistenceInput())
    persistence = FencedPersistence(MemoryUpdateStore())
    assert persistence.store_data == PersistenceInput(callback_data=False)


def test_initialize_refuses_a_processor_that_cannot_fence_the_state(tmp_path: Path) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "a.db"))
    try:
        with FakeBotApi() as fake:
            unary = DurableUpdateProcessor(store)
            app = build(unary, fake, Application.builder().persistence(FencedPersistence(store)))
            with pytest.raises(RuntimeError, match="needs a FencedUpdateProcessor"):
                run(app.initialize())
            run(app.shutdown())
            plain = (Application.builder().token(fake.token).base_url(fake.base_url)
                     .persistence(FencedPersistence(store)).build())
            with pytest.raises(RuntimeError, match="not attached to a ptb_fence Application"):
                run(plain.initialize())
            other = build(FencedUpdateProcessor(store), fake,
                          Application.builder().persistence(FencedPersistence(MemoryUpdateStore())))
            with pytest.raises(RuntimeError, match="pass the processor's store to both"):
                run(other.initialize())
    finally:
        store.close()


def test_initialize_refuses_a_context_type_without_the_private_data(tmp_path: Path) -> None:
    class Plain(CallbackContext[Any, Any, Any, Any]):
        __slots__ = ()

    store = MemoryUpdateStore()
    with FakeBotApi() as fake:
        processor = FencedUpdateProcessor(store)
        app = build(processor, fake, Application.builder().persistence(FencedPersistence(store)))
        # a context type set after install() is not adapted
        object.__setattr__(app, "context_types", ContextTypes(context=Plain))
        with pytest.raises(RuntimeError, match="derive from ptb_fence.ptb.FencedCallbackContext"):
            run(app.initialize())


def test_the_unfenced_uses_are_warned_at_start(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryUpdateStore()

    async def quick(update: Any, context: Any) -> None:
        return None

    with FakeBotApi() as fake:
        app = build(FencedUpdateProcessor(store), fake,
                    Application.builder().persistence(FencedPersistence(store)))
        app.add_handler(_conversation(conversation_timeout=30))
        app.add_handler(CommandHandler("quick", quick, block=False), group=1)
        async def start_and_stop() -> None:
            await app.initialize()
            await app.shutdown()

        with caplog.at_level(logging.WARNING, logger="ptb_fence.ptb"):
            run(start_and_stop())
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "ConversationHandler 'talk' has conversation_timeout" in text
    assert "deadline is not persisted" in text
    assert "CommandHandler (callback quick) runs with block=False" in text
    assert "jobs run outside any update" in text
