"""Wiring and lifecycle of the PTB processors: install, builder settings, hooks, start/stop."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, List, Set

import pytest
from telegram import Update
from telegram.ext import (
    Application,
    ApplicationBuilder,
    CallbackContext,
    ContextTypes,
    MessageHandler,
    filters,
)

from ptb_fence import Attempt, MemoryUpdateStore, SQLiteUpdateStore, current_attempt
from ptb_fence.ptb import (
    DurableUpdateProcessor,
    FencedApplication,
    FencedApplicationMixin,
    FencedUpdateProcessor,
)
from ptb_fence.testing import FakeBotApi
from ptb_support import FAST, build, polling, rows, run, wait_for, wait_sync


def _retry(error: BaseException, attempt: int) -> float:
    return 0.05


# -- stores of the lower capability levels (delegating to the memory store) --------------------
class BaseOnlyStore:
    """Only the six base methods."""

    def __init__(self) -> None:
        self._inner = MemoryUpdateStore()
        for name in ("add", "claim", "renew", "settle", "due", "prune"):
            setattr(self, name, getattr(self._inner, name))


class FencedOnlyStore(BaseOnlyStore):
    """Base + fenced, no durable exhaustion."""

    def __init__(self) -> None:
        super().__init__()
        for name in ("claim_owned", "renew_owned", "owns", "settle_owned"):
            setattr(self, name, getattr(self._inner, name))


def test_processors_check_the_store_capability() -> None:
    with pytest.raises(TypeError) as info:
        FencedUpdateProcessor(BaseOnlyStore())
    message = str(info.value)
    assert "fenced" in message
    for name in ("claim_owned", "renew_owned", "owns", "settle_owned"):
        assert name in message
    with pytest.raises(TypeError) as info:
        FencedUpdateProcessor(FencedOnlyStore(), handle_exhaustion=print)
    message = str(info.value)
    assert "durable" in message
    for name in ("exhaust", "due_exhaustions", "acknowledge_exhaustion"):
        assert name in message
    with pytest.raises(TypeError):
        DurableUpdateProcessor(object())
    # the lower levels are enough where they are enough
    DurableUpdateProcessor(BaseOnlyStore())
    FencedUpdateProcessor(FencedOnlyStore())
    with pytest.raises(ValueError, match="lease_seconds"):
        FencedUpdateProcessor(MemoryUpdateStore(), lease_seconds=0)


def test_a_processor_not_wired_with_install_is_refused_at_initialize() -> None:
    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(MemoryUpdateStore(), **FAST)
        app = (
            Application.builder()
            .token(fake.token)
            .base_url(fake.base_url)
            .concurrent_updates(processor)
            .build()
        )
        with pytest.raises(RuntimeError, match="install"):
            await app.initialize()
        assert not processor.runtime.jobs.running
        # the durable queue alone (no FencedApplication) is refused too
        processor2 = FencedUpdateProcessor(MemoryUpdateStore(), **FAST)
        app2 = (
            Application.builder()
            .token(fake.token)
            .base_url(fake.base_url)
            .concurrent_updates(processor2)
            .update_queue(processor2.queue)
            .build()
        )
        with pytest.raises(RuntimeError, match="install"):
            await app2.initialize()

    with FakeBotApi() as fake:
        run(scenario(fake))


def test_install_refuses_a_builder_with_its_own_updater() -> None:
    from telegram import Bot
    from telegram.ext import Updater

    builder = Application.builder().updater(Updater(Bot("1:x"), asyncio.Queue()))
    with pytest.raises(RuntimeError, match="updater"):
        FencedUpdateProcessor(MemoryUpdateStore()).install(builder)


class MyContext(CallbackContext):  # type: ignore[type-arg]
    @property
    def hello(self) -> str:
        return "hello"


class MyApplication(Application):  # type: ignore[type-arg]
    def __init__(self, *args: Any, flavour: str = "plain", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flavour = flavour


def test_custom_application_class_and_context_types_set_before_install(tmp_path: Any) -> None:
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    seen: List[Any] = []

    async def on_message(update: Update, context: Any) -> None:
        seen.append((type(context), context.hello, context.attempt, context.application.flavour))
        if context.attempt.attempt == 1:
            raise RuntimeError("first attempt fails")

    async def scenario(fake: FakeBotApi) -> Any:
        processor = FencedUpdateProcessor(store, max_attempts=3, retry=_retry, **FAST)
        builder = (
            Application.builder()
            .application_class(MyApplication, kwargs={"flavour": "custom"})
            .context_types(ContextTypes(context=MyContext))
        )
        app = build(processor, fake, builder)
        assert isinstance(app, MyApplication) and isinstance(app, FencedApplicationMixin)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        update_id = fake.inject_message(chat_id=1, text="x")
        async with polling(app):
            await wait_for("settled", lambda: rows(path).get(update_id, ("",))[0] == "completed")
        return update_id

    with FakeBotApi() as fake:
        update_id = run(scenario(fake))
    assert len(seen) == 2
    for number, (ctx_type, hello, attempt, flavour) in enumerate(seen, start=1):
        assert issubclass(ctx_type, MyContext)
        assert hello == "hello" and flavour == "custom"
        assert isinstance(attempt, Attempt) and attempt.attempt == number
    assert rows(path)[update_id][:2] == ("completed", 2)  # the failure was detected


def test_application_class_set_after_install(tmp_path: Any) -> None:
    class PlainLater(Application):  # type: ignore[type-arg]
        pass

    class FencedLater(FencedApplication):
        pass

    seen: List[Any] = []

    async def on_message(update: Update, context: Any) -> None:
        seen.append(context.attempt)

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(MemoryUpdateStore(), **FAST)
        builder = processor.install(Application.builder().token(fake.token).base_url(fake.base_url))
        app = builder.application_class(PlainLater).build()
        with pytest.raises(RuntimeError, match="FencedApplication"):
            await app.initialize()
        assert not processor.runtime.jobs.running

        processor = FencedUpdateProcessor(MemoryUpdateStore(), **FAST)
        builder = processor.install(Application.builder().token(fake.token).base_url(fake.base_url))
        app = builder.application_class(FencedLater).build()
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        fake.inject_message(chat_id=1, text="x")
        async with polling(app):
            await wait_for("handled", lambda: seen)
        assert isinstance(seen[0], Attempt)

    with FakeBotApi() as fake:
        run(scenario(fake))


def test_context_types_set_after_install_get_context_attempt(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # the Application (not install()) makes the context type fenced, from the context_types
    # PTB hands its constructor: so also when they were set after install()
    seen: List[Any] = []

    async def on_message(update: Update, context: Any) -> None:
        seen.append((context.attempt, current_attempt(), context.hello))

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(MemoryUpdateStore(), **FAST)
        builder = processor.install(Application.builder().token(fake.token).base_url(fake.base_url))
        with caplog.at_level(logging.WARNING, logger="ptb_fence"):
            app = builder.context_types(ContextTypes(context=MyContext)).build()
        assert not any("FencedCallbackContext" in r.getMessage() for r in caplog.records)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        fake.inject_message(chat_id=1, text="x")
        async with polling(app):
            await wait_for("handled", lambda: seen)

    with FakeBotApi() as fake:
        run(scenario(fake))
    assert isinstance(seen[0][0], Attempt) and seen[0][1] is seen[0][0]
    assert seen[0][2] == "hello"


def _ptb_fence_threads(baseline: Set[int]) -> List[threading.Thread]:
    """Threads started since ``baseline`` that are still alive and not daemon threads, plus
    any APScheduler thread (the lease keeper)."""
    return [
        t
        for t in threading.enumerate()
        if t.ident not in baseline
        and t.is_alive()
        and (not t.daemon or t.name.startswith("APScheduler"))
        and t is not threading.current_thread()
    ]


def test_initialize_twice_restart_and_shutdown_stops_everything(tmp_path: Any) -> None:
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    handled: List[int] = []
    baseline = {t.ident for t in threading.enumerate()}

    async def on_message(update: Update, context: Any) -> None:
        handled.append(update.update_id)

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(store, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        await app.initialize()
        await app.initialize()
        await processor.initialize()  # PTB may call it again; a no-op
        assert processor.runtime.jobs.running
        sweeps = [t for t in asyncio.all_tasks() if t.get_name() == "ptb_fence:sweep"]
        assert len(sweeps) == 1
        first = fake.inject_message(chat_id=1, text="one")
        await app.start()
        assert app.updater is not None
        await app.updater.start_polling(poll_interval=0.0, timeout=1)
        await wait_for("first handled", lambda: first in handled)
        await app.updater.stop()
        await app.stop()
        await app.shutdown()
        await app.shutdown()  # twice is fine
        assert not processor.runtime.jobs.running
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "ptb_fence:sweep"]
        # updates recorded while the bot is down are handled at the next start
        second = fake.inject_message(chat_id=2, text="two")
        async with polling(app):
            await wait_for("second handled", lambda: second in handled)
        assert not processor.runtime.jobs.running

    with FakeBotApi() as fake:
        run(scenario(fake))
    assert len(handled) == 2
    assert wait_sync("ptb_fence threads to end", lambda: not _ptb_fence_threads(baseline), 3)


def test_run_polling_with_hooks_set_after_install(tmp_path: Any) -> None:
    """The most common wiring: run_polling(), with post_init/post_stop/post_shutdown set on the
    builder after install. Fencing stays on (context.attempt, failures retried)."""
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    hooks: List[str] = []
    seen: List[Any] = []
    baseline = {t.ident for t in threading.enumerate()}
    fake = FakeBotApi().start()
    try:
        ids = [fake.inject_message(chat_id=1 + i % 2, text=f"m{i}") for i in range(4)]

        async def on_message(update: Update, context: Any) -> None:
            seen.append((update.update_id, context.attempt.attempt))
            if update.update_id == ids[0] and context.attempt.attempt == 1:
                raise RuntimeError("flaky")

        async def watcher(app: Application) -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                table = await asyncio.to_thread(rows, path)
                if set(table) >= set(ids) and {r[0] for r in table.values()} == {"completed"}:
                    break
                await asyncio.sleep(0.05)
            app.stop_running()

        async def post_init(app: Application) -> None:
            hooks.append("post_init")
            assert app.update_processor.runtime.jobs.running  # type: ignore[attr-defined]
            asyncio.get_running_loop().create_task(watcher(app))

        async def post_stop(app: Application) -> None:
            hooks.append("post_stop")

        async def post_shutdown(app: Application) -> None:
            hooks.append("post_shutdown")

        processor = FencedUpdateProcessor(store, max_attempts=3, retry=_retry, **FAST)
        builder: ApplicationBuilder = processor.install(  # type: ignore[type-arg]
            Application.builder().token(fake.token).base_url(fake.base_url)
        )
        app = builder.post_init(post_init).post_stop(post_stop).post_shutdown(post_shutdown).build()
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        started = time.monotonic()
        app.run_polling(poll_interval=0.0, timeout=1, stop_signals=None)
        assert time.monotonic() - started < 15
    finally:
        fake.stop()
    assert hooks == ["post_init", "post_stop", "post_shutdown"]
    table = rows(path)
    assert {uid: table[uid][:2] for uid in ids} == {
        uid: ("completed", 2 if uid == ids[0] else 1) for uid in ids
    }
    assert sorted(seen) == sorted([(uid, 1) for uid in ids] + [(ids[0], 2)])
    assert not processor.runtime.jobs.running
    assert wait_sync("ptb_fence threads to end", lambda: not _ptb_fence_threads(baseline), 3)


def test_records_left_from_before_a_crash_are_handled_at_start(tmp_path: Any) -> None:
    """Rows recorded by an earlier run (pending, failed and due, processing with a lapsed lease)
    are handed over by the first sweep when the Application starts, without waiting for
    ``pending_grace_seconds``, and without being recorded a second time."""
    import json

    from ptb_fence import Failed
    from ptb_fence.testing import make_message_update

    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    now = int(time.time() * 1000)
    for uid in (10, 11, 12):
        assert store.add(uid, json.dumps(make_message_update(uid, chat_id=uid, text="old")), now)
    # 11 failed earlier and is due again; 12 was being handled by a process that died
    assert store.claim(11, now=now, lease_until=now + 60_000, max_attempts=5) == 1
    store.settle(11, 1, Failed(at=now, retry_at=now - 1, error="earlier failure"))
    assert store.claim(12, now=now - 5_000, lease_until=now - 4_000, max_attempts=5) == 1
    handled: List[Any] = []

    async def on_message(update: Update, context: Any) -> None:
        handled.append((update.update_id, context.attempt.attempt, update.message.text))

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(
            store, lease_seconds=1, sweep_every_seconds=0.1, pending_grace_seconds=60
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            await wait_for("the old rows", lambda: len(handled) == 3, timeout=5)

    with FakeBotApi() as fake:
        run(scenario(fake))
    assert sorted(handled) == [(10, 1, "old"), (11, 2, "old"), (12, 2, "old")]
    table = rows(path)
    assert {uid: table[uid][:2] for uid in (10, 11, 12)} == {
        10: ("completed", 1), 11: ("completed", 2), 12: ("completed", 2)
    }
