"""PostgresSchemaState: how far a PostgreSQL update table is behind the current schema.

The migration (:func:`ptb_fence.postgres_update_store_schema`) is idempotent. But it runs
``ALTER TABLE`` and plain ``CREATE INDEX``, which lock a table that exists. So the command
line reads this state first. ``migrate --check`` reports it. ``migrate`` runs the DDL
transaction only when a column or a table is missing. It builds missing indexes
``CONCURRENTLY`` on an existing table. ``health`` reports a table that needs ``migrate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from ptb_fence.stores._jobs_sql import jobs_table_name
from ptb_fence.stores._outbox_sql import outbox_table_name
from ptb_fence.stores._state_sql import state_table_name
from ptb_fence.stores._broadcasts import broadcast_tables
from ptb_fence.stores._pace import pace_table_name
from ptb_fence.stores._steps_sql import steps_table_name
from ptb_fence.stores.postgres._sql import INSTANCES_TABLE, META_TABLE, index_names, statements

__all__ = ["PostgresSchemaState", "read_schema_state"]

# The columns added to update tables after their first release (the rest make a table an
# update table at all: the command line refuses a table without them).
_LATER_COLUMNS = ("claim_id", "fingerprint", "instance", "isolated_claim", "chat_key")

@dataclass(frozen=True)
class PostgresSchemaState:
    """What the update table ``table`` and its companions lack (empty tuples: current).

    ``invalid_indexes`` are indexes that exist but are not valid: a ``CREATE INDEX
    CONCURRENTLY`` that was interrupted leaves one behind, and ``IF NOT EXISTS`` would then
    skip it forever.
    """

    table: str
    table_exists: bool
    missing_columns: Tuple[str, ...]
    missing_tables: Tuple[str, ...]
    missing_indexes: Tuple[str, ...]
    invalid_indexes: Tuple[str, ...]

    @property
    def current(self) -> bool:
        """:obj:`bool`: Nothing is missing: the migration would change nothing."""
        return self.table_exists and not (
            self.missing_columns or self.missing_tables or self.missing_indexes
            or self.invalid_indexes
        )

    @property
    def needs_ddl(self) -> bool:
        """:obj:`bool`: A table or a column is missing (the DDL transaction must run)."""
        return not self.table_exists or bool(self.missing_columns or self.missing_tables)

    def gaps(self) -> List[str]:
        """What is missing, one phrase each (empty when current)."""
        if not self.table_exists:
            return [f"the table {self.table!r}"]
        found = [f"column {name}" for name in self.missing_columns]
        found += [f"table {name!r}" for name in self.missing_tables]
        found += [f"index {name}" for name in self.missing_indexes]
        found += [f"index {name} (invalid: an interrupted build)" for name in self.invalid_indexes]
        return found

    def as_json(self) -> Dict[str, Any]:
        """The state as a JSON-ready dict."""
        return {
            "current": self.current,
            "table_exists": self.table_exists,
            "missing_columns": list(self.missing_columns),
            "missing_tables": list(self.missing_tables),
            "missing_indexes": [name.strip('"') for name in self.missing_indexes],
            "invalid_indexes": [name.strip('"') for name in self.invalid_indexes],
        }


def read_schema_state(cur: Any, table: str) -> PostgresSchemaState:
    """Read the state of ``table`` (validated) with the psycopg2 cursor ``cur``.

    Only catalog reads: it takes no lock on the tables.
    """
    sql = statements(table)
    quoted = {"quoted": f'"{table}"'}
    cur.execute(sql["table_exists"], quoted)
    exists = bool(cur.fetchone()[0])
    tables = (
        outbox_table_name(table), state_table_name(table), steps_table_name(table),
        jobs_table_name(table), pace_table_name(table),
        broadcast_tables(table)["broadcasts"], broadcast_tables(table)["recipients"],
        META_TABLE, INSTANCES_TABLE,
    )
    if not exists:
        return PostgresSchemaState(table, False, (), (), (), ())
    cur.execute(sql["table_columns"], quoted)
    columns = {str(row[0]) for row in cur.fetchall()}
    missing_columns = tuple(c for c in _LATER_COLUMNS if c not in columns)
    missing_tables: List[str] = []
    for name in tables:
        cur.execute(sql["table_exists"], {"quoted": f'"{name}"'})
        if not cur.fetchone()[0]:
            missing_tables.append(name)
    if INSTANCES_TABLE not in missing_tables:
        cur.execute(sql["instances_have_seen_at"], {"quoted": f'"{INSTANCES_TABLE}"'})
        if not cur.fetchone()[0]:
            missing_columns += (f"{INSTANCES_TABLE}.seen_at",)
    missing_indexes: List[str] = []
    invalid_indexes: List[str] = []
    for _, name, owner in index_names(table):
        if owner in missing_tables:
            continue  # comes with its table
        cur.execute(sql["index_validity"], {"quoted": name})
        found = cur.fetchone()
        if found is None:
            missing_indexes.append(name)
        elif not found[0]:
            invalid_indexes.append(name)
    return PostgresSchemaState(
        table, True, missing_columns, tuple(missing_tables), tuple(missing_indexes),
        tuple(invalid_indexes),
    )
