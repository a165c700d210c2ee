"""PostgresUpdateStore: the store for several processes or machines (psycopg2)."""

from __future__ import annotations

import re
import threading
import time
import urllib.parse
import uuid
from contextlib import contextmanager
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)


from ptb_fence._errors import RowLocked, SchemaError, StoreBusy, TableBotMismatch
from ptb_fence._fingerprint import update_fingerprint
from ptb_fence.stores._duplicates import warn_conflict
from ptb_fence._values import (
    Abandoned,
    AttemptIdentity,
    Completed,
    Exhaustion,
    Failed,
    Settlement,
    StoredUpdate,
)
from ptb_fence.stores._names import validate_table_name, validate_update_id
from ptb_fence.stores._postgres_sql import META_TABLE, PostgresStatements, schema_sql

if TYPE_CHECKING:  # psycopg2 is imported when a store is created, not with ptb_fence
    import psycopg2.pool

__all__ = ["PostgresUpdateStore", "postgres_update_store_schema"]

_T = TypeVar("_T")

_DEFAULT_CONNECT_TIMEOUT = 10
_UNDEFINED_COLUMN = "42703"
_UNDEFINED_TABLE = "42P01"
_LOCK_NOT_AVAILABLE = "55P03"


def postgres_update_store_schema(table: str = "telegram_updates") -> str:
    """Return the idempotent SQL migration for a :class:`PostgresUpdateStore` table.

    It creates the table if it is missing, adds the ``claim_id`` column to a table created
    before fencing, and creates the ``(state, due_at)`` index if it is missing. Applying it
    again changes nothing, and it takes a transaction-scoped advisory lock first, so several
    processes may apply it at once. Apply it (for example with ``psql -1 -f`` or one
    ``cursor.execute``) when you construct the store with ``create_table=False``.

    Args:
        table (:obj:`str`, optional): The table name. Defaults to ``"telegram_updates"``.

    Returns:
        :obj:`str`: The migration, several SQL statements separated by semicolons.

    Raises:
        ValueError: If ``table`` is not a valid table name (checked before anything else).
    """
    return schema_sql(validate_table_name(table))


