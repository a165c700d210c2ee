"""Retries on time: a retry due before the next sweep runs at its due time, not at the sweep.

With the default sweep interval (30 s) and ``retry=lambda e, a: 0.2``, three attempts of an
always-failing update must take about 0.4 s, not a minute; each retry goes through the same
fenced claim (a new claim id per attempt), and the log states the real delay.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Dict, List, Tuple

import pytest

from ptb_fence import Attempt, Exhaustion, SQLiteUpdateStore, UpdateIntake


def _body(update_id: int, chat: int = 7) -> str:
    return json.dumps(
        {
            "update_id": update_id,
            "message": {"message_id": update_id, "date": 0, "chat": {"id": chat, "type": "private"}},
        }
    )


def test_short_retry_runs_at_its_time_not_at_the_sweep(
    tmp_path: "os.PathLike[str]", caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ptb_fence")
    store = SQLiteUpdateStore(os.path.join(str(tmp_path), "retry.db"))
    runs: List[Tuple[float, int, str]] = []
    exhausted = threading.Event()

    def handle_attempt(update: Dict[str, Any], attempt: Attempt) -> None:
        runs.append((time.monotonic(), attempt.attempt, attempt.claim_id))
        raise ValueError("always fails")

    def handle_exhaustion(exhaustion: Exhaustion) -> None:
        exhausted.set()

    intake = UpdateIntake(
        store,
        handle_attempt=handle_attempt,
        handle_exhaustion=handle_exhaustion,
        max_attempts=3,
        retry=lambda error, attempt: 0.2,
    )  # default sweep_every_seconds (30 s)
    try:
        intake.start()
        started = time.monotonic()
        assert intake.accept(_body(1)) == "accepted"
        assert exhausted.wait(10), f"not exhausted in 10 s (runs: {runs})"
        elapsed = time.monotonic() - started
    finally:
        intake.close(10)
        store.close()
    assert [a for _, a, _ in runs] == [1, 2, 3]
    assert len({c for _, _, c in runs}) == 3  # a fresh fenced claim per attempt
    gaps = [b[0] - a[0] for a, b in zip(runs, runs[1:])]
    for gap in gaps:
        assert 0.19 <= gap <= 1.5, gaps  # at its time (±100 ms on an idle machine), never early
    assert elapsed < 5, elapsed
    lines = [r.getMessage() for r in caplog.records if "retry scheduled in" in r.getMessage()]
    assert len(lines) == 2 and all("retry scheduled in 200 ms" in line for line in lines), lines
    assert not any("next sweep" in line for line in lines), lines


def test_long_retry_is_left_to_the_sweep(tmp_path: "os.PathLike[str]") -> None:
    store = SQLiteUpdateStore(os.path.join(str(tmp_path), "retry_long.db"))
    runs: List[int] = []

    def handle(update: Dict[str, Any]) -> None:
        runs.append(1)
        raise ValueError("fails")

    intake = UpdateIntake(store, handle=handle, retry=lambda e, a: 60.0, sweep_every_seconds=30)
    try:
        intake.start()
        intake.accept(_body(2))
        assert intake.idle(5)
        time.sleep(0.3)
        assert runs == [1]
    finally:
        intake.close(5)
        store.close()
