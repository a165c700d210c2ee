"""No silent loss through the PTB adapter: each way an update could vanish or stall unnoticed
has a regression test.

Real PTB Applications against :class:`ptb_fence.testing.FakeBotApi`, real SQLite files and
PostgreSQL tables. Store *test doubles* (wrappers that delegate to a real store and can hold a
write back) are used where a scenario needs a write in flight; ptb_fence itself is not patched.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any, Dict, List, Optional

import pytest
from telegram import Bot, Update
from telegram.ext import Application, MessageHandler, TypeHandler, filters

from ptb_fence import Exhaustion, PostgresUpdateStore, SQLiteUpdateStore
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi, make_message_update
from ptb_support import FAST, build, polling, rows, run, wait_for


class GatedStore:
    """Delegates to a real store. While :attr:`gate` is clear, the *first* recording call
    (a ``commit`` that records, ``add``) commits and then blocks in the worker thread
    (after setting :attr:`entered`) before it returns: a write that landed while its caller
    is cancelled."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def _hold(self) -> None:
        if not self.gate.is_set() and not self.entered.is_set():
            self.entered.set()
            assert self.gate.wait(20), "the test never opened the gate"

    def add(self, *args: Any, **kwargs: Any) -> Any:
        result = self.inner.add(*args, **kwargs)
        self._hold()
        return result

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if name not in ("add_many", "commit"):
            return target

        def held(*args: Any, **kwargs: Any) -> Any:
            result = target(*args, **kwargs)
            batch = args[0] if name == "commit" else None
            if batch is None or batch.records or batch.claimed_records:  # a recording
                self._hold()
            return result

        return held


def _count_handled(handled: Dict[int, int]) -> Any:
    async def on_message(update: Update, context: Any) -> None:
        handled[update.update_id] = handled.get(update.update_id, 0) + 1

    return on_message


# -- a lone UTF-16 surrogate -----------------------------------------------------------------
def _surrogate_scenario(store: Any) -> None:
    handled: Dict[int, int] = {}

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor = FencedUpdateProcessor(store, **FAST)
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.ALL, _count_handled(handled)))
            first = fake.inject_message(chat_id=1, text="before")
            bad = fake.inject(make_message_update(first + 1, 2, "lone \ud83d here", message_id=1))
            after = [fake.inject_message(chat_id=3, text=f"after {i}") for i in range(3)]
            wanted = {first, bad, *after}
            async with polling(app):
                await wait_for("every update handled", lambda: set(handled) >= wanted, 10)
                await wait_for("every update confirmed", lambda: fake.confirmed_update_ids >= wanted, 10)
            assert all(handled[u] == 1 for u in wanted), handled

    run(scenario())


def test_lone_surrogate_update_is_recorded_and_handled_sqlite(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    try:
        _surrogate_scenario(store)
        table = rows(str(tmp_path / "bot.db"))
        assert all(state == "completed" for state, *_ in table.values()), table
    finally:
        store.close()


def test_lone_surrogate_update_is_recorded_and_handled_postgres(pg_dsn: str, pg_table: str) -> None:
    store = PostgresUpdateStore(pg_dsn, pg_table)
    try:
        _surrogate_scenario(store)
    finally:
        store.close()


def test_a_failing_batch_names_the_culprit_update(tmp_path: Any, caplog: Any) -> None:
    from ptb_support import FlakyStore

    store = FlakyStore(SQLiteUpdateStore(str(tmp_path / "bot.db")))
    handled: Dict[int, int] = {}

    async def scenario() -> None:
        with FakeBotApi() as fake:
            app = build(FencedUpdateProcessor(store, **FAST), fake)
            app.add_handler(MessageHandler(filters.ALL, _count_handled(handled)))
            ids = [fake.inject_message(chat_id=1, text=f"m{i}") for i in range(3)]
            store.fail_ids = {ids[2]}
            store.failing = True
            with caplog.at_level(logging.ERROR, logger="ptb_fence"):
                async with polling(app):
                    await wait_for("a failed batch", lambda: store.failed_adds, 10)
                    store.failing = False
                    await wait_for("every update handled", lambda: set(handled) >= set(ids), 10)
            messages = [r.getMessage() for r in caplog.records if "could not record" in r.getMessage()]
            assert messages and all(str(ids[2]) in m for m in messages), messages

    try:
        run(scenario())
    finally:
        store.inner.close()


# -- a cancelled ingest ------------------------------------------------------------------------
def test_polling_stopped_mid_write_then_restarted_handles_the_update_once(
    tmp_path: Any, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="ptb_fence")
    store = GatedStore(SQLiteUpdateStore(str(tmp_path / "bot.db")))
    handled: Dict[int, int] = {}

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor = FencedUpdateProcessor(store, **dict(FAST, lease_seconds=30.0))
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.ALL, _count_handled(handled)))
            async with app:
                await app.start()
                assert app.updater is not None
                store.gate.clear()
                uid = fake.inject_message(chat_id=1, text="caught mid-write")
                await app.updater.start_polling(poll_interval=0.0, timeout=1)
                await wait_for("the write to start", store.entered.is_set, 10)
                await app.updater.stop()  # cancels the polling task mid-write
                store.gate.set()
                await asyncio.sleep(0.2)
                await app.updater.start_polling(poll_interval=0.0, timeout=1)
                # well under the lease (30 s): nobody may leave it leased
                await wait_for("the update handled", lambda: uid in handled, 5)
                await asyncio.sleep(0.5)
                await app.updater.stop()
                await app.stop()
            assert handled == {uid: 1}
        assert "handing it on" in caplog.text

    try:
        run(scenario())
    finally:
        store.inner.close()


