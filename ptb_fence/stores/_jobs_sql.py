"""Durable jobs (the declared part ``jobs``) for the SQLite and PostgreSQL stores.

The table ``<table>_jobs`` holds one row per job.
Its statements are in each dialect's ``jobs.sql``.
This module names the table and its indexes, checks the values and turns rows into jobs.
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Sequence, Tuple

from ptb_fence._fingerprint import update_fingerprint
from ptb_fence._values import JobFire, JobWrite, StoredJob
from ptb_fence.stores._names import validate_update_id

__all__ = [
    "JOB_COLUMNS",
    "fire_order",
    "fire_params",
    "job_of",
    "jobs_index_name",
    "jobs_table_name",
    "keyed_order",
    "positions",
    "write_params",
]

JOB_COLUMNS = ("job_id", "name", "callback", "data", "chat_id", "user_id", "schedule",
               "next_run_at", "runs", "keyed", "state", "created_at", "options")
"""The columns every statement that reads jobs returns, in this order."""


def jobs_table_name(table: str) -> str:
    """The jobs table of the update table ``table``: ``<table>_jobs``.

    When that would be longer than 63 characters, the name is derived from a digest.
    PostgreSQL would truncate a longer name silently.
    """
    name = f"{table}_jobs"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(table.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_jobs"


def jobs_index_name(jobs: str, suffix: str) -> str:
    """The name of the index ``suffix`` of the jobs table ``jobs`` (at most 63 characters)."""
    name = f"{jobs}_{suffix}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(jobs.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_{suffix}"


def _optional_int(field: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"JobWrite.{field} must be an int or None")
    return value


def write_params(write: JobWrite, at: int) -> Dict[str, Any]:
    """The named parameters of a job's insert or declaration, checked.

    Raises:
        TypeError: Not a :class:`~ptb_fence.JobWrite`, or a field of the wrong type.
    """
    if not isinstance(write, JobWrite):
        raise TypeError(f"a job must be a JobWrite, got {type(write).__name__}")
    for field in ("name", "callback", "data", "schedule", "options"):
        if not isinstance(getattr(write, field), str):
            raise TypeError(f"JobWrite.{field} must be a str")
    return {
        "name": write.name,
        "callback": write.callback,
        "data": write.data,
        "chat_id": _optional_int("chat_id", write.chat_id),
        "user_id": _optional_int("user_id", write.user_id),
        "schedule": write.schedule,
        "next_run_at": _optional_int("next_run_at", write.next_run_at),
        "keyed": bool(write.keyed),
        "options": write.options,
        "at": int(at),
    }


def keyed_order(writes: Sequence[JobWrite]) -> List[int]:
    """The positions of ``writes`` in the order to write them.

    A job that is not keyed keeps its place. The keyed ones take the keyed places by name.
    So two transactions meet the names in one order. The writes of one name keep their order.
    """
    keyed = [p for p, write in enumerate(writes) if write.keyed]
    by_name = iter(sorted(keyed, key=lambda p: (writes[p].name, p)))
    return [next(by_name) if write.keyed else p for p, write in enumerate(writes)]


def fire_params(fire: JobFire, at: int) -> Dict[str, Any]:
    """The named parameters of one fire, the run's fingerprint computed as ``add`` does.

    Raises:
        TypeError, ValueError: A run's update id that no update row can have.
    """
    validate_update_id(fire.update_id)
    return {
        "job_id": int(fire.job_id),
        "runs": int(fire.runs),
        "due_at": int(fire.due_at),
        "next_run_at": None if fire.next_run_at is None else int(fire.next_run_at),
        "update_id": fire.update_id,
        "body": fire.body,
        "fingerprint": update_fingerprint(fire.body),
        "chat_key": None if fire.chat_key is None else int(fire.chat_key),
        "skip": bool(fire.skip),
        "at": int(at),
    }


def job_of(row: Sequence[Any]) -> StoredJob:
    """The job of a row read in the order of :data:`JOB_COLUMNS`."""
    (job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs, keyed,
     state, created_at, options) = row
    return StoredJob(
        int(job_id), str(name), str(callback), str(data),
        None if chat_id is None else int(chat_id), None if user_id is None else int(user_id),
        str(schedule), None if next_run_at is None else int(next_run_at), int(runs),
        bool(keyed), str(state), int(created_at), str(options),
    )


def positions(order: Sequence[int], found: Sequence[Any]) -> List[Any]:
    """``found`` (one per position of ``order``) back in input order."""
    result: List[Any] = [None] * len(order)
    for position, value in zip(order, found):
        result[position] = value
    return result


def fire_order(fires: Sequence[JobFire]) -> List[Tuple[int, JobFire]]:
    """The fires by job id, so two transactions lock jobs in one order."""
    return sorted(enumerate(fires), key=lambda item: (item[1].job_id, item[0]))
