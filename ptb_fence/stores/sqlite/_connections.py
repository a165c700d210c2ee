"""SQLite connections of a SQLiteUpdateStore.

There is one connection per thread. It is opened on first use. It is closed with its thread
or by ``close()``, never under a call using it. Forked children drop the parent's.
The module also holds the ``BEGIN IMMEDIATE`` write transactions, the caller's connection for
fenced transactions, and the errors that name the file and what to do."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, cast

__all__ = ["SQLiteConnections", "is_busy", "rollback"]

# Connections inherited through os.fork() belong to the parent process: they must neither be
# used nor closed in the child. They are parked here so that garbage collection does not close
# them either.
_INHERITED: List[sqlite3.Connection] = []


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's SQLITE_BUSY / SQLITE_LOCKED ("database is locked")."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (5, 6)
    text = str(exc).lower()
    return "locked" in text or "busy" in text


_READONLY = 8  # SQLITE_READONLY (and its extended codes)
_CANTOPEN = 14  # SQLITE_CANTOPEN: e.g. the -wal/-shm file cannot be created
_CLOSE_WAIT = 5.0  # seconds close() waits for statements in progress on other threads


def _errorcode(exc: BaseException) -> Optional[int]:
    code = getattr(exc, "sqlite_errorcode", None)
    return code if isinstance(code, int) else None


def _is_unwritable(exc: BaseException) -> bool:
    """Whether ``exc`` says the file (or its directory) cannot be written."""
    code = _errorcode(exc)
    if code is not None:
        return code & 0xFF in (_READONLY, _CANTOPEN)
    text = str(exc).lower()
    return "readonly database" in text or "unable to open database file" in text


def _is_lock_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a plain SQLITE_BUSY: the write lock stayed taken for busy_timeout.

    (Not SQLITE_BUSY_SNAPSHOT, a stale read transaction, which fails at once.)
    """
    code = _errorcode(exc)
    if code is not None:
        return code in (5, 773)  # SQLITE_BUSY, SQLITE_BUSY_TIMEOUT
    return str(exc).lower() == "database is locked"


class _Slot:
    """One thread's connection and whether a call is using it right now."""

    __slots__ = ("conn", "thread", "depth", "stale")

    def __init__(self, conn: sqlite3.Connection, thread: "weakref.ref[threading.Thread]") -> None:
        self.conn = conn
        self.thread = thread
        self.depth = 0  # calls of the owning thread inside a statement/transaction on it
        self.stale = False  # opened read-only: reopen once the current call ends


def rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:  # pragma: no cover - the original error matters more
            pass