def test_a_get_updates_answer_that_polling_does_not_put_strands_nothing(tmp_path: Any) -> None:
    """PTB's last getUpdates in Updater.stop() (or a manual bot.get_updates()) returns updates
    that PTB never puts: they must not be claimed and left to a lease."""
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    handled: Dict[int, int] = {}

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor = FencedUpdateProcessor(store, **dict(FAST, lease_seconds=30.0))
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.ALL, _count_handled(handled)))
            uid = fake.inject_message(chat_id=1, text="fetched but never put")
            async with app:
                await app.start()
                assert [u.update_id for u in await app.bot.get_updates(timeout=0)] == [uid]
                assert app.updater is not None
                await app.updater.start_polling(poll_interval=0.0, timeout=1)
                await wait_for("the update handled well within the lease", lambda: uid in handled, 5)
                await app.updater.stop()
                await app.stop()
            assert handled == {uid: 1}

    try:
        run(scenario())
    finally:
        store.close()


def test_put_cancelled_mid_write_hands_the_update_on(tmp_path: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="ptb_fence")
    store = GatedStore(SQLiteUpdateStore(str(tmp_path / "bot.db")))
    handled: Dict[int, int] = {}

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor = FencedUpdateProcessor(store, **dict(FAST, lease_seconds=30.0))
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.ALL, _count_handled(handled)))
            async with app:
                await app.start()
                update = Update.de_json(make_message_update(77, 1, "webhook"), app.bot)
                store.gate.clear()
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(app.update_queue.put(update), 0.2)
                assert store.entered.is_set()
                store.gate.set()
                await wait_for("the update handled", lambda: 77 in handled, 5)
                # Telegram redelivers it (the put failed): no second handling
                await app.update_queue.put(Update.de_json(make_message_update(77, 1, "webhook"), app.bot))
                await asyncio.sleep(0.5)
                await app.stop()
            assert handled == {77: 1}
        assert "handing it on" in caplog.text

    try:
        run(scenario())
    finally:
        store.inner.close()


