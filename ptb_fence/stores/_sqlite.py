"""SQLiteUpdateStore: the embedded default store (one file, many threads, several processes)."""

from __future__ import annotations

import operator
import os
import random
import sqlite3
import sys
import threading
import time
import uuid
import warnings
import weakref
from contextlib import contextmanager
from typing import (
    Any,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
    cast,
)

from ptb_fence._errors import SchemaError, TableBotMismatch
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
from ptb_fence.stores._sqlite_sql import REQUIRED_COLUMNS, SQLiteStatements

__all__ = ["SQLiteUpdateStore"]

_MIN_SQLITE = (3, 35, 0)  # UPDATE … RETURNING (3.35), UPDATE … FROM (3.33)
_SYNCHRONOUS = ("NORMAL", "FULL")
_DEFAULT_MAX_VARIABLES = 999  # SQLite's historical SQLITE_MAX_VARIABLE_NUMBER

# Connections inherited through os.fork() belong to the parent process: they must neither be
# used nor closed in the child. They are parked here so that garbage collection does not close
# them either.
_INHERITED: List[sqlite3.Connection] = []


def _new_claim_id() -> str:
    return uuid.uuid4().hex


def _is_busy(exc: BaseException) -> bool:
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


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:  # pragma: no cover - the original error matters more
            pass


def _columns(conn: sqlite3.Connection, sql: SQLiteStatements) -> Set[str]:
    return {str(row[1]) for row in conn.execute(sql.table_info).fetchall()}


def _add_claim_id_column(conn: sqlite3.Connection, sql: SQLiteStatements) -> None:
    """``ALTER TABLE … ADD COLUMN claim_id``, tolerating a concurrent upgrade.

    If the ``ALTER`` fails (for example because another process added the column first), the
    table is read again and the error is re-raised only if the column is still missing.
    """
    _add_column(conn, sql, sql.add_claim_id, "claim_id")


def _add_column(conn: sqlite3.Connection, sql: SQLiteStatements, alter: str, name: str) -> None:
    """``alter`` (an ``ADD COLUMN name``), tolerating a concurrent upgrade."""
    try:
        conn.execute(alter)
    except sqlite3.DatabaseError:
        if name in _columns(conn, sql):
            return
        raise


