"""The caller's connections around a fenced transaction.

DB-API drivers are used directly. SQLAlchemy and Django go through :mod:`ptb_fence.contrib`."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Optional, Protocol

from ptb_fence._errors import TransactionEnded, UsageError
from ptb_fence.runtime._block_connection import BlockConnection
from ptb_fence._dbapi import (
    COMMITTED_OR_ROLLED_BACK,
    ROLLBACK_MARK,
    GivenConnection,
    interrupt,
    is_dbapi,
    library_of,
    target_of,
    transaction_ended,
)

__all__ = [
    "COMMITTED_OR_ROLLED_BACK",
    "ROLLBACK_MARK",
    "CallerConnection",
    "GivenConnection",
    "asyncio_refusal",
    "caller_connection",
    "dbapi_connection",
    "interrupt",
    "transaction_ended",
]

if TYPE_CHECKING:
    from ptb_fence._values import AttemptIdentity

# asyncio drivers known by their top-level package (never imported here)
_ASYNC_DRIVERS = frozenset({"asyncpg", "aiosqlite", "aiopg", "aiomysql", "asyncmy", "aioodbc"})

_ASYNC_SQLALCHEMY = (
    "connection= got a SQLAlchemy asyncio object ({name}): a fenced transaction runs blocking "
    "code (the ownership check, your writes, the commit) and cannot await. Use the sync "
    "Session inside it: async with AsyncSession(engine) as session: await "
    "session.run_sync(write), where write(sync_session) opens attempt.transaction("
    "connection=sync_session, complete=True) (see the docs, How-to guides, SQLAlchemy)"
)
_ASYNC_PSYCOPG = (
    "connection= got a psycopg 3 asyncio object ({name}): a fenced transaction runs blocking "
    "code and cannot await it. Pass a sync connection (psycopg.connect(...)) and run the "
    "block on a worker thread: await attempt.run_in_transaction(fn, connection=conn)"
)
_ASYNC_OTHER = (
    "connection= got an asyncio connection ({name}): a fenced transaction runs blocking code "
    "and cannot await it. Pass a sync DB-API connection to the same database (psycopg2, "
    "psycopg 3's psycopg.connect(...), sqlite3) or a SQLAlchemy Session, and run the block on "
    "a worker thread: await attempt.run_in_transaction(fn, connection=conn)"
)

ACCEPTED = (
    "connection= takes a DB-API connection or cursor (sqlite3, psycopg2, psycopg 3, or "
    "another DB-API 2 driver's), a SQLAlchemy Connection or Session, or a Django connection "
    "(django.db.connection)"
)


class CallerConnection(Protocol):
    """A caller's connection around a fenced transaction (see :func:`caller_connection`).

    Entering opens (or joins) the caller's transaction and returns the DB-API connection (or
    cursor) the store's ``owns``/``settle_owned`` run on. Leaving commits it (through the
    library that owns it) or, on an exception, rolls it back.
    """

    @property
    def yielded(self) -> Any:
        """What the block receives (the object the caller passed)."""

    @property
    def refused(self) -> "Optional[TransactionEnded]":
        """The refusal of a commit the block tried through the caller's object (raised in
        the block, which fails with it), or :obj:`None`."""

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


def caller_connection(
    connection: Any, identity: "Optional[AttemptIdentity]" = None
) -> CallerConnection:
    """Wrap what a caller passed as ``connection=`` for a fenced transaction.

    DB-API connections and cursors (sqlite3, psycopg2, psycopg 3, other DB-API 2 drivers)
    are used as they are. A SQLAlchemy ``Connection`` or ``Session`` and a Django connection
    go through :mod:`ptb_fence.contrib` (imported only here, so ``import ptb_fence`` never
    imports SQLAlchemy or Django).

    Raises:
        TypeError: Anything else, naming what is accepted.
    """
    if isinstance(connection, BlockConnection):  # a fenced block's: the connection itself
        connection = connection.target
    root = library_of(type(connection))
    refused = asyncio_refusal(connection, root)
    if refused is not None:
        raise UsageError(refused)
    if root == "sqlalchemy":
        from ptb_fence.contrib.sqlalchemy import SQLAlchemyTransaction

        return SQLAlchemyTransaction(connection, identity)
    if root == "django":
        from ptb_fence.contrib.django import DjangoTransaction

        return DjangoTransaction(connection, identity)
    return GivenConnection(_checked(connection, root))


def asyncio_refusal(connection: Any, root: Optional[str] = None) -> Optional[str]:
    """Why ``connection`` cannot carry a fenced transaction because it is asyncio (an
    ``AsyncSession``, a psycopg 3 ``AsyncConnection``, asyncpg's), naming the recipe that
    works. Returns :obj:`None` for anything else. Known by module and class names: nothing is
    imported."""
    kind = type(connection)
    if root is None:
        root = library_of(kind)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if root == "sqlite3":
        return None  # the common case first: nothing more to look at
    if root == "sqlalchemy":
        if any((getattr(k, "__module__", None) or "").startswith("sqlalchemy.ext.asyncio")
               for k in kind.__mro__):
            return _ASYNC_SQLALCHEMY.format(name=name)
        return None
    if root == "psycopg":
        if kind.__name__.startswith("Async"):
            return _ASYNC_PSYCOPG.format(name=name)
        return None
    if (kind.__module__ or "").split(".")[0] in _ASYNC_DRIVERS or inspect.iscoroutinefunction(
        getattr(kind, "commit", None)
    ):
        return _ASYNC_OTHER.format(name=name)
    return None


def _checked(connection: Any, root: str) -> Any:
    """``connection`` if it is a DB-API connection or cursor. Raises TypeError naming what is
    accepted otherwise (never the store's SQL failing on it later)."""
    if root in ("sqlite3", "psycopg2", "psycopg") or is_dbapi(target_of(connection)):
        return connection
    kind = type(connection)
    raise UsageError(f"{ACCEPTED}; got {kind.__module__}.{kind.__qualname__}")


def dbapi_connection(connection: Any) -> Any:
    """The DB-API connection (or cursor) for ``owns(connection=...)``: a SQLAlchemy
    ``Connection`` or ``Session`` and a Django connection give theirs (a Session begins its
    transaction). DB-API connections and cursors are passed on as they are.

    Raises:
        TypeError: Anything else, naming what is accepted.
    """
    if isinstance(connection, BlockConnection):  # a fenced block's: the connection itself
        connection = connection.target
    root = library_of(type(connection))
    refused = asyncio_refusal(connection, root)
    if refused is not None:
        raise UsageError(refused)
    if root == "sqlalchemy":
        from ptb_fence.contrib.sqlalchemy import dbapi_of

        return dbapi_of(connection)
    if root == "django":
        from ptb_fence.contrib.django import dbapi_of as django_dbapi_of

        return django_dbapi_of(connection)
    return _checked(connection, root)


