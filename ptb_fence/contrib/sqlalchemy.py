"""A SQLAlchemy 2.x ``Connection`` or ``Session`` as ``connection=`` of a fenced transaction.

The fenced transaction is SQLAlchemy's own: the store's ownership check (PostgreSQL
``FOR UPDATE``) and ``complete=True``'s settle run on its DB-API connection, next to the
block's ORM writes, and SQLAlchemy commits them together when the block ends (a Session is
flushed and committed, a Connection's transaction committed) or rolls them back on an
exception or a lost update.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Any, Callable, FrozenSet, Optional

from ptb_fence._errors import TransactionEnded, UsageError
from ptb_fence.contrib._tables import DEFAULT_TABLE, owned_tables
from ptb_fence._dbapi import (
    ROLLBACK_MARK,
    GivenConnection,
    transaction_ended,
)

__all__ = [
    "SQLAlchemyTransaction",
    "alembic_include_object",
    "dbapi_of",
    "include_object",
    "ptb_fence_tables",
]

_BEGUN = (
    "attempt.transaction(connection=...) begins and commits the SQLAlchemy transaction "
    "itself, so that the ownership check, your writes and complete=True land in one commit "
    "that it sees; {what}: call it outside that block, with the {kind} not in a transaction "
    "begun by you (session.begin(), connection.begin() or an earlier statement on a "
    "Connection: commit or roll back first)"
)


if TYPE_CHECKING:
    from ptb_fence._values import AttemptIdentity

# Session.info key: the attempt whose fenced block runs in this Session's transaction
_BLOCK = "ptb_fence.fenced_block"

_REFUSED = (
    "refused {what} inside the block: nothing was committed, and the block fails (rolled "
    "back, not retried). ptb_fence has SQLAlchemy commit the {kind} when the block ends, "
    "together with the ownership check and complete=True: do not commit it yourself (raise an "
    "exception to roll it back; session.begin_nested() savepoints are fine)"
)

_FAILED = (
    f"{ROLLBACK_MARK} (the Session's transaction failed, e.g. a flush error caught inside the "
    "block, and SQLAlchemy rolled it back)"
)

_ROLLED_BACK = (
    f"{ROLLBACK_MARK} (the block rolled it back itself: session.rollback(), "
    "connection.rollback() or close())"
)

_LISTENING = threading.Lock()
_LISTENED: "list[bool]" = []


def _refuse_session_commit(session: Any) -> None:
    """SQLAlchemy's ``before_commit`` of every Session: refuse a commit of a Session whose
    fenced block is running (a savepoint's release is no commit of it)."""
    block = session.info.get(_BLOCK)
    if block is not None and session.get_nested_transaction() is None:
        block.refuse("session.commit()")


def _listen_to_sessions() -> None:
    """Register :func:`_refuse_session_commit` once, for every Session class (it costs a
    dict look-up per commit of a Session outside fenced blocks)."""
    if _LISTENED:
        return
    with _LISTENING:
        if not _LISTENED:
            importlib.import_module("sqlalchemy.event").listen(
                _orm().Session, "before_commit", _refuse_session_commit
            )
            _LISTENED.append(True)


def _orm() -> Any:
    # imported by name: type-checking ptb_fence needs neither SQLAlchemy nor its types
    return importlib.import_module("sqlalchemy.orm")


def _session_or_connection(given: Any) -> Any:
    """A Session (also behind a ``scoped_session``) or a Connection, else TypeError."""
    orm = _orm()
    connection_type = importlib.import_module("sqlalchemy.engine").Connection
    if isinstance(given, orm.scoped_session):
        given = given()
    if isinstance(given, (orm.Session, connection_type)):
        return given
    raise UsageError(
        "connection= takes a SQLAlchemy Connection (engine.connect()) or Session, got "
        f"{type(given).__module__}.{type(given).__qualname__}"
    )


def dbapi_of(given: Any) -> Any:
    """The DB-API connection under a SQLAlchemy Connection or Session (a Session begins its
    transaction if it has none)."""
    connection = _session_or_connection(given)
    if isinstance(connection, _orm().Session):
        connection = connection.connection()
    return connection.connection.dbapi_connection


class SQLAlchemyTransaction:
    """One fenced transaction in a SQLAlchemy Session's or Connection's transaction.

    Entering begins it and returns the DB-API connection for the store. A Session joins the
    transaction it began by itself, e.g. for an earlier query. An explicit ``session.begin()``
    block or a Connection already in a transaction is refused: the commit would not be this
    block's. Leaving commits through SQLAlchemy, or rolls back.

    Args:
        given: A ``sqlalchemy.orm.Session`` (or ``scoped_session``) or a
            ``sqlalchemy.engine.Connection``.

    Raises:
        TypeError: ``given`` is another SQLAlchemy object (e.g. an ``Engine``).
    """

    __slots__ = ("_given", "_session", "_connection", "_transaction", "_raw", "_dbapi",
                 "_identity", "_listener", "_refused")

    def __init__(self, given: Any, identity: "Optional[AttemptIdentity]" = None) -> None:
        self._given = given
        self._identity = identity
        self._listener: Any = None
        self._refused: Optional[TransactionEnded] = None
        target = _session_or_connection(given)
        self._session: Any = target if isinstance(target, _orm().Session) else None
        self._connection: Any = None if self._session is not None else target
        self._transaction: Any = None
        self._raw: Any = None
        self._dbapi: Optional[GivenConnection] = None

    @property
    def yielded(self) -> Any:
        """The Session or Connection the caller passed."""
        return self._given

    def __enter__(self) -> Any:
        session = self._session
        if session is not None:
            current = session.get_transaction()
            # origin (AUTOBEGIN, BEGIN, BEGIN_NESTED) tells a transaction the Session began
            # by itself from one begun by the caller, whose block would commit it
            origin = getattr(getattr(current, "origin", None), "name", "AUTOBEGIN")
            if session.get_nested_transaction() is not None or (
                current is not None and origin != "AUTOBEGIN"
            ):
                raise ValueError(_BEGUN.format(what="the Session is inside session.begin()",
                                               kind="Session"))
            self._raw = session.connection().connection.dbapi_connection
            self._transaction = session.get_transaction()
            if self._identity is not None:
                _listen_to_sessions()
                session.info[_BLOCK] = self
        else:
            connection = self._connection
            if connection.in_transaction():
                raise ValueError(_BEGUN.format(what="the Connection is already in a "
                                               "transaction", kind="Connection"))
            self._transaction = connection.begin()
            self._raw = connection.connection.dbapi_connection
            if self._identity is not None:
                self._guard_connection(connection)
        # on an engine in AUTOCOMMIT mode SQLAlchemy's commit is the driver's, which ends
        # nothing there (psycopg2): the transaction opened for the block is ended explicitly
        self._dbapi = GivenConnection(self._raw)
        return self._raw

    @property
    def refused(self) -> Optional[TransactionEnded]:
        """The refusal of a commit the block tried (raised in the block), or :obj:`None`."""
        return self._refused

    def refuse(self, what: str) -> None:
        """Raise (and keep) the refusal of ``what`` tried in the block."""
        assert self._identity is not None
        kind = "Session" if self._session is not None else "Connection"
        error = TransactionEnded(self._identity, "refused",
                                 _REFUSED.format(what=what, kind=kind))
        if self._refused is None:
            self._refused = error
        raise error

    def _guard_connection(self, connection: Any) -> None:
        """Refuse ``connection.commit()`` in the block: a listener on this Connection only
        (about 18 us to add and remove), removed before the block's own commit."""

        def refuse(conn: Any) -> None:
            self.refuse("connection.commit()")

        importlib.import_module("sqlalchemy.event").listen(connection, "commit", refuse)
        self._listener = refuse

    def _unguard(self) -> None:
        """The block is over: its own commit (or rollback) follows."""
        if self._session is not None:
            self._session.info.pop(_BLOCK, None)
        elif self._listener is not None:
            listener, self._listener = self._listener, None
            importlib.import_module("sqlalchemy.event").remove(
                self._connection, "commit", listener)

    def prepare(self) -> None:
        """Before the ownership check: open the DB-API transaction of a connection in
        autocommit mode, which the check's own statement would not."""
        assert self._dbapi is not None
        self._dbapi.prepare()

    def begin(self) -> None:
        """Open the DB-API transaction now (SQLAlchemy's drivers begin lazily), so a block
        that writes nothing is not taken for one that committed."""
        assert self._dbapi is not None
        self._dbapi.begin()

    def ended(self) -> Optional[str]:
        """Whether the block committed or rolled back (through SQLAlchemy or its DB-API
        connection) or closed the transaction itself."""
        # SQLAlchemy's commit is refused in the block: a transaction it ended was rolled back
        if self._session is not None:
            if self._session.get_transaction() is not self._transaction:
                return _ROLLED_BACK
            if not self._transaction.is_active:
                return _FAILED  # still the Session's, but it must be rolled back
        elif self._connection.closed:
            return "closed"
        elif self._connection.invalidated:
            return "closed or broken"
        if not self._transaction.is_active:
            return _ROLLED_BACK
        return transaction_ended(self._raw)  # a commit through the DB-API connection

    def store_connection(self) -> Any:
        """A DB-API connection of the Session or Connection (to undo a completion that the
        block's own commit landed)."""
        return dbapi_of(self._given)

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        transaction = self._transaction
        self._unguard()
        if kind is None:
            try:
                if self._session is not None:
                    self._session.flush()  # the ORM writes, before an explicit COMMIT
                    self._finish(commit=True)
                    self._session.commit()
                else:
                    self._finish(commit=True)
                    transaction.commit()
                return
            except BaseException:
                self._rollback()
                raise
        self._rollback()

    def _finish(self, commit: bool) -> None:
        if self._dbapi is not None:
            self._dbapi.finish(commit)

    def _rollback(self) -> None:
        try:
            self._finish(commit=False)
        except Exception:  # a broken connection: SQLAlchemy's rollback below handles it
            pass
        if self._session is not None:
            self._session.rollback()
        elif self._transaction.is_active:
            self._transaction.rollback()
        elif not self._connection.closed and self._raw is not None:
            # a refused commit left the Connection's transaction inactive and the database's
            # still open: the DB-API connection's rollback ends that one, the Connection's
            # clears its own state (it would not reach the database any more)
            self._raw.rollback()
            self._connection.rollback()


# -- Alembic -------------------------------------------------------------------------------------
IncludeObject = Callable[[Any, Optional[str], str, bool, Any], bool]
"""The signature of Alembic's ``include_object`` hook."""


def ptb_fence_tables(*tables: str) -> FrozenSet[str]:
    """The tables of ptb_fence stores on the update tables ``tables`` (default
    ``telegram_updates``): each update table, its ``_outbox`` and ``_state`` tables, and the
    shared ``ptb_fence_meta`` and ``ptb_fence_instances``.

    Raises:
        ValueError: A name that is not a valid table name.
    """
    return owned_tables(tables or (DEFAULT_TABLE,))


def alembic_include_object(*tables: str, chain: Optional[IncludeObject] = None) -> IncludeObject:
    """An ``include_object`` hook for Alembic that leaves ptb_fence's tables out.

    The stores create and migrate their own tables, which are in no application's
    ``MetaData``: without the hook, ``alembic revision --autogenerate`` proposes to drop them
    (and their indexes). Pass it in ``env.py``::

        from ptb_fence.contrib.sqlalchemy import alembic_include_object

        context.configure(..., include_object=alembic_include_object("bot_updates"))

    Args:
        *tables (:obj:`str`): The update tables of the bot's stores (default
            ``telegram_updates``).
        chain (optional): The application's own hook, asked about everything else.

    Returns:
        The hook: :obj:`False` for a ptb_fence table and its indexes and constraints.
    """
    names = ptb_fence_tables(*tables)

    def include_object(
        obj: Any, name: Optional[str], type_: str, reflected: bool, compare_to: Any
    ) -> bool:
        if type_ == "table":
            owner = name
        else:  # an index, a column or a constraint: of which table
            owner = getattr(getattr(obj, "table", None), "name", None)
        if owner in names:
            return False
        return True if chain is None else bool(chain(obj, name, type_, reflected, compare_to))

    return include_object


include_object: IncludeObject = alembic_include_object()
"""The Alembic hook for a bot on the default ``telegram_updates`` table
(``context.configure(..., include_object=include_object)``)."""
