"""The lean hop from the event loop to the store threads.

A burst of fast calls is served by the few core threads (a bounded number of threads touch the
GIL at once); calls stuck in something slow never hold the others up for long (a thread more
starts); context variables travel with each call; errors reach the awaiting task; stopping lets
the queued calls finish and ends the threads.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import List

import pytest

from ptb_fence.runtime._hop import StoreHop

VAR: "contextvars.ContextVar[str]" = contextvars.ContextVar("hop_test", default="unset")


def _store_threads(prefix: str) -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def test_a_burst_of_fast_calls_runs_on_the_core_threads() -> None:
    hop = StoreHop(2, 36, "hop-burst")
    seen: List[str] = []

    def call() -> int:
        seen.append(threading.current_thread().name)
        time.sleep(0.0005)  # a short store call
        return 1

    async def main() -> int:
        total = 0
        for _ in range(20):
            total += sum(await asyncio.gather(*(hop.run(call) for _ in range(32))))
        return total

    try:
        assert asyncio.run(main()) == 640
        # 2 core threads, a few more only if the machine stalled the process (not 32)
        assert len(set(seen)) <= 8, sorted(set(seen))
    finally:
        hop.stop()


def test_calls_stuck_in_something_slow_do_not_hold_up_the_others() -> None:
    hop = StoreHop(2, 8, "hop-stuck")
    release = threading.Event()

    async def main() -> float:
        stuck = [hop.run(lambda: release.wait(30)) for _ in range(2)]
        tasks = [asyncio.ensure_future(s) for s in stuck]
        await asyncio.sleep(0.05)
        started = time.monotonic()
        assert await asyncio.wait_for(hop.run(lambda: threading.current_thread().name),
                                      10) == "hop-stuck_3"
        waited = time.monotonic() - started
        release.set()
        assert await asyncio.gather(*tasks) == [True, True]
        return waited

    try:
        assert asyncio.run(main()) < 2.0  # a third thread started (50 ms stall, loaded machine)
        deadline = time.monotonic() + 5
        while hop.threads > 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hop.threads == 2  # the extra thread ended: nothing is queued
    finally:
        release.set()
        hop.stop()


def test_a_call_queued_behind_calls_that_share_one_idle_thread_is_not_stranded() -> None:
    # one core thread idle, two slow calls queued in the same loop step: both see the same
    # idle thread; a call made afterwards still runs while both slow calls wait
    hop = StoreHop(2, 8, "hop-share")
    release = threading.Event()

    async def main() -> str:
        loop = asyncio.get_running_loop()
        assert await hop.run(lambda: "warm") == "warm"  # one thread, now idle
        slow = [hop.submit(loop, lambda: release.wait(30)) for _ in range(2)]
        await asyncio.sleep(0.1)
        name = await asyncio.wait_for(hop.run(lambda: threading.current_thread().name), 10)
        release.set()
        assert await asyncio.gather(*slow) == [True, True]
        return name

    try:
        assert asyncio.run(main()).startswith("hop-share_")
    finally:
        release.set()
        hop.stop()


def test_context_errors_and_stop() -> None:
    hop = StoreHop(1, 2, "hop-ctx")

    def boom() -> None:
        raise ValueError("from the store thread")

    async def main() -> List[str]:
        VAR.set("mine")
        got = await hop.run(VAR.get)
        with pytest.raises(ValueError, match="from the store thread"):
            await hop.run(boom)
        loop = asyncio.get_running_loop()
        queued = [hop.submit(loop, lambda i=i: time.sleep(0.01) or str(i)) for i in range(5)]
        hop.stop()
        with pytest.raises(RuntimeError):
            hop.submit(loop, lambda: None)
        return [got] + list(await asyncio.gather(*queued))

    assert asyncio.run(main()) == ["mine", "0", "1", "2", "3", "4"]
    deadline = time.monotonic() + 5
    while _store_threads("hop-ctx") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _store_threads("hop-ctx")


def test_a_real_application_runs_32_concurrent_fenced_writes_on_few_store_threads(
    pg_dsn: str, pg_tables: List[str]
) -> None:
    """PTB polling, ``max_concurrent=32``, every handler a fenced write: the writes run on a
    few store threads (before: one thread per concurrent handler, up to 36)."""
    import uuid

    from telegram import Update
    from telegram.ext import MessageHandler, filters

    from ptb_fence import PostgresUpdateStore
    from ptb_fence.ptb import FencedUpdateProcessor
    from ptb_fence.testing import FakeBotApi
    from ptb_support import FAST, build, polling, run, wait_for

    table = "t_" + uuid.uuid4().hex[:16]
    pg_tables += [table, table + "_notes"]
    store = PostgresUpdateStore(pg_dsn, table)
    with store.transaction() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table}_notes (update_id BIGINT PRIMARY KEY)")
    threads: List[str] = []
    done: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        def write(conn: Any) -> None:
            threads.append(threading.current_thread().name)
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO {table}_notes VALUES (%s)", (update.update_id,))
            time.sleep(0.003)

        await context.attempt.run_in_transaction(write, complete=True)
        done.append(update.update_id)

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(store, max_concurrent=32, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        for chat in range(96):
            fake.inject_message(chat_id=chat + 1, text="x")
        async with polling(app):
            await wait_for("96 fenced writes", lambda: len(done) >= 96, 60)

    try:
        with FakeBotApi() as fake:
            run(scenario(fake), timeout=90)
    finally:
        store.close()
    assert len(threads) == 96
    assert len(set(threads)) <= 16, sorted(set(threads))