def _close_quietly(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error:  # pragma: no cover - closing is best effort
        pass


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


class SQLiteConnections:
    """The per-thread connections to one database file. Thread-safe.

    Args:
        path: The absolute path of the database file.
        label: How the store names itself in errors (its ``repr``).
        synchronous: ``PRAGMA synchronous`` (``"NORMAL"`` or ``"FULL"``).
        busy_timeout: Seconds a statement waits for another connection's write lock.
    """

    __slots__ = (
        "__weakref__",
        "busy_timeout",
        "closed",
        "label",
        "path",
        "_idle",
        "_local",
        "_lock",
        "_pid",
        "_slots",
        "_synchronous",
    )

    def __init__(self, path: str, label: str, synchronous: str, busy_timeout: float) -> None:
        self.path = path
        self.label = label
        self.busy_timeout = busy_timeout
        self._synchronous = synchronous
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._local = threading.local()
        self._slots: List[_Slot] = []
        self.closed = False
        self._pid = os.getpid()

    def close(self) -> None:
        """Close every connection (see ``SQLiteUpdateStore.close``). Idempotent."""
        me = threading.current_thread()
        with self._lock:
            self.closed = True
            idle = [slot for slot in self._slots if slot.depth == 0]
            self._slots = [slot for slot in self._slots if slot.depth > 0]
        for slot in idle:
            _close_quietly(slot.conn)
        deadline = time.monotonic() + _CLOSE_WAIT
        with self._idle:
            while any(slot.thread() is not me for slot in self._slots):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break  # their threads close them when their calls end
                self._idle.wait(remaining)

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.OperationalError as exc:
            raise sqlite3.OperationalError(
                f"cannot open the SQLite database {self.path!r}: {exc}; check that its "
                "directory exists and is writable"
            ) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        except sqlite3.OperationalError as exc:
            conn.close()
            if _is_unwritable(exc):
                raise self.unwritable_error(exc) from exc
            raise
        except BaseException:
            conn.close()
            raise
        return conn

    def _reap(self) -> None:
        """Close the idle connections of threads that have ended (caller holds ``_lock``)."""
        alive = []
        for slot in self._slots:
            thread = slot.thread()
            if slot.depth > 0 or (thread is not None and thread.is_alive()):
                alive.append(slot)
            else:
                _close_quietly(slot.conn)
        self._slots = alive

    def closed_error(self) -> RuntimeError:
        return RuntimeError(
            f"{self.label} is closed; create a new store to use the database again"
        )

    def _slot(self) -> _Slot:
        """The calling thread's connection slot, opened on first use."""
        if self.closed:
            raise self.closed_error()
        if self._pid != os.getpid():
            # Forked child: the parent's connections must not be used (nor closed) here.
            with self._lock:
                if self._pid != os.getpid():
                    _INHERITED.extend(slot.conn for slot in self._slots)
                    self._slots = []
                    self._local = threading.local()
                    self._pid = os.getpid()
        slot: Optional[_Slot] = getattr(self._local, "slot", None)
        if slot is None:
            conn = self._connect()
            slot = _Slot(conn, weakref.ref(threading.current_thread()))
            with self._lock:
                if self.closed:
                    conn.close()
                    raise self.closed_error()
                self._reap()
                self._slots.append(slot)
            self._local.slot = slot
        return slot

    @contextmanager
    def using(self) -> Iterator[sqlite3.Connection]:
        """The calling thread's connection, marked in use for the block.

        :meth:`close` never closes a connection in use: the block's end closes it instead.
        A connection that turned out read-only (opened while the file was not writable) is
        closed at the block's end and reopened by the thread's next call. SQLite's errors for
        an unwritable file and for a write lock held past ``busy_timeout`` are re-raised with
        a message that names the file and what to do.
        """
        slot = self._slot()
        with self._lock:
            if self.closed:
                raise self.closed_error()
            slot.depth += 1
        failure: Optional[sqlite3.OperationalError] = None
        try:
            yield slot.conn
        except sqlite3.OperationalError as exc:
            if _is_unwritable(exc):
                slot.stale = True
                failure = self.unwritable_error(exc)
            elif _is_lock_timeout(exc):
                failure = self._lock_timeout_error(exc)
            else:
                raise
        finally:
            with self._lock:
                slot.depth -= 1
                done = slot.depth == 0 and (self.closed or slot.stale)
                if done:
                    if slot in self._slots:
                        self._slots.remove(slot)
                    if getattr(self._local, "slot", None) is slot:
                        self._local.slot = None
                self._idle.notify_all()
            if done:
                _close_quietly(slot.conn)
        if failure is not None:
            raise failure from failure.__cause__

    def unwritable_error(self, exc: sqlite3.OperationalError) -> sqlite3.OperationalError:
        error = sqlite3.OperationalError(
            f"cannot write the SQLite database {self.path!r}: {exc}; check that the file and "
            "its directory are writable by this process (SQLite creates the -wal and -shm "
            "files next to it). A connection opened while the file was not writable is "
            "reopened on the next call."
        )
        error.__cause__ = exc
        error.sqlite_errorcode = _errorcode(exc)  # type: ignore[attr-defined]
        return error

    def _lock_timeout_error(self, exc: sqlite3.OperationalError) -> sqlite3.OperationalError:
        error = sqlite3.OperationalError(
            f"database is locked: the write lock of {self.path!r} was held longer than "
            f"busy_timeout ({self.busy_timeout:g} s) by another transaction (for example a "
            "long fenced transaction, or another process). Fenced transactions on SQLite hold "
            "the whole database's write lock and must stay shorter than busy_timeout."
        )
        error.__cause__ = exc
        error.sqlite_errorcode = _errorcode(exc)  # type: ignore[attr-defined]
        return error

    @contextmanager
    def immediate(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` … ``COMMIT``) on the thread's connection."""
        with self.using() as conn:
            if conn.in_transaction:
                raise RuntimeError(
                    "this thread is inside SQLiteUpdateStore.transaction(): store writes cannot "
                    "run on the same thread until the block ends (pass connection= to owns() or "
                    "settle_owned() to act inside the transaction)"
                )
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                rollback(conn)
                raise

    def caller_connection(self, connection: Any) -> sqlite3.Connection:
        """The sqlite3 connection behind a caller's connection or cursor, checked."""
        conn: Any = connection
        if not hasattr(conn, "in_transaction") and hasattr(conn, "fetchone"):
            conn = getattr(conn, "connection", None)  # a cursor
        if not (hasattr(conn, "execute") and hasattr(conn, "in_transaction")):
            raise TypeError(
                "connection must be a sqlite3.Connection (or a cursor of one) open on "
                f"{self.path!r}, got {connection!r}"
            )
        slot = getattr(self._local, "slot", None)
        if slot is not None and conn is slot.conn:
            return cast(sqlite3.Connection, conn)
        databases = conn.execute("PRAGMA database_list").fetchall()
        files = [row[2] for row in databases if row[1] == "main"]
        if not files or not files[0] or not _same_file(files[0], self.path):
            raise ValueError(
                f"connection is open on {files[0] if files else None!r}, not on this store's "
                f"database {self.path!r}: the ownership check must run on the same file"
            )
        return cast(sqlite3.Connection, conn)

    def join(self, conn: sqlite3.Connection, write_lock: str) -> None:
        """Make sure the caller's connection is in a transaction that holds the write lock.

        Not in a transaction, it runs ``BEGIN IMMEDIATE``. The connection may already be in
        one, perhaps a deferred one that has only read so far. Then a write that changes
        nothing takes the write lock now, like PostgreSQL's ``FOR UPDATE``. SQLite refuses it
        (``database is locked``) if another connection wrote since the caller's transaction
        began reading.
        """
        if not conn.in_transaction:
            conn.execute("BEGIN IMMEDIATE")
        else:
            conn.execute(write_lock)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` on this thread's connection (see ``SQLiteUpdateStore.transaction``).

        It commits on normal exit. On an exception it rolls back and re-raises."""
        with self.using() as conn:
            if conn.in_transaction:
                raise RuntimeError(
                    "SQLiteUpdateStore.transaction() is already open on this thread; nested "
                    "transactions are not supported"
                )
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                rollback(conn)
                raise
            if conn.in_transaction:
                try:
                    conn.execute("COMMIT")
                except BaseException:
                    rollback(conn)
                    raise
