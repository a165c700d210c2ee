"""DB-API connections around a fenced transaction: how a caller's transaction ended, and
committing or rolling back a caller's connection. Shared by the runtime and the ORM adapters
of :mod:`ptb_fence.contrib` (which the runtime imports only when a caller passes such an
object), so neither depends on the other through it."""

from __future__ import annotations

import sqlite3
from typing import Any, Optional

from ptb_fence._sockets import cut

__all__ = [
    "COMMITTED_OR_ROLLED_BACK",
    "ROLLBACK_MARK",
    "GivenConnection",
    "interrupt",
    "is_dbapi",
    "library_of",
    "target_of",
    "transaction_ended",
]

COMMITTED_OR_ROLLED_BACK = "committed or rolled back"
"""What :func:`transaction_ended` returns when the block ended the transaction itself (the
connection is still usable)."""


ROLLBACK_MARK = "marked for rollback"
"""How an adapter's ``ended()`` begins when the block left its transaction marked for
rollback (it is rolled back on exit, nothing of it lands)."""


def target_of(connection: Any) -> Any:
    """The DB-API connection of a connection or cursor."""
    return connection if hasattr(connection, "commit") else getattr(connection, "connection", None)


def _pg_status(target: Any) -> Optional[int]:
    """A PostgreSQL connection's transaction status, or :obj:`None` for other drivers.

    It is psycopg2's ``get_transaction_status()`` or psycopg 3's ``info.transaction_status``:
    0 idle, 1 active, 2 in a transaction, 3 failed, 4 unknown/broken."""
    status = getattr(target, "get_transaction_status", None)
    if callable(status):
        return int(status())
    if library_of(type(target)) == "psycopg":
        return int(target.info.transaction_status)
    return None


def library_of(kind: type) -> str:
    """The top-level package of a class or of its first base class from a known library
    (``sqlite3``, ``psycopg2``, ``psycopg``, ``sqlalchemy``, ``django``), else ``""``."""
    for klass in kind.__mro__:
        root = (getattr(klass, "__module__", None) or "").split(".")[0]
        if root in ("sqlite3", "psycopg2", "psycopg", "sqlalchemy", "django"):
            return root
    return ""


def transaction_ended(connection: Any) -> Optional[str]:
    """How the block ended its own transaction, or :obj:`None` while it is still open.

    sqlite3 (autocommit outside the block): ``in_transaction`` is false after a commit or
    rollback, and raises once closed. psycopg2 and psycopg 3: ``closed`` is true once closed.
    Their transaction status is IDLE (0) after a commit or rollback, UNKNOWN (4) when the
    connection is broken. Anything else (the memory store's :obj:`None`, other drivers) cannot
    be checked and counts as open.
    """
    target = None if connection is None else target_of(connection)
    if target is None:
        return None
    if isinstance(target, sqlite3.Connection):
        try:
            return None if target.in_transaction else COMMITTED_OR_ROLLED_BACK
        except sqlite3.ProgrammingError:
            return "closed"
    if getattr(target, "closed", 0):
        return "closed"
    value = _pg_status(target)
    if value == 0:
        return COMMITTED_OR_ROLLED_BACK
    if value == 4:
        return "closed or broken"
    return None


def is_dbapi(target: Any) -> bool:
    return all(callable(getattr(target, name, None)) for name in ("cursor", "commit", "rollback"))


class GivenConnection:
    """Commit or roll back a caller's connection (or a cursor's connection) around a block.

    :meth:`begin` opens the transaction on a connection that is not in one yet, so a block that
    writes nothing still runs inside a transaction and its end can be told from a block that
    ended the transaction itself.
    """

    __slots__ = ("_connection", "_explicit", "_target")

    @property
    def yielded(self) -> Any:
        """The connection or cursor the caller passed (what the block receives)."""
        return self._connection

    @property
    def refused(self) -> None:
        """Nothing here refuses (the block receives this connection guarded instead)."""
        return None

    def ended(self) -> Optional[str]:
        """:func:`transaction_ended` of the connection."""
        return transaction_ended(self._target)

    def store_connection(self) -> Any:
        """The connection or cursor the caller passed."""
        return self._connection

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._target = target = target_of(connection)
        # a sqlite3 (Python 3.12+), psycopg2 or psycopg 3 connection in autocommit mode: its
        # driver's commit() and rollback() do nothing, so the transaction (opened by begin(),
        # by the store's ownership check or by the caller) ends with COMMIT / ROLLBACK
        known = isinstance(target, sqlite3.Connection) or _pg_status(target) is not None
        self._explicit = known and getattr(target, "autocommit", None) is True

    def __enter__(self) -> Any:
        return self._connection

    def prepare(self) -> None:
        """Before the ownership check, open the transaction of a connection in autocommit mode.

        This concerns sqlite3 on Python 3.12+, psycopg2 and psycopg 3, when no transaction is
        open. The check would otherwise run outside any transaction, and the store refuses
        that (PostgreSQL's row lock would end with its statement). This block commits it with
        ``COMMIT`` anyway. Other connections begin with the check's first statement, or in
        :meth:`begin`."""
        if self._explicit:
            self.begin()

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
        if _pg_status(target) != 0:  # an unknown driver, or already in one
            return
        with target.cursor() as cur:
            # psycopg outside autocommit sends its own BEGIN before the first statement
            cur.execute("BEGIN" if self._explicit else "SELECT 1")

    def finish(self, commit: bool) -> None:
        """End the transaction of a connection in autocommit mode with ``COMMIT`` or ``ROLLBACK``.

        Its driver's ``commit()`` and ``rollback()`` would leave it open (psycopg2). Other
        connections are left alone. For a library that ends the transaction through the driver
        (SQLAlchemy), call it before the library does."""
        if self._explicit:
            self._end("COMMIT" if commit else "ROLLBACK")

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
    connections it cannot interrupt: sqlite3 (whose lock only its own thread can end), other
    drivers, and an already closed connection.
    """
    target = None if connection is None else target_of(connection)
    if target is None or isinstance(target, sqlite3.Connection):
        return False
    if not callable(getattr(target, "get_transaction_status", None)):
        return False  # not psycopg2: leave it alone
    return cut(target)