# -- builder calls after install ----------------------------------------------------------------
def test_concurrent_updates_after_install_is_refused(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor = FencedUpdateProcessor(store, **FAST)
            builder = processor.install(Application.builder().token(fake.token).base_url(fake.base_url))
            app = builder.concurrent_updates(4).build()
            with pytest.raises(RuntimeError) as info:
                await app.initialize()
            message = str(info.value)
            assert "concurrent_updates" in message and "max_concurrent=" in message
            await app.shutdown()

    try:
        run(scenario())
    finally:
        store.close()


def test_update_queue_after_install_is_refused(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    try:
        processor = FencedUpdateProcessor(store, **FAST)
        builder = processor.install(Application.builder().token("1:x"))
        builder.update_queue(asyncio.Queue())
        with pytest.raises(RuntimeError) as info:
            builder.build()
        assert ".update_queue(" in str(info.value) and "after install" in str(info.value)
    finally:
        store.close()


# -- one Bot, two Applications ------------------------------------------------------------------
def test_a_bot_reused_by_a_second_application_is_wired_to_the_new_processor(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    handled: Dict[int, int] = {}

    async def scenario() -> None:
        with FakeBotApi() as fake:
            bot = Bot(fake.token, base_url=fake.base_url)
            for round_ in range(2):
                processor = FencedUpdateProcessor(store, **dict(FAST, lease_seconds=30.0))
                app = processor.install(Application.builder().bot(bot)).build()
                app.add_handler(MessageHandler(filters.ALL, _count_handled(handled)))
                uid = fake.inject_message(chat_id=1, text=f"round {round_}")
                async with polling(app):
                    await wait_for(f"round {round_} handled promptly", lambda: uid in handled, 5)
            assert len(handled) == 2 and set(handled.values()) == {1}

    try:
        run(scenario())
    finally:
        store.close()


def test_a_bot_wired_to_a_running_processor_is_refused(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))

    async def scenario() -> None:
        with FakeBotApi() as fake:
            bot = Bot(fake.token, base_url=fake.base_url)
            first = FencedUpdateProcessor(store, **FAST).install(Application.builder().bot(bot)).build()
            second = FencedUpdateProcessor(store, **FAST).install(Application.builder().bot(bot)).build()
            async with first:
                with pytest.raises(RuntimeError, match="another running FencedUpdateProcessor"):
                    await second.initialize()
            async with second:  # the first is gone: the Bot is free again
                pass

    try:
        run(scenario())
    finally:
        store.close()


# -- max_concurrent for everything -------------------------------------------------------------
class _Gauge:
    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.done = 0

    async def run(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(0.15)
        finally:
            self.now -= 1
            self.done += 1


def test_non_update_objects_count_against_max_concurrent(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    gauge = _Gauge()

    async def on_payload(update: object, context: Any) -> None:
        await gauge.run()

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor = FencedUpdateProcessor(store, **dict(FAST, max_concurrent=2))
            app = build(processor, fake)
            app.add_handler(TypeHandler(dict, on_payload))
            async with app:
                await app.start()
                for i in range(6):
                    await app.update_queue.put({"payload": i})
                await wait_for("all six handled", lambda: gauge.done == 6, 10)
                await app.stop()
        assert gauge.peak <= 2, gauge.peak

    try:
        run(scenario())
    finally:
        store.close()


class _OverridingProcessor(FencedUpdateProcessor):
    __slots__ = ()

    async def do_process_update(self, update: object, coroutine: Any) -> None:
        await super().do_process_update(update, coroutine)


def test_a_subclass_overriding_do_process_update_is_still_capped(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    gauge = _Gauge()

    async def on_message(update: Update, context: Any) -> None:
        await gauge.run()

    async def on_payload(update: object, context: Any) -> None:
        await gauge.run()

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor = _OverridingProcessor(store, **dict(FAST, max_concurrent=2))
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.ALL, on_message))
            app.add_handler(TypeHandler(dict, on_payload))
            for i in range(5):
                fake.inject_message(chat_id=10 + i, text=f"m{i}")
            async with polling(app):
                for i in range(3):
                    await app.update_queue.put({"payload": i})
                await wait_for("all eight handled", lambda: gauge.done == 8, 10)
        assert gauge.peak <= 2, gauge.peak

    try:
        run(scenario())
    finally:
        store.close()


# -- a hanging exhaustion handler ----------------------------------------------------------------
def _retry_unless_boom(error: BaseException, attempt: int) -> Optional[float]:
    return None if str(error) == "boom" else 0.05


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_hanging_exhaustion_handler_blocks_neither_sweep_nor_chat(tmp_path: Any, kind: str) -> None:
    path = str(tmp_path / "bot.db")
    store = SQLiteUpdateStore(path)
    entered: List[int] = []
    handled: Dict[int, int] = {}
    attempts: Dict[int, int] = {}
    release_async: List[asyncio.Event] = []
    release_sync = threading.Event()

    async def hang_async(exhaustion: Exhaustion) -> None:
        entered.append(exhaustion.update_id)
        await release_async[0].wait()

    def hang_sync(exhaustion: Exhaustion) -> None:
        entered.append(exhaustion.update_id)
        assert release_sync.wait(20)

    async def on_message(update: Update, context: Any) -> None:
        text = update.effective_message.text
        attempts[update.update_id] = attempts.get(update.update_id, 0) + 1
        if text == "boom":
            raise RuntimeError("boom")
        if text == "flaky" and attempts[update.update_id] == 1:
            raise RuntimeError("flaky")
        handled[update.update_id] = handled.get(update.update_id, 0) + 1

    async def scenario() -> None:
        release_async.append(asyncio.Event())
        with FakeBotApi() as fake:
            processor = FencedUpdateProcessor(
                store,
                handle_exhaustion=hang_async if kind == "async" else hang_sync,
                retry=_retry_unless_boom,
                **FAST,
            )
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.ALL, on_message))
            boom = fake.inject_message(chat_id=1, text="boom")
            async with polling(app):
                await wait_for("the exhaustion handler entered", lambda: entered, 10)
                same_chat = fake.inject_message(chat_id=1, text="same chat")
                other = fake.inject_message(chat_id=2, text="other chat")
                flaky = fake.inject_message(chat_id=3, text="flaky")
                await wait_for(
                    "later updates handled while the handler hangs",
                    lambda: {same_chat, other, flaky} <= set(handled),
                    10,
                )
                assert attempts[flaky] == 2  # the retry came from the sweep
                # a "dead process" claimed an update and stopped renewing: taken over
                dead = 900_000
                now = int(time.time() * 1000)
                body = json.dumps(make_message_update(dead, 4, "orphaned", message_id=1))
                store.add(dead, body, now)
                assert store.claim_owned(dead, now=now, lease_until=now + 300, max_attempts=5)
                await wait_for("a lapsed lease taken over", lambda: dead in handled, 10)
                await asyncio.sleep(0.5)  # several sweeps
                assert entered == [boom]  # entered once while it hangs
                if kind == "async":
                    release_async[0].set()
                else:
                    release_sync.set()
                await wait_for(
                    "the exhaustion acknowledged",
                    lambda: not store.due_exhaustions(limit=10),
                    10,
                )
            assert entered == [boom]

    try:
        run(scenario())
    finally:
        release_sync.set()
        store.close()


# -- startup warnings -------------------------------------------------------------------------------
def test_no_exhaustion_handler_warns_at_initialize(tmp_path: Any, caplog: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))

    async def scenario() -> None:
        with FakeBotApi() as fake:
            app = build(FencedUpdateProcessor(store, **FAST), fake)
            with caplog.at_level(logging.WARNING, logger="ptb_fence"):
                async with app:
                    pass
        assert any(
            "handle_exhaustion" in r.getMessage() and "abandoned" in r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING
        ), caplog.text
        caplog.clear()
        with FakeBotApi() as fake:
            app = build(FencedUpdateProcessor(store, handle_exhaustion=print, **FAST), fake)
            with caplog.at_level(logging.WARNING, logger="ptb_fence"):
                async with app:
                    pass
        assert not any("handle_exhaustion" in r.getMessage() for r in caplog.records), caplog.text

    try:
        run(scenario())
    finally:
        store.close()


