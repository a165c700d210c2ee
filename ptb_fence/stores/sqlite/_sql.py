"""The SQL of :class:`ptb_fence.SQLiteUpdateStore`: its named statements, in the ``.sql``
files of this package, and what is not a statement (names, required columns).

Every rule of the store contract is ONE conditional statement on one row (see
``updates.sql``). Table names are validated (:func:`ptb_fence.stores.validate_table_name`)
before they reach this module and are always double-quoted, so names that happen to be SQL
keywords (``order``) work too.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Dict, Tuple

from ptb_fence.stores._admin_sql import AdminStatements, admin_statements
from ptb_fence.stores._chat_order_sql import chat_index_name
from ptb_fence.stores._jobs_sql import jobs_index_name, jobs_table_name
from ptb_fence.stores._outbox_sql import outbox_index_name, outbox_table_name
from ptb_fence.stores._queries import Statements, load
from ptb_fence.stores._state_sql import state_table_name
from ptb_fence.stores._broadcasts import broadcast_tables
from ptb_fence.stores._pace import pace_table_name
from ptb_fence.stores._steps_sql import steps_index_name, steps_table_name

__all__ = [
    "INSTANCES_TABLE",
    "META_TABLE",
    "REQUIRED_COLUMNS",
    "index_name",
    "sqlite_admin_statements",
    "statements",
]

FILES = (
    "schema.sql", "updates.sql", "chat.sql", "liveness.sql", "outbox.sql", "state.sql",
    "steps.sql", "jobs.sql", "pace.sql", "broadcasts.sql", "admin.sql",
)
"""The ``.sql`` files of the dialect, in this package."""

REQUIRED_COLUMNS: Tuple[str, ...] = (
    "update_id",
    "body",
    "state",
    "attempts",
    "due_at",
    "received_at",
    "settled_at",
    "error",
)
"""Columns an existing table must have (``claim_id``, ``fingerprint``, ``instance``,
``chat_key`` and ``isolated_claim`` are added when missing)."""

META_TABLE = "ptb_fence_meta"
"""The table recording which bot owns each update table (``bind_bot``)."""

INSTANCES_TABLE = "ptb_fence_instances"
"""The table of the live instances (``hold_liveness``) of every update table of the file."""


def index_name(table: str) -> str:
    """The name of the ``(state, due_at)`` index of ``table``."""
    return f"{table}_state_due_at_idx"


def _names(table: str) -> Dict[str, str]:
    outbox = outbox_table_name(table)
    return {
        "table": table,
        "index": index_name(table),
        "chat_index": chat_index_name(table),
        "outbox": outbox,
        "outbox_state_due_idx": outbox_index_name(outbox, "state_due_idx"),
        "outbox_chat_idx": outbox_index_name(outbox, "chat_idx"),
        "outbox_failed_idx": outbox_index_name(outbox, "failed_idx"),
        "state": state_table_name(table),
        "steps": steps_table_name(table),
        "steps_update_idx": steps_index_name(steps_table_name(table)),
        "jobs": jobs_table_name(table),
        "jobs_due_idx": jobs_index_name(jobs_table_name(table), "due_idx"),
        "jobs_name_idx": jobs_index_name(jobs_table_name(table), "name_idx"),
        "pace": pace_table_name(table),
        **broadcast_tables(table),
        "meta": META_TABLE,
        "instances": INSTANCES_TABLE,
    }


@lru_cache(maxsize=64)
def statements(table: str) -> Statements:
    """Every named statement of the update table ``table`` (already validated), filled once."""
    return load("sqlite", __package__, FILES).fill(_names(table), {})


def sqlite_admin_statements(table: str, *, has_claim_id: bool = True) -> AdminStatements:
    """The admin statements of the command line and the chaos runner for ``table``.

    ``table`` is already validated (see :func:`~ptb_fence.stores._admin_sql.admin_statements`)."""
    return admin_statements(statements(table), has_claim_id=has_claim_id)
