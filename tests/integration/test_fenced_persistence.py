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
        assert app.job_queue is not None
        app.job_queue.run_repeating(quick, 3600, name="tick")
        async def start_and_stop() -> None:
            await app.initialize()
            await app.shutdown()

        with caplog.at_level(logging.WARNING, logger="ptb_fence.ptb"):
            run(start_and_stop())
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "ConversationHandler 'talk' has conversation_timeout" in text
    assert "deadline is not persisted" in text
    assert "CommandHandler (callback quick) runs with block=False" in text
    assert "job 'tick' runs outside any update" in text


# -- handled updates -------------------------------------------------------------------------------
def _read(store: Any, key: StateKey) -> Any:
    entry = store.read_state([key]).get(key)
    return None if entry is None or entry.value is None else decode_state(entry.value)


def test_state_commits_with_the_update_and_every_attempt_starts_from_it(tmp_path: Path) -> None:
    """A conversation over two Applications on one file (a restart): the second continues
    at the committed state; a failing attempt's user_data change is not seen by its retry and
    not written; handlers work on private copies (the Application's dict is not the one the
    handler changes)."""
    path = str(tmp_path / "bot.db")
    seen: List[Dict[str, Any]] = []
    failed: List[int] = []

    async def start(update: Any, context: Any) -> int:
        seen.append(dict(context.user_data))
        context.user_data["started"] = update.update_id
        return 1

    async def step(update: Any, context: Any) -> int:
        seen.append(dict(context.user_data))
        context.user_data["x"] = context.user_data.get("x", 0) + 1
        assert context.application.user_data[update.effective_user.id] is not context.user_data
        if update.message.text == "boom" and update.update_id not in failed:
            failed.append(update.update_id)
            raise RuntimeError("first attempt fails after changing user_data")
        return ConversationHandler.END

    def app_for(store: Any, fake: FakeBotApi) -> Any:
        processor = FencedUpdateProcessor(store, retry=lambda error, attempt: 0.05,
                                          sweep_every_seconds=0.1, pending_grace_seconds=0.1)
        app = build(processor, fake, Application.builder().persistence(FencedPersistence(store)))
        app.add_handler(ConversationHandler(
            entry_points=[CommandHandler("start", start)],
            states={1: [MessageHandler(filters.TEXT & ~filters.COMMAND, step)]},
            fallbacks=[], name="talk", persistent=True))
        return app

    with FakeBotApi() as fake:
        store = SQLiteUpdateStore(path)

        ids: List[int] = []

        async def first() -> None:
            async with polling(app_for(store, fake)):
                ids.append(fake.inject_message(chat_id=5, text="/start"))
                for _ in range(200):
                    if _read(store, StateKey("user", "", "5")) is not None:
                        break
                    await asyncio.sleep(0.05)

        run(first())
        store.close()
        store = SQLiteUpdateStore(path)
        conversation = conversation_state_key("talk", (5, 5))
        assert _read(store, conversation) == 1
        assert _read(store, StateKey("user", "", "5")) == {"started": ids[0]}

        async def second() -> None:
            async with polling(app_for(store, fake)):
                fake.inject_message(chat_id=5, text="boom")
                for _ in range(300):
                    entry = store.read_state([conversation]).get(conversation)
                    if entry is not None and entry.value is None:
                        break
                    await asyncio.sleep(0.05)

        run(second())
        try:
            # the restarted Application continued the conversation; the retry saw x as before
            assert seen == [{}, {"started": ids[0]}, {"started": ids[0]}]
            assert _read(store, StateKey("user", "", "5")) == {"started": ids[0], "x": 1}
            assert store.read_state([conversation])[conversation].value is None  # ended
        finally:
            store.close()


