"""FencedPersistence in a real PTB Application (FakeBotApi, SQLite): what it refuses at
construction and at ``initialize()`` (each message naming the fix), the WARNINGs at start for
what cannot be fenced, and, for updates handled by polling, that the state commits with the
update: a conversation continues from the store, a failed attempt's changes are not seen by
its retry, handlers work on private copies, PTB's flush writes nothing, a version conflict
spends no attempt."""

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
def test_a_store_without_state_is_refused_at_construction() -> None:
    with pytest.raises(TypeError, match="read_state, write_state, list_state"):
        FencedPersistence(FencedOnlyStore())
    # the callback-data cache is fenced too (when the bot has one)
    persistence = FencedPersistence(MemoryUpdateStore())
    assert persistence.store_data == PersistenceInput()


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


# -- Application.drop_user_data / drop_chat_data -----------------------------------------------
@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_dropped_user_and_chat_data_stay_dropped_after_a_restart(
    shared_stores: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Update 1 sets user_data and chat_data; update 2's handler drops both
    (``context.application.drop_*``). PTB applies the drops at its flush, here the last one
    at stop: the rows become tombstones, and a new Application on the same store (a restart)
    hands the next update of that user and chat empty data."""
    seen: List[Any] = []

    async def keep(update: Any, context: Any) -> None:
        context.user_data["a"] = 1
        context.chat_data["b"] = 2

    async def drop(update: Any, context: Any) -> None:
        context.application.drop_user_data(update.effective_user.id)
        context.application.drop_chat_data(update.effective_chat.id)

    async def look(update: Any, context: Any) -> None:
        seen.append((dict(context.user_data), dict(context.chat_data)))

    def app_for(store: Any, fake: FakeBotApi) -> Any:
        app = build(FencedUpdateProcessor(store), fake,
                    Application.builder().persistence(FencedPersistence(store)))
        app.add_handler(CommandHandler("keep", keep))
        app.add_handler(CommandHandler("drop", drop))
        app.add_handler(CommandHandler("look", look))
        return app

    user, chat = StateKey("user", "", "5"), StateKey("chat", "", "5")
    with FakeBotApi() as fake:
        store = shared_stores()

        async def first() -> None:
            app = app_for(store, fake)
            async with polling(app):
                fake.inject_message(chat_id=5, text="/keep")
                for _ in range(300):
                    if _read(store, user) == {"a": 1} and _read(store, chat) == {"b": 2}:
                        break
                    await asyncio.sleep(0.02)
                fake.inject_message(chat_id=5, text="/drop")
                for _ in range(300):
                    if app.update_processor.stats().attempts_ended["completed"] >= 2:
                        break
                    await asyncio.sleep(0.02)
                assert 5 not in app.user_data and 5 not in app.chat_data

        with caplog.at_level(logging.WARNING, logger="ptb_fence.ptb"):
            run(first())
        rows = store.read_state([user, chat])
        assert rows[user].value is None and rows[user].version == 2
        assert rows[chat].value is None and rows[chat].version == 2

        restarted = shared_stores()

        async def second() -> None:
            async with polling(app_for(restarted, fake)):
                fake.inject_message(chat_id=5, text="/look")
                for _ in range(300):
                    if seen:
                        return
                    await asyncio.sleep(0.02)

        run(second())
    assert seen == [({}, {})]
    assert not [r for r in caplog.records if "not dropped" in r.getMessage()]


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_drop_outside_any_update_is_written_by_ptbs_flush(shared_stores: Any) -> None:
    """``Application.drop_user_data`` called outside any update (as a job would): PTB's flush
    deletes the stored row (a tombstone at the version read); a handler of an update of
    another user that drops that user's data is outside its session too and goes the same
    way."""
    async def keep(update: Any, context: Any) -> None:
        context.user_data["a"] = update.effective_user.id
        if update.effective_user.id == 7:
            context.application.drop_user_data(6)

    user6, user7 = StateKey("user", "", "6"), StateKey("user", "", "7")
    store = shared_stores()
    with FakeBotApi() as fake:
        app = build(FencedUpdateProcessor(store), fake,
                    Application.builder().persistence(FencedPersistence(store)))
        app.add_handler(CommandHandler("keep", keep))

        async def go() -> None:
            async with polling(app):
                fake.inject_message(chat_id=6, text="/keep")
                for _ in range(300):
                    if _read(store, user6) == {"a": 6}:
                        break
                    await asyncio.sleep(0.02)
                app.drop_user_data(6)
                await app.update_persistence()
                entry = store.read_state([user6])[user6]
                assert (entry.value, entry.version) == (None, 2)
                fake.inject_message(chat_id=6, text="/keep")
                for _ in range(300):
                    if _read(store, user6) == {"a": 6}:
                        break
                    await asyncio.sleep(0.02)
                fake.inject_message(chat_id=7, text="/keep")  # drops user 6 again
                for _ in range(300):
                    if _read(store, user7) == {"a": 7}:
                        break
                    await asyncio.sleep(0.02)

        run(go())  # the last flush runs at stop
    entry = store.read_state([user6])[user6]
    assert (entry.value, entry.version) == (None, 4)


def test_a_drop_by_a_failing_handler_is_not_written(tmp_path: Path) -> None:
    """A handler that drops its user's data and then fails, every attempt: the drop rode
    the completions that never landed, so the stored data stay (PTB's flush leaves the row
    alone too)."""
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    user = StateKey("user", "", "5")

    async def keep(update: Any, context: Any) -> None:
        context.user_data["a"] = 1

    async def drop(update: Any, context: Any) -> None:
        context.application.drop_user_data(update.effective_user.id)
        assert context.user_data == {}
        raise RuntimeError("fails after dropping")

    with FakeBotApi() as fake:
        processor = FencedUpdateProcessor(store, max_attempts=2, retry=lambda e, a: 0.02)
        app = build(processor, fake, Application.builder().persistence(FencedPersistence(store)))
        app.add_handler(CommandHandler("keep", keep))
        app.add_handler(CommandHandler("drop", drop))

        async def go() -> None:
            async with polling(app):
                fake.inject_message(chat_id=5, text="/keep")
                for _ in range(300):
                    if _read(store, user) == {"a": 1}:
                        break
                    await asyncio.sleep(0.02)
                fake.inject_message(chat_id=5, text="/drop")
                for _ in range(300):
                    if processor.stats().attempts_ended["abandoned"] >= 1:
                        break
                    await asyncio.sleep(0.02)
                await app.update_persistence()

        run(go())
    try:
        entry = store.read_state([user])[user]
        assert (decode_state(entry.value), entry.version) == ({"a": 1}, 1)
    finally:
        store.close()


def test_state_rides_a_completion_whose_outbox_calls_are_claimed_at_insert(tmp_path: Path) -> None:
    """An update that changes user_data and queues a reply: the completion inserts the reply
    already claimed for this process's sender, and still writes the user_data."""
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    user = StateKey("user", "", "5")

    async def hello(update: Any, context: Any) -> None:
        context.user_data["n"] = context.user_data.get("n", 0) + 1
        context.attempt.outbox.reply_text(f"hello {context.user_data['n']}")

    with FakeBotApi() as fake:
        app = build(FencedUpdateProcessor(store), fake,
                    Application.builder().persistence(FencedPersistence(store)))
        app.add_handler(CommandHandler("hello", hello))

        async def go() -> None:
            async with polling(app):
                for n in (1, 2):
                    fake.inject_message(chat_id=5, text="/hello")
                    for _ in range(300):
                        if [m for m in fake.sent_messages if m["text"] == f"hello {n}"]:
                            break
                        await asyncio.sleep(0.02)

        run(go())
    try:
        assert [m["text"] for m in fake.sent_messages] == ["hello 1", "hello 2"]
        assert _read(store, user) == {"n": 2}
    finally:
        store.close()


def test_conflicts_with_one_attempt_allowed_are_given_back_unspent(tmp_path: Path) -> None:
    """20 updates of 20 chats each add one to ``bot_data["n"]`` at once with
    ``max_attempts=1``: a conflict spends no attempt, so none is abandoned; the stats count
    every run past an update's first as ``conflicted``, none as failed."""
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    runs: List[int] = []

    async def inc(update: Any, context: Any) -> None:
        runs.append(context.attempt.attempt)
        before = context.bot_data.get("n", 0)
        await asyncio.sleep(0.05)
        context.bot_data["n"] = before + 1

    with FakeBotApi() as fake:
        processor = FencedUpdateProcessor(store, max_attempts=1, max_concurrent=20)
        app = build(processor, fake, Application.builder().persistence(FencedPersistence(store)))
        app.add_handler(CommandHandler("inc", inc))

        async def go() -> None:
            async with polling(app):
                for i in range(20):
                    fake.inject_message(chat_id=100 + i, text="/inc")
                for _ in range(600):
                    ended = processor.stats().attempts_ended
                    if ended["completed"] + ended["abandoned"] >= 20:
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"not settled: {dict(processor.stats().attempts_ended)}")

        run(go())
    try:
        ended = processor.stats().attempts_ended
        assert (ended["completed"], ended["abandoned"], ended["failed"]) == (20, 0, 0)
        assert ended["conflicted"] == len(runs) - 20 >= 1
        assert set(runs) == {1}
        assert _read(store, StateKey("bot")) == {"n": 20}
    finally:
        store.close()
