"""PostgreSQL connections and their pools.

This module holds the password redaction, the store's pools (waiting for a free connection),
the broken-connection marker, and the fork hook that keeps a forked child off its parent's
sessions (:func:`_after_fork_in_child`). psycopg2 is imported only when used.
"""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.parse
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from ptb_fence._errors import StoreBusy

if TYPE_CHECKING:
    import psycopg2.pool

__all__ = [
    "Broken",
    "DsnPool",
    "UserPool",
    "close_quietly",
    "closed_error",
    "dsn_opener",
    "factory_opener",
    "register_pool",
    "track",
    "redact",
    "rollback_quietly",
    "secrets_of",
]

DEFAULT_CONNECT_TIMEOUT = 10

# Every connection the store opened or took from a caller's pool in this process, and its
# pools: a forked child detaches the first and empties the second (_after_fork_in_child).
_CONNECTIONS: "weakref.WeakSet[Any]" = weakref.WeakSet()
_POOLS: "weakref.WeakSet[Any]" = weakref.WeakSet()  # each has forget_inherited()
_INHERITED: List[Any] = []  # the parent's connections in a forked child: never closed
_DETACHED: "weakref.WeakSet[Any]" = weakref.WeakSet()  # the same, to recognise them


def track(conn: Any) -> Any:
    """Remember ``conn``, a connection the store uses, so a forked child detaches its copy.

    Returns ``conn``."""
    try:
        _CONNECTIONS.add(conn)
    except TypeError:  # pragma: no cover - a connection type without weak references
        pass
    return conn


def detach_in_child(conn: Any) -> None:
    """In a forked child: replace the child's copy of ``conn``'s socket by ``/dev/null``."""
    try:
        if conn.closed:
            return
        fd = conn.fileno()
    except Exception:  # closed, or not a psycopg2 connection
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(devnull, fd, inheritable=False)
    finally:
        os.close(devnull)


def _after_fork_in_child() -> None:
    """Keep a forked child off its parent's sessions.

    A child made by ``os.fork()`` inherits the sockets of every connection the store holds.
    ``multiprocessing``, ``ProcessPoolExecutor`` and a helper started from a handler make such
    children. While any process has a socket open, the server keeps its session. The
    transaction open on it and the row locks that transaction holds stay too. So a parent
    killed inside a fenced transaction would keep the update's row locked as long as the
    child lives. There would be no takeover, and no claim after the lease. A child using a
    shared socket would also corrupt the parent's session.

    So right after a fork the child points its copy of each such socket at ``/dev/null``
    (``os.register_at_fork``). It parks the connection, never used and never closed.
    Whatever libpq would send on it goes nowhere. The store's pools in the child start empty
    and open connections of their own.
    """
    for conn in list(_CONNECTIONS):
        _INHERITED.append(conn)
        _DETACHED.add(conn)
        detach_in_child(conn)
    _CONNECTIONS.clear()
    for pool in list(_POOLS):
        pool.forget_inherited()


os.register_at_fork(after_in_child=_after_fork_in_child)