# -- secrets ---------------------------------------------------------------------------------
_KV_PASSWORD = re.compile(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URI_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*?:([^/?#]*)@")


def _secrets_of(dsn: Optional[str], kwargs: Optional[Dict[str, Any]] = None) -> Set[str]:
    """Every spelling of the password found in ``dsn`` and ``kwargs`` (for redaction)."""
    import psycopg2.extensions
    found: Set[str] = set()
    if kwargs and kwargs.get("password"):
        found.add(str(kwargs["password"]))
    if dsn:
        try:
            password = psycopg2.extensions.parse_dsn(dsn).get("password")
        except Exception:  # pragma: no cover - unparsable DSNs are refused earlier
            password = None
        if password:
            found.add(password)
        for match in _KV_PASSWORD.finditer(dsn):
            value = match.group(1)
            found.add(value)
            found.add(value.strip("'"))
        uri = _URI_PASSWORD.match(dsn)
        if uri and uri.group(1):
            found.add(uri.group(1))
            found.add(urllib.parse.unquote(uri.group(1)))
    for value in list(found):
        found.add(urllib.parse.quote(value, safe=""))
    return {value for value in found if value}


def _redact(text: str, secrets: Iterable[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _scrubbed(error: BaseException, secrets: Set[str], prefix: str) -> BaseException:
    """A copy of a connection error whose message cannot contain the password."""
    message = prefix + _redact(str(error).strip(), secrets)
    try:
        return type(error)(message)
    except Exception:  # pragma: no cover - every psycopg2 error takes a message
        import psycopg2

        return psycopg2.OperationalError(message)


def _open_connection(args: Tuple[Any, ...], kwargs: Dict[str, Any], secrets: Set[str]) -> Any:
    """``psycopg2.connect`` whose errors never carry the password (and no chained cause)."""
    import psycopg2

    failure: Optional[BaseException] = None
    try:
        return psycopg2.connect(*args, **kwargs)
    except psycopg2.Error as exc:
        failure = exc
    # Raised outside the except block, so the original error is not kept as __context__.
    raise _scrubbed(failure, secrets, "could not connect to PostgreSQL: ")


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass


def _rollback_quietly(conn: Any) -> None:
    if conn.closed:
        return
    try:
        conn.rollback()
    except Exception:
        pass


def _busy(timeout: float, capacity: int) -> StoreBusy:
    return StoreBusy(
        f"no PostgreSQL connection became free within pool_timeout={timeout:g}s: all {capacity} "
        "connections of the store's pool are in use. Raise pool_size (or the pool's maxconn) "
        "or pool_timeout, or keep transactions shorter."
    )


def _closed_error() -> RuntimeError:
    return RuntimeError("this PostgresUpdateStore is closed; create a new store to continue")


# -- connection sources ----------------------------------------------------------------------
class _DsnPool:
    """A small blocking pool: at most ``size`` connections, callers wait for a free one."""

    __slots__ = ("_args", "_kwargs", "_secrets", "capacity", "_cond", "_idle", "_open", "_closed")

    def __init__(self, dsn: str, size: int, secrets: Set[str]) -> None:
        import psycopg2.extensions

        self._args: Tuple[Any, ...] = (dsn,)
        self._kwargs: Dict[str, Any] = {}
        if "connect_timeout" not in psycopg2.extensions.parse_dsn(dsn):
            # Bound the wait for an unreachable server (libpq's default is to wait forever).
            self._kwargs["connect_timeout"] = _DEFAULT_CONNECT_TIMEOUT
        self._secrets = secrets
        self.capacity = size
        self._cond = threading.Condition()
        self._idle: List[Any] = []
        self._open = 0
        self._closed = False

    def connect(self) -> Any:
        return _open_connection(self._args, self._kwargs, self._secrets)

    def acquire(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise _closed_error()
                while self._idle:
                    conn = self._idle.pop()
                    if not conn.closed:
                        return conn
                    self._open -= 1
                if self._open < self.capacity:
                    self._open += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _busy(timeout, self.capacity)
                self._cond.wait(remaining)
        try:
            return self.connect()
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def release(self, conn: Any, discard: bool) -> None:
        import psycopg2.extensions

        if not discard and not conn.closed:
            status = conn.info.transaction_status
            if status == psycopg2.extensions.TRANSACTION_STATUS_UNKNOWN:
                discard = True
            elif status != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
                try:
                    conn.rollback()
                except Exception:
                    discard = True
        with self._cond:
            keep = not (discard or conn.closed or self._closed)
            if keep:
                self._idle.append(conn)
            else:
                self._open -= 1
            self._cond.notify()
        if not keep:
            _close_quietly(conn)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            _close_quietly(conn)


class _UserPool:
    """A caller's psycopg2 pool, made to wait for a free connection instead of failing."""

    __slots__ = ("_pool", "_secrets", "capacity", "_slots", "_lock", "_closed")

    def __init__(self, pool: "psycopg2.pool.AbstractConnectionPool", secrets: Set[str]) -> None:
        self._pool = pool
        self._secrets = secrets
        self.capacity = max(1, int(pool.maxconn))
        self._slots = threading.BoundedSemaphore(self.capacity)
        self._lock = threading.Lock()  # SimpleConnectionPool is not thread-safe by itself
        self._closed = False

    def connect(self) -> Any:
        # A standalone connection with the pool's own connection arguments (for renewals).
        args = tuple(getattr(self._pool, "_args", ()))
        kwargs = dict(getattr(self._pool, "_kwargs", {}))
        return _open_connection(args, kwargs, self._secrets)

    def acquire(self, timeout: float) -> Any:
        import psycopg2.pool

        if self._closed:
            raise _closed_error()
        deadline = time.monotonic() + timeout
        if not self._slots.acquire(timeout=timeout):
            raise _busy(timeout, self.capacity)
        try:
            while True:
                failure: Optional[BaseException] = None
                try:
                    with self._lock:
                        conn = self._pool.getconn()
                except psycopg2.pool.PoolError as exc:
                    if "exhausted" not in str(exc):
                        raise
                    # Someone else uses the same pool: wait for a connection, bounded.
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise _busy(timeout, self.capacity) from None
                    time.sleep(min(0.02, remaining))
                    continue
                except psycopg2.Error as exc:  # the pool failed to open a connection
                    failure = exc
                if failure is not None:
                    raise _scrubbed(failure, self._secrets, "could not connect to PostgreSQL: ")
                if conn.closed:
                    with self._lock:
                        self._pool.putconn(conn, close=True)
                    continue
                return conn
        except BaseException:
            self._slots.release()
            raise

    def release(self, conn: Any, discard: bool) -> None:
        try:
            with self._lock:
                if not self._pool.closed:
                    self._pool.putconn(conn, close=discard or bool(conn.closed))
                else:
                    _close_quietly(conn)
        finally:
            self._slots.release()

    def close(self) -> None:
        # The pool belongs to the caller: leave it open.
        self._closed = True


_Source = Union[_DsnPool, _UserPool]


class _Broken(Exception):
    """The connection broke before the commit was sent: nothing was written, safe to retry."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _returns_row(cur: Any, sql: str, params: Any) -> bool:
    cur.execute(sql, params)
    return cur.fetchone() is not None


def _row_locked(update_id: int, error: BaseException) -> RowLocked:
    return RowLocked(
        f"the row of update {update_id} is held by an open transaction (a fenced transaction "
        "of the attempt, or another one) for longer than the renewal waits (200 ms): the lease "
        "was neither renewed nor refused; renew again later. Keep fenced transactions shorter "
        "than the lease."
    )


def _batch_results(rows: List[Tuple[Any, ...]], count: int) -> List[Optional[bool]]:
    """``(position, renewed, still_matches)`` rows -> True / None (row locked) / False."""
    results: List[Optional[bool]] = [False] * count
    for position, renewed, matches in rows:
        results[int(position)] = True if renewed else (None if matches else False)
    return results


class PostgresUpdateStore:
    """A durable, fenced update store in PostgreSQL, for one or several processes or machines.

    Thread-safe. Every operation takes a connection from the store's pool for one short
    transaction; when all are busy a caller waits up to ``pool_timeout`` seconds and then gets
    :exc:`ptb_fence.StoreBusy` (never psycopg2's "connection pool exhausted"). Lease renewals
    (:meth:`renew`, :meth:`renew_owned`, :meth:`renew_many`, :meth:`renew_owned_many`) use a
    dedicated connection of their own, so an exhausted pool cannot stop them.

    **Fenced transactions and renewals**: ``owns(identity, at, connection=conn)`` locks the
    update's row ``FOR UPDATE`` until the caller's transaction ends. Renewals never wait for
    such a lock: the batched renewals skip a locked row (``SKIP LOCKED``) and report it as
    :obj:`None` (neither renewed nor refused), and a single renewal waits at most 200 ms and
    then raises :exc:`ptb_fence.RowLocked`. So a long fenced transaction delays only its own
    row's renewal; the other attempts keep renewing. Its own lease is not extended while the
    transaction is open, so **a fenced transaction may stay open at most until its lease
    expires** (``lease_seconds`` after the last renewal, minus a safety margin); no other
    claim can take the row while the lock is held, but once the lease has expired the
    attempt's settle is refused.

    A connection that breaks (the server restarted, the backend was terminated) is discarded,
    and the operation is retried on a new connection when the break happened before the commit,
    i.e. when nothing was written. A break during the commit raises, as the outcome is unknown:
    an operation reports success only after its commit. Connection errors never contain the
    DSN's password.

    **Legacy tables**: :meth:`add`, :meth:`claim` (without ``durable_exhaustion``),
    :meth:`renew`, :meth:`settle`, :meth:`due`, :meth:`prune`, :meth:`add_many` and
    :meth:`renew_many` never reference the ``claim_id`` column, so with ``create_table=False``
    a table created before fencing keeps working with the unary API. The fenced and durable
    methods, and :meth:`claim` with ``durable_exhaustion=True``, need that column and raise
    :exc:`ptb_fence.SchemaError` naming :func:`postgres_update_store_schema` when it is missing.

    Args:
        dsn_or_pool (:obj:`str` | :class:`psycopg2.pool.AbstractConnectionPool`): A libpq
            connection string or URI, or a psycopg2 connection pool (for example a
            :class:`psycopg2.pool.ThreadedConnectionPool`). The store never closes a pool it was
            given; its ``maxconn`` bounds the store's concurrent connections, and the renewal
            connection is opened with the pool's connection arguments. With a DSN that sets no
            ``connect_timeout``, connections are opened with ``connect_timeout=10``.
        table (:obj:`str`, optional): The table name; must fully match
            ``[A-Za-z_][A-Za-z0-9_]{0,62}``. It is used double-quoted, i.e. exactly as given.
            Defaults to ``"telegram_updates"``.
        create_table (:obj:`bool`, optional): Ensure the schema (see
            :func:`postgres_update_store_schema`) before first use. If that fails (for example
            because the server is down) it is retried on the next use. Pass :obj:`False` to
            manage the schema yourself. Defaults to :obj:`True`.

    Keyword Args:
        pool_size (:obj:`int`, optional): With a DSN, the most pooled connections the store
            opens (renewals use one more). Ignored when a pool is given. Defaults to ``8``.
        pool_timeout (:obj:`float`, optional): Seconds a caller waits for a free connection
            before :exc:`ptb_fence.StoreBusy`. Defaults to ``30.0``.

    Raises:
        ValueError: For a bad table name, a malformed DSN (its password is not repeated) or a
            non-positive ``pool_size``/``pool_timeout``.
        TypeError: If ``dsn_or_pool`` is neither a string nor a psycopg2 pool.
    """

    __slots__ = (
        "_closed",
        "_create_table",
        "_fingerprints",
        "_pool_timeout",
        "_renew_conn",
        "_renew_lock",
        "_schema_lock",
        "_schema_ready",
        "_source",
        "_sql",
        "_table",
    )

    def __init__(
        self,
        dsn_or_pool: Union[str, "psycopg2.pool.AbstractConnectionPool"],
        table: str = "telegram_updates",
        create_table: bool = True,
        *,
        pool_size: int = 8,
        pool_timeout: float = 30.0,
    ) -> None:
        import psycopg2.extensions
        import psycopg2.pool

        self._table = validate_table_name(table)
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be a positive integer, not {pool_size!r}")
        if (
            isinstance(pool_timeout, bool)
            or not isinstance(pool_timeout, (int, float))
            or not pool_timeout > 0
        ):
            raise ValueError(f"pool_timeout must be a positive number of seconds, not {pool_timeout!r}")
        self._pool_timeout = float(pool_timeout)
        source: _Source
        if isinstance(dsn_or_pool, str):
            secrets = _secrets_of(dsn_or_pool)
            problem: Optional[str] = None
            try:
                psycopg2.extensions.parse_dsn(dsn_or_pool)
            except psycopg2.Error as exc:
                problem = _redact(str(exc).strip(), secrets)
            if problem is not None:
                # A fragment of an unparsable DSN may be part of a password: quote nothing.
                problem = re.sub(r'"[^"]*"', '"…"', problem)
                raise ValueError(f"invalid PostgreSQL DSN: {problem}")
            source = _DsnPool(dsn_or_pool, pool_size, secrets)
        elif isinstance(dsn_or_pool, psycopg2.pool.AbstractConnectionPool):
            args = tuple(getattr(dsn_or_pool, "_args", ()))
            kwargs = dict(getattr(dsn_or_pool, "_kwargs", {}))
            dsn = args[0] if args and isinstance(args[0], str) else kwargs.get("dsn")
            source = _UserPool(dsn_or_pool, _secrets_of(dsn, kwargs))
        else:
            raise TypeError(
                "PostgresUpdateStore needs a DSN string or a psycopg2 connection pool "
                f"(psycopg2.pool.AbstractConnectionPool), not {type(dsn_or_pool).__name__}"
            )
        self._source: _Source = source
        self._sql = PostgresStatements.for_table(self._table)
        self._create_table = bool(create_table)
        self._schema_ready = not self._create_table
        self._schema_lock = threading.Lock()
        self._renew_lock = threading.Lock()
        self._renew_conn: Any = None
        self._closed = False
        # Whether the table has the fingerprint column (None: not known yet; False: an older
        # table managed with create_table=False: ids are plain duplicates, SPEC §12 not applied)
        self._fingerprints: Optional[bool] = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(table={self._table!r}, create_table={self._create_table!r}, "
            f"pool_size={self._source.capacity}, pool_timeout={self._pool_timeout:g})"
        )

    @property
    def table(self) -> str:
        """:obj:`str`: The name of the store's table."""
        return self._table

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Close the store's connections (a pool given by the caller stays open).

        Connections still lent out (an open :meth:`transaction`) are closed when returned.
        Calling it again does nothing.
        """
        if self._closed:
            return
        self._closed = True
        self._source.close()
        if self._renew_lock.acquire(timeout=5):
            try:
                self._drop_renew_conn()
            finally:
                self._renew_lock.release()
        # Otherwise the renewal in progress drops the connection when it finishes.

    def __enter__(self) -> "PostgresUpdateStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------------
    def _schema_error(self, error: BaseException) -> Optional[SchemaError]:
        code = getattr(error, "pgcode", None) or getattr(error, "sqlstate", None)
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if code == _UNDEFINED_COLUMN:
            return SchemaError(
                f"table {self._table!r} lacks a column this operation needs ({detail}). A table "
                "created before fencing has no claim_id column: apply the idempotent migration "
                f"returned by ptb_fence.postgres_update_store_schema({self._table!r}), or "
                "construct PostgresUpdateStore with create_table=True to apply it automatically."
            )
        if code == _UNDEFINED_TABLE:
            return SchemaError(
                f"table {self._table!r} does not exist ({detail}): construct PostgresUpdateStore "
                "with create_table=True (the default), or apply the migration returned by "
                f"ptb_fence.postgres_update_store_schema({self._table!r})."
            )
        return None

    def _ensure_schema(self, conn: Any) -> None:
        if self._schema_ready:
            return
        with self._schema_lock:
            if self._schema_ready:
                return
            with conn.cursor() as cur:
                cur.execute(self._sql.schema_lock)
                cur.execute(self._sql.schema_check, self._sql.schema_check_args)
                row = cur.fetchone()
                if row is None or not all(row):
                    cur.execute(self._sql.schema)
            conn.commit()
            self._schema_ready = True

    def _attempt(self, conn: Any, work: Callable[[Any], _T], commit: bool) -> _T:
        """Run ``work(cursor)`` in a transaction on ``conn`` and commit it (if ``commit``).

        Raises :class:`_Broken` when the connection broke before the commit was sent.
        """
        import psycopg2

        failure: Optional[BaseException] = None
        try:
            self._ensure_schema(conn)
            with conn.cursor() as cur:
                result = work(cur)
        except psycopg2.Error as exc:
            if conn.closed:
                raise _Broken(exc) from exc
            _rollback_quietly(conn)
            failure = exc
        except BaseException:
            _rollback_quietly(conn)
            raise
        if failure is not None:
            schema_error = self._schema_error(failure)
            if schema_error is not None:
                raise schema_error from failure
            raise failure
        if commit:
            try:
                conn.commit()
            except BaseException:
                # Broken during the commit: the outcome is unknown, so it is never retried.
                _rollback_quietly(conn)
                raise
        return result

    def _run(self, work: Callable[[Any], _T], commit: bool = True) -> _T:
        """Run ``work`` on a pooled connection, retrying on a new one if it was broken."""
        if self._closed:
            raise _closed_error()
        tries = self._source.capacity + 1
        last: Optional[BaseException] = None
        for _ in range(tries):
            conn = self._source.acquire(self._pool_timeout)
            try:
                result = self._attempt(conn, work, commit)
            except _Broken as broken:
                self._source.release(conn, discard=True)
                last = broken.error
                continue
            except BaseException:
                self._source.release(conn, discard=bool(conn.closed))
                raise
            if commit:
                self._source.release(conn, discard=False)
            return result
        assert last is not None
        raise last

    def _run_renewal(self, work: Callable[[Any], _T]) -> _T:
        """Run ``work`` on the dedicated renewal connection (reconnecting if it broke)."""
        if self._closed:
            raise _closed_error()
        if not self._renew_lock.acquire(timeout=self._pool_timeout):
            raise StoreBusy(
                f"the renewal connection stayed busy for pool_timeout={self._pool_timeout:g}s "
                "(a renewal is waiting for a row locked by a long transaction?)"
            )
        try:
            last: Optional[BaseException] = None
            for _ in range(2):
                if self._renew_conn is None or self._renew_conn.closed:
                    self._drop_renew_conn()
                    self._renew_conn = self._source.connect()
                conn = self._renew_conn
                try:
                    return self._attempt(conn, work, True)
                except _Broken as broken:
                    self._drop_renew_conn()
                    last = broken.error
                except BaseException:
                    if conn.closed:
                        self._drop_renew_conn()
                    raise
            assert last is not None
            raise last
        finally:
            if self._closed:
                self._drop_renew_conn()
            self._renew_lock.release()

    def _drop_renew_conn(self) -> None:
        conn, self._renew_conn = self._renew_conn, None
        if conn is not None:
            _close_quietly(conn)

    def _on_caller(self, connection: Any, sql: str, params: Dict[str, Any]) -> bool:
        """Run a one-row statement on the caller's connection or cursor; never commit."""
        if self._closed:
            raise _closed_error()
        if not self._schema_ready:
            self._run(lambda cur: None)  # ensure the schema on a pooled connection first
        failure: Optional[BaseException] = None
        try:
            if callable(getattr(connection, "execute", None)):  # a cursor
                result = connection.execute(sql, params)
                reader = result if callable(getattr(result, "fetchone", None)) else connection
                return reader.fetchone() is not None
            with connection.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchone() is not None
        except Exception as exc:
            failure = exc
        assert failure is not None
        schema_error = self._schema_error(failure)
        if schema_error is not None:
            raise schema_error from failure
        raise failure

    @staticmethod
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

    # -- base contract ---------------------------------------------------------------------
    def add(self, update_id: int, body: str, received_at: int) -> bool:
        """Insert a pending row; :obj:`False` if the id exists (the rules of :meth:`add_many`).

        Returns only after the row is committed. Legacy-safe.

        Args:
            update_id (:obj:`int`): The Telegram ``update_id``.
            body (:obj:`str`): The update's JSON text.
            received_at (:obj:`int`): When it was received (epoch milliseconds).

        Returns:
            :obj:`bool`: Whether the row was inserted.
        """
        validate_update_id(update_id)
        return self.add_many([(update_id, body, received_at)])[0]

    def _run_fingerprinted(self, make_work: Callable[[bool], Callable[[Any], _T]]) -> _T:
        """Run ``make_work(True)``; on a table without the fingerprint column (an older table
        with ``create_table=False``) run ``make_work(False)`` instead, from then on."""
        if self._fingerprints is not False:
            try:
                result = self._run(make_work(True))
            except SchemaError as exc:
                if "fingerprint" not in str(exc.__cause__ or ""):
                    raise
                self._fingerprints = False
            else:
                self._fingerprints = True
                return result
        return self._run(make_work(False))

    def _conflicts(
        self, cur: Any, missing: List[Tuple[int, Optional[str]]]
    ) -> List[Tuple[Any, ...]]:
        """Rows of ids not inserted that hold a different update (for the WARNING)."""
        missing = [(u, f) for u, f in missing if f is not None]
        if not missing:
            return []
        cur.execute(self._sql.conflicts, ([u for u, _ in missing], [f for _, f in missing]))
        return [tuple(row) for row in cur.fetchall()]

    @staticmethod
    def _warn(conflicts: List[Tuple[Any, ...]]) -> None:
        for update_id, stored, state, settled_at, new in conflicts:
            warn_conflict(int(update_id), stored, new, str(state), settled_at)

    def bind_bot(self, bot_id: int) -> None:
        """Record that the table belongs to bot ``bot_id``; the first binder wins.

        The owner is kept in the table ``ptb_fence_meta`` (created when missing, also by
        :func:`postgres_update_store_schema`) in one ``INSERT … ON CONFLICT`` statement, so
        processes binding a new table at once are safe. Binding the same id again is a no-op.

        Raises:
            ptb_fence.TableBotMismatch: The table was bound to another bot id first.
        """
        bot_id = int(bot_id)
        params = {"table": self._table, "bot_id": bot_id}

        def work(cur: Any) -> int:
            cur.execute("SELECT to_regclass(%s) IS NULL", (f'"{META_TABLE}"',))
            if cur.fetchone()[0]:  # created only when missing (needs the CREATE privilege)
                cur.execute(self._sql.create_meta)
            cur.execute(self._sql.bind_bot, params)
            return int(cur.fetchone()[0])

        owner = self._run(work)
        if owner != bot_id:
            raise TableBotMismatch(self._table, "this PostgreSQL database", owner, bot_id)

    def add_many(self, rows: Sequence[Tuple[int, str, int]]) -> List[bool]:
        """Insert several ``(update_id, body, received_at)`` rows in one statement and commit.

        An existing id is a duplicate (:obj:`False`, nothing changes) unless it holds a
        different update (another fingerprint) in a settled row (completed, or abandoned with
        ``settled_at`` set): then the new update replaces it as a fresh pending row
        (:obj:`True`). A different update while the row is live keeps the first and logs a
        WARNING on ``ptb_fence.store``. Legacy-safe: on a table without the ``fingerprint``
        column every existing id is a plain duplicate (optional capability).

        Args:
            rows: The rows to insert.

        Returns:
            List[:obj:`bool`]: Per input position, whether that row was inserted (:obj:`False`
            if the id existed, or appeared earlier in ``rows``).
        """
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        if not rows:
            return []
        first: Dict[int, int] = {}
        for position, (update_id, _body, _at) in enumerate(rows):
            first.setdefault(update_id, position)
        batch = [rows[position] for position in sorted(first.values())]
        prints = [update_fingerprint(body) for _, body, _ in batch]

        def make_work(fingerprint: bool) -> Callable[[Any], Tuple[Set[int], List[Any]]]:
            sql = self._sql.add_many(len(batch), fingerprint)
            params: List[Any] = []
            for row, fp in zip(batch, prints):
                params += [*row, fp] if fingerprint else list(row)

            def work(cur: Any) -> Tuple[Set[int], List[Any]]:
                cur.execute(sql, params)
                done = {int(row[0]) for row in cur.fetchall()}
                if not fingerprint:
                    return done, []
                missing = [(u, fp) for (u, _, _), fp in zip(batch, prints) if u not in done]
                return done, self._conflicts(cur, missing)

            return work

        inserted, conflicts = self._run_fingerprinted(make_work)
        self._warn(conflicts)
        return [
            first[update_id] == position and update_id in inserted
            for position, (update_id, _body, _at) in enumerate(rows)
        ]

    def _claim_params(
        self,
        update_id: int,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool,
    ) -> Dict[str, Any]:
        return {
            "update_id": update_id,
            "now": now,
            "lease_until": lease_until,
            "max_attempts": max_attempts,
            "durable": bool(durable_exhaustion),
            "claim_id": uuid.uuid4().hex,
        }

    def _fetch_one(self, sql: str, params: Any) -> Optional[Tuple[Any, ...]]:
        def work(cur: Any) -> Optional[Tuple[Any, ...]]:
            cur.execute(sql, params)
            row = cur.fetchone()
            return None if row is None else tuple(row)

        return self._run(work)

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[int]:
        """Take a claimable row for a new attempt and return the attempt number.

        One conditional ``UPDATE``. If the row is claimable and ``attempts < max_attempts``, it
        becomes ``processing`` with ``attempts + 1`` and ``due_at = lease_until``. If its
        attempts are spent it is abandoned instead (an unacknowledged exhaustion when
        ``durable_exhaustion``) and :obj:`None` is returned, as for a live lease, a final row or
        an unknown id. Without ``durable_exhaustion`` it leaves ``claim_id`` alone (legacy-safe);
        with it, it writes a fresh claim id and needs that column.

        Args:
            update_id (:obj:`int`): The Telegram ``update_id``.
            now (:obj:`int`): The current time (epoch milliseconds).
            lease_until (:obj:`int`): When the new lease expires (epoch milliseconds).
            max_attempts (:obj:`int`): How many attempts an update gets.
            durable_exhaustion (:obj:`bool`, optional): Keep a spent row as an unacknowledged
                exhaustion (``settled_at`` NULL). Defaults to :obj:`False`.

        Returns:
            :obj:`int` | :obj:`None`: The attempt number, or :obj:`None` if not taken.

        Raises:
            ptb_fence.SchemaError: With ``durable_exhaustion`` on a table without ``claim_id``.
        """
        params = self._claim_params(update_id, now, lease_until, max_attempts, durable_exhaustion)
        sql = self._sql.claim_fenced if durable_exhaustion else self._sql.claim
        row = self._fetch_one(sql, params)
        if row is None or row[0] != "processing":
            return None
        return int(row[1])

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """Extend the lease of ``attempt`` to at least ``lease_until`` (dedicated connection).

        Never shortens a lease and, with ``now``, never revives one that expired before
        ``now``. Legacy-safe.

        Args:
            update_id (:obj:`int`): The Telegram ``update_id``.
            attempt (:obj:`int`): The attempt holding the lease.
            lease_until (:obj:`int`): The new lease expiry (epoch milliseconds).
            now (:obj:`int`, optional): The current time; the lease must not have expired.

        Returns:
            :obj:`bool`: :obj:`True` when the row matched (even if the lease stayed as it was).

        Raises:
            ptb_fence.RowLocked: Another open transaction (typically the attempt's own fenced
                transaction) held the row for more than 200 ms: neither renewed nor refused.
        """
        params = {
            "update_id": update_id,
            "attempt": attempt,
            "lease_until": lease_until,
            "now": now,
        }
        return self._renew_one(update_id, self._sql.renew, params)

    def _renew_one(self, update_id: int, sql: str, params: Dict[str, Any]) -> bool:
        """A single renewal that waits at most 200 ms for a row lock, then :exc:`RowLocked`."""
        import psycopg2


        def work(cur: Any) -> bool:
            cur.execute(self._sql.renew_lock_timeout)
            return _returns_row(cur, sql, params)

        failure: Optional[BaseException] = None
        try:
            return self._run_renewal(work)
        except psycopg2.Error as exc:
            if getattr(exc, "pgcode", None) != _LOCK_NOT_AVAILABLE:
                raise
            failure = exc
        raise _row_locked(update_id, failure) from failure

    def renew_many(
        self, leases: Sequence[Tuple[int, int]], lease_until: int, now: int
    ) -> List[Optional[bool]]:
        """Renew several ``(update_id, attempt)`` leases in one statement (optional capability).

        As :meth:`renew` for each pair, on the dedicated renewal connection. Legacy-safe.
        Never waits on a row lock: a row held by another open transaction (a fenced
        transaction's ``FOR UPDATE``) is skipped (``SKIP LOCKED``) and reported as
        :obj:`None`, so one long transaction cannot stop the other renewals.

        Args:
            leases: The ``(update_id, attempt)`` pairs.
            lease_until (:obj:`int`): The new lease expiry (epoch milliseconds).
            now (:obj:`int`): The current time (epoch milliseconds).

        Returns:
            List[:obj:`bool` | :obj:`None`]: Per input position: :obj:`True` renewed (matched);
            :obj:`False` refused (no such attempt, or its lease expired before ``now``);
            :obj:`None` undecided: the row still matches but another open transaction holds
            it right now (the lease was not extended; do not treat it as lost).
        """
        leases = [(update_id, attempt) for update_id, attempt in leases]
        if not leases:
            return []
        sql = self._sql.renew_many(len(leases))
        params: List[Any] = []
        for position, (update_id, attempt) in enumerate(leases):
            params += [position, update_id, attempt]
        params += [now, lease_until, now]

        def work(cur: Any) -> List[Optional[bool]]:
            cur.execute(sql, params)
            return _batch_results(cur.fetchall(), len(leases))

        return self._run_renewal(work)

    def add_claimed_many(
        self, rows: Sequence[Tuple[int, str, int]], *, lease_until: int
    ) -> List[Optional[AttemptIdentity]]:
        """Record fresh updates already claimed for attempt 1, in one statement and commit.

        For each ``(update_id, body, received_at)``: a new id is inserted as ``processing``
        with ``attempts = 1``, lease ``lease_until`` and a fresh claim id (read back with
        ``RETURNING``); an existing id (or one earlier in ``rows``) is left alone (unless it
        holds a different, settled update, which is replaced as in :meth:`add_many`) and
        gives :obj:`None`. Lets the receiving process record and claim a fresh update in one
        statement (optional capability). Needs the ``claim_id`` column.
        """
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        if not rows:
            return []
        inserted, landed, finish = self._run_add_claimed(rows, lease_until, [])
        return finish(inserted)

    def _run_add_claimed(
        self,
        rows: List[Tuple[int, str, int]],
        lease_until: int,
        settlements: List[Tuple[AttemptIdentity, Settlement]],
    ) -> Tuple[
        Dict[int, AttemptIdentity],
        List[bool],
        Callable[[Dict[int, AttemptIdentity]], List[Optional[AttemptIdentity]]],
    ]:
        """Record-and-claim ``rows`` and settle ``settlements`` in one transaction; log the
        conflicts (a different update held by a live row) after the commit."""
        settle_work = self._settle_owned_work(settlements) if settlements else None
        first: Dict[int, int] = {}
        for position, (update_id, _body, _at) in enumerate(rows):
            first.setdefault(update_id, position)
        batch = [rows[position] for position in sorted(first.values())]
        prints = [update_fingerprint(body) for _, body, _ in batch]

        def make_work(
            fingerprint: bool,
        ) -> Callable[[Any], Tuple[Dict[int, AttemptIdentity], List[Any], List[bool]]]:
            sql = self._sql.add_claimed_many(len(batch), fingerprint) if batch else ""
            params: List[Any] = [int(lease_until)]
            for (update_id, body, received_at), fp in zip(batch, prints):
                params += [update_id, body, received_at, uuid.uuid4().hex]
                if fingerprint:
                    params.append(fp)

            def work(cur: Any) -> Tuple[Dict[int, AttemptIdentity], List[Any], List[bool]]:
                inserted: Dict[int, AttemptIdentity] = {}
                conflicts: List[Any] = []
                if batch:
                    cur.execute(sql, params)
                    inserted = {
                        int(u): AttemptIdentity(int(u), int(a), str(c))
                        for u, a, c in cur.fetchall()
                    }
                    if fingerprint:
                        missing = [
                            (u, fp) for (u, _, _), fp in zip(batch, prints) if u not in inserted
                        ]
                        conflicts = self._conflicts(cur, missing)
                landed = settle_work(cur) if settle_work is not None else []
                return inserted, conflicts, landed

            return work

        inserted, conflicts, landed = self._run_fingerprinted(make_work)
        self._warn(conflicts)

        def finish(found: Dict[int, AttemptIdentity]) -> List[Optional[AttemptIdentity]]:
            return [
                found.get(update_id) if first[update_id] == position else None
                for position, (update_id, _body, _at) in enumerate(rows)
            ]

        return inserted, landed, finish

    def add_claimed_and_settle_many(
        self,
        rows: Sequence[Tuple[int, str, int]],
        *,
        lease_until: int,
        settlements: Sequence[Tuple[AttemptIdentity, Settlement]],
    ) -> Tuple[List[Optional[AttemptIdentity]], List[bool]]:
        """:meth:`add_claimed_many` and :meth:`settle_owned_many` in one transaction (one
        commit): fresh updates and finished attempts that arrive together share a commit
        (optional capability). Needs the ``claim_id`` column."""
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        inserted, landed, finish = self._run_add_claimed(rows, lease_until, list(settlements))
        return finish(inserted), landed

    def _settle_params(
        self, update_id: int, attempt: int, settlement: Settlement, owned: bool
    ) -> Tuple[str, Dict[str, Any]]:
        params: Dict[str, Any] = {"update_id": update_id, "attempt": attempt}
        if isinstance(settlement, Completed):
            sql = self._sql.settle_completed_owned if owned else self._sql.settle_completed
            params.update(at=settlement.at)
        elif isinstance(settlement, Failed):
            sql = self._sql.settle_failed_owned if owned else self._sql.settle_failed
            params.update(at=settlement.at, retry_at=settlement.retry_at, error=settlement.error)
        elif isinstance(settlement, Abandoned):
            sql = self._sql.settle_abandoned_owned if owned else self._sql.settle_abandoned
            params.update(at=settlement.at, error=settlement.error)
        else:
            raise TypeError(f"not a settlement: {settlement!r}")
        return sql, params

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Record the result of ``attempt`` if it still holds its lease at ``settlement.at``.

        A settle that does not land is ignored. Legacy-safe.

        Args:
            update_id (:obj:`int`): The Telegram ``update_id``.
            attempt (:obj:`int`): The attempt whose result this is.
            settlement (:class:`ptb_fence.Completed` | :class:`ptb_fence.Failed` |
                :class:`ptb_fence.Abandoned`): The result.
        """
        sql, params = self._settle_params(update_id, attempt, settlement, owned=False)
        self._run(lambda cur: _returns_row(cur, sql, params))

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """Rows to hand over, ordered by ``update_id``, at most ``limit``. Legacy-safe.

        Pending rows with ``received_at <= pending_before``, failed rows with ``due_at <= now``
        and processing rows whose lease lapsed (``due_at < now``).

        Args:
            now (:obj:`int`): The current time (epoch milliseconds).
            pending_before (:obj:`int`): Pending rows received at or before this time count.
            limit (:obj:`int`): The most rows to return.

        Returns:
            List[:class:`ptb_fence.StoredUpdate`]: The rows.
        """
        params = {"now": now, "pending_before": pending_before, "limit": max(int(limit), 0)}

        def work(cur: Any) -> List[StoredUpdate]:
            cur.execute(self._sql.due, params)
            return [StoredUpdate(int(u), body) for u, body in cur.fetchall()]

        return self._run(work)

    def prune(self, before: int) -> int:
        """Delete completed and abandoned rows with ``settled_at < before``. Legacy-safe.

        Pending, processing and failed rows and unacknowledged exhaustions are never pruned.

        Args:
            before (:obj:`int`): The strict bound (epoch milliseconds).

        Returns:
            :obj:`int`: How many rows were deleted.
        """

        def work(cur: Any) -> int:
            cur.execute(self._sql.prune, {"before": before})
            return int(cur.rowcount)

        return self._run(work)

    # -- fenced contract -------------------------------------------------------------------
    def claim_owned(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """As :meth:`claim`, returning the attempt's identity.

        The claim id is generated fresh for the claim and **read back from the row**
        (``RETURNING``).

        Returns:
            :class:`ptb_fence.AttemptIdentity` | :obj:`None`: The identity, or :obj:`None` if
            not taken.

        Raises:
            ptb_fence.SchemaError: On a table without ``claim_id``.
        """
        params = self._claim_params(update_id, now, lease_until, max_attempts, durable_exhaustion)
        row = self._fetch_one(self._sql.claim_fenced, params)
        if row is None or row[0] != "processing":
            return None
        return AttemptIdentity(update_id=update_id, attempt=int(row[1]), claim_id=str(row[2]))

    def renew_owned(
        self, identity: AttemptIdentity, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """As :meth:`renew`, and the claim id must match (dedicated connection).

        Returns:
            :obj:`bool`: :obj:`True` when this exact claim's row matched.

        Raises:
            ptb_fence.RowLocked: Another open transaction (typically this attempt's own fenced
                transaction) held the row for more than 200 ms: neither renewed nor refused.
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "lease_until": lease_until,
            "now": now,
        }
        return self._renew_one(identity.update_id, self._sql.renew_owned, params)

    def renew_owned_many(
        self, identities: Sequence[AttemptIdentity], lease_until: int, now: int
    ) -> List[Optional[bool]]:
        """Renew several fenced leases in one statement (optional capability).

        As :meth:`renew_owned` for each identity, on the dedicated renewal connection, and
        like :meth:`renew_many` it never waits on a row lock.

        Returns:
            List[:obj:`bool` | :obj:`None`]: Per input position: :obj:`True` renewed;
            :obj:`False` refused (not this claim, or its lease expired before ``now``);
            :obj:`None` undecided: the row still matches but is locked by another open
            transaction right now, typically the attempt's own fenced transaction (the lease
            was not extended; the caller must not treat it as refused).
        """
        identities = list(identities)
        if not identities:
            return []
        sql = self._sql.renew_owned_many(len(identities))
        params: List[Any] = []
        for position, identity in enumerate(identities):
            params += [position, identity.update_id, identity.attempt, identity.claim_id]
        params += [now, lease_until, now]

        def work(cur: Any) -> List[Optional[bool]]:
            cur.execute(sql, params)
            return _batch_results(cur.fetchall(), len(identities))

        return self._run_renewal(work)

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """:obj:`True` only while this exact claim holds a lease unexpired at ``at``.

        Args:
            identity (:class:`ptb_fence.AttemptIdentity`): The attempt's identity.
            at (:obj:`int`): The time the lease must hold at (epoch milliseconds).
            connection (optional): A psycopg2 connection (or cursor) with the caller's open
                transaction. The check then runs on it as ``SELECT … FOR UPDATE`` and does not
                commit: the row stays locked until the caller's transaction ends, so a competing
                claim waits for it (and a competing claim in flight makes this wait and see its
                result). Without it the store uses its own connection: an advisory answer only.

        Raises:
            ValueError: If ``connection`` is in autocommit mode outside a transaction.
            ptb_fence.SchemaError: On a table without ``claim_id``.
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": at,
        }
        if connection is not None:
            self._check_in_transaction(connection)
            return self._on_caller(connection, self._sql.owns_for_update, params)
        return self._run(lambda cur: _returns_row(cur, self._sql.owns, params))

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        """As :meth:`settle`, and the claim id must match; returns whether it landed.

        Args:
            identity (:class:`ptb_fence.AttemptIdentity`): The attempt's identity.
            settlement: The result (:class:`ptb_fence.Completed`, :class:`ptb_fence.Failed` or
                :class:`ptb_fence.Abandoned`).
            connection (optional): A psycopg2 connection (or cursor) with the caller's open
                transaction: the update runs on it and is **not** committed here (the caller's
                commit makes it land, atomically with the caller's own writes).

        Returns:
            :obj:`bool`: Whether the settlement landed (with ``connection``: will land when the
            caller commits).
        """
        sql, params = self._settle_params(
            identity.update_id, identity.attempt, settlement, owned=True
        )
        params["claim_id"] = identity.claim_id
        if connection is not None:
            return self._on_caller(connection, sql, params)
        return self._run(lambda cur: _returns_row(cur, sql, params))

    def settle_owned_many(
        self, items: Sequence[Tuple[AttemptIdentity, Settlement]]
    ) -> List[bool]:
        """:meth:`settle_owned` for several attempts in one transaction (one commit).

        Completions go in one statement; failures and abandonments one statement each.

        Returns:
            List[:obj:`bool`]: Per input position, whether that settlement landed.
        """
        items = list(items)
        if not items:
            return []
        return self._run(self._settle_owned_work(items))

    def _settle_owned_work(
        self, items: List[Tuple[AttemptIdentity, Settlement]]
    ) -> Callable[[Any], List[bool]]:
        """The statements of :meth:`settle_owned_many`, to run on a cursor."""
        completed = [
            (position, identity, settlement)
            for position, (identity, settlement) in enumerate(items)
            if isinstance(settlement, Completed)
        ]
        others = [
            (position, identity, settlement)
            for position, (identity, settlement) in enumerate(items)
            if not isinstance(settlement, Completed)
        ]
        prepared = []
        for position, identity, settlement in others:
            sql, params = self._settle_params(
                identity.update_id, identity.attempt, settlement, owned=True
            )
            params["claim_id"] = identity.claim_id
            prepared.append((position, sql, params))

        def work(cur: Any) -> List[bool]:
            landed = [False] * len(items)
            if completed:
                matched: Set[Tuple[int, int, str]] = set()
                # one statement per distinct identity (VALUES must not repeat a target row)
                seen: Set[AttemptIdentity] = set()
                unique = []
                for position, identity, settlement in completed:
                    if identity not in seen:
                        seen.add(identity)
                        unique.append((identity, settlement))
                values: List[Any] = []
                for identity, settlement in unique:
                    values += [identity.update_id, identity.attempt, identity.claim_id, settlement.at]
                cur.execute(self._sql.complete_owned_many(len(unique)), values)
                matched = {(int(u), int(a), str(c)) for u, a, c in cur.fetchall()}
                claimed: Set[Tuple[int, int, str]] = set()
                for position, identity, _ in completed:
                    key = (identity.update_id, identity.attempt, identity.claim_id)
                    if key in matched and key not in claimed:
                        claimed.add(key)
                        landed[position] = True
            for position, sql, params in prepared:
                landed[position] = _returns_row(cur, sql, params)
            return landed

        return work

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """Open a transaction on a pooled psycopg2 connection (optional capability).

        Yields the connection (``%s`` placeholders) for the caller's writes; commits on normal
        exit, rolls back on an exception (and re-raises), and returns the connection to the
        pool. Do not commit or roll back the yielded connection yourself. Waits for a free
        connection like every other call (:exc:`ptb_fence.StoreBusy` after ``pool_timeout``).

        Yields:
            A psycopg2 connection inside an open transaction.
        """
        def begin(cur: Any) -> Any:
            cur.execute(self._sql.probe)  # also proves the connection is alive (else: retried)
            return cur.connection

        conn = self._run(begin, commit=False)
        released = False
        try:
            yield conn
        except BaseException:
            _rollback_quietly(conn)
            released = True
            self._source.release(conn, discard=bool(conn.closed))
            raise
        finally:
            if not released:
                try:
                    conn.commit()
                except BaseException:
                    _rollback_quietly(conn)
                    self._source.release(conn, discard=bool(conn.closed))
                    raise
                self._source.release(conn, discard=False)

    # -- durable contract ------------------------------------------------------------------
    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        """Turn the exact live claim into an unacknowledged exhaustion.

        The row becomes ``abandoned`` with ``due_at = at``, ``settled_at`` NULL and ``error``
        kept, only if this claim's lease holds at ``at``.

        Returns:
            :obj:`bool`: Whether it landed.
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": at,
            "error": error,
        }
        return self._run(lambda cur: _returns_row(cur, self._sql.exhaust, params))

    def due_exhaustions(
        self, *, limit: int, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        """Unacknowledged exhaustions with ``update_id > after_update_id``, by ``update_id``.

        Args:
            limit (:obj:`int`): The most rows to return.
            after_update_id (:obj:`int`, optional): The paging cursor.

        Returns:
            List[:class:`ptb_fence.Exhaustion`]: The exhaustions.
        """
        params = {"limit": max(int(limit), 0), "after_update_id": after_update_id}

        def work(cur: Any) -> List[Exhaustion]:
            cur.execute(self._sql.due_exhaustions, params)
            return [
                Exhaustion(
                    update_id=int(u),
                    attempt=int(a),
                    claim_id=str(c),
                    body=body,
                    exhausted_at=int(due_at),
                    error=error,
                )
                for u, a, c, body, due_at, error in cur.fetchall()
            ]

        return self._run(work)

    def acknowledge_exhaustion(self, identity: AttemptIdentity, at: int) -> bool:
        """Acknowledge the exhaustion with exactly this identity; it becomes prunable.

        Returns:
            :obj:`bool`: :obj:`True` the first time for the exact identity of an unacknowledged
            exhaustion, :obj:`False` otherwise.
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": at,
        }
        return self._run(lambda cur: _returns_row(cur, self._sql.acknowledge_exhaustion, params))
