"""``strict_chat_order`` in one process, through UpdateIntake (blocking front end).

One chat, updates 1, 2, 3; update 1 fails once (retry 0.2 s). Without strict order the
handler runs 1, 2, 3, 1; with it 1, 1, 2, 3 — and another chat is not held up meanwhile (it
finishes before the failed update's retry runs). On SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest

from ptb_fence import MemoryUpdateStore, SQLiteUpdateStore, UpdateIntake

CHAT_A = 100
CHAT_B = 200


def message(update_id: int, chat_id: int) -> str:
    return json.dumps(
        {
            "update_id": update_id,
            "message": {
                "message_id": update_id,
                "date": 1_700_000_000,
                "chat": {"id": chat_id, "type": "private"},
                "from": {"id": chat_id, "is_bot": False, "first_name": "u"},
                "text": f"m{update_id}",
            },
        }
    )


class Recorder:
    """The handler: logs (update_id, chat, 'start'|'ok'|'fail', time); fails update 1 once."""

    def __init__(self, fail_once: int = 1, hold: float = 0.0) -> None:
        self.events: List[Tuple[int, int, str, float]] = []
        self.lock = threading.Lock()
        self.failed = False
        self.fail_once = fail_once
        self.hold = hold

    def __call__(self, update: Dict[str, Any]) -> None:
        update_id = update["update_id"]
        chat = update["message"]["chat"]["id"]
        with self.lock:
            self.events.append((update_id, chat, "start", time.monotonic()))
            fail = update_id == self.fail_once and not self.failed
            self.failed = self.failed or fail
        time.sleep(self.hold)
        if fail:
            with self.lock:
                self.events.append((update_id, chat, "fail", time.monotonic()))
            raise RuntimeError("first attempt fails")
        with self.lock:
            self.events.append((update_id, chat, "ok", time.monotonic()))

    def starts(self, chat: int) -> List[int]:
        with self.lock:
            return [u for u, c, what, _ in self.events if c == chat and what == "start"]

    def at(self, update_id: int, what: str, nth: int = 0) -> float:
        with self.lock:
            times = [t for u, _, w, t in self.events if u == update_id and w == what]
        return times[nth]


def run_intake(store: Any, strict: bool, recorder: Recorder) -> None:
    intake = UpdateIntake(
        store,
        handle=recorder,
        strict_chat_order=strict,
        retry=lambda error, attempt: 0.2,
        max_concurrent=4,
        sweep_every_seconds=5,
    )
    intake.start()
    try:
        for update_id, chat in ((1, CHAT_A), (2, CHAT_A), (3, CHAT_A), (4, CHAT_B), (5, CHAT_B)):
            assert intake.accept(message(update_id, chat)) == "accepted"
        deadline = time.monotonic() + 20
        while len([e for e in recorder.events if e[2] == "ok"]) < 5:
            assert time.monotonic() < deadline, recorder.events
            time.sleep(0.02)
        assert intake.idle(10)
    finally:
        intake.close()


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_fail_once_keeps_the_chat_in_order(store: Any) -> None:
    recorder = Recorder(hold=0.05)
    run_intake(store, True, recorder)
    assert recorder.starts(CHAT_A) == [1, 1, 2, 3], recorder.events
    assert recorder.starts(CHAT_B) == [4, 5], recorder.events
    # update 2 starts only after update 1 succeeded on its retry
    assert recorder.at(2, "start") >= recorder.at(1, "ok")
    # no head-of-line blocking: the other chat finished while chat A waited for its retry
    assert recorder.at(5, "ok") < recorder.at(1, "start", 1), recorder.events


def test_without_strict_order_the_retry_runs_after_later_updates() -> None:
    """The default (documented): first attempts in order, a retry after the later updates."""
    recorder = Recorder(hold=0.05)
    run_intake(MemoryUpdateStore(), False, recorder)
    assert recorder.starts(CHAT_A) == [1, 2, 3, 1], recorder.events


def test_strict_order_needs_a_chat_ordered_store() -> None:
    from runtime_support import StoreWrapper

    with pytest.raises(TypeError, match="strict_chat_order.*add_many_in_chats"):
        UpdateIntake(StoreWrapper(), handle=lambda u: None, strict_chat_order=True)
    with pytest.raises(TypeError, match="strict_chat_order must be True or False"):
        UpdateIntake(MemoryUpdateStore(), handle=lambda u: None, strict_chat_order=1)


def test_an_exhausted_update_releases_its_chat(tmp_path: Path) -> None:
    """Update 1 fails every time: once exhausted (and delivered), 2 and 3 run, in order."""
    starts: List[int] = []
    exhausted: List[int] = []

    def handle(update: Dict[str, Any]) -> None:
        starts.append(update["update_id"])
        if update["update_id"] == 1:
            raise RuntimeError("always")

    store = SQLiteUpdateStore(str(tmp_path / "exhaust.sqlite3"))
    intake = UpdateIntake(
        store,
        handle_attempt=lambda update, attempt: handle(update),
        handle_exhaustion=lambda exhaustion: exhausted.append(exhaustion.update_id),
        strict_chat_order=True,
        max_attempts=2,
        retry=lambda error, attempt: 0.1,
        sweep_every_seconds=5,
    )
    intake.start()
    try:
        for update_id in (1, 2, 3):
            assert intake.accept(message(update_id, CHAT_A)) == "accepted"
        deadline = time.monotonic() + 20
        while len(starts) < 4 or not exhausted:
            assert time.monotonic() < deadline, (starts, exhausted)
            time.sleep(0.02)
        assert intake.idle(10)
    finally:
        intake.close()
        store.close()
    assert starts == [1, 1, 2, 3]
    assert exhausted == [1]


def test_an_update_refused_elsewhere_is_handed_over_when_the_chat_is_free(
    tmp_path: Path,
) -> None:
    """Two intakes share one SQLite file (as two processes would). A receives update 1 of a
    chat and handles it slowly; B receives update 2 of the same chat meanwhile: B must not
    start it (its claim is refused). Once 1 completed, A hands 2 over at once: no sweep
    (every 60 s here) and no pending grace (60 s) are waited for."""
    path = str(tmp_path / "shared.sqlite3")
    events: List[Tuple[str, int, str, float]] = []

    def handler(name: str) -> Callable[[Dict[str, Any]], None]:
        def handle(update: Dict[str, Any]) -> None:
            events.append((name, update["update_id"], "start", time.monotonic()))
            time.sleep(0.5 if update["update_id"] == 1 else 0.01)
            events.append((name, update["update_id"], "ok", time.monotonic()))

        return handle

    stores = [SQLiteUpdateStore(path), SQLiteUpdateStore(path)]
    intakes = [
        UpdateIntake(
            store,
            handle=handler(name),
            strict_chat_order=True,
            sweep_every_seconds=60,
            pending_grace_seconds=60,
        )
        for name, store in zip("AB", stores)
    ]
    for intake in intakes:
        intake.start()
    try:
        assert intakes[0].accept(message(1, CHAT_A)) == "accepted"
        deadline = time.monotonic() + 10
        while not events:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert intakes[1].accept(message(2, CHAT_A)) == "accepted"
        deadline = time.monotonic() + 10
        while len([e for e in events if e[2] == "ok"]) < 2:
            assert time.monotonic() < deadline, events
            time.sleep(0.01)
    finally:
        for intake in intakes:
            intake.close()
        for store in stores:
            store.close()
    (one_ok,) = [t for _, u, what, t in events if u == 1 and what == "ok"]
    (two,) = [(name, t) for name, u, what, t in events if u == 2 and what == "start"]
    assert two[1] >= one_ok, events
    assert two[1] - one_ok < 2.0, events  # handed over, not left to a sweep
    assert two[0] == "A", events  # by the process that freed the chat


def no_chat(update_id: int) -> str:
    """An update of no chat and no user (a poll's new state): never ordered."""
    return json.dumps(
        {
            "update_id": update_id,
            "poll": {"id": "p", "question": "q", "options": [], "total_voter_count": 0,
                     "is_closed": False, "is_anonymous": True, "type": "regular",
                     "allows_multiple_answers": False},
        }
    )


def test_rows_recorded_without_a_chat_key_get_it_at_a_strict_start(store: Any, caplog: Any) -> None:
    """Updates recorded by an intake without strict_chat_order have no chat key; an intake
    with it keys them from their stored bodies when it starts, before its first claim (the
    update of no chat stays without one), and says so at WARNING."""
    lax = UpdateIntake(store, handle=lambda update: None)  # never started: records only
    for text in (message(1, CHAT_A), message(2, CHAT_A), message(3, CHAT_B), no_chat(4)):
        assert lax.accept(text) == "accepted"
    lax.close()
    assert [row.update_id for row in store.unkeyed_in_chats(limit=10)] == [1, 2, 3, 4]
    release = threading.Event()
    started: List[int] = []
    strict = UpdateIntake(
        store,
        handle=lambda update: (started.append(update["update_id"]), release.wait(20)),
        strict_chat_order=True,
        sweep_every_seconds=5,
    )
    caplog.set_level("WARNING", logger="ptb_fence")
    try:
        strict.start()
        assert [row.update_id for row in store.unkeyed_in_chats(limit=10)] == [4]
        assert "3 update(s) recorded without a chat key" in caplog.text
        deadline = time.monotonic() + 20
        while len(started) < 3:  # 1 (chat A), 3 (chat B), 4 (no chat); 2 waits for 1
            assert time.monotonic() < deadline, started
            time.sleep(0.02)
        time.sleep(0.2)
        assert sorted(started) == [1, 3, 4], started
        release.set()
        assert strict.idle(20)
        assert sorted(started) == [1, 2, 3, 4]
    finally:
        release.set()
        strict.close()


def test_a_store_that_cannot_key_old_rows_is_refused_at_a_strict_start() -> None:
    """Keying rows recorded without a chat key is part of the declared ``chat_order``."""
    from runtime_support import ALL_METHODS, StoreWrapper

    from ptb_fence.contract import CHAT_ORDER_METHODS

    store = StoreWrapper(methods=ALL_METHODS + CHAT_ORDER_METHODS)
    assert not store.features.chat_order  # without unkeyed_in_chats/set_chat_keys
    with pytest.raises(TypeError, match="strict_chat_order needs a store that keeps chat order"):
        UpdateIntake(store, handle=lambda update: None, strict_chat_order=True)