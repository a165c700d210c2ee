"""Quiet by default: ptb_fence's own scheduler jobs do not log at INFO; durations read well.

A real :class:`~ptb_fence.UpdateIntake` over a SQLite file runs with a short lease (many keeper
ticks) and a short sweep interval while ``caplog`` captures everything at INFO: APScheduler's
"Running job … / executed successfully / Scheduler started" records must not appear for
ptb_fence's scheduler, and a retry's log line states its delay for humans ("200 ms", not
"0.2s" or "3.6e+03s").
"""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

from ptb_fence import SQLiteUpdateStore, UpdateIntake


def _body(update_id: int) -> str:
    return json.dumps(
        {
            "update_id": update_id,
            "message": {"message_id": 1, "date": 0, "chat": {"id": 5, "type": "private"}},
        }
    )


def test_scheduler_jobs_do_not_log_at_info(tmp_path: "os.PathLike[str]", caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    store = SQLiteUpdateStore(os.path.join(str(tmp_path), "quiet.db"))
    calls = []

    def handle(update: dict) -> None:
        calls.append(update["update_id"])
        if len(calls) == 1:
            raise ValueError("first try fails")
        time.sleep(0.6)  # long enough for several lease-keeper ticks

    intake = UpdateIntake(
        store,
        handle=handle,
        lease_seconds=0.4,
        sweep_every_seconds=0.1,
        retry=lambda error, attempt: 0.2,
    )
    try:
        intake.start()
        assert intake.accept(_body(1)) == "accepted"
        deadline = time.monotonic() + 15
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert intake.idle(10)
    finally:
        intake.close(10)
        store.close()
    assert calls == [1, 1]
    assert intake.runtime.keeper.ticks >= 2  # the keeper really ran while we listened
    noisy = [
        r for r in caplog.records
        if r.name.startswith("apscheduler") or r.name == "ptb_fence.scheduler"
    ]
    assert noisy == [], [(r.name, r.getMessage()) for r in noisy]
    retry_lines = [r.getMessage() for r in caplog.records if "retry scheduled in" in r.getMessage()]
    assert retry_lines and "retry scheduled in 200 ms" in retry_lines[0], retry_lines


def test_user_configured_scheduler_logger_is_kept(tmp_path: "os.PathLike[str]", caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("apscheduler.executors.ptb_fence")
    before = logger.level
    logger.setLevel(logging.INFO)
    try:
        caplog.set_level(logging.INFO)
        store = SQLiteUpdateStore(os.path.join(str(tmp_path), "loud.db"))
        intake = UpdateIntake(store, handle=lambda u: None, lease_seconds=0.4)
        intake.start()
        time.sleep(0.5)
        intake.close(5)
        store.close()
        runs = [r for r in caplog.records if r.name == "apscheduler.executors.ptb_fence"]
        assert runs, "a level the user set must not be overridden"
    finally:
        logger.setLevel(before)
