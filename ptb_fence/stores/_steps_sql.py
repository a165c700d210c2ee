"""Recorded steps (the declared part ``steps``) for the SQLite and PostgreSQL stores.

The table ``<table>_steps`` holds one row per effect key.
Each row is the :class:`~ptb_fence.StepRecord` of one step of one update.
Its statements are in each dialect's ``steps.sql``.
This module names the table, checks records and turns rows into records.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Dict, Sequence

from ptb_fence._values import StepRecord
from ptb_fence.stores._names import validate_update_id

__all__ = [
    "check_step",
    "record_of",
    "step_params",
    "steps_index_name",
    "steps_table_name",
]

_KEY = re.compile(r"[a-z0-9-]{1,64}")


def steps_table_name(table: str) -> str:
    """The steps table of the update table ``table``: ``<table>_steps``.

    When that would be longer than 63 characters, the name is derived from a digest.
    PostgreSQL would truncate a longer name silently.
    """
    name = f"{table}_steps"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(table.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_steps"


def steps_index_name(steps: str) -> str:
    """The name of the ``update_id`` index of the steps table ``steps`` (at most 63 characters)."""
    name = f"{steps}_update_idx"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(steps.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_update_idx"


def check_step(record: StepRecord) -> StepRecord:
    """Return ``record`` if a store can write it, else raise.

    Raises:
        TypeError: Not a :class:`~ptb_fence.StepRecord`, or a field of the wrong type.
        ValueError: A key outside ``[a-z0-9-]{1,64}``, or an update id out of range.
    """
    if not isinstance(record, StepRecord):
        raise TypeError(f"a step record must be a StepRecord, got {type(record).__name__}")
    validate_update_id(record.update_id)
    if not isinstance(record.key, str) or _KEY.fullmatch(record.key) is None:
        raise ValueError(
            f"step key {record.key!r} must be 1 to 64 characters of a-z, 0-9 and '-'"
        )
    for field in ("name", "result", "claim_id"):
        if not isinstance(getattr(record, field), str):
            raise TypeError(f"StepRecord.{field} must be a str")
    for field in ("attempt", "recorded_at"):
        value = getattr(record, field)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"StepRecord.{field} must be an int")
    return record


def step_params(record: StepRecord) -> Dict[str, Any]:
    """The named parameters of ``record_step``, checked."""
    check_step(record)
    return {
        "key": record.key,
        "update_id": record.update_id,
        "name": record.name,
        "result": record.result,
        "attempt": record.attempt,
        "claim_id": record.claim_id,
        "recorded_at": record.recorded_at,
    }


def record_of(row: Sequence[Any]) -> StepRecord:
    """The record of a row read in the column order of ``steps.sql``."""
    key, update_id, name, result, attempt, claim_id, recorded_at = row
    return StepRecord(
        str(key), int(update_id), str(name), str(result), int(attempt), str(claim_id),
        int(recorded_at),
    )