def test_a_state_set_after_a_completing_transaction_is_written_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without next_conversation_state, PTB sets the state after the callback's
    transaction(complete=True) committed: it is written right after, with a WARNING; declared
    first, it commits with the transaction and nothing is logged."""
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    errors: List[BaseException] = []

    async def start(update: Any, context: Any) -> int:
        declare = update.message.text == "/start declared"
        if declare:
            context.next_conversation_state(2)
        try:
            context.next_conversation_state(2, name="nope")
        except ValueError as exc:
            errors.append(exc)
        await context.attempt.run_in_transaction(lambda conn: None, complete=True)
        return 2

    with FakeBotApi() as fake:
        processor = FencedUpdateProcessor(store)
        app = build(processor, fake, Application.builder().persistence(FencedPersistence(store)))
        app.add_handler(ConversationHandler(
            entry_points=[CommandHandler("start", start)],
            states={2: [MessageHandler(filters.TEXT, start)]},
            fallbacks=[], name="talk", persistent=True))

        async def go() -> None:
            async with polling(app):
                fake.inject_message(chat_id=5, text="/start")
                fake.inject_message(chat_id=6, text="/start declared")
                for _ in range(300):
                    if (_read(store, conversation_state_key("talk", (5, 5))) == 2
                            and _read(store, conversation_state_key("talk", (6, 6))) == 2):
                        return
                    await asyncio.sleep(0.05)

        with caplog.at_level(logging.WARNING, logger="ptb_fence.ptb"):
            run(go())
    try:
        assert _read(store, conversation_state_key("talk", (5, 5))) == 2
        assert _read(store, conversation_state_key("talk", (6, 6))) == 2
        late = [r.getMessage() for r in caplog.records
                if "after its transaction(complete=True) committed" in r.getMessage()]
        assert len(late) == 1 and "conversation talk [5,5]" in late[0], late
        assert errors and "named 'nope'" in str(errors[0])
    finally:
        store.close()


def test_next_conversation_state_outside_fenced_persistence_names_the_fix() -> None:
    store = MemoryUpdateStore()
    raised: List[BaseException] = []

    async def start(update: Any, context: Any) -> None:
        try:
            context.next_conversation_state(1)
        except RuntimeError as exc:
            raised.append(exc)

    with FakeBotApi() as fake:
        app = build(FencedUpdateProcessor(store), fake)
        app.add_handler(CommandHandler("start", start))

        async def go() -> None:
            async with polling(app):
                fake.inject_message(chat_id=5, text="/start")
                for _ in range(200):
                    if raised:
                        return
                    await asyncio.sleep(0.05)

        run(go())
    assert raised and "FencedPersistence(store)" in str(raised[0])


def test_state_that_cannot_be_pickled_fails_only_its_own_attempt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that puts a lock into user_data: its attempts fail with the error naming the
    fix (nothing of them written), while another user's update completing in the same
    moments is written."""
    import threading

    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))

    async def keep(update: Any, context: Any) -> None:
        if update.message.text == "/lock":
            context.user_data["lock"] = threading.Lock()
        else:
            context.user_data["ok"] = True

    with FakeBotApi() as fake:
        processor = FencedUpdateProcessor(store, max_attempts=2, retry=lambda e, a: 0.05)
        app = build(processor, fake, Application.builder().persistence(FencedPersistence(store)))
        app.add_handler(CommandHandler(["lock", "fine"], keep))

        async def go() -> None:
            async with polling(app):
                bad = fake.inject_message(chat_id=5, text="/lock")
                fake.inject_message(chat_id=6, text="/fine")
                for _ in range(300):
                    rows = dict(store.list_state())
                    if StateKey("user", "", "6") in rows and processor.stats().attempts_ended["abandoned"] >= 1:
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"update {bad} was not abandoned")

        with caplog.at_level(logging.WARNING):
            run(go())
    try:
        assert _read(store, StateKey("user", "", "6")) == {"ok": True}
        assert _read(store, StateKey("user", "", "5")) is None
        text = "\n".join(r.getMessage() for r in caplog.records)
        assert "cannot store the state of update" in text and "picklable" in text
    finally:
        store.close()


