"""The caller's connections around a fenced transaction (DB-API drivers; SQLAlchemy and
Django through :mod:`ptb_fence.contrib`)."""

from __future__ import annotations

from typing import Any, Optional, Protocol

from ptb_fence._dbapi import (
    COMMITTED_OR_ROLLED_BACK,
    GivenConnection,
    interrupt,
    is_dbapi,
    library_of,
    target_of,
    transaction_ended,
)

__all__ = [
    "COMMITTED_OR_ROLLED_BACK",
    "CallerConnection",
    "GivenConnection",
    "caller_connection",
    "dbapi_connection",
    "interrupt",
    "transaction_ended",
]

ACCEPTED = (
    "connection= takes a DB-API connection or cursor (sqlite3, psycopg2, psycopg 3, or "
    "another DB-API 2 driver's), a SQLAlchemy Connection or Session, or a Django connection "
    "(django.db.connection)"
)


class CallerConnection(Protocol):
    """A caller's connection around a fenced transaction (see :func:`caller_connection`).

    Entering opens (or joins) the caller's transaction and returns the DB-API connection (or
    cursor) the store's ``owns``/``settle_owned`` run on; leaving commits it (through the
    library that owns it) or, on an exception, rolls it back.
    """

    @property
    def yielded(self) -> Any:
        """What the block receives (the object the caller passed)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> Optional[bool]: ...

    def prepare(self) -> None:
        """Before the ownership check: open the transaction where the check's own statement
        would not (a DB-API connection in autocommit mode)."""

    def begin(self) -> None:
        """Make sure a transaction is open after the ownership check."""

    def ended(self) -> Optional[str]:
        """How the block ended the transaction itself, or :obj:`None` while it is open."""

    def store_connection(self) -> Any:
        """A DB-API connection on which the store may undo a completion and commit."""


def caller_connection(connection: Any) -> CallerConnection:
    """Wrap what a caller passed as ``connection=`` for a fenced transaction.

    DB-API connections and cursors (sqlite3, psycopg2, psycopg 3, other DB-API 2 drivers)
    are used as they are; a SQLAlchemy ``Connection`` or ``Session`` and a Django connection
    go through :mod:`ptb_fence.contrib` (imported only here, so ``import ptb_fence`` never
    imports SQLAlchemy or Django).

    Raises:
        TypeError: Anything else, naming what is accepted.
    """
    root = library_of(type(connection))
    if root == "sqlalchemy":
        from ptb_fence.contrib.sqlalchemy import SQLAlchemyTransaction

        return SQLAlchemyTransaction(connection)
    if root == "django":
        from ptb_fence.contrib.django import DjangoTransaction

        return DjangoTransaction(connection)
    return GivenConnection(_checked(connection, root))


def _checked(connection: Any, root: str) -> Any:
    """``connection`` if it is a DB-API connection or cursor; TypeError naming what is
    accepted otherwise (never the store's SQL failing on it later)."""
    if root in ("sqlite3", "psycopg2", "psycopg") or is_dbapi(target_of(connection)):
        return connection
    kind = type(connection)
    raise TypeError(f"{ACCEPTED}; got {kind.__module__}.{kind.__qualname__}")


def dbapi_connection(connection: Any) -> Any:
    """The DB-API connection (or cursor) for ``owns(connection=...)``: a SQLAlchemy
    ``Connection`` or ``Session`` and a Django connection give theirs (a Session begins its
    transaction); DB-API connections and cursors are passed on as they are.

    Raises:
        TypeError: Anything else, naming what is accepted.
    """
    root = library_of(type(connection))
    if root == "sqlalchemy":
        from ptb_fence.contrib.sqlalchemy import dbapi_of

        return dbapi_of(connection)
    if root == "django":
        from ptb_fence.contrib.django import dbapi_of as django_dbapi_of

        return django_dbapi_of(connection)
    return _checked(connection, root)


