"""``UpdateIntake`` with ``attempt_timeout_seconds``: a blocking handler that passed the timeout
keeps its thread (a thread cannot be stopped), but that thread no longer counts against
``max_concurrent``: a new worker takes its place (at most ``max_concurrent`` threads are replaced
while they are stuck), the stuck threads are named in a WARNING, and other chats go on. The
hung update is retried and exhausted per policy.

A real ``UpdateIntake`` in this process (it is the blocking front end: no signals involved) on
a SQLite file and on the real PostgreSQL.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Dict, List

import pytest

from ptb_fence import AttemptTimeout, SQLiteUpdateStore, UpdateIntake
from ptb_support import wait_sync


def _body(update_id: int, chat: int, text: str) -> str:
    return json.dumps({"update_id": update_id, "message": {
        "message_id": update_id, "date": 0, "chat": {"id": chat, "type": "private"}, "text": text}})


def _states(store: Any) -> Dict[int, str]:
    with store.transaction() as conn:
        cur = conn.cursor()
        cur.execute(f"SELECT update_id, state FROM {store.table}")  # noqa: S608
        return {int(r[0]): str(r[1]) for r in cur.fetchall()}


def _workers(before: "set[threading.Thread]") -> "set[threading.Thread]":
    """The worker threads started since ``before`` (other tests' may still run here)."""
    return {t for t in threading.enumerate() if t.name.startswith("ptb_fence-worker")} - before


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_hung_blocking_handlers_do_not_eat_the_worker_pool(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ptb_fence")
    before = _workers(set())
    release = threading.Event()
    hung_runs: List[int] = []
    handled: List[int] = []
    failures: List[Any] = []
    lock = threading.Lock()

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        if update["message"]["text"] == "hang":
            with lock:
                hung_runs.append(attempt.attempt)
            release.wait(120)  # past the timeout, every attempt: its thread is stuck
            return
        with lock:
            handled.append(update["update_id"])

    intake = UpdateIntake(
        store, handle_attempt=handle, max_concurrent=2, max_attempts=3,
        attempt_timeout_seconds=0.3, retry=lambda error, n: 0.05,
        lease_seconds=5.0, sweep_every_seconds=0.1, pending_grace_seconds=0.2,
        on_failure=lambda error, attempt, retrying: failures.append((error, attempt.attempt, retrying)),
    )
    try:
        intake.start()
        assert intake.accept(_body(1, 1, "hang")) == "accepted"
        # all three attempts of the hung update time out: two of them on the two workers the
        # intake started with, the third on a replacement
        wait_sync("three attempts of the hung update", lambda: len(failures) == 3, 30)
        others = list(range(2, 14))
        for update_id in others:
            assert intake.accept(_body(update_id, 100 + update_id, "hello")) == "accepted"
        # other chats are handled although three worker threads are stuck
        wait_sync("the other chats handled", lambda: sorted(handled) == others, 30)
        assert intake.idle(10)
        stats = intake.stats()
        assert (stats.handlers_left_running, stats.attempts_running) == (3, 0), stats
        assert hung_runs == [1, 2, 3]
        assert [(type(e), n, r) for e, n, r in failures] == [
            (AttemptTimeout, 1, True), (AttemptTimeout, 2, True), (AttemptTimeout, 3, False)]
        states = _states(store)
        assert states[1] == "abandoned"
        assert all(states[u] == "completed" for u in others), states
        stuck = [r.getMessage() for r in caplog.records
                 if r.levelno == logging.WARNING and "stuck" in r.getMessage()]
        assert len(stuck) == 3, stuck
        assert "update 1 attempt 1" in stuck[0] and "1 worker thread(s) stuck" in stuck[0]
        assert "update 1 attempt 3" in stuck[2] and "3 worker thread(s) stuck" in stuck[2]
        assert "another thread takes its place" in stuck[1]
        assert "fewer handlers run at once" in stuck[2]
        # bounded: at most max_concurrent threads are replaced while stuck (2 + 2)
        assert len(_workers(before)) <= 4
    finally:
        release.set()
        intake.close(10)
    # the stuck threads returned and close() ended every worker
    wait_sync("the stuck threads returned", lambda: not _workers(before), 10)
    assert intake.stats().handlers_left_running == 0
    assert any("returned" in r.getMessage() and "0 worker thread(s) still stuck" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_a_stuck_thread_that_returns_takes_work_again_when_it_was_not_replaced(
    tmp_path: Any,
) -> None:
    """max_concurrent=1: the first stuck thread is replaced, the second is not (the bound);
    once it returns it takes work again, so the intake is back to one worker."""
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    releases = {1: threading.Event(), 2: threading.Event()}
    handled: List[int] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        update_id = update["update_id"]
        if update_id in releases:
            releases[update_id].wait(60)
            return
        handled.append(update_id)

    intake = UpdateIntake(
        store, handle_attempt=handle, max_concurrent=1, max_attempts=1,
        attempt_timeout_seconds=0.3, lease_seconds=5.0, sweep_every_seconds=0.1,
        pending_grace_seconds=0.2,
    )
    try:
        intake.start()
        intake.accept(_body(1, 1, "hang"))
        intake.accept(_body(2, 2, "hang"))
        wait_sync("both hung updates timed out",
                  lambda: _states(store).get(2) == "abandoned" and _states(store).get(1) == "abandoned", 20)
        intake.accept(_body(3, 3, "hello"))
        time.sleep(0.5)
        assert handled == []  # both threads stuck, one of them beyond the bound: no worker
        releases[2].set()
        wait_sync("update 3 handled once a stuck thread returned", lambda: handled == [3], 20)
        assert intake.idle(10)
    finally:
        for event in releases.values():
            event.set()
        intake.close(10)
    store.close()  # type: ignore[attr-defined]
