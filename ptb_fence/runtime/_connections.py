"""The caller's DB-API connections around a fenced transaction (sqlite3, psycopg2, others)."""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from ptb_fence._sockets import cut

__all__ = ["COMMITTED_OR_ROLLED_BACK", "given_connection", "interrupt", "transaction_ended"]

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


@contextmanager
def given_connection(connection: Any) -> Iterator[Any]:
    """Commit or roll back a caller's connection (or a cursor's connection) around a block."""
    target = _target(connection)
    try:
        yield connection
    except BaseException:
        try:
            target.rollback()
        except Exception:
            if transaction_ended(target) is None:
                raise  # a closed connection has nothing to roll back
        raise
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