def _close_quietly(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error:  # pragma: no cover - closing is best effort
        pass


def _int(name: str, value: Any) -> int:
    """``value`` as an int; a clear :exc:`TypeError` otherwise (NULL must never reach SQL)."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an int (epoch milliseconds or a count), got {value!r}"
        ) from None


def _max_variables(conn: sqlite3.Connection) -> int:
    """The connection's limit on host parameters per statement (Python 3.11+ can ask)."""
    if sys.version_info < (3, 11):  # pragma: no cover - Python 3.10
        return _DEFAULT_MAX_VARIABLES
    return conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


class SQLiteUpdateStore:
    """The embedded default store: one SQLite file, safe from many threads and processes.

    The table (and its index on ``(state, due_at)``) is created on construction; a table from an
    older version without the ``claim_id`` column gets it added, keeping its rows. Several
    processes may open (and upgrade) the same new or older file at once. The database runs in
    WAL mode with a busy timeout; every write is one conditional statement inside
    ``BEGIN IMMEDIATE``, so each rule of the store contract is atomic across processes.

    Every thread gets its own connection (created on first use, closed by :meth:`close` or once
    its thread has ended; a connection is never closed while a call is using it, and one that
    was opened while the file was not writable is reopened). Times are integer milliseconds
    since the epoch.

    **Fenced transactions**: SQLite has one write lock per database. A fenced transaction on
    the store's file (:meth:`transaction`, or ``owns(..., connection=conn)``) holds it until it
    ends, so every other write of every process, lease renewals included, waits meanwhile and
    fails after ``busy_timeout`` with ``database is locked: the write lock of … was held longer
    than busy_timeout``. **Keep fenced transactions on SQLite well shorter than
    ``busy_timeout`` (30 s by default) and than the lease.**

    Besides the durable contract (:class:`ptb_fence.DurableUpdateStore`), the store offers the
    batched :meth:`add_many`, :meth:`renew_many` and :meth:`renew_owned_many`, and
    :meth:`transaction` for exactly-once domain writes in the same file.

    Example:
        .. code-block:: python

            store = SQLiteUpdateStore("bot.sqlite3")
            identity = store.claim_owned(update_id, now=now, lease_until=now + 120_000,
                                         max_attempts=5)
            with store.transaction() as conn:
                if not store.owns(identity, now_ms(), connection=conn):
                    raise OwnershipLost(identity)
                conn.execute("INSERT INTO replies VALUES (?, ?)", (identity.update_id, text))

    Args:
        path (:obj:`str` | :obj:`os.PathLike`): The database file. It is created if missing; its
            directory must exist. ``":memory:"`` is refused (every thread would see its own
            empty database): use :class:`ptb_fence.MemoryUpdateStore` instead.
        table (:obj:`str`, optional): The table name; must fully match
            ``[A-Za-z_][A-Za-z0-9_]{0,62}``. Defaults to ``"telegram_updates"``.

    Keyword Args:
        synchronous (:obj:`str`, optional): SQLite's ``PRAGMA synchronous``: ``"NORMAL"``
            (default; in WAL mode a power loss may lose the last commits but never corrupts the
            file) or ``"FULL"`` (every commit is on disk before it returns).
        busy_timeout (:obj:`float`, optional): Seconds a statement waits for another
            connection's write lock before failing with ``database is locked``; also bounds the
            retries while several processes create or upgrade the schema at once. Defaults to
            ``30.0``.

    Raises:
        ValueError: A bad ``table``, ``path``, ``synchronous`` or ``busy_timeout`` (raised before
            any file is touched).
        RuntimeError: The SQLite library is older than 3.35.
        ptb_fence.SchemaError: An existing table of that name lacks columns the store needs.
    """

    __slots__ = (
        "__weakref__",
        "_busy_timeout",
        "_closed",
        "_idle",
        "_slots",
        "_local",
        "_lock",
        "_path",
        "_pid",
        "_sql",
        "_synchronous",
        "_table",
    )

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        table: str = "telegram_updates",
        *,
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
    ) -> None:
        self._table = validate_table_name(table)
        if not isinstance(synchronous, str) or synchronous.upper() not in _SYNCHRONOUS:
            raise ValueError(
                f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}"
            )
        self._synchronous = synchronous.upper()
        if (
            isinstance(busy_timeout, bool)
            or not isinstance(busy_timeout, (int, float))
            or not busy_timeout > 0
            or busy_timeout == float("inf")
        ):
            raise ValueError(
                f"busy_timeout must be a positive number of seconds, got {busy_timeout!r}"
            )
        self._busy_timeout = float(busy_timeout)
        if not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"path must be a file path (str or os.PathLike), got {path!r}")
        raw = os.fspath(path)
        if not isinstance(raw, str) or raw in ("", ":memory:"):
            raise ValueError(
                f"path must name a database file, got {path!r}; SQLiteUpdateStore gives every "
                "thread its own connection, so an in-memory or temporary database would not be "
                "shared (use MemoryUpdateStore for an in-process store)"
            )
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise RuntimeError(
                "SQLiteUpdateStore needs SQLite 3.35 or newer (for UPDATE … RETURNING); this "
                f"Python uses SQLite {sqlite3.sqlite_version}. Use a Python build with a newer "
                "SQLite, or use PostgresUpdateStore."
            )
        self._path = os.path.abspath(raw)
        self._sql = SQLiteStatements(self._table)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._local = threading.local()
        self._slots: List[_Slot] = []
        self._closed = False
        self._pid = os.getpid()
        try:
            self._ensure_schema()
        except BaseException:
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """:obj:`str`: The absolute path of the database file."""
        return self._path

    @property
    def table(self) -> str:
        """:obj:`str`: The table name."""
        return self._table

    def close(self) -> None:
        """Close every connection the store opened (from all threads). Idempotent.

        A connection another thread is using right now (a statement, or an open
        :meth:`transaction` block) is never closed under it: that call finishes normally and
        its thread closes the connection when the call ends. ``close()`` waits up to 5 seconds
        for such calls, then returns. Calls that start after ``close()`` raise
        :exc:`RuntimeError`.
        """
        me = threading.current_thread()
        with self._lock:
            self._closed = True
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

    def __enter__(self) -> "SQLiteUpdateStore":
        """Return the store itself."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close the store (see :meth:`close`)."""
        self.close()

    def __repr__(self) -> str:
        return f"SQLiteUpdateStore({self._path!r}, table={self._table!r})"

    # -- connections -----------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self._path,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.OperationalError as exc:
            raise sqlite3.OperationalError(
                f"cannot open the SQLite database {self._path!r}: {exc}; check that its "
                "directory exists and is writable"
            ) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        except sqlite3.OperationalError as exc:
            conn.close()
            if _is_unwritable(exc):
                raise self._unwritable_error(exc) from exc
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

    def _closed_error(self) -> RuntimeError:
        return RuntimeError(f"{self!r} is closed; create a new store to use the database again")

    def _slot(self) -> _Slot:
        """The calling thread's connection slot, opened on first use."""
        if self._closed:
            raise self._closed_error()
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
                if self._closed:
                    conn.close()
                    raise self._closed_error()
                self._reap()
                self._slots.append(slot)
            self._local.slot = slot
        return slot

    @contextmanager
    def _using(self) -> Iterator[sqlite3.Connection]:
        """The calling thread's connection, marked in use for the block.

        :meth:`close` never closes a connection in use: the block's end closes it instead.
        A connection that turned out read-only (opened while the file was not writable) is
        closed at the block's end and reopened by the thread's next call. SQLite's errors for
        an unwritable file and for a write lock held past ``busy_timeout`` are re-raised with
        a message that names the file and what to do.
        """
        slot = self._slot()
        with self._lock:
            if self._closed:
                raise self._closed_error()
            slot.depth += 1
        failure: Optional[sqlite3.OperationalError] = None
        try:
            yield slot.conn
        except sqlite3.OperationalError as exc:
            if _is_unwritable(exc):
                slot.stale = True
                failure = self._unwritable_error(exc)
            elif _is_lock_timeout(exc):
                failure = self._lock_timeout_error(exc)
            else:
                raise
        finally:
            with self._lock:
                slot.depth -= 1
                done = slot.depth == 0 and (self._closed or slot.stale)
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

    def _unwritable_error(self, exc: sqlite3.OperationalError) -> sqlite3.OperationalError:
        error = sqlite3.OperationalError(
            f"cannot write the SQLite database {self._path!r}: {exc}; check that the file and "
            "its directory are writable by this process (SQLite creates the -wal and -shm "
            "files next to it). A connection opened while the file was not writable is "
            "reopened on the next call."
        )
        error.__cause__ = exc
        error.sqlite_errorcode = _errorcode(exc)  # type: ignore[attr-defined]
        return error

    def _lock_timeout_error(self, exc: sqlite3.OperationalError) -> sqlite3.OperationalError:
        error = sqlite3.OperationalError(
            f"database is locked: the write lock of {self._path!r} was held longer than "
            f"busy_timeout ({self._busy_timeout:g} s) by another transaction (for example a "
            "long fenced transaction, or another process). Fenced transactions on SQLite hold "
            "the whole database's write lock and must stay shorter than busy_timeout."
        )
        error.__cause__ = exc
        error.sqlite_errorcode = _errorcode(exc)  # type: ignore[attr-defined]
        return error

    @contextmanager
    def _immediate(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` … ``COMMIT``) on the thread's connection."""
        with self._using() as conn:
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
                _rollback(conn)
                raise

    def _caller_connection(self, connection: Any) -> sqlite3.Connection:
        """The sqlite3 connection behind a caller's connection or cursor, checked."""
        conn: Any = connection
        if not hasattr(conn, "in_transaction") and hasattr(conn, "fetchone"):
            conn = getattr(conn, "connection", None)  # a cursor
        if not (hasattr(conn, "execute") and hasattr(conn, "in_transaction")):
            raise TypeError(
                "connection must be a sqlite3.Connection (or a cursor of one) open on "
                f"{self._path!r}, got {connection!r}"
            )
        slot = getattr(self._local, "slot", None)
        if slot is not None and conn is slot.conn:
            return cast(sqlite3.Connection, conn)
        databases = conn.execute("PRAGMA database_list").fetchall()
        files = [row[2] for row in databases if row[1] == "main"]
        if not files or not files[0] or not _same_file(files[0], self._path):
            raise ValueError(
                f"connection is open on {files[0] if files else None!r}, not on this store's "
                f"database {self._path!r}: the ownership check must run on the same file"
            )
        return cast(sqlite3.Connection, conn)

    def _join(self, conn: sqlite3.Connection) -> None:
        """Make sure the caller's connection is in a transaction that holds the write lock.

        Not in a transaction: ``BEGIN IMMEDIATE``. Already in one (perhaps a deferred one that
        has only read so far): a write that changes nothing takes the write lock now, like
        PostgreSQL's ``FOR UPDATE``; SQLite refuses it (``database is locked``) if another
        connection wrote since the caller's transaction began reading.
        """
        if not conn.in_transaction:
            conn.execute("BEGIN IMMEDIATE")
        else:
            conn.execute(self._sql.write_lock)

    def bind_bot(self, bot_id: int) -> None:
        """Record that the table belongs to bot ``bot_id``; the first binder wins.

        The owner is kept in the table ``ptb_fence_meta`` of the same file (created when
        missing). Binding the same id again is a no-op; several processes binding a new table
        at once are safe (``BEGIN IMMEDIATE``).

        Raises:
            ptb_fence.TableBotMismatch: The table was bound to another bot id first.
        """
        bot_id = int(bot_id)
        params = {"table": self._table, "bot_id": bot_id}
        with self._immediate() as conn:
            conn.execute(self._sql.create_meta)
            conn.execute(self._sql.bind_bot, params)
            row = conn.execute(self._sql.bot_of, params).fetchone()
        owner = int(row[0])
        if owner != bot_id:
            raise TableBotMismatch(self._table, repr(self._path), owner, bot_id)

    # -- schema ----------------------------------------------------------------------------
    def _ensure_schema(self) -> None:
        """Create or upgrade the schema, retrying while other processes hold the lock."""
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                with self._using() as conn:
                    try:
                        self._init_schema(conn)
                    except BaseException:
                        _rollback(conn)
                        raise
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(random.uniform(0.005, 0.05))

    def _schema_complete(self, conn: sqlite3.Connection) -> bool:
        columns = _columns(conn, self._sql)
        if not columns or "claim_id" not in columns or "fingerprint" not in columns:
            return False
        self._check_columns(columns)
        index = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?",
            (f"{self._table}_state_due_at_idx",),
        ).fetchone()
        return index is not None

    def _check_columns(self, columns: Set[str]) -> None:
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise SchemaError(
                f"table {self._table!r} in {self._path!r} exists but lacks the columns "
                f"{', '.join(missing)}, so it was not created by ptb_fence: pass another "
                "table= name or migrate the table"
            )

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if not mode or str(mode[0]).lower() != "wal":
            warnings.warn(
                f"SQLite could not switch {self._path!r} to WAL mode (journal_mode is "
                f"{mode[0] if mode else None!r}); the store stays correct but readers and "
                "writers block each other. Put the file on a local file system.",
                RuntimeWarning,
                stacklevel=4,
            )
        if self._schema_complete(conn):
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(self._sql.create_table)
            columns = _columns(conn, self._sql)
            self._check_columns(columns)
            if "claim_id" not in columns:
                _add_claim_id_column(conn, self._sql)
                for (update_id,) in conn.execute(self._sql.unclaimed_exhaustions).fetchall():
                    conn.execute(
                        self._sql.backfill_claim_id,
                        {"update_id": update_id, "claim_id": _new_claim_id()},
                    )
            if "fingerprint" not in columns:
                _add_column(conn, self._sql, self._sql.add_fingerprint, "fingerprint")
            conn.execute(self._sql.create_index)
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    # -- base contract ---------------------------------------------------------------------
    def add(self, update_id: int, body: str, received_at: int) -> bool:
        """Insert a pending row.

        Args:
            update_id (:obj:`int`): The Telegram ``update_id``.
            body (:obj:`str`): The update's JSON text.
            received_at (:obj:`int`): When it was received (epoch milliseconds).

        Returns:
            :obj:`bool`: :obj:`True` if inserted, :obj:`False` if the id exists. The same
            update again never changes anything; a different update (another
            :func:`~ptb_fence._fingerprint.update_fingerprint`) replaces a settled row
            (completed, or abandoned with ``settled_at`` set) like a fresh insert and returns
            :obj:`True`; with a live row the first is kept and a WARNING is logged on
            ``ptb_fence.store`` (SPEC §12).
        """
        validate_update_id(update_id)
        with self._immediate() as conn:
            return self._add_in(conn, update_id, body, received_at)

    def _add_in(
        self, conn: sqlite3.Connection, update_id: int, body: str, received_at: int
    ) -> bool:
        fingerprint = update_fingerprint(body)
        params = {
            "update_id": update_id,
            "body": body,
            "received_at": received_at,
            "fingerprint": fingerprint,
        }
        if conn.execute(self._sql.add, params).rowcount == 1:
            return True
        self._warn_if_different(conn, update_id, fingerprint)
        return False

    def _warn_if_different(
        self, conn: sqlite3.Connection, update_id: int, fingerprint: Optional[str]
    ) -> None:
        """After an insert that did not happen: log a different update held by a live row."""
        row = conn.execute(self._sql.stored_fingerprint, {"update_id": update_id}).fetchone()
        if row is not None:
            warn_conflict(update_id, row[0], fingerprint, str(row[1]), row[2])

    def add_many(self, rows: Sequence[Tuple[int, str, int]]) -> List[bool]:
        """Insert several ``(update_id, body, received_at)`` rows in one transaction.

        Args:
            rows: The rows to insert.

        Returns:
            List[:obj:`bool`]: Per row, :obj:`True` if inserted, :obj:`False` if the id existed
            (including an earlier row of the same batch).
        """
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        if not rows:
            return []
        with self._immediate() as conn:
            return [
                self._add_in(conn, update_id, body, received_at)
                for update_id, body, received_at in rows
            ]

    def add_claimed_many(
        self, rows: Sequence[Tuple[int, str, int]], *, lease_until: int
    ) -> List[Optional[AttemptIdentity]]:
        """Record fresh updates already claimed for attempt 1, in one transaction.

        For each ``(update_id, body, received_at)``: a new id is inserted as ``processing``
        with ``attempts = 1``, lease ``lease_until`` and a fresh claim id (read back with
        ``RETURNING``); an existing id is left alone and gives :obj:`None` (unless it holds a
        different, settled update, which is replaced as in :meth:`add`). Lets the
        receiving process record and claim a fresh update in one statement (optional
        capability).
        """
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        if not rows:
            return []
        lease_until = _int("lease_until", lease_until)
        with self._immediate() as conn:
            return self._add_claimed_in(conn, rows, lease_until)

    def _add_claimed_in(
        self, conn: sqlite3.Connection, rows: Sequence[Tuple[int, str, int]], lease_until: int
    ) -> List[Optional[AttemptIdentity]]:
        result: List[Optional[AttemptIdentity]] = []
        for update_id, body, received_at in rows:
            fingerprint = update_fingerprint(body)
            found = conn.execute(
                self._sql.add_claimed,
                {
                    "update_id": update_id,
                    "body": body,
                    "received_at": received_at,
                    "lease_until": lease_until,
                    "claim_id": _new_claim_id(),
                    "fingerprint": fingerprint,
                },
            ).fetchall()
            if not found:
                self._warn_if_different(conn, update_id, fingerprint)
            result.append(
                AttemptIdentity(update_id, int(found[0][0]), str(found[0][1])) if found else None
            )
        return result

    def add_claimed_and_settle_many(
        self,
        rows: Sequence[Tuple[int, str, int]],
        *,
        lease_until: int,
        settlements: Sequence[Tuple[AttemptIdentity, Settlement]],
    ) -> Tuple[List[Optional[AttemptIdentity]], List[bool]]:
        """:meth:`add_claimed_many` and :meth:`settle_owned_many` in one transaction (one
        commit): fresh updates and finished attempts that arrive together share a commit
        (optional capability)."""
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        settlements = list(settlements)
        lease_until = _int("lease_until", lease_until)
        with self._immediate() as conn:
            added = self._add_claimed_in(conn, rows, lease_until)
            landed = self._settle_owned_in(conn, settlements)
        return added, landed

    def _take(
        self,
        update_id: int,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool,
    ) -> Optional[AttemptIdentity]:
        params = {
            "update_id": update_id,
            "now": _int("now", now),
            "lease_until": _int("lease_until", lease_until),
            "max_attempts": _int("max_attempts", max_attempts),
            "durable": 1 if durable_exhaustion else 0,
            "claim_id": _new_claim_id(),
        }
        with self._immediate() as conn:
            rows = conn.execute(self._sql.claim, params).fetchall()
        if not rows or rows[0][0] != "processing":
            return None
        _, attempt, claim_id = rows[0]
        return AttemptIdentity(update_id, int(attempt), str(claim_id))

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[int]:
        """Take a claimable row for a new attempt (one conditional ``UPDATE``).

        If the row is claimable and ``attempts < max_attempts``, it becomes ``processing`` with
        a fresh claim id and lease ``lease_until``. If it is claimable but its attempts are
        spent, it is abandoned (an unacknowledged exhaustion when ``durable_exhaustion``).

        Args:
            update_id (:obj:`int`): The update to claim.
            now (:obj:`int`): The current time (epoch milliseconds).
            lease_until (:obj:`int`): The lease expiry of the new attempt.
            max_attempts (:obj:`int`): Attempts allowed in total.
            durable_exhaustion (:obj:`bool`, optional): Keep a spent row as an unacknowledged
                exhaustion (``settled_at`` NULL) instead of ordinary prunable history.

        Returns:
            :obj:`int` | :obj:`None`: The attempt number, or :obj:`None` for a spend, a live
            lease, a final row or an unknown id.
        """
        identity = self._take(update_id, now, lease_until, max_attempts, durable_exhaustion)
        return None if identity is None else identity.attempt

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """Extend the lease of ``attempt`` to at least ``lease_until``.

        A renewal never shortens a lease and, with ``now``, never revives an expired one
        (``due_at >= now`` is required).

        Returns:
            :obj:`bool`: :obj:`True` when the row matched (even if the lease stayed as it was).
        """
        params = {"update_id": update_id, "attempt": attempt, "lease_until": lease_until,
                  "now": now}
        with self._immediate() as conn:
            return bool(conn.execute(self._sql.renew, params).fetchall())

    def renew_many(
        self, leases: Sequence[Tuple[int, int]], lease_until: int, now: int
    ) -> List[bool]:
        """:meth:`renew` for many ``(update_id, attempt)`` pairs in one statement.

        Larger batches than SQLite's host-parameter limit are split into chunks, all in one
        transaction.

        Returns:
            List[:obj:`bool`]: Per input position, whether that lease matched.
        """
        leases = [(update_id, attempt) for update_id, attempt in leases]
        if not leases:
            return []
        matched: Set[Tuple[int, int]] = set()
        with self._immediate() as conn:
            per_statement = max(1, (_max_variables(conn) - 3) // 2)
            for start in range(0, len(leases), per_statement):
                chunk = leases[start : start + per_statement]
                params: List[Any] = [lease_until, lease_until]
                for update_id, attempt in chunk:
                    params += (update_id, attempt)
                params.append(now)
                for row in conn.execute(self._sql.renew_many(len(chunk)), params).fetchall():
                    matched.add((row[0], row[1]))
        return [lease in matched for lease in leases]

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Record the result of ``attempt`` if it holds a lease unexpired at ``settlement.at``.

        :class:`~ptb_fence.Completed` and :class:`~ptb_fence.Abandoned` make the row final
        (``settled_at = at``); :class:`~ptb_fence.Failed` makes it due at ``retry_at``. A settle
        that does not land is ignored.
        """
        statement = self._settle_statement(settlement, owned=False)
        with self._immediate() as conn:
            conn.execute(statement, self._settle_params(update_id, attempt, settlement, None))

    def _settle_statement(self, settlement: Settlement, *, owned: bool) -> str:
        sql = self._sql
        if isinstance(settlement, Completed):
            return sql.settle_completed_owned if owned else sql.settle_completed
        if isinstance(settlement, Failed):
            return sql.settle_failed_owned if owned else sql.settle_failed
        if isinstance(settlement, Abandoned):
            return sql.settle_abandoned_owned if owned else sql.settle_abandoned
        raise TypeError(
            f"not a settlement: {settlement!r} (use Completed, Failed or Abandoned)"
        )

    @staticmethod
    def _settle_params(
        update_id: int, attempt: int, settlement: Settlement, claim_id: Optional[str]
    ) -> Dict[str, Any]:
        return {
            "update_id": update_id,
            "attempt": attempt,
            "claim_id": claim_id,
            "at": settlement.at,
            "retry_at": getattr(settlement, "retry_at", None),
            "error": getattr(settlement, "error", None),
        }

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """Rows to hand over, ordered by ``update_id``, at most ``limit``.

        Pending rows with ``received_at <= pending_before``, failed rows with ``due_at <= now``
        and processing rows whose lease lapsed (``due_at < now``).
        """
        with self._using() as conn:
            rows = conn.execute(
                self._sql.due,
                {"now": now, "pending_before": pending_before, "limit": max(int(limit), 0)},
            ).fetchall()
        return [StoredUpdate(int(update_id), body) for update_id, body in rows]

    def prune(self, before: int) -> int:
        """Delete completed and abandoned rows with ``settled_at < before``.

        Pending, processing and failed rows and unacknowledged exhaustions are never pruned.

        Returns:
            :obj:`int`: The number of rows deleted.
        """
        with self._immediate() as conn:
            return int(conn.execute(self._sql.prune, {"before": before}).rowcount)

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

        The claim id is read back from the row (``RETURNING``), not remembered by the client.

        Returns:
            :class:`~ptb_fence.AttemptIdentity` | :obj:`None`: The identity, or :obj:`None` when
            the update was not taken.
        """
        return self._take(update_id, now, lease_until, max_attempts, durable_exhaustion)

    def renew_owned(
        self, identity: AttemptIdentity, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """As :meth:`renew`, and the claim id must match.

        Returns:
            :obj:`bool`: :obj:`True` when this exact claim's row matched.
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "lease_until": lease_until,
            "now": now,
        }
        with self._immediate() as conn:
            return bool(conn.execute(self._sql.renew_owned, params).fetchall())

    def renew_owned_many(
        self, identities: Sequence[AttemptIdentity], lease_until: int, now: int
    ) -> List[bool]:
        """:meth:`renew_owned` for many identities in one statement (chunked like
        :meth:`renew_many`).

        Returns:
            List[:obj:`bool`]: Per input position, whether that claim's lease matched.
        """
        keys = [(i.update_id, i.attempt, i.claim_id) for i in identities]
        if not keys:
            return []
        matched: Set[Tuple[int, int, str]] = set()
        with self._immediate() as conn:
            per_statement = max(1, (_max_variables(conn) - 3) // 3)
            for start in range(0, len(keys), per_statement):
                chunk = keys[start : start + per_statement]
                params: List[Any] = [lease_until, lease_until]
                for key in chunk:
                    params += key
                params.append(now)
                statement = self._sql.renew_owned_many(len(chunk))
                for row in conn.execute(statement, params).fetchall():
                    matched.add((row[0], row[1], row[2]))
        return [key in matched for key in keys]

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """:obj:`True` only while this exact claim holds a lease unexpired at ``at``.

        Without ``connection`` the answer is advisory (it may change right after). With
        ``connection`` — the caller's :class:`sqlite3.Connection` to the same file, or a cursor
        of one — the check runs on it, inside the caller's transaction, and nothing is
        committed. If that connection is not in a transaction yet, one is started with
        ``BEGIN IMMEDIATE``; if it is, the check first takes the write lock inside it (a write
        that changes nothing). Either way the caller then holds the database's write lock, so
        no claim can take the update over until the caller commits or rolls back.

        Raises:
            TypeError: ``connection`` is not a sqlite3 connection or cursor.
            ValueError: ``connection`` is open on another database file.
            sqlite3.OperationalError: ``database is locked``: the write lock was not free within
                the busy timeout, or the caller's transaction read data that another connection
                has changed since (roll back and start again).
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": at,
        }
        if connection is None:
            with self._using() as conn:
                return conn.execute(self._sql.owns, params).fetchone() is not None
        conn = self._caller_connection(connection)
        self._join(conn)
        return conn.execute(self._sql.owns, params).fetchone() is not None

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        """As :meth:`settle`, and the claim id must match.

        With ``connection`` (the caller's sqlite3 connection or cursor, same file) the update
        runs inside the caller's transaction (joined as in :meth:`owns`) and is NOT
        committed: it lands with the caller's commit.

        Returns:
            :obj:`bool`: Whether the settlement landed.
        """
        statement = self._settle_statement(settlement, owned=True)
        params = self._settle_params(
            identity.update_id, identity.attempt, settlement, identity.claim_id
        )
        if connection is not None:
            conn = self._caller_connection(connection)
            self._join(conn)
            return bool(conn.execute(statement, params).fetchall())
        with self._immediate() as conn:
            return bool(conn.execute(statement, params).fetchall())

    def settle_owned_many(
        self, items: Sequence[Tuple[AttemptIdentity, Settlement]]
    ) -> List[bool]:
        """:meth:`settle_owned` for several attempts in one transaction (one commit).

        Returns:
            List[:obj:`bool`]: Per input position, whether that settlement landed.
        """
        items = list(items)
        if not items:
            return []
        with self._immediate() as conn:
            return self._settle_owned_in(conn, items)

    def _settle_owned_in(
        self, conn: sqlite3.Connection, items: Sequence[Tuple[AttemptIdentity, Settlement]]
    ) -> List[bool]:
        landed = []
        for identity, settlement in items:
            statement = self._settle_statement(settlement, owned=True)
            params = self._settle_params(
                identity.update_id, identity.attempt, settlement, identity.claim_id
            )
            landed.append(bool(conn.execute(statement, params).fetchall()))
        return landed

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction on this thread's connection to the store's file.

        Starts ``BEGIN IMMEDIATE``, yields the :class:`sqlite3.Connection` (``?`` placeholders,
        autocommit mode outside the block), commits on normal exit and rolls back (and
        re-raises) on an exception. Do not commit or roll back the yielded connection
        yourself. While the block runs, this thread cannot call the store's own write methods
        (pass ``connection=`` to :meth:`owns` and :meth:`settle_owned` instead); other threads
        and processes wait for the write lock.

        Raises:
            RuntimeError: A transaction is already open on this thread.
        """
        with self._using() as conn:
            if conn.in_transaction:
                raise RuntimeError(
                    "SQLiteUpdateStore.transaction() is already open on this thread; nested "
                    "transactions are not supported"
                )
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                _rollback(conn)
                raise
            if conn.in_transaction:
                try:
                    conn.execute("COMMIT")
                except BaseException:
                    _rollback(conn)
                    raise

    # -- durable contract ------------------------------------------------------------------
    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        """Turn the exact live claim (lease unexpired at ``at``) into an unacknowledged
        exhaustion: abandoned, ``due_at = at``, ``settled_at`` NULL, ``error`` kept.

        Returns:
            :obj:`bool`: Whether the claim was still live and was exhausted.
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": at,
            "error": error,
        }
        with self._immediate() as conn:
            return bool(conn.execute(self._sql.exhaust, params).fetchall())

    def due_exhaustions(
        self, *, limit: int, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        """Unacknowledged exhaustions with ``update_id > after_update_id``, by ``update_id``,
        at most ``limit``."""
        with self._using() as conn:
            rows = conn.execute(
                self._sql.due_exhaustions,
                {"after": after_update_id, "limit": max(int(limit), 0)},
            ).fetchall()
        return [
            Exhaustion(
                update_id=int(update_id),
                attempt=int(attempt),
                claim_id=claim_id,
                body=body,
                exhausted_at=due_at,
                error=error,
            )
            for update_id, attempt, claim_id, body, due_at, error in rows
        ]

    def acknowledge_exhaustion(self, identity: AttemptIdentity, at: int) -> bool:
        """Acknowledge the exhaustion with exactly this identity; it becomes prunable history.

        Returns:
            :obj:`bool`: :obj:`True` once; :obj:`False` for a wrong identity or a second call.
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": at,
        }
        with self._immediate() as conn:
            return bool(conn.execute(self._sql.ack_exhaustion, params).fetchall())
