"""The durable jobs of a PostgresUpdateStore, written on a cursor in the caller's transaction.

The store's own methods, a commit's landed completions and ``write_effects`` share them.
"""

from __future__ import annotations

from typing import Any, List, Sequence

from ptb_fence._values import AttemptEffects, JobFire, JobWrite, StoredJob
from ptb_fence.stores._jobs_sql import (
    fire_order,
    fire_params,
    job_of,
    keyed_order,
    positions,
    write_params,
)
from ptb_fence.stores._queries import Statements
from ptb_fence.stores.postgres._executor import returns_row

__all__ = ["cancel_in", "fire_in", "schedule_in", "write_jobs_in"]


def schedule_in(
    sql: Statements, cur: Any, writes: Sequence[JobWrite], at: int
) -> List[StoredJob]:
    """Add or declare ``writes`` and return them as stored, in input order."""
    checked = [write_params(write, at) for write in writes]  # refused before any write
    order = keyed_order(writes)
    found: List[StoredJob] = []
    for position in order:
        params = checked[position]
        if not params["keyed"]:
            name = "job_insert"
        elif params["next_run_at"] is not None:
            name = "job_declare"
        else:
            name = "job_declare_ended"
        cur.execute(sql[name], params)
        found.append(job_of(cur.fetchone()))
    stored: List[StoredJob] = positions(order, found)
    return stored


def cancel_in(sql: Statements, cur: Any, job_ids: Sequence[int], at: int) -> List[bool]:
    """Cancel live jobs. Per id, whether it was live."""
    return [returns_row(cur, sql["job_cancel"], {"job_id": int(job_id), "at": int(at)})
            for job_id in job_ids]


def write_jobs_in(sql: Statements, cur: Any, effects: AttemptEffects, at: int) -> None:
    """The jobs a landed completion scheduled and removed, in its transaction."""
    if effects.jobs:
        schedule_in(sql, cur, effects.jobs, at)
    if effects.cancelled_jobs:
        cancel_in(sql, cur, effects.cancelled_jobs, at)


def fire_in(sql: Statements, cur: Any, fires: Sequence[JobFire], at: int) -> List[bool]:
    """Fire runs in the cursor's transaction, one statement each, by job id.

    Per fire, whether its job moved on."""
    checked = [fire_params(fire, at) for fire in fires]  # refused before any write
    fired = [False] * len(fires)
    for position, _ in fire_order(fires):
        cur.execute(sql["job_fire"], checked[position])
        fired[position] = bool(cur.fetchone()[0])
    return fired