_KV_PASSWORD = re.compile(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URI_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*?:([^/?#]*)@")


def secrets_of(dsn: Optional[str], kwargs: Optional[Dict[str, Any]] = None) -> Set[str]:
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


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def scrubbed(error: BaseException, secrets: Set[str], prefix: str) -> BaseException:
    """A copy of a connection error whose message cannot contain the password."""
    message = prefix + redact(str(error).strip(), secrets)
    try:
        return type(error)(message)
    except Exception:  # pragma: no cover - every psycopg2 error takes a message
        import psycopg2

        return psycopg2.OperationalError(message)


def open_connection(args: Tuple[Any, ...], kwargs: Dict[str, Any], secrets: Set[str]) -> Any:
    """``psycopg2.connect`` whose errors never carry the password (and no chained cause)."""
    import psycopg2

    failure: Optional[BaseException] = None
    try:
        return track(psycopg2.connect(*args, **kwargs))
    except psycopg2.Error as exc:
        failure = exc
    # Raised outside the except block, so the original error is not kept as __context__.
    raise scrubbed(failure, secrets, "could not connect to PostgreSQL: ")


def close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass


def rollback_quietly(conn: Any) -> None:
    if conn.closed:
        return
    try:
        conn.rollback()
    except Exception:
        pass


def busy(timeout: float, capacity: int) -> StoreBusy:
    return StoreBusy(
        f"no PostgreSQL connection became free within pool_timeout={timeout:g}s: all {capacity} "
        "connections of the store's pool are in use. Raise pool_size (or the pool's maxconn) "
        "or pool_timeout, or keep transactions shorter."
    )


def register_pool(pool: Any) -> None:
    """Have a forked child call ``pool.forget_inherited()``."""
    _POOLS.add(pool)


def closed_error() -> RuntimeError:
    return RuntimeError("this PostgresUpdateStore is closed; create a new store to continue")


def search_path_option(options: Optional[str], schema: str) -> str:
    """libpq ``options`` that set ``search_path`` to ``schema`` (validated), after any the DSN
    already had. Quoted, so that the schema's case is kept."""
    setting = f'-c search_path="{schema}"'
    return f"{options} {setting}" if options else setting


def dsn_opener(dsn: str, secrets: Set[str], schema: Optional[str] = None) -> Callable[[], Any]:
    """What opens a connection to ``dsn`` (with ``connect_timeout=10`` unless it sets one, and
    ``search_path`` set to ``schema`` when given)."""
    import psycopg2.extensions

    args: Tuple[Any, ...] = (dsn,)
    kwargs: Dict[str, Any] = {}
    parsed = psycopg2.extensions.parse_dsn(dsn)
    if "connect_timeout" not in parsed:
        # Bound the wait for an unreachable server (libpq's default is to wait forever).
        kwargs["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT
    if schema is not None:
        kwargs["options"] = search_path_option(parsed.get("options"), schema)
    return lambda: open_connection(args, kwargs, secrets)


def factory_opener(factory: Callable[[], Any], schema: Optional[str] = None) -> Callable[[], Any]:
    """What opens a connection with an application's connection factory (checked to be a
    psycopg2 connection: the store's SQL and error handling are psycopg2's), its
    ``search_path`` set to ``schema`` when given."""

    def opener() -> Any:
        import psycopg2.extensions

        conn = factory()
        if not isinstance(conn, psycopg2.extensions.connection):
            kind = f"{type(conn).__module__}.{type(conn).__qualname__}"
            close_quietly(conn)
            raise TypeError(
                f"the connection factory given to PostgresUpdateStore returned {kind}: it "
                "must return a new psycopg2 connection (psycopg2.connect(...)); psycopg 3 "
                "and other drivers are not supported"
            )
        if schema is not None:
            try:
                with conn.cursor() as cur:
                    cur.execute(f'SET search_path TO "{schema}"')
                if not conn.autocommit:
                    conn.commit()  # a session setting: it outlives this transaction
            except BaseException:
                close_quietly(conn)
                raise
        return track(conn)

    return opener


class DsnPool:
    """A small blocking pool: at most ``size`` connections, callers wait for a free one.

    Its connections are opened by ``opener``: from a DSN (:func:`dsn_opener`) or by an
    application's connection factory (:func:`factory_opener`).
    """

    __slots__ = (
        "__weakref__", "_opener", "capacity", "_cond", "_idle", "_open", "_closed",
    )

    def __init__(self, opener: Callable[[], Any], size: int) -> None:
        self._opener = opener
        self.capacity = size
        self._cond = threading.Condition()
        self._idle: List[Any] = []
        self._open = 0
        self._closed = False
        _POOLS.add(self)

    def forget_inherited(self) -> None:
        """In a forked child: drop the parent's connections and the state of its threads.

        The fork hook detached those connections. The child opens connections of its own."""
        self._cond = threading.Condition()
        self._idle = []
        self._open = 0

    def connect(self) -> Any:
        return self._opener()

    def acquire(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise closed_error()
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
                    raise busy(timeout, self.capacity)
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
            close_quietly(conn)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            close_quietly(conn)


class UserPool:
    """A caller's psycopg2 pool, made to wait for a free connection instead of failing."""

    __slots__ = ("__weakref__", "_pool", "_secrets", "capacity", "_slots", "_lock", "_closed")

    def __init__(self, pool: "psycopg2.pool.AbstractConnectionPool", secrets: Set[str]) -> None:
        self._pool = pool
        self._secrets = secrets
        self.capacity = max(1, int(pool.maxconn))
        self._slots = threading.BoundedSemaphore(self.capacity)
        self._lock = threading.Lock()  # SimpleConnectionPool is not thread-safe by itself
        self._closed = False
        _POOLS.add(self)

    def forget_inherited(self) -> None:
        """In a forked child: the parent's threads no longer hold slots or the lock.

        The caller's pool keeps its connections. Those the store used are detached.
        :meth:`acquire` closes such a one instead of handing it out."""
        self._slots = threading.BoundedSemaphore(self.capacity)
        self._lock = threading.Lock()

    def connect(self) -> Any:
        # A standalone connection with the pool's own connection arguments (for renewals).
        args = tuple(getattr(self._pool, "_args", ()))
        kwargs = dict(getattr(self._pool, "_kwargs", {}))
        return open_connection(args, kwargs, self._secrets)

    def acquire(self, timeout: float) -> Any:
        import psycopg2.pool

        if self._closed:
            raise closed_error()
        deadline = time.monotonic() + timeout
        if not self._slots.acquire(timeout=timeout):
            raise busy(timeout, self.capacity)
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
                        raise busy(timeout, self.capacity) from None
                    time.sleep(min(0.02, remaining))
                    continue
                except psycopg2.Error as exc:  # the pool failed to open a connection
                    failure = exc
                if failure is not None:
                    raise scrubbed(failure, self._secrets, "could not connect to PostgreSQL: ")
                if conn.closed or conn in _DETACHED:
                    # (a detached one is closed on /dev/null: the parent's session is safe)
                    with self._lock:
                        self._pool.putconn(conn, close=True)
                    continue
                return track(conn)
        except BaseException:
            self._slots.release()
            raise

    def release(self, conn: Any, discard: bool) -> None:
        try:
            with self._lock:
                if not self._pool.closed:
                    self._pool.putconn(conn, close=discard or bool(conn.closed))
                else:
                    close_quietly(conn)
        finally:
            self._slots.release()

    def close(self) -> None:
        # The pool belongs to the caller: leave it open.
        self._closed = True


class Broken(Exception):
    """The connection broke before the commit was sent: nothing was written, safe to retry."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error
