"""What PTB handlers receive: context.attempt, current_attempt(), fenced transactions."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Dict, List

import pytest
from telegram import Update
from telegram.ext import MessageHandler, filters

from ptb_fence import Attempt, SQLiteUpdateStore, current_attempt
from ptb_fence.ptb import DurableUpdateProcessor, FencedCallbackContext, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import DOMAIN_DDL, FAST, build, domain_rows, polling, rows, run, wait_for


def test_attempt_is_visible_in_handler_threads_and_transactions(tmp_path: Any) -> None:
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute(DOMAIN_DDL)
    seen: List[Dict[str, Any]] = []
    ticks: List[float] = []

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    async def on_message(update: Update, context: Any) -> None:
        attempt = context.attempt
        info: Dict[str, Any] = {
            "context_type": type(context),
            "attempt": attempt,
            "current": current_attempt(),
            "in_thread": await asyncio.to_thread(current_attempt),
            "loop_thread": threading.get_ident(),
        }

        def write(conn: Any) -> int:
            info["tx_thread"] = threading.get_ident()
            info["tx_current"] = current_attempt()
            time.sleep(0.3)  # holds the transaction (and a worker thread), not the loop
            conn.execute(
                "INSERT INTO domain (update_id, attempt, claim_id) VALUES (?, ?, ?)",
                (update.update_id, attempt.attempt, attempt.claim_id),
            )
            return 42

        stop = asyncio.Event()
        tick_task = asyncio.create_task(ticker(stop))
        before = len(ticks)
        started = time.monotonic()
        info["result"] = await attempt.run_in_transaction(write, complete=True)
        info["tx_seconds"] = time.monotonic() - started
        info["ticks"] = len(ticks) - before
        stop.set()
        await tick_task
        info["completed"] = attempt.completed
        seen.append(info)

    async def scenario(fake: FakeBotApi) -> int:
        processor = FencedUpdateProcessor(store, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        update_id = fake.inject_message(chat_id=1, text="x")
        async with polling(app):
            await wait_for("the handler", lambda: seen)
            await wait_for("settled", lambda: rows(path)[update_id][0] == "completed")
            await asyncio.sleep(0.2)
        return update_id

    with FakeBotApi() as fake:
        update_id = run(scenario(fake))
    assert len(seen) == 1
    info = seen[0]
    attempt = info["attempt"]
    assert issubclass(info["context_type"], FencedCallbackContext)
    assert isinstance(attempt, Attempt)
    assert (attempt.update_id, attempt.attempt) == (update_id, 1)
    assert info["current"] is attempt and info["in_thread"] is attempt and info["tx_current"] is attempt
    assert info["tx_thread"] != info["loop_thread"]
    assert info["result"] == 42 and info["completed"] is True
    assert info["tx_seconds"] >= 0.3
    assert info["ticks"] >= 10, f"the event loop was blocked: {info['ticks']} ticks in 0.3 s"
    assert domain_rows(path) == [(update_id, 1, attempt.claim_id)]
    assert rows(path)[update_id][:2] == ("completed", 1)


@pytest.mark.parametrize("exhaustions", [False, True], ids=["plain", "handle_exhaustion"])
def test_unary_processor_handlers_have_no_attempt(tmp_path: Any, exhaustions: bool) -> None:
    """Also with handle_exhaustion, whose attempts carry claim ids: the docs say there is no
    attempt, and attempt.outbox could not be used with it anyway."""
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    seen: List[Any] = []

    async def on_message(update: Update, context: Any) -> None:
        seen.append((update.update_id, context.attempt, current_attempt()))

    async def scenario(fake: FakeBotApi) -> List[int]:
        extra: Dict[str, Any] = {"handle_exhaustion": print} if exhaustions else {}
        processor = DurableUpdateProcessor(store, **extra, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        ids = [fake.inject_message(chat_id=i, text="x") for i in range(1, 4)]
        async with polling(app):
            await wait_for("handled", lambda: len(seen) == 3)
            await wait_for("settled", lambda: {r[0] for r in rows(path).values()} == {"completed"})
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake))
    assert sorted(s[0] for s in seen) == ids
    assert all(s[1] is None and s[2] is None for s in seen)


def test_slow_handler_keeps_its_lease(tmp_path: Any) -> None:
    """A handler running 3 leases long is renewed by the lease keeper: no sweep takes it over."""
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    runs: List[Any] = []

    async def on_message(update: Update, context: Any) -> None:
        runs.append(context.attempt)
        await asyncio.sleep(1.5)
        assert not context.attempt.owner_lost.is_set()
        assert await context.attempt.run_in_transaction(lambda conn: context.attempt.owns(conn))

    async def scenario(fake: FakeBotApi) -> int:
        processor = FencedUpdateProcessor(
            store, lease_seconds=0.5, sweep_every_seconds=0.1, pending_grace_seconds=0.1
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        update_id = fake.inject_message(chat_id=1, text="slow")
        async with polling(app):
            await wait_for("settled", lambda: rows(path).get(update_id, ("",))[0] == "completed",
                           timeout=6)
        return update_id

    with FakeBotApi() as fake:
        update_id = run(scenario(fake))
    assert len(runs) == 1 and not runs[0].owner_lost.is_set()
    assert rows(path)[update_id][:2] == ("completed", 1)


def test_jobs_run_outside_the_attempt(tmp_path: Any) -> None:
    """Jobs scheduled from a handler (and a repeating job whose timer a handler re-armed) must
    not see the handler's attempt, neither as context.attempt nor from current_attempt()."""
    store = SQLiteUpdateStore(str(tmp_path / "updates.db"))
    seen: List[Any] = []

    async def job(context: Any) -> None:
        seen.append((context.job.name, context.attempt, current_attempt()))

    async def on_message(update: Update, context: Any) -> None:
        context.job_queue.run_once(job, 0, name="now")
        context.job_queue.run_once(job, 0.2, name="later")
        seen.append(("handler", context.attempt, current_attempt()))

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(store, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        assert app.job_queue is not None
        app.job_queue.run_repeating(job, interval=0.1, first=0.05, name="repeating")
        fake.inject_message(chat_id=1, text="x")
        async with polling(app):
            await wait_for("both jobs", lambda: {"now", "later"} <= {s[0] for s in seen})
            await asyncio.sleep(0.25)

    with FakeBotApi() as fake:
        run(scenario(fake))
    handler = [s for s in seen if s[0] == "handler"]
    assert len(handler) == 1 and isinstance(handler[0][1], Attempt) and handler[0][2] is handler[0][1]
    jobs = [s for s in seen if s[0] != "handler"]
    assert len(jobs) >= 4
    assert all(s[1] is None and s[2] is None for s in jobs), jobs
