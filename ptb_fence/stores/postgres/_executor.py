"""How a PostgresUpdateStore runs its statements.

A statement runs in one short transaction on a pooled connection. It is retried on a new
connection when the old one broke before the commit. Renewals run on a dedicated connection.
Some statements run on the caller's connection. The module also holds the schema check and
``transaction()``."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Optional, Set, TypeVar

from ptb_fence._errors import RowLocked, SchemaError, StoreBusy
from ptb_fence._sockets import cut
from ptb_fence.stores.postgres._connections import (
    Broken,
    close_quietly,
    closed_error,
    rollback_quietly,
)
from ptb_fence.stores._queries import Statements
from ptb_fence.stores.postgres._sources import Source
from ptb_fence.stores.postgres._sql import schema_check_args, schema_sql, statements

__all__ = ["PgExecutor", "returns_row"]

_T = TypeVar("_T")

_UNDEFINED_COLUMN = "42703"
_UNDEFINED_TABLE = "42P01"
_LOCK_NOT_AVAILABLE = "55P03"

# The columns added to update tables after claim_id: a table with claim_id has them all.
_LATER_COLUMNS = ("fingerprint", "instance", "isolated_claim", "chat_key")


def returns_row(cur: Any, sql: str, params: Any) -> bool:
    """Execute ``sql`` on ``cur`` and tell whether it returned a row."""
    cur.execute(sql, params)
    return cur.fetchone() is not None


def _row_locked(update_id: int) -> RowLocked:
    return RowLocked(
        f"the row of update {update_id} is held by an open transaction (a fenced transaction "
        "of the attempt, or another one) for longer than the renewal waits (200 ms): the lease "
        "was neither renewed nor refused; renew again later. Keep fenced transactions shorter "
        "than the lease."
    )


def _check_in_transaction(connection: Any) -> None:
    import psycopg2.extensions

    conn = getattr(connection, "connection", connection)  # a cursor's connection
    if getattr(conn, "autocommit", False) is not True:
        return
    info = getattr(conn, "info", None)
    status = getattr(info, "transaction_status", None)
    if status == psycopg2.extensions.TRANSACTION_STATUS_IDLE:
        raise ValueError(
            "owns(..., connection=...) needs a connection inside a transaction: this one is "
            "in autocommit mode with no transaction open, so the row lock would end with the "
            "statement. Turn autocommit off or execute BEGIN first."
        )


def _maybe_broken(conn: Any) -> bool:
    """Whether a pooled connection may have died while idle: the server ended it (its socket
    has something to read: the termination notice or end of file), or the socket is gone. A
    live idle connection has nothing to read, so checking costs no round trip."""
    import select

    if conn.closed:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class PgExecutor:
    """Runs work (a function of a cursor) for one store table. Thread-safe.

    Args:
        source: Where pooled connections come from.
        table: The (validated) table name.
        create_table: Ensure the schema before first use.
        pool_timeout: Seconds a caller waits for a free connection.
    """

    __slots__ = (
        "closed",
        "_create_table",
        "_legacy",
        "pool_timeout",
        "source",
        "sql",
        "table",
        "_renew_conn",
        "_renew_lock",
        "_schema_lock",
        "_schema_ready",
    )

    def __init__(self, source: Source, table: str, create_table: bool, pool_timeout: float) -> None:
        self.source = source
        self.table = table
        self.sql: Statements = statements(table)
        self.pool_timeout = pool_timeout
        self.closed = False
        self._create_table = create_table
        # the seed's legacy table (no claim_id, create_table=False): its _legacy statements
        self._legacy = False
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        self._renew_lock = threading.Lock()
        self._renew_conn: Any = None

    def close(self) -> None:
        """Close the connections. A pool given by the caller stays open. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.source.close()
        acquired = self._renew_lock.acquire(timeout=1)
        if not acquired:
            # A renewal still waits for a server that does not answer (frozen, partitioned).
            # Cut its connection so that it ends now. It is bounded either way, since a
            # renewal still connecting ends within its connect_timeout by itself.
            cut(self._renew_conn)
            acquired = self._renew_lock.acquire(timeout=1)
        if acquired:
            try:
                self._drop_renew_conn()
            finally:
                self._renew_lock.release()
        # Otherwise the renewal in progress drops the connection when it finishes.

    def schema_error(self, error: BaseException) -> Optional[SchemaError]:
        """The :exc:`SchemaError` for a missing column or table, else :obj:`None`."""
        code = getattr(error, "pgcode", None) or getattr(error, "sqlstate", None)
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if code == _UNDEFINED_COLUMN:
            return SchemaError(
                f"table {self.table!r} lacks a column this operation needs ({detail}). A table "
                "created before fencing has no claim_id column: apply the idempotent migration "
                f"returned by ptb_fence.postgres_update_store_schema({self.table!r}), or "
                "construct PostgresUpdateStore with create_table=True to apply it automatically."
            )
        if code == _UNDEFINED_TABLE:
            return SchemaError(
                f"table {self.table!r} does not exist ({detail}): construct PostgresUpdateStore "
                "with create_table=True (the default), or apply the migration returned by "
                f"ptb_fence.postgres_update_store_schema({self.table!r})."
            )
        return None

    def legacy(self) -> bool:
        """Whether the table is the seed's legacy table (no ``claim_id``), known once the
        schema was checked (checked now if it was not yet)."""
        if not self._schema_ready:
            self.run(lambda cur: None)
        return self._legacy

    def _ensure_schema(self, conn: Any) -> None:
        if self._schema_ready:
            return
        with self._schema_lock:
            if self._schema_ready:
                return
            with conn.cursor() as cur:
                if self._create_table:
                    cur.execute(self.sql["schema_lock"])
                    cur.execute(self.sql["schema_check"], schema_check_args(self.table))
                    row = cur.fetchone()
                    if row is None or not all(row):
                        cur.execute(schema_sql(self.table))
                else:
                    cur.execute(self.sql["table_columns"], {"quoted": f'"{self.table}"'})
                    columns = {str(row[0]) for row in cur.fetchall()}
                    if not columns:  # no table yet: its statements fail with SchemaError
                        conn.commit()
                        return
                    self._legacy = self._variant(columns)
            conn.commit()
            self._schema_ready = True

    def _variant(self, columns: Set[str]) -> bool:
        """Whether ``columns`` are the legacy table's, without ``claim_id``.

        It refuses a table that has ``claim_id`` but lacks a later column (migrated halfway)."""
        if "claim_id" not in columns:
            return True
        missing = [c for c in _LATER_COLUMNS if c not in columns]
        if missing:
            raise SchemaError(
                f"table {self.table!r} has claim_id but lacks {', '.join(missing)}: migrate it "
                f"(ptb-fence --store <dsn> --table {self.table} migrate, or apply "
                f"ptb_fence.postgres_update_store_schema({self.table!r})), or construct "
                "PostgresUpdateStore with create_table=True to apply it automatically."
            )
        return False

    def _attempt(self, conn: Any, work: Callable[[Any], _T], commit: bool) -> _T:
        """Run ``work(cursor)`` in a transaction on ``conn`` and commit it (if ``commit``).

        Raises :class:`Broken` when the connection broke before the commit was sent.
        """
        import psycopg2

        failure: Optional[BaseException] = None
        try:
            self._ensure_schema(conn)
            with conn.cursor() as cur:
                result = work(cur)
        except psycopg2.Error as exc:
            if conn.closed:
                raise Broken(exc) from exc
            rollback_quietly(conn)
            failure = exc
        except BaseException:
            rollback_quietly(conn)
            raise
        if failure is not None:
            schema_error = self.schema_error(failure)
            if schema_error is not None:
                raise schema_error from failure
            raise failure
        if commit:
            try:
                conn.commit()
            except BaseException:
                # Broken during the commit: the outcome is unknown, so it is never retried.
                rollback_quietly(conn)
                raise
        return result

    def run(self, work: Callable[[Any], _T], commit: bool = True) -> _T:
        """Run ``work`` on a pooled connection, retrying on a new one if it was broken."""
        if self.closed:
            raise closed_error()
        tries = self.source.capacity + 1
        last: Optional[BaseException] = None
        for _ in range(tries):
            conn = self.source.acquire(self.pool_timeout)
            try:
                result = self._attempt(conn, work, commit)
            except Broken as broken:
                self.source.release(conn, discard=True)
                last = broken.error
                continue
            except BaseException:
                self.source.release(conn, discard=bool(conn.closed))
                raise
            if commit:
                self.source.release(conn, discard=False)
            return result
        assert last is not None
        raise last

    def read(self, work: Callable[[Any], _T]) -> _T:
        """Run ``work``, which reads with **one** statement, on a pooled connection in autocommit.

        The statement is its own transaction. That is one round trip instead of three
        (``BEGIN``, the statement, ``COMMIT``), and no commit at the driver. It is retried on
        a new connection if the connection was broken. It is never for writes, nor for reads
        of several statements that must see one snapshot."""
        if self.closed:
            raise closed_error()
        if not self._schema_ready:  # ensuring the schema takes a transaction-scoped lock
            return self.run(work)
        last: Optional[BaseException] = None
        for _ in range(self.source.capacity + 1):
            conn = self.source.acquire(self.pool_timeout)
            previous = conn.autocommit
            try:
                conn.autocommit = True
                try:
                    result = self._attempt(conn, work, False)
                finally:
                    if not conn.closed:
                        conn.autocommit = previous
            except Broken as broken:
                self.source.release(conn, discard=True)
                last = broken.error
                continue
            except BaseException:
                self.source.release(conn, discard=bool(conn.closed))
                raise
            self.source.release(conn, discard=False)
            return result
        assert last is not None
        raise last

    def run_renewal(self, work: Callable[[Any], _T]) -> _T:
        """Run ``work`` on the dedicated renewal connection (reconnecting if it broke)."""
        if self.closed:
            raise closed_error()
        if not self._renew_lock.acquire(timeout=self.pool_timeout):
            raise StoreBusy(
                f"the renewal connection stayed busy for pool_timeout={self.pool_timeout:g}s "
                "(a renewal is waiting for a row locked by a long transaction?)"
            )
        try:
            last: Optional[BaseException] = None
            for _ in range(2):
                if self._renew_conn is None or self._renew_conn.closed:
                    self._drop_renew_conn()
                    self._renew_conn = self.source.connect()
                conn = self._renew_conn
                try:
                    return self._attempt(conn, work, True)
                except Broken as broken:
                    self._drop_renew_conn()
                    last = broken.error
                except BaseException:
                    if conn.closed:
                        self._drop_renew_conn()
                    raise
            assert last is not None
            raise last
        finally:
            if self.closed:
                self._drop_renew_conn()
            self._renew_lock.release()

    def _drop_renew_conn(self) -> None:
        conn, self._renew_conn = self._renew_conn, None
        if conn is not None:
            close_quietly(conn)

    def renew_one(self, update_id: int, sql: str, params: Dict[str, Any]) -> bool:
        """A single renewal that waits at most 200 ms for a row lock, then :exc:`RowLocked`."""
        import psycopg2

        def work(cur: Any) -> bool:
            cur.execute(self.sql["renew_lock_timeout"])
            return returns_row(cur, sql, params)

        failure: Optional[BaseException] = None
        try:
            return self.run_renewal(work)
        except psycopg2.Error as exc:
            if getattr(exc, "pgcode", None) != _LOCK_NOT_AVAILABLE:
                raise
            failure = exc
        raise _row_locked(update_id) from failure

    def on_caller(
        self, connection: Any, sql: str, params: Dict[str, Any], *, locking: bool = False
    ) -> bool:
        """Run a one-row statement on the caller's connection or cursor, without a commit.

        With ``locking`` the connection must be inside a transaction (the row lock must
        outlive the statement): :exc:`ValueError` for autocommit outside one.
        """
        if locking:
            _check_in_transaction(connection)
        if self.closed:
            raise closed_error()
        if not self._schema_ready:
            self.run(lambda cur: None)  # ensure the schema on a pooled connection first
        failure: Optional[BaseException] = None
        try:
            # a psycopg 3 connection (and SQLAlchemy 2.0's adapter of one, under an
            # AsyncSession) also has execute(): only what has no cursor() is a cursor
            if not callable(getattr(connection, "cursor", None)):
                result = connection.execute(sql, params)
                reader = result if callable(getattr(result, "fetchone", None)) else connection
                return reader.fetchone() is not None
            cur = connection.cursor()  # not a context manager under every adapter
            try:
                cur.execute(sql, params)
                return cur.fetchone() is not None
            finally:
                cur.close()
        except Exception as exc:
            failure = exc
        assert failure is not None
        schema_error = self.schema_error(failure)
        if schema_error is not None:
            raise schema_error from failure
        raise failure

    def caller_work(self, connection: Any, work: Callable[[Any], _T]) -> _T:
        """Run ``work(cursor)`` on the caller's connection (or cursor) in its open transaction.

        It never commits. The connection must be inside a transaction. Autocommit outside
        one raises :exc:`ValueError`."""
        _check_in_transaction(connection)
        if self.closed:
            raise closed_error()
        if not self._schema_ready:
            self.run(lambda cur: None)  # ensure the schema on a pooled connection first
        failure: Optional[BaseException] = None
        try:
            # a psycopg 3 connection also has execute() (returning a cursor): only what has
            # no cursor() of its own is a cursor to work on directly
            if not callable(getattr(connection, "cursor", None)):
                return work(connection)
            with connection.cursor() as cur:
                return work(cur)
        except Exception as exc:
            failure = exc
        assert failure is not None
        schema_error = self.schema_error(failure)
        if schema_error is not None:
            raise schema_error from failure
        raise failure

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A pooled connection in an open transaction: commit on normal exit, roll back on an
        exception (re-raised), then return the connection to the pool."""

        def begin(cur: Any) -> Any:
            conn = cur.connection
            if _maybe_broken(conn):
                cur.execute(self.sql["probe"])  # proves it alive, else a new one is tried
            # else psycopg2 sends BEGIN with the caller's first statement: no round trip here
            return conn

        conn = self.run(begin, commit=False)
        released = False
        try:
            yield conn
        except BaseException:
            rollback_quietly(conn)
            released = True
            self.source.release(conn, discard=bool(conn.closed))
            raise
        finally:
            if not released:
                try:
                    conn.commit()
                except BaseException:
                    rollback_quietly(conn)
                    self.source.release(conn, discard=bool(conn.closed))
                    raise
                self.source.release(conn, discard=False)