@pytest.mark.parametrize("method", ["run_polling", "run_webhook"])
def test_drop_pending_updates_warns(tmp_path: Any, caplog: Any, method: str) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))

    async def stop_at_once(application: Any) -> None:
        application.stop_running()

    try:
        with FakeBotApi() as fake:
            processor = FencedUpdateProcessor(store, handle_exhaustion=print, **FAST)
            app = build(processor, fake, Application.builder().post_init(stop_at_once))
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                with caplog.at_level(logging.WARNING, logger="ptb_fence"):
                    secret = {"secret_token": "s3cret"} if method == "run_webhook" else {}
                    getattr(app, method)(drop_pending_updates=True, stop_signals=None,
                                         close_loop=False, **secret)
            finally:
                asyncio.set_event_loop(None)
                loop.close()
        assert any(
            "drop_pending_updates" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
        ), caplog.text
    finally:
        store.close()


@pytest.mark.parametrize("method", ["start_polling", "start_webhook"])
def test_drop_pending_updates_warns_on_the_updater_form(tmp_path: Any, caplog: Any, method: str) -> None:
    """``app.updater.start_polling(drop_pending_updates=True)`` (the form of PTB's "Your first
    bot" with ``async with app``) and ``start_webhook`` warn as run_polling does; run_polling
    warns once, not once more from its updater; without the argument nothing is said."""
    import socket

    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))

    async def start(app: Any, drop: bool) -> None:
        updater = app.updater
        assert updater is not None
        if method == "start_polling":
            await updater.start_polling(poll_interval=0.0, timeout=1, drop_pending_updates=drop)
        else:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            await updater.start_webhook(
                listen="127.0.0.1", port=port, url_path="hook", secret_token="s3cret",
                webhook_url=f"http://127.0.0.1:{port}/hook", drop_pending_updates=drop,
            )
        await updater.stop()

    async def scenario(fake: FakeBotApi) -> None:
        for drop in (False, True):
            app = build(FencedUpdateProcessor(store, handle_exhaustion=print, **FAST), fake)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="ptb_fence"):
                async with app:
                    await app.start()
                    await start(app, drop)
                    await app.stop()
            warned = [
                r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "drop_pending_updates" in r.getMessage()
            ]
            if drop:
                assert len(warned) == 1 and f"updater.{method}(drop_pending_updates=True)" in warned[0], warned
            else:
                assert warned == [], warned

    try:
        with FakeBotApi() as fake:
            run(scenario(fake), timeout=60)
    finally:
        store.close()


