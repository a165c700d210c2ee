"""The caller's DB-API connections around a fenced transaction (sqlite3, psycopg2, others)."""

from __future__ import annotations

import sqlite3
from typing import Any, Optional

from ptb_fence._sockets import cut

__all__ = ["COMMITTED_OR_ROLLED_BACK", "GivenConnection", "interrupt", "transaction_ended"]

COMMITTED_OR_ROLLED_BACK = "committed or rolled back"
"""What :func:`transaction_ended` returns when the block ended the transaction itself (the
connection is still usable)."""


def _target(connection: Any) -> Any:
    """The DB-API connection of a connection or cursor."""
    return connection if hasattr(connection, "commit") else getattr(connection, "connection", None)


def transaction_ended(connection: Any) -> Optional[str]:
    """How the block ended its own transaction, or :obj:`None` while it is still open.

    sqlite3 (autocommit outside the block): ``in_transaction`` is false after a commit or
    rollback, and raises once closed. psycopg2: ``closed`` is non-zero once closed;
    ``get_transaction_status()`` is IDLE (0) after a commit or rollback, UNKNOWN (4) when the
    connection is broken. Anything else (the memory store's :obj:`None`, other drivers) cannot
    be checked and counts as open.
    """
    target = None if connection is None else _target(connection)
    if target is None:
        return None
    if isinstance(target, sqlite3.Connection):
        try:
            return None if target.in_transaction else COMMITTED_OR_ROLLED_BACK
        except sqlite3.ProgrammingError:
            return "closed"
    if getattr(target, "closed", 0):
        return "closed"
    status = getattr(target, "get_transaction_status", None)
    if callable(status):
        value = status()
        if value == 0:
            return COMMITTED_OR_ROLLED_BACK
        if value == 4:
            return "closed or broken"
    return None


class GivenConnection:
    """Commit or roll back a caller's connection (or a cursor's connection) around a block.

    :meth:`begin` opens the transaction on a connection that is not in one yet, so a block that
    writes nothing still runs inside a transaction and its end can be told from a block that
    ended the transaction itself.
    """

    __slots__ = ("_connection", "_explicit", "_target")

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._target = target = _target(connection)
        # a sqlite3 (Python 3.12+) or psycopg2 connection in autocommit mode: its driver's
        # commit() and rollback() do nothing, so the transaction (opened by begin(), by the
        # store's ownership check or by the caller) ends with COMMIT / ROLLBACK statements
        known = isinstance(target, sqlite3.Connection) or callable(
            getattr(target, "get_transaction_status", None)
        )
        self._explicit = known and getattr(target, "autocommit", None) is True

    def __enter__(self) -> Any:
        return self._connection

    def begin(self) -> None:
        """Open a transaction on the connection if none is open (nothing for other drivers).

        sqlite3 sends no ``BEGIN`` before a ``SELECT`` or DDL (nor before nothing at all), and
        psycopg2 only before the first statement: without this, a block that only reads looks
        exactly like one that committed.
        """
        target = self._target
        if isinstance(target, sqlite3.Connection):
            if not target.in_transaction:
                # IMMEDIATE: the write lock now, like the SQLite store's own fenced
                # transactions, rather than a read lock that fails at once ("database is
                # locked") on its first write if another connection wrote meanwhile
                target.execute("BEGIN IMMEDIATE")
            return
        status = getattr(target, "get_transaction_status", None)
        if not callable(status) or status() != 0:  # an unknown driver, or already in one
            return
        with target.cursor() as cur:
            # psycopg2 outside autocommit sends its own BEGIN before the first statement
            cur.execute("BEGIN" if self._explicit else "SELECT 1")

    def _end(self, statement: str) -> None:
        if transaction_ended(self._target) is not None:
            return
        cursor = self._target.cursor()
        try:
            cursor.execute(statement)
        finally:
            cursor.close()

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        target = self._target
        if kind is not None:
            try:
                if self._explicit:
                    self._end("ROLLBACK")
                else:
                    target.rollback()
            except Exception:
                if transaction_ended(target) is None:
                    raise  # a closed connection has nothing to roll back
            return
        if self._explicit:
            self._end("COMMIT")
        else:
            target.commit()


def interrupt(connection: Any) -> bool:
    """End the transaction open on a psycopg2 connection from another thread, at once.

    Cuts the connection's socket (:func:`ptb_fence._sockets.cut`): the server rolls the
    transaction back (its row locks go with it) and the thread using the connection gets an
    error at its next statement or commit instead of writing. Returns :obj:`False` for
    connections it cannot interrupt (sqlite3, whose lock only its own thread can end; other
    drivers; an already closed connection).
    """
    target = None if connection is None else _target(connection)
    if target is None or isinstance(target, sqlite3.Connection):
        return False
    if not callable(getattr(target, "get_transaction_status", None)):
        return False  # not psycopg2: leave it alone
    return cut(target)
