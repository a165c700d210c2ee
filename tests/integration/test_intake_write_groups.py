"""UpdateIntake groups its writes as the PTB processor does: updates that threads accept at the
same time are recorded in one store call (a ``commit`` of records), and handlers that finish
at the same time are completed in one store call (a ``commit`` of settlements). Every update is
still recorded once and handled once; a duplicate accepted in the same burst is still told
apart.

A real UpdateIntake over a real SQLite file and a real PostgreSQL table, behind a wrapper that
counts the store's calls (each write method is one transaction in the shipped SQL stores).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from store_support import new_store
from counting_store import CountingStore
from ptb_fence import UpdateIntake
from runtime_support import body

THREADS = 16
PER_THREAD = 20
MAX_CONCURRENT = 8


@pytest.fixture(params=["sqlite", "postgres"])
def inner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """An empty real store (closed after the test)."""
    store: Any = new_store(request.param, request, str(tmp_path / "updates.db"))
    yield store
    store.close()


def test_updates_accepted_together_are_recorded_together_and_once(inner: Any) -> None:
    store = CountingStore(inner)
    intake = UpdateIntake(store, handle=lambda update: None, sweep_every_seconds=60)
    results: List[List[str]] = [[] for _ in range(THREADS)]
    start = threading.Barrier(THREADS, timeout=20)

    def webhook_thread(n: int) -> None:
        start.wait()
        for i in range(PER_THREAD):
            update_id = 1 + n * PER_THREAD + i
            results[n].append(intake.accept(body(update_id)))
            # Telegram sent one update twice (a retried webhook): the copy is a duplicate
            if i == 0:
                results[n].append(intake.accept(body(update_id)))

    threads = [threading.Thread(target=webhook_thread, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        for outcome in results:
            assert outcome == ["accepted", "duplicate"] + ["accepted"] * (PER_THREAD - 1)
        total = THREADS * PER_THREAD
        rows = inner.due(now=2**62, pending_before=2**62, limit=total + 10)
        assert sorted(row.update_id for row in rows) == list(range(1, total + 1))
        calls = store.calls["add"] + store.calls["commit_records"]
        assert store.calls["commit_records"] >= 1, dict(store.calls)
        # one call per accept without grouping (336 here); a thread waits while a group is in
        # the store, so the others' accepts join the next group
        assert calls <= (total + THREADS) // 2, dict(store.calls)
    finally:
        intake.close()


def test_handlers_that_finish_together_complete_together(inner: Any) -> None:
    backlog = 96
    hour_ago = int(time.time() * 1000) - 3_600_000
    for update_id in range(1, backlog + 1):
        assert inner.add(update_id, body(update_id), hour_ago)
    store = CountingStore(inner)
    handled: "Counter[int]" = Counter()
    lock = threading.Lock()
    together = threading.Barrier(MAX_CONCURRENT, timeout=20)

    def handle(update: Any, attempt: Any) -> None:
        assert attempt.owns()  # a fenced check, then nothing written: completed by the intake
        with lock:
            handled[update["update_id"]] += 1
        together.wait()  # the workers finish together

    intake = UpdateIntake(
        store, handle_attempt=handle, max_concurrent=MAX_CONCURRENT, sweep_every_seconds=60
    )
    intake.start()
    try:
        deadline = time.monotonic() + 60
        while sum(handled.values()) < backlog and time.monotonic() < deadline:
            time.sleep(0.02)
        assert intake.idle(10)
    finally:
        intake.close()
    assert sorted(handled) == list(range(1, backlog + 1))
    assert set(handled.values()) == {1}
    assert inner.due(now=2**62, pending_before=2**62, limit=10) == []  # all completed
    settles = store.calls["settle_owned"] + store.calls["commit_settle"]
    assert store.calls["commit_settle"] >= 1, dict(store.calls)
    # one settle per update without grouping (96); 8 workers finish at a barrier each round
    assert settles <= backlog // 2, dict(store.calls)
