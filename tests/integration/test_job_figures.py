"""What operators see of durable jobs in-process: the job figures of ``stats()``, their
Prometheus metrics, the jobs-late alarm and ``healthy()``.

The sweep reads the due jobs of a store that keeps jobs at most every 10 s. The runs running,
failed and exhausted are counted by the process that handles them.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, List, Optional

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ptb_fence import AlarmThresholds, MemoryUpdateStore, UpdateIntake
from ptb_fence._values import JobWrite, StoredJob
from ptb_fence.metrics import register
from ptb_fence.runtime._durable_jobs import JobRun, run_update_id
from ptb_fence.runtime._stats import JOB_FIGURES_LIMIT
from runtime_support import FakeClock, body


class CountingStore(MemoryUpdateStore):
    """A memory store that counts its ``due_jobs`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.due_calls: List[int] = []

    def due_jobs(self, now: int, limit: int) -> List[StoredJob]:
        self.due_calls.append(limit)
        return super().due_jobs(now, limit)


def once(name: str, at: int) -> JobWrite:
    return JobWrite(name=name, callback="bot:remind", data='""', chat_id=None, user_id=None,
                    schedule=json.dumps({"kind": "once", "at": at}), next_run_at=at)


def run_body(job_id: int, run: int) -> str:
    return JobRun(job_id, run, 0, "nightly", "bot:job", '""', None, None).body(
        run_update_id(job_id, run))


def _alarms(caplog: pytest.LogCaptureFixture, name: str, level: int = logging.WARNING
            ) -> List[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "ptb_fence.alarms"
            and getattr(r, "alarm", None) == name and r.levelno == level]


def test_the_sweep_reads_the_due_jobs_and_how_late_the_most_overdue_is() -> None:
    clock = FakeClock()
    store = CountingStore()
    now = clock.ms()
    store.schedule_jobs([once("a", now - 90_000), once("b", now - 5_000),
                         once("later", now + 60_000)], now - 100_000)
    intake = UpdateIntake(store, handle=lambda update: None, clock=clock)
    try:
        before = intake.stats()
        assert (before.jobs_due, before.jobs_late_seconds, before.jobs_read_at) == (None,) * 3
        assert (before.job_runs_running, before.job_runs_failed, before.job_runs_exhausted) \
            == (0, 0, 0)
        intake.runtime.sweep_done(0)
        stats = intake.stats()
        assert stats.jobs_due == 2
        assert stats.jobs_late_seconds == pytest.approx(90.0)
        assert stats.jobs_read_at is not None
        assert store.due_calls == [JOB_FIGURES_LIMIT]
        # the next sweeps within 10 s read nothing more: the figures stay as read
        clock.advance(60)
        intake.runtime.sweep_done(0)
        intake.runtime.sweep_done(0)
        assert store.due_calls == [JOB_FIGURES_LIMIT]
        assert intake.stats().jobs_late_seconds == pytest.approx(90.0)
        # once they are older, the next sweep reads them again: the jobs fired meanwhile
        store.fire_jobs([], clock.ms())
        for job in store.due_jobs(clock.ms(), 10):
            store.cancel_jobs([job.job_id], clock.ms())
        store.due_calls.clear()
        intake.runtime.stats._jobs_read_at = 0.0  # as if read long ago
        intake.runtime.sweep_done(0)
        stats = intake.stats()
        assert store.due_calls == [JOB_FIGURES_LIMIT]
        assert (stats.jobs_due, stats.jobs_late_seconds) == (0, 0.0)
    finally:
        intake.close()


def test_job_runs_running_failed_and_exhausted_are_counted_apart_from_updates() -> None:
    """The runtime's own claim and settle, as every front end uses them (how a front end
    calls a run's callback does not matter here)."""
    clock = FakeClock()
    store = MemoryUpdateStore()
    run_id = run_update_id(1, 1)
    for update_id, text in ((run_id, run_body(1, 1)), (7, body(7))):
        store.add(update_id, text, clock.ms())
    intake = UpdateIntake(store, handle_attempt=lambda update, attempt: None, clock=clock,
                          max_attempts=2, retry=lambda error, attempt: 0.0,
                          sweep_every_seconds=60)
    runtime = intake.runtime
    try:
        for _ in range(2):  # two attempts each: failed, then exhausted (abandoned)
            attempts = [runtime.claim(update_id) for update_id in (run_id, 7)]
            assert all(attempts)
            stats = intake.stats()
            assert (stats.job_runs_running, stats.claims_held) == (1, 2)
            for attempt in attempts:
                assert attempt is not None
                runtime.settle(attempt, RuntimeError("boom"))
                runtime.end(attempt)
            clock.advance(1)
        stats = intake.stats()
    finally:
        intake.close()
    assert stats.job_runs_running == 0
    assert stats.job_runs_failed == 1  # the run's first attempt (the update's is not counted)
    assert stats.job_runs_exhausted == 1  # its last one
    assert stats.attempts_ended["failed"] == 2
    assert stats.attempts_ended["exhausted"] + stats.attempts_ended["abandoned"] == 2


def test_the_job_metrics_are_exported() -> None:
    clock = FakeClock()
    store = MemoryUpdateStore()
    store.schedule_jobs([once("a", clock.ms() - 12_000)], clock.ms() - 20_000)
    intake = UpdateIntake(store, handle=lambda update: None, clock=clock)
    try:
        registry = CollectorRegistry()
        register(intake, registry)
        before = generate_latest(registry).decode()
        assert "ptb_fence_job_runs_failed_total 0.0" in before
        assert "ptb_fence_job_runs_exhausted_total 0.0" in before
        assert "ptb_fence_job_runs_running 0.0" in before
        assert "ptb_fence_jobs_due" not in before  # not read yet
        intake.runtime.sweep_done(0)
        text = generate_latest(registry).decode()
    finally:
        intake.close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("ptb_fence_jobs_due", (("scope", "store"),))] == 1
    assert samples[("ptb_fence_jobs_late_seconds", (("scope", "store"),))] == pytest.approx(12.0)


def test_jobs_late_past_the_threshold_raise_the_alarm_and_fail_healthy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ptb_fence.alarms")
    clock = FakeClock()
    store = MemoryUpdateStore()
    now = clock.ms()
    (job,) = store.schedule_jobs([once("reminder", now - 30_000)], now - 60_000)
    thresholds = AlarmThresholds(jobs_late_seconds=45.0)
    intake = UpdateIntake(store, handle=lambda update: None, clock=clock, alarms=thresholds,
                          sweep_every_seconds=60)
    intake.start()
    try:
        intake.runtime.sweep_done(0)
        assert not _alarms(caplog, "jobs_late")  # 30 s late: under 45 s
        assert intake.healthy()
        clock.advance(20)
        intake.runtime.stats._jobs_read_at = 0.0  # as if read long ago
        intake.runtime.sweep_done(0)
        (said,) = _alarms(caplog, "jobs_late")
        assert "1 durable job(s) due and not fired, the most overdue late by 50 s" \
            in said.getMessage()
        assert "ptb-fence jobs list" in said.getMessage()
        health = intake.healthy()
        assert not health
        assert any("late by 50 s" in problem for problem in health.problems)
        # readiness leaves it out: every process sharing the store sees the same lateness
        assert intake.runtime.alarms.readiness(running=True)
        store.cancel_jobs([job.job_id], clock.ms())
        intake.runtime.stats._jobs_read_at = 0.0
        intake.runtime.sweep_done(0)
        assert _alarms(caplog, "jobs_late", logging.INFO)  # cleared
        assert intake.healthy()
    finally:
        intake.close()


def test_alarms_none_leave_late_jobs_out_of_healthy() -> None:
    clock = FakeClock()
    store = MemoryUpdateStore()
    store.schedule_jobs([once("reminder", clock.ms() - 3_600_000)], clock.ms() - 3_700_000)
    intake = UpdateIntake(store, handle=lambda update: None, clock=clock, alarms=None,
                          sweep_every_seconds=60)
    intake.start()
    try:
        intake.runtime.sweep_done(0)
        assert intake.stats().jobs_late_seconds == pytest.approx(3600.0)
        assert intake.healthy()
    finally:
        intake.close()


@pytest.mark.parametrize("value", [-1, float("nan"), "60", float("inf")])
def test_a_bad_jobs_late_threshold_is_refused(value: Optional[Any]) -> None:
    with pytest.raises(ValueError, match="AlarmThresholds.jobs_late_seconds"):
        AlarmThresholds(jobs_late_seconds=value)