def test_ptbs_flush_writes_nothing_and_names_a_change_made_outside_an_update(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After an update committed user_data, code outside any update (as a job would) changes
    the Application's copy; PTB's update_persistence (its periodic flush) and the final flush
    at stop write nothing, and one WARNING names the change."""
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))

    async def hello(update: Any, context: Any) -> None:
        context.user_data["hello"] = True

    with FakeBotApi() as fake:
        app = build(FencedUpdateProcessor(store), fake,
                    Application.builder().persistence(FencedPersistence(store)))
        app.add_handler(CommandHandler("hello", hello))

        async def go() -> None:
            async with polling(app):
                fake.inject_message(chat_id=5, text="/hello")
                for _ in range(300):
                    if _read(store, StateKey("user", "", "5")) == {"hello": True}:
                        break
                    await asyncio.sleep(0.05)
                assert app.user_data[5] == {"hello": True}  # the committed data, published
                app.user_data[5]["job"] = 1  # outside any update
                app.mark_data_for_update_persistence(user_ids=5)
                await app.update_persistence()

        with caplog.at_level(logging.WARNING, logger="ptb_fence.ptb"):
            run(go())
    try:
        assert _read(store, StateKey("user", "", "5")) == {"hello": True}
        assert store.read_state([StateKey("user", "", "5")])[StateKey("user", "", "5")].version == 1
        outside = [r.getMessage() for r in caplog.records
                   if "changed outside any update" in r.getMessage()]
        assert len(outside) == 1 and "user_data of user 5" in outside[0], outside
    finally:
        store.close()


# -- state read ahead ------------------------------------------------------------------------
def _counter_app(store: Any, fake: Any, seen: List[Any], **options: Any) -> Any:
    async def count(update: Any, context: Any) -> None:
        seen.append((update.update_id, context.attempt.attempt, context.user_data.get("n")))
        context.user_data["n"] = context.user_data.get("n", 0) + 1

    processor = FencedUpdateProcessor(store, strict_chat_order=True, **options)
    app = build(processor, fake, Application.builder().persistence(FencedPersistence(store)))
    app.add_handler(MessageHandler(filters.TEXT, count))
    return app


class _CountingReads(SQLiteUpdateStore):
    """Counts its ``read_state`` calls (the number of keys of each)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.reads: List[int] = []

    def read_state(self, keys: Any) -> Any:
        keys = list(keys)
        self.reads.append(len(keys))
        return super().read_state(keys)


def test_updates_put_together_use_the_state_read_with_their_record(tmp_path: Path) -> None:
    """A webhook burst: five updates of one user put at once. Each update's state is read in
    the store call that records it (no read of its own when it starts), and each first attempt
    sees the count its predecessors committed although its rows were read before they
    completed: this process's newer commits take the place of what was read ahead."""
    store = _CountingReads(str(tmp_path / "a.db"))
    reads = store.reads
    seen: List[Any] = []
    try:
        with FakeBotApi() as fake:
            app = _counter_app(store, fake, seen)

            async def main() -> None:
                async with app:
                    await app.start()
                    from telegram import Update

                    from ptb_fence.testing import make_message_update

                    bodies = [make_message_update(100 + i, 5, f"m{i}", message_id=1 + i)
                              for i in range(5)]
                    await asyncio.gather(*(app.update_queue.put(Update.de_json(b, app.bot))
                                           for b in bodies))
                    for _ in range(500):
                        if len(seen) >= 5 and store.figures().unsettled == 0:
                            break
                        await asyncio.sleep(0.01)
                    await app.stop()

            run(main())
        assert [(attempt, n) for _, attempt, n in seen] == [
            (1, None), (1, 1), (1, 2), (1, 3), (1, 4)], seen
        assert len(reads) <= 2, reads  # read with the records (one group, or two), none later
    finally:
        store.close()


def test_updates_of_one_getupdates_answer_share_one_state_read(tmp_path: Path) -> None:
    """Polling: the updates of one getUpdates answer have their state read together when they
    are queued (one read), and each sees what the one before it committed."""
    store = _CountingReads(str(tmp_path / "a.db"))
    reads = store.reads
    seen: List[Any] = []
    try:
        with FakeBotApi() as fake:
            for i in range(6):
                fake.inject_message(chat_id=7, text=f"m{i}")
            app = _counter_app(store, fake, seen)

            async def main() -> None:
                async with polling(app):
                    for _ in range(500):
                        if len(seen) >= 6 and store.figures().unsettled == 0:
                            break
                        await asyncio.sleep(0.01)

            run(main())
        assert [(attempt, n) for _, attempt, n in seen] == [
            (1, None), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5)], seen
        assert len(reads) < 6, reads
    finally:
        store.close()
