"""The schema of a SQLiteUpdateStore table: create it, upgrade an older table (add
``claim_id``, ``fingerprint``, ``instance``, ``chat_key`` with its index and ``isolated_claim``,
keeping its rows), create the outbox table ``<table>_outbox`` with its indexes and the state table
``<table>_persistence``, refuse a
foreign table; safe while other processes do the same."""

from __future__ import annotations

import random
import sqlite3
import time
import uuid
import warnings
from typing import Set

from ptb_fence._errors import SchemaError
from ptb_fence.stores.sqlite._connections import SQLiteConnections, is_busy, rollback
from ptb_fence.stores.sqlite._sql import REQUIRED_COLUMNS, SQLiteStatements

__all__ = ["add_claim_id_column", "ensure_schema", "new_claim_id"]


_NEWER_COLUMNS = frozenset(("claim_id", "fingerprint", "instance", "chat_key", "isolated_claim"))
"""Columns added to an older table when it is opened."""


def new_claim_id() -> str:
    """A fresh claim id."""
    return uuid.uuid4().hex


def _columns(conn: sqlite3.Connection, sql: SQLiteStatements) -> Set[str]:
    return {str(row[1]) for row in conn.execute(sql.table_info).fetchall()}


def add_claim_id_column(conn: sqlite3.Connection, sql: SQLiteStatements) -> None:
    """``ALTER TABLE … ADD COLUMN claim_id``, tolerating a concurrent upgrade.

    If the ``ALTER`` fails (for example because another process added the column first), the
    table is read again and the error is re-raised only if the column is still missing.
    """
    _add_column(conn, sql, sql.add_claim_id, "claim_id")


def _add_column(conn: sqlite3.Connection, sql: SQLiteStatements, alter: str, name: str) -> None:
    """``alter`` (an ``ADD COLUMN name``), tolerating a concurrent upgrade."""
    try:
        conn.execute(alter)
    except sqlite3.DatabaseError:
        if name in _columns(conn, sql):
            return
        raise


class _Schema:
    """Creates or upgrades one table of one database file."""

    __slots__ = ("_conns", "_sql", "_table")

    def __init__(self, conns: SQLiteConnections, sql: SQLiteStatements, table: str) -> None:
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
        indexes = {
            str(row[0])
            for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        }
        outbox = conn.execute(self._sql.outbox.exists, {"outbox": self._sql.outbox.name})
        if outbox.fetchone() is None:
            return False
        state = conn.execute(self._sql.state.exists, {"state": self._sql.state.name})
        if state.fetchone() is None:
            return False
        return {f"{self._table}_state_due_at_idx", self._sql.chat.index} <= indexes

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
            conn.execute(self._sql.create_table)
            columns = _columns(conn, self._sql)
            self._check_columns(columns)
            if "claim_id" not in columns:
                add_claim_id_column(conn, self._sql)
                for (update_id,) in conn.execute(self._sql.unclaimed_exhaustions).fetchall():
                    conn.execute(
                        self._sql.backfill_claim_id,
                        {"update_id": update_id, "claim_id": new_claim_id()},
                    )
            if "fingerprint" not in columns:
                _add_column(conn, self._sql, self._sql.add_fingerprint, "fingerprint")
            if "instance" not in columns:
                _add_column(conn, self._sql, self._sql.add_instance, "instance")
            if "chat_key" not in columns:
                _add_column(conn, self._sql, self._sql.chat.add_column, "chat_key")
            if "isolated_claim" not in columns:
                _add_column(conn, self._sql, self._sql.add_isolated_claim, "isolated_claim")
            conn.execute(self._sql.create_index)
            conn.execute(self._sql.chat.create_index)
            for statement in self._sql.outbox.create:
                conn.execute(statement)
            for statement in self._sql.state.create:
                conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise


def ensure_schema(conns: SQLiteConnections, sql: SQLiteStatements, table: str) -> None:
    """Create or upgrade ``table``, retrying while other processes hold the lock.

    Raises:
        ptb_fence.SchemaError: The table exists but lacks columns the store needs.
    """
    _Schema(conns, sql, table)._ensure_schema()
