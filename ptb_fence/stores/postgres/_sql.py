"""The SQL of :class:`ptb_fence.PostgresUpdateStore`.

It holds the named statements (the ``.sql`` files of this package) and the names, lock keys
and liveness constants. The schema variants are the current one and the seed's legacy table
(``_legacy``). :data:`BEAT_STALE_MS` says how liveness is proven.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Dict, Tuple

from ptb_fence.stores._admin_sql import AdminStatements, admin_statements
from ptb_fence.stores._chat_order_sql import chat_index_name
from ptb_fence.stores._jobs_sql import jobs_index_name, jobs_table_name
from ptb_fence.stores._outbox_sql import outbox_index_name, outbox_table_name
from ptb_fence.stores._queries import Statements, load
from ptb_fence.stores._state_sql import LOCK_CLASS, state_table_name
from ptb_fence.stores._broadcasts import broadcast_tables
from ptb_fence.stores._pace import pace_table_name
from ptb_fence.stores._steps_sql import steps_index_name, steps_table_name

__all__ = [
    "BEAT_STALE_MS",
    "CLASS_ID",
    "INSTANCES_TABLE",
    "META_TABLE",
    "INDEXES",
    "index_names",
    "instance_key",
    "postgres_admin_statements",
    "schema_check_args",
    "schema_lock_key",
    "schema_sql",
    "statements",
]

FILES = (
    "schema.sql", "updates.sql", "chat.sql", "liveness.sql", "outbox.sql", "state.sql",
    "steps.sql", "jobs.sql", "pace.sql", "broadcasts.sql", "admin.sql",
)
"""The ``.sql`` files of the dialect, in this package."""

CLASS_ID = 0x70746266  # "ptbf": the advisory-lock namespace of ptb_fence instances

BEAT_STALE_MS = 3000
"""How long an instance whose lock is free must have left its row unrefreshed to be dead.

An instance holds a *session* advisory lock ``pg_advisory_lock(CLASS_ID, key)`` on a
dedicated connection and has a row in ``ptb_fence_instances``. A free lock alone proves
nothing, since a terminated backend or a server restart ends it while the process lives on.
So every ``take_over_dead`` of a holder also refreshes its row. The runtime calls it every
second. An instance is dead when its lock can be taken *and* its row was not refreshed for
this long since the server started. Three missed refreshes are a death, not a delay."""

META_TABLE = "ptb_fence_meta"
"""The table recording which bot owns each update table (``bind_bot``)."""

INSTANCES_TABLE = "ptb_fence_instances"
"""The live instances (``hold_liveness``) of every update table of the database."""


def _index_name(table: str) -> str:
    name = f"{table}_state_due_at_idx"
    if len(name) <= 63:
        return name
    # PostgreSQL would silently truncate a longer name, and two long table names with a common
    # prefix would then share one index name (relation names share a namespace).
    digest = hashlib.sha256(table.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_state_due_at_idx"


def schema_lock_key(table: str) -> int:
    """The ``pg_advisory_xact_lock`` key that serialises schema changes of ``table``."""
    digest = hashlib.sha256(b"ptb_fence schema:" + table.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def instance_key(instance: str) -> int:
    """The signed 32-bit advisory-lock key of ``instance`` (second half of the two-int form)."""
    digest = hashlib.sha256(b"ptb_fence instance:" + instance.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


def _names(table: str) -> Dict[str, str]:
    outbox = outbox_table_name(table)
    return {
        "table": table,
        "index": _index_name(table),
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
    keys = {
        "schema_lock_key": schema_lock_key(table),
        "meta_lock_key": schema_lock_key(META_TABLE),
        "class_id": CLASS_ID,
        "beat_stale_ms": BEAT_STALE_MS,
        "state_lock_class": LOCK_CLASS,
    }
    return load("postgresql", __package__, FILES).fill(_names(table), keys)


INDEXES = (
    "index", "chat_index", "outbox_state_due_idx", "outbox_chat_idx", "outbox_failed_idx",
    "steps_update_idx", "jobs_due_idx", "jobs_name_idx", "recipients_due_idx",
)
"""The indexes of the schema by placeholder: the statements ``index_<key>`` (in the
migration), ``build_<key>`` and ``drop_<key>`` (``CONCURRENTLY``, on a table that exists)."""


def schema_sql(table: str) -> str:
    """The idempotent migration for ``table`` (already validated): ``schema_tables``, then
    every ``index_<key>`` statement.

    Takes a transaction-scoped advisory lock first, so several processes applying it at once
    (each in its own transaction) do not race on ``CREATE TABLE IF NOT EXISTS``.
    """
    sql = statements(table)
    return "\n\n".join([sql["schema_tables"]] + [sql["index_" + key] for key in INDEXES]) + "\n"


def index_names(table: str) -> Tuple[Tuple[str, str, str], ...]:
    """The indexes of ``table``'s schema: ``(key, quoted index name, table it is on)``."""
    names = _names(table)
    owners = {"outbox": "outbox", "steps": "steps", "jobs": "jobs", "recipients": "recipients"}
    return tuple(
        (key, f'"{names[key]}"', names[owners.get(key.split("_", 1)[0], "table")])
        for key in INDEXES
    )


def schema_check_args(table: str) -> Dict[str, str]:
    """The parameters of the ``schema_check`` statement: each relation's double-quoted name."""
    return {
        key: f'"{name}"'
        for key, name in _names(table).items()
        if key in ("table", "index", "chat_index", "meta", "instances", "outbox", "state",
                   "steps", "steps_update_idx", "jobs", "jobs_due_idx", "jobs_name_idx",
                   "pace", "broadcasts", "recipients", "recipients_due_idx")
    }


def postgres_admin_statements(table: str, *, has_claim_id: bool = True) -> AdminStatements:
    """The admin statements of the command line and the chaos runner for ``table``.

    ``table`` is already validated (see :func:`~ptb_fence.stores._admin_sql.admin_statements`)."""
    return admin_statements(statements(table), has_claim_id=has_claim_id)
