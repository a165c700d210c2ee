"""Durable jobs of the blocking front end: ``UpdateIntake(..., handle_attempt=...).jobs``.

Real stores (memory, SQLite file, PostgreSQL table). A job's callback gets the job and the
run's attempt, runs once, and a job scheduled by a failing attempt is never scheduled.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List

import pytest

from ptb_fence import UpdateIntake
from runtime_support import body, wait_until

RAN: List[Dict[str, Any]] = []
_LOCK = threading.Lock()


def note(job: Any, attempt: Any) -> None:
    """A module-level job callback of a blocking bot."""
    with _LOCK:
        RAN.append({"name": job.name, "data": job.data, "run": job.run_number,
                    "attempt": attempt.attempt, "fenced": attempt.fenced})
    if job.data.get("fail") and attempt.attempt == 1:
        raise RuntimeError("the first run attempt fails")


@pytest.fixture(autouse=True)
def clean() -> None:
    RAN.clear()


def _intake(store: Any, intakes: List[UpdateIntake], handle: Any) -> UpdateIntake:
    intake = UpdateIntake(store, handle_attempt=handle, sweep_every_seconds=0.5,
                          retry=lambda error, attempt: 0.05)
    intakes.append(intake)
    intake.start()
    return intake


def test_a_job_runs_once_as_an_attempt_and_is_retried(store: Any,
                                                      intakes: List[UpdateIntake]) -> None:
    intake = _intake(store, intakes, lambda update, attempt: None)
    job = intake.jobs.run_once(note, 0.1, data={"n": 1, "fail": True}, chat_id=3, name="n1")
    assert job.job_id is not None and job.name == "n1"
    assert wait_until(lambda: len(RAN) >= 2, 15)
    assert wait_until(lambda: intake.idle(0.05), 10)
    assert [(r["name"], r["run"], r["attempt"], r["fenced"]) for r in RAN] == [
        ("n1", 1, 1, True), ("n1", 1, 2, True)]
    assert intake.jobs.jobs() == ()


def test_a_job_scheduled_by_a_failing_attempt_is_never_scheduled(
    store: Any, intakes: List[UpdateIntake]
) -> None:
    holder: Dict[str, Any] = {}

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        holder["intake"].jobs.run_once(note, 0.05, data={"by": attempt.attempt})
        if attempt.attempt == 1:
            raise RuntimeError("fails after scheduling")

    intake = holder["intake"] = _intake(store, intakes, handle)
    intake.accept(body(1))
    assert wait_until(lambda: RAN, 15)
    assert wait_until(lambda: intake.idle(0.05), 10)
    assert [r["data"] for r in RAN] == [{"by": 2}]


def test_a_repeating_job_is_declared_once_by_name(store: Any,
                                                 intakes: List[UpdateIntake]) -> None:
    intake = _intake(store, intakes, lambda update, attempt: None)
    first = intake.jobs.run_repeating(note, 0.3, first=0.05, name="beat", data={})
    again = intake.jobs.run_repeating(note, 0.3, first=0.05, name="beat", data={})
    assert first.job_id == again.job_id
    assert wait_until(lambda: len(RAN) >= 3, 15)
    first.schedule_removal()
    assert intake.jobs.get_jobs_by_name("beat") == ()
    runs = [r["run"] for r in RAN]
    assert runs == list(range(1, len(runs) + 1))


def test_jobs_need_an_attempt_aware_intake(intakes: List[UpdateIntake]) -> None:
    from ptb_fence import MemoryUpdateStore

    intake = UpdateIntake(MemoryUpdateStore(), handle=lambda update: None)
    intakes.append(intake)
    with pytest.raises(TypeError, match="handle_attempt"):
        intake.jobs  # noqa: B018
