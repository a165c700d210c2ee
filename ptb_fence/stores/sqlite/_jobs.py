"""The durable jobs of a SQLiteUpdateStore, written inside a transaction the caller holds.

Each function runs on a connection that holds the write lock. So the store's own methods,
a commit's landed completions and ``write_effects`` share them.
"""

from __future__ import annotations

import sqlite3
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

__all__ = ["cancel_in", "fire_in", "schedule_in", "write_jobs_in"]


def _one(conn: sqlite3.Connection, statement: str, params: Any) -> Any:
    return conn.execute(statement, params).fetchone()


def schedule_in(
    sql: Statements, conn: sqlite3.Connection, writes: Sequence[JobWrite], at: int
) -> List[StoredJob]:
    """Add or declare ``writes`` and return them as stored, in input order."""
    checked = [write_params(write, at) for write in writes]  # refused before any write
    order = keyed_order(writes)
    found: List[StoredJob] = []
    for position in order:
        params = dict(checked[position], keyed=1 if checked[position]["keyed"] else 0)
        row = None
        if not params["keyed"]:
            row = _one(conn, sql["job_insert"], params)
        elif params["next_run_at"] is not None:
            row = _one(conn, sql["job_declare"], params)
        else:
            row = _one(conn, sql["job_declare_ended"], params)
            if row is None:
                row = _one(conn, sql["job_insert"], params)
        found.append(job_of(row))
    stored: List[StoredJob] = positions(order, found)
    return stored


def cancel_in(
    sql: Statements, conn: sqlite3.Connection, job_ids: Sequence[int], at: int
) -> List[bool]:
    """Cancel live jobs. Per id, whether it was live."""
    return [
        _one(conn, sql["job_cancel"], {"job_id": int(job_id), "at": int(at)}) is not None
        for job_id in job_ids
    ]


def write_jobs_in(
    sql: Statements, conn: sqlite3.Connection, effects: AttemptEffects, at: int
) -> None:
    """The jobs a landed completion scheduled and removed, in its transaction."""
    if effects.jobs:
        schedule_in(sql, conn, effects.jobs, at)
    if effects.cancelled_jobs:
        cancel_in(sql, conn, effects.cancelled_jobs, at)


def fire_in(
    sql: Statements, conn: sqlite3.Connection, fires: Sequence[JobFire], at: int
) -> List[bool]:
    """Fire runs in the caller's transaction. Per fire, whether its job moved on."""
    checked = [fire_params(fire, at) for fire in fires]  # refused before any write
    fired = [False] * len(fires)
    for position, _ in fire_order(fires):
        params = checked[position]
        if _one(conn, sql["job_advance"], params) is None:
            continue
        fired[position] = True
        if not params["skip"]:
            conn.execute(sql["job_run_record"], params)
    return fired
