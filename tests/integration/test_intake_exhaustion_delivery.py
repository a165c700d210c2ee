"""A hanging exhaustion handler never blocks a chat nor the sweep.

Real SQLite file, real clock, real UpdateIntake: the exhaustion handler blocks on an event. Later
updates of the same chat and of other chats are handled meanwhile; the handler is entered
exactly once for that exhaustion however many sweeps run; once released, the exhaustion is
acknowledged.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict, List

from ptb_fence import SQLiteUpdateStore, UpdateIntake


def _body(update_id: int, chat: int) -> str:
    return json.dumps(
        {
            "update_id": update_id,
            "message": {
                "message_id": update_id,
                "date": 1_700_000_000,
                "chat": {"id": chat, "type": "private"},
                "text": "x",
            },
        }
    )


def _wait(what: str, predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def _bounded(fn: Any, timeout: float) -> float:
    """Run ``fn`` on a thread; fail if it does not return within ``timeout``; its duration."""
    started = time.monotonic()
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"{fn} did not return within {timeout}s"
    return time.monotonic() - started


def test_a_hanging_exhaustion_handler_blocks_neither_chats_nor_sweeps(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "hang.db"))
    release = threading.Event()
    lock = threading.Lock()
    entered: List[Any] = []
    handled: List[int] = []

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        if update["update_id"] == 1:
            raise ValueError("final failure")
        with lock:
            handled.append(update["update_id"])

    def handle_exhaustion(exhaustion: Any) -> None:
        with lock:
            entered.append(exhaustion.identity)
        release.wait(30)  # hangs until the test releases it (bounded for safety)

    intake = UpdateIntake(
        store,
        handle_attempt=handle_attempt,
        handle_exhaustion=handle_exhaustion,
        max_attempts=1,
        lease_seconds=2.0,
        sweep_every_seconds=0.1,
        pending_grace_seconds=0.2,
        max_concurrent=4,
    )
    intake.start()
    try:
        assert intake.accept(_body(1, chat=5)) == "accepted"
        _wait("the exhaustion handler", lambda: len(entered) >= 1)
        # later updates of the same chat and of another chat are handled meanwhile
        assert intake.accept(_body(2, chat=5)) == "accepted"
        assert intake.accept(_body(3, chat=6)) == "accepted"
        _wait("updates 2 and 3 handled", lambda: sorted(handled) == [2, 3], timeout=5)
        # several scheduled sweeps, and explicit ones that must not wait for the hanging handler
        for _ in range(3):
            assert _bounded(intake.sweep, 5) < 2.0
        time.sleep(1.0)  # about ten scheduled sweeps
        with lock:
            assert len(entered) == 1, entered
        assert len(store.due_exhaustions(limit=10)) == 1  # not acknowledged while it hangs
        release.set()
        _wait("the exhaustion acknowledged", lambda: store.due_exhaustions(limit=10) == [])
        time.sleep(0.3)
        with lock:
            assert len(entered) == 1, entered
        assert intake.idle(5)
    finally:
        release.set()
        intake.close(timeout=10)
        store.close()



def test_at_most_eight_exhaustion_deliveries_at_once_each_entered_once(tmp_path: Any) -> None:
    """The delivery decisions shared with the PTB processor: up to 8
    exhaustion handlers run at once (UpdateIntake delivered one at a time before, so 8 were
    never entered within 30 s), never a ninth, each exhaustion entered once, all acknowledged
    once they return."""
    store = SQLiteUpdateStore(str(tmp_path / "many.db"))
    release = threading.Event()
    lock = threading.Lock()
    entered: List[int] = []
    running = [0, 0]  # now, most at once

    def handle_exhaustion(exhaustion: Any) -> None:
        with lock:
            entered.append(exhaustion.update_id)
            running[0] += 1
            running[1] = max(running[1], running[0])
        try:
            release.wait(30)
        finally:
            with lock:
                running[0] -= 1

    def fail(update: Dict[str, Any]) -> None:
        raise ValueError("final failure")

    intake = UpdateIntake(store, handle=fail, handle_exhaustion=handle_exhaustion, max_attempts=1,
                          sweep_every_seconds=0.1, pending_grace_seconds=0.2, max_concurrent=4)
    intake.start()
    try:
        for update_id in range(1, 21):
            assert intake.accept(_body(update_id, chat=update_id)) == "accepted"
        _wait("8 exhaustion handlers at once", lambda: len(entered) >= 8)
        time.sleep(1.0)  # about ten scheduled sweeps: no ninth delivery while 8 run
        with lock:
            assert running[1] == 8 and len(entered) == 8, (running, entered)
        release.set()
        _wait("every exhaustion acknowledged", lambda: store.due_exhaustions(limit=50) == [], 10)
        assert sorted(entered) == list(range(1, 21)), entered  # each entered once
        assert running[1] == 8
    finally:
        release.set()
        intake.close(timeout=10)
        store.close()


def test_a_failing_exhaustion_handler_is_entered_once_per_sweep(tmp_path: Any) -> None:
    """Ten exhaustions whose handler raises: one sweep enters it at most once per exhaustion
    (it stays due for the next sweep): the deliveries that end fetch the next page after the
    rotating cursor, and a short page ends the sweep's deliveries instead of wrapping round to
    the same failing exhaustions."""
    store = SQLiteUpdateStore(str(tmp_path / "failing.db"))
    lock = threading.Lock()
    calls: List[int] = []

    def handle_exhaustion(exhaustion: Any) -> None:
        with lock:
            calls.append(exhaustion.update_id)
        raise RuntimeError("delivery keeps failing")

    def fail(update: Dict[str, Any]) -> None:
        raise ValueError("final failure")

    intake = UpdateIntake(store, handle=fail, handle_exhaustion=handle_exhaustion, max_attempts=1,
                          sweep_every_seconds=3600, pending_grace_seconds=3600)
    intake.start()
    try:
        for update_id in range(1, 11):
            assert intake.accept(_body(update_id, chat=update_id)) == "accepted"
        _wait("ten exhaustions recorded", lambda: len(store.due_exhaustions(limit=50)) == 10)
        _wait("first deliveries over", lambda: intake.idle(0.1), 10)
        with lock:
            calls.clear()
        intake.sweep()
        assert intake.idle(10)
        time.sleep(0.3)  # deliveries started by the ones that ended
        with lock:
            counts = {update_id: calls.count(update_id) for update_id in set(calls)}
        assert sorted(counts) == list(range(1, 11)), counts  # every due one delivered
        assert max(counts.values()) == 1, counts  # and once
        assert len(store.due_exhaustions(limit=50)) == 10  # all still due
    finally:
        intake.close(timeout=10)
        store.close()


def test_a_unary_handler_gets_no_attempt_with_handle_exhaustion(tmp_path: Any) -> None:
    """UpdateIntake(handle=...) with handle_exhaustion claims with claim ids, yet its handler
    is unary: current_attempt() is None there, as without handle_exhaustion."""
    from ptb_fence import current_attempt

    store = SQLiteUpdateStore(str(tmp_path / "unary.db"))
    seen: List[Any] = []

    def handle(update: Dict[str, Any]) -> None:
        seen.append(current_attempt())

    intake = UpdateIntake(store, handle=handle, handle_exhaustion=print,
                          sweep_every_seconds=0.1, pending_grace_seconds=0.2)
    intake.start()
    try:
        assert intake.accept(_body(1, chat=1)) == "accepted"
        _wait("the handler ran", lambda: len(seen) == 1)
        assert seen == [None]
    finally:
        intake.close(timeout=10)
        store.close()
