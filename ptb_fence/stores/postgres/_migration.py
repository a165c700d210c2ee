"""PostgresSchemaState: how far a PostgreSQL update table is behind the current schema.

The migration (:func:`ptb_fence.postgres_update_store_schema`) is idempotent, but it runs
``ALTER TABLE`` and plain ``CREATE INDEX``, which lock a table that exists. The command line
reads this state first: ``migrate --check`` reports it, ``migrate`` runs the DDL transaction
only when a column or a table is missing and builds missing indexes ``CONCURRENTLY`` on an
existing table, and ``health`` reports a table that needs ``migrate``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from ptb_fence.stores._outbox_sql import outbox_table_name
from ptb_fence.stores._state_sql import state_table_name
from ptb_fence.stores.postgres._sql import INSTANCES_TABLE, META_TABLE, schema_sql

__all__ = ["PostgresSchemaState", "index_statements", "read_schema_state", "schema_without_indexes"]

# The columns added to update tables after their first release (the rest make a table an
# update table at all: the command line refuses a table without them).
_LATER_COLUMNS = ("claim_id", "fingerprint", "instance", "isolated_claim", "chat_key")

# One CREATE INDEX statement of the migration: its name and the rest after the name.
_INDEX = re.compile(r'CREATE INDEX IF NOT EXISTS ("[^"]+") (ON [^;]*);', re.DOTALL)


def index_statements(table: str) -> Tuple[Tuple[str, str], ...]:
    """The indexes the migration creates for ``table`` (validated).

    Returns:
        ``(quoted name, definition)`` pairs: the definition is what follows the name
        (``ON "t" (state, due_at)``). They are read from the migration itself, so that the
        two never disagree.
    """
    return tuple((m.group(1), " ".join(m.group(2).split())) for m in _INDEX.finditer(
        schema_sql(table)
    ))


def schema_without_indexes(table: str) -> str:
    """The migration of ``table`` without its ``CREATE INDEX`` statements (built separately,
    ``CONCURRENTLY``, on a table that exists)."""
    return _INDEX.sub("", schema_sql(table))


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
    quoted = f'"{table}"'
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (quoted,))
    exists = bool(cur.fetchone()[0])
    tables = (outbox_table_name(table), state_table_name(table), META_TABLE, INSTANCES_TABLE)
    if not exists:
        return PostgresSchemaState(table, False, (), (), (), ())
    cur.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
        "AND NOT attisdropped",
        (quoted,),
    )
    columns = {str(row[0]) for row in cur.fetchall()}
    missing_columns = tuple(c for c in _LATER_COLUMNS if c not in columns)
    missing_tables: List[str] = []
    for name in tables:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{name}"',))
        if not cur.fetchone()[0]:
            missing_tables.append(name)
    if INSTANCES_TABLE not in missing_tables:
        cur.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attname = 'seen_at' AND NOT attisdropped)",
            (f'"{INSTANCES_TABLE}"',),
        )
        if not cur.fetchone()[0]:
            missing_columns += (f"{INSTANCES_TABLE}.seen_at",)
    missing_indexes: List[str] = []
    invalid_indexes: List[str] = []
    for name, definition in index_statements(table):
        if any(definition.startswith(f'ON "{missing}" ') for missing in missing_tables):
            continue  # comes with its table
        cur.execute(
            "SELECT i.indisvalid FROM pg_index AS i WHERE i.indexrelid = to_regclass(%s)",
            (name,),
        )
        found = cur.fetchone()
        if found is None:
            missing_indexes.append(name)
        elif not found[0]:
            invalid_indexes.append(name)
    return PostgresSchemaState(
        table, True, missing_columns, tuple(missing_tables), tuple(missing_indexes),
        tuple(invalid_indexes),
    )
