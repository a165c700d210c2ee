"""The schema of a SQLiteUpdateStore table.

It creates the table, or upgrades an older one and keeps its rows. The upgrade adds
``claim_id``, ``fingerprint``, ``instance``, ``chat_key`` with its index and
``isolated_claim``. It creates the outbox table ``<table>_outbox`` with its indexes, the
state table ``<table>_persistence``, the steps table ``<table>_steps`` with its index and
the jobs table ``<table>_jobs`` with its indexes.
It refuses a foreign table. It is safe while other processes do the same."""

from __future__ import annotations

import random
import sqlite3
import time
import uuid
import warnings
from typing import Set

from ptb_fence._errors import SchemaError
from ptb_fence.stores.sqlite._connections import SQLiteConnections, is_busy, rollback
from ptb_fence.stores._chat_order_sql import chat_index_name
from ptb_fence.stores._jobs_sql import jobs_index_name, jobs_table_name
from ptb_fence.stores._outbox_sql import outbox_table_name
from ptb_fence.stores._queries import Statements
from ptb_fence.stores._state_sql import state_table_name
from ptb_fence.stores._broadcasts import broadcast_tables
from ptb_fence.stores._pace import pace_table_name
from ptb_fence.stores._steps_sql import steps_index_name, steps_table_name
from ptb_fence.stores.sqlite._sql import REQUIRED_COLUMNS, index_name

__all__ = ["add_claim_id_column", "ensure_schema", "new_claim_id"]


_NEWER_COLUMNS = frozenset(("claim_id", "fingerprint", "instance", "chat_key", "isolated_claim"))
"""Columns added to an older table when it is opened."""


def new_claim_id() -> str:
    """A fresh claim id."""
    return uuid.uuid4().hex


def _columns(conn: sqlite3.Connection, sql: Statements) -> Set[str]:
    return {str(row[1]) for row in conn.execute(sql["table_info"]).fetchall()}


def add_claim_id_column(conn: sqlite3.Connection, sql: Statements) -> None:
    """``ALTER TABLE … ADD COLUMN claim_id``, tolerating a concurrent upgrade.

    If the ``ALTER`` fails (for example because another process added the column first), the
    table is read again and the error is re-raised only if the column is still missing.
    """
    _add_column(conn, sql, "claim_id")


def _add_column(conn: sqlite3.Connection, sql: Statements, name: str) -> None:
    """``ALTER TABLE … ADD COLUMN name``, tolerating a concurrent upgrade."""
    try:
        conn.execute(sql["add_" + name])
    except sqlite3.DatabaseError:
        if name in _columns(conn, sql):
            return
        raise


class _Schema:
    """Creates or upgrades one table of one database file."""

    __slots__ = ("_conns", "_sql", "_table")

    def __init__(self, conns: SQLiteConnections, sql: Statements, table: str) -> None:
        self._conns = conns
        self._sql = sql
        self._table = table

    def _ensure_schema(self) -> None:
        """Create or upgrade the schema, retrying while other processes hold the lock."""
        deadline = time.monotonic() + self._conns.busy_timeout
        while True:
            try:
                with self._conns.using() as conn:
                    try:
                        self._init_schema(conn)
                    except BaseException:
                        rollback(conn)
                        raise
                return
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(random.uniform(0.005, 0.05))

    def _schema_complete(self, conn: sqlite3.Connection) -> bool:
        columns = _columns(conn, self._sql)
        if not columns or not _NEWER_COLUMNS <= columns:
            return False
        self._check_columns(columns)
        indexes = {str(row[0]) for row in conn.execute(self._sql["index_names"])}
        outbox = conn.execute(self._sql["outbox_exists"], {"outbox": outbox_table_name(self._table)})
        if outbox.fetchone() is None:
            return False
        state = conn.execute(self._sql["state_exists"], {"state": state_table_name(self._table)})
        if state.fetchone() is None:
            return False
        steps = steps_table_name(self._table)
        if conn.execute(self._sql["steps_exists"], {"steps": steps}).fetchone() is None:
            return False
        jobs = jobs_table_name(self._table)
        if conn.execute(self._sql["jobs_exists"], {"jobs": jobs}).fetchone() is None:
            return False
        pace = pace_table_name(self._table)
        if conn.execute(self._sql["pace_exists"], {"pace": pace}).fetchone() is None:
            return False
        recipients = broadcast_tables(self._table)["recipients"]
        if conn.execute(self._sql["broadcasts_exists"],
                        {"recipients": recipients}).fetchone() is None:
            return False
        wanted = {index_name(self._table), chat_index_name(self._table), steps_index_name(steps),
                  jobs_index_name(jobs, "due_idx"), jobs_index_name(jobs, "name_idx")}
        return wanted <= indexes

    def _check_columns(self, columns: Set[str]) -> None:
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise SchemaError(
                f"table {self._table!r} in {self._conns.path!r} exists but lacks the columns "
                f"{', '.join(missing)}, so it was not created by ptb_fence: pass another "
                "table= name or migrate the table"
            )

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if not mode or str(mode[0]).lower() != "wal":
            warnings.warn(
                f"SQLite could not switch {self._conns.path!r} to WAL mode (journal_mode is "
                f"{mode[0] if mode else None!r}); the store stays correct but readers and "
                "writers block each other. Put the file on a local file system.",
                RuntimeWarning,
                stacklevel=5,
            )
        if self._schema_complete(conn):
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(self._sql["create_table"])
            columns = _columns(conn, self._sql)
            self._check_columns(columns)
            if "claim_id" not in columns:
                add_claim_id_column(conn, self._sql)
                for (update_id,) in conn.execute(self._sql["unclaimed_exhaustions"]).fetchall():
                    conn.execute(
                        self._sql["backfill_claim_id"],
                        {"update_id": update_id, "claim_id": new_claim_id()},
                    )
            for name in ("fingerprint", "instance", "chat_key", "isolated_claim"):
                if name not in columns:
                    _add_column(conn, self._sql, name)
            for name in ("create_index", "create_chat_index", "create_outbox",
                         "create_outbox_state_due_index", "create_outbox_chat_index",
                         "create_outbox_failed_index", "create_state", "create_steps",
                         "create_steps_index", "create_jobs", "create_jobs_due_index",
                         "create_jobs_name_index", "create_pace", "create_broadcasts",
                         "create_recipients", "create_recipients_due_index"):
                conn.execute(self._sql[name])
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise


def ensure_schema(conns: SQLiteConnections, sql: Statements, table: str) -> None:
    """Create or upgrade ``table``, retrying while other processes hold the lock.

    Raises:
        ptb_fence.SchemaError: The table exists but lacks columns the store needs.
    """
    _Schema(conns, sql, table)._ensure_schema()