def test_run_polling_warns_about_drop_pending_updates_once(tmp_path: Any, caplog: Any) -> None:
    """run_polling warns before it starts and its updater does not warn again."""
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))

    async def stop_soon(application: Any) -> None:
        asyncio.get_running_loop().call_later(0.5, application.stop_running)

    try:
        with FakeBotApi() as fake:
            processor = FencedUpdateProcessor(store, handle_exhaustion=print, **FAST)
            app = build(processor, fake, Application.builder().post_init(stop_soon))
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                with caplog.at_level(logging.WARNING, logger="ptb_fence"):
                    app.run_polling(drop_pending_updates=True, stop_signals=None, close_loop=False, poll_interval=0.0, timeout=1)
            finally:
                asyncio.set_event_loop(None)
                loop.close()
        warned = [
            r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "drop_pending_updates" in r.getMessage()
        ]
        assert len(warned) == 1 and "run_polling(drop_pending_updates=True)" in warned[0], warned
    finally:
        store.close()


# -- one table per bot (wiring): bind_bot -------------------------------------------------------------
class _BindingStore:
    """A real store plus ``bind_bot`` (as the stores will have it): records the calls, and
    refuses every bot but :attr:`owner`."""

    def __init__(self, inner: Any, owner: Optional[int]) -> None:
        self.inner = inner
        self.owner = owner
        self.bound: List[int] = []
        self.threads: List[str] = []

    def bind_bot(self, bot_id: int) -> None:
        self.bound.append(bot_id)
        self.threads.append(threading.current_thread().name)
        if self.owner is not None and bot_id != self.owner:
            raise LookupError(f"table belongs to bot {self.owner}, not {bot_id}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_initialize_binds_the_store_to_the_bot(tmp_path: Any) -> None:
    inner = SQLiteUpdateStore(str(tmp_path / "bot.db"))

    async def scenario() -> None:
        with FakeBotApi() as fake:
            bot_id = int(fake.token.split(":")[0])
            store = _BindingStore(inner, owner=None)
            app = build(FencedUpdateProcessor(store, **FAST), fake)
            async with app:
                pass
            assert store.bound == [bot_id]
            assert store.threads[0] != threading.current_thread().name  # off the event loop
            other = _BindingStore(inner, owner=bot_id + 1)
            app = build(FencedUpdateProcessor(other, **FAST), fake)
            with pytest.raises(LookupError, match="belongs to bot"):
                await app.initialize()
            await app.shutdown()

    try:
        run(scenario())
    finally:
        inner.close()


def test_at_most_eight_exhaustion_deliveries_at_once_the_rest_as_they_end(tmp_path: Any) -> None:
    """The delivery decisions shared with UpdateIntake: 20 exhaustions, at most
    8 handlers at once, each entered once; when they return, the other 12 are delivered at
    once, not after the next sweep (30 s here; before, they waited for it)."""
    store = SQLiteUpdateStore(str(tmp_path / "many.db"))
    release = asyncio.Event()
    entered: List[int] = []
    running = [0, 0]  # now, most at once

    async def on_message(update: Update, context: Any) -> None:
        raise ValueError("final failure")

    async def handle_exhaustion(exhaustion: Any) -> None:
        entered.append(exhaustion.update_id)
        running[0] += 1
        running[1] = max(running[1], running[0])
        try:
            await asyncio.wait_for(release.wait(), 30)
        finally:
            running[0] -= 1

    async def scenario(fake: FakeBotApi) -> List[int]:
        processor = FencedUpdateProcessor(
            store, handle_exhaustion=handle_exhaustion, max_attempts=1, max_concurrent=4,
            **{**FAST, "sweep_every_seconds": 30.0},
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            ids = [fake.inject_message(chat_id=c, text="x") for c in range(1, 21)]
            await wait_for("8 exhaustion handlers at once", lambda: len(entered) >= 8)
            await asyncio.sleep(0.5)
            assert running[1] == 8 and len(entered) == 8, (running, entered)
            release.set()
            await wait_for("every exhaustion acknowledged",
                           lambda: store.due_exhaustions(limit=50) == [], 8)
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake))
    assert sorted(entered) == sorted(ids), entered  # each entered once
    assert running[1] == 8
    store.close()
