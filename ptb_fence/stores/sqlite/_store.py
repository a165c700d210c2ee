"""SQLiteUpdateStore: the embedded default store (one file, many threads, several processes),
whole in one class.

Sections: construction and lifecycle, the base contract, the fenced contract, the durable
contract, chat order, release and liveness, figures, the outbox. Its collaborators: the per-thread connections
(``_connections``), the schema steps (``_schema``), the statements several methods share
(``_writes``), the lock-file liveness holder (``_liveness``) and all its SQL (``_sql``).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
import uuid
from typing import (
    Any,
    ContextManager,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)

from ptb_fence._errors import StateConflictError, TableBotMismatch
from ptb_fence.contract import ChatKey, ClaimTerms
from ptb_fence._values import (
    AttemptEffects,
    AttemptIdentity,
    Completed,
    Exhaustion,
    Landing,
    OutboxEntry,
    Settlement,
    StateConflict,
    StateEntry,
    StateKey,
    StateWrite,
    StoreFigures,
    StoredUpdate,
)
from ptb_fence.stores._figures_sql import figures_of
from ptb_fence.stores._names import validate_table_name, validate_update_id
from ptb_fence.stores._outbox_sql import counts_of, effects_params, entry_of, sender_pattern
from ptb_fence.stores._state_sql import check_kind, check_writes, entries_of
from ptb_fence.stores._suspects import SuspectClaims
from ptb_fence.stores.sqlite._connections import SQLiteConnections
from ptb_fence.stores.sqlite._sent_journal import SentJournal, SentRow, fold_order
from ptb_fence.stores.sqlite._liveness import (
    FileLiveness,
    close_fd,
    lock_directory,
    lock_if_dead,
    make_directory,
    new_lock_file,
    unlink,
)
from ptb_fence.stores.sqlite._schema import ensure_schema
from ptb_fence.stores.sqlite._sql import SQLiteStatements
from ptb_fence.stores.sqlite._writes import (
    add_claimed_in,
    add_in,
    claim_params,
    insert_calls,
    int_arg,
    max_variables,
    settle_owned_in,
    settle_params,
    settle_statement,
    take,
    read_state_in,
    write_state_in,
)

__all__ = ["SQLiteUpdateStore"]

_LOGGER = logging.getLogger("ptb_fence.store")

_MIN_SQLITE = (3, 35, 0)  # UPDATE … RETURNING (3.35), UPDATE … FROM (3.33)
_SYNCHRONOUS = ("NORMAL", "FULL")

_S = TypeVar("_S", bound="SQLiteUpdateStore")


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
            now = int(time.time() * 1000)
            store.add(7, '{"update_id": 7}', now)
            identity = store.claim_owned(7, now=now, lease_until=now + 120_000, max_attempts=5)
            with store.transaction() as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS replies (update_id, text)")
                if not store.owns(identity, now, connection=conn):
                    raise OwnershipLost(identity)
                conn.execute("INSERT INTO replies VALUES (?, ?)", (identity.update_id, "hi"))

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
        "__weakref__", "_conns", "_journal", "_liveness", "_sql", "_suspects", "_table"
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
        if (
            isinstance(busy_timeout, bool)
            or not isinstance(busy_timeout, (int, float))
            or not busy_timeout > 0
            or busy_timeout == float("inf")
        ):
            raise ValueError(
                f"busy_timeout must be a positive number of seconds, got {busy_timeout!r}"
            )
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
        path = os.path.abspath(raw)
        self._liveness = FileLiveness()
        self._suspects = SuspectClaims()
        self._sql = SQLiteStatements(self._table)
        # sent calls recorded at once, whatever transaction holds the write lock
        self._journal = SentJournal(path, synchronous.upper(), float(busy_timeout))
        self._conns = SQLiteConnections(
            path,
            f"SQLiteUpdateStore({path!r}, table={self._table!r})",
            synchronous.upper(),
            float(busy_timeout),
        )
        try:
            ensure_schema(self._conns, self._sql, self._table)
        except BaseException:
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """:obj:`str`: The absolute path of the database file."""
        return self._conns.path

    @property
    def table(self) -> str:
        """:obj:`str`: The table name."""
        return self._table

    def close(self) -> None:
        """Stop holding liveness (:meth:`release_liveness`), then close every connection the
        store opened (from all threads). Idempotent.

        A connection another thread is using right now (a statement, or an open
        :meth:`transaction` block) is never closed under it: that call finishes normally and
        its thread closes the connection when the call ends. ``close()`` waits up to 5 seconds
        for such calls, then returns. Calls that start after ``close()`` raise
        :exc:`RuntimeError`.
        """
        try:
            self.release_liveness()
        except Exception:  # the file may be unwritable or closed: the lock ends with the fd
            pass
        self._conns.close()
        self._journal.close()

    def __enter__(self: _S) -> _S:
        """Return the store itself."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close the store (see :meth:`close`)."""
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._conns.path!r}, table={self._table!r})"

    # -- base contract ---------------------------------------------------------------------
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
        with self._conns.immediate() as conn:
            conn.execute(self._sql.create_meta)
            conn.execute(self._sql.bind_bot, params)
            row = conn.execute(self._sql.bot_of, params).fetchone()
        owner = int(row[0])
        if owner != bot_id:
            raise TableBotMismatch(self._table, repr(self._conns.path), owner, bot_id)

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
            ``ptb_fence.store``.
        """
        validate_update_id(update_id)
        with self._conns.immediate() as conn:
            return add_in(self._sql, conn, update_id, body, received_at)

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
        with self._conns.immediate() as conn:
            return [
                add_in(self._sql, conn, update_id, body, received_at)
                for update_id, body, received_at in rows
            ]

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
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        identity = take(
            self._conns, self._sql, update_id, terms, self._liveness.mine(),
            self._sql.claim_counted,
        )
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
        with self._conns.immediate() as conn:
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
        with self._conns.immediate() as conn:
            per_statement = max(1, (max_variables(conn) - 3) // 2)
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
        statement = settle_statement(self._sql, settlement, owned=False)
        with self._conns.immediate() as conn:
            conn.execute(statement, settle_params(update_id, attempt, settlement, None))

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """Rows to hand over, ordered by ``update_id``, at most ``limit``.

        Pending rows with ``received_at <= pending_before``, released rows (pending with a
        claim id, see :meth:`~ptb_fence.SQLiteUpdateStore.release_many`) whatever
        ``pending_before``, failed rows with ``due_at <= now`` and processing rows whose lease
        lapsed (``due_at < now``).
        """
        with self._conns.using() as conn:
            rows = conn.execute(
                self._sql.due,
                {"now": now, "pending_before": pending_before, "limit": max(int(limit), 0)},
            ).fetchall()
        return [StoredUpdate(int(update_id), body) for update_id, body in rows]

    def prune(self, before: int) -> int:
        """Delete completed and abandoned rows with ``settled_at < before``.

        Pending, processing and failed rows and unacknowledged exhaustions are never pruned.
        In the same transaction the outbox loses its sent calls with ``sent_at < before`` and
        its acknowledged failed calls with ``due_at < before``, and the persisted state its
        callback-data keyboards (kind ``callback``) written before ``before`` (neither
        counted; no other state is pruned).

        Returns:
            :obj:`int`: The number of update rows deleted.
        """
        with self._conns.immediate() as conn:
            conn.execute(self._sql.outbox.prune, {"before": before})
            conn.execute(self._sql.state.prune, {"before": before})
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
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        return take(
            self._conns, self._sql, update_id, terms, self._liveness.mine(),
            suspects=self._suspects,
        )

    def claim_owned_many(
        self, update_ids: Sequence[int], terms: ClaimTerms
    ) -> List[Optional[AttemptIdentity]]:
        """:meth:`claim_owned` for each id in one statement (one transaction).

        Returns:
            List[:class:`~ptb_fence.AttemptIdentity` | :obj:`None`]: Per input position, the
            identity the row was claimed with, or :obj:`None` where ``claim_owned`` gives
            :obj:`None` (not claimable, attempts spent, unknown) and at the later positions of
            an id repeated in ``update_ids``.
        """
        ids = [validate_update_id(update_id) for update_id in update_ids]
        if not ids:
            return []
        with self._conns.immediate() as conn:
            return self._claim_many_in(conn, ids, terms)

    def _claim_many_in(
        self, conn: sqlite3.Connection, ids: List[int], terms: ClaimTerms
    ) -> List[Optional[AttemptIdentity]]:
        """The claims of :meth:`claim_owned_many` on ``conn``, inside its open transaction."""
        distinct = list(dict.fromkeys(ids))
        if not distinct:
            return []
        params = claim_params(terms, self._liveness.mine())
        params["ids"] = json.dumps(distinct)
        rows = conn.execute(self._sql.claim_owned_many, params).fetchall()
        taken: Dict[int, AttemptIdentity] = {}
        for update_id, state, attempts, claim_id, suspicion in rows:
            if state == "processing":
                identity = AttemptIdentity(int(update_id), int(attempts), str(claim_id))
                taken[identity.update_id] = identity
                self._suspects.note(identity, int(suspicion))
        result: List[Optional[AttemptIdentity]] = []
        for update_id in ids:
            result.append(taken.pop(update_id, None))
        return result

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
        with self._conns.immediate() as conn:
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
        with self._conns.immediate() as conn:
            per_statement = max(1, (max_variables(conn) - 3) // 3)
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
        lease_until = int_arg("lease_until", lease_until)
        with self._conns.immediate() as conn:
            return add_claimed_in(self._sql, conn, rows, lease_until, self._liveness.mine())

    def add_claimed_and_settle_many(
        self,
        rows: Sequence[Tuple[int, str, int]],
        *,
        lease_until: int,
        settlements: Sequence[Tuple[AttemptIdentity, Settlement]],
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    ) -> Tuple[List[Optional[AttemptIdentity]], List[Landing]]:
        """:meth:`add_claimed_many` and :meth:`settle_owned_many` (with its ``effects``) in one
        transaction (one commit): fresh updates and finished attempts that arrive together
        share a commit (optional capability)."""
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        settlements = list(settlements)
        lease_until = int_arg("lease_until", lease_until)
        with self._conns.immediate() as conn:
            added = add_claimed_in(self._sql, conn, rows, lease_until, self._liveness.mine())
            landed = settle_owned_in(self._sql, conn, settlements, effects)
        return added, landed

    def settle_and_claim_many(
        self,
        settlements: Sequence[Tuple[AttemptIdentity, Settlement]],
        update_ids: Sequence[int],
        terms: ClaimTerms,
        *,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    ) -> Tuple[List[Landing], List[Optional[AttemptIdentity]]]:
        """:meth:`settle_owned_many` (with its ``effects``), then :meth:`claim_owned_many`, in
        one transaction (one commit): the slots that completions free are claimed in the
        commit that frees them (optional capability).

        Returns:
            Per settlement whether it landed, and per ``update_ids`` position what
            :meth:`claim_owned_many` gives.
        """
        ids = [validate_update_id(update_id) for update_id in update_ids]
        settlements = list(settlements)
        if not ids and not settlements:
            return [], []
        with self._conns.immediate() as conn:
            landed = settle_owned_in(self._sql, conn, settlements, effects) if settlements else []
            return landed, self._claim_many_in(conn, ids, terms)

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
            with self._conns.using() as conn:
                return conn.execute(self._sql.owns, params).fetchone() is not None
        conn = self._conns.caller_connection(connection)
        self._conns.join(conn, self._sql.write_lock)
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
        statement = settle_statement(self._sql, settlement, owned=True)
        params = settle_params(
            identity.update_id, identity.attempt, settlement, identity.claim_id
        )
        if connection is not None:
            conn = self._conns.caller_connection(connection)
            self._conns.join(conn, self._sql.write_lock)
            return bool(conn.execute(statement, params).fetchall())
        with self._conns.immediate() as conn:
            return bool(conn.execute(statement, params).fetchall())

    def complete_owned(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Inside the caller's transaction on ``connection`` (a :class:`sqlite3.Connection` or
        cursor on this file; ``BEGIN IMMEDIATE`` first if none is open): complete this exact
        claim at ``at`` if its lease holds at ``at`` (``due_at >= at``), in one ``UPDATE``
        that takes the database's write lock until the caller's transaction ends. Nothing is
        committed: the caller's rollback restores the claim (optional capability,
        :class:`ptb_fence.CompletingUpdateStore`).

        Returns:
            :obj:`bool`: Whether the claim was owned at ``at`` and is now completed in the
            caller's transaction.
        """
        conn = self._conns.caller_connection(connection)
        if not conn.in_transaction:
            conn.execute("BEGIN IMMEDIATE")
        params = settle_params(
            identity.update_id, identity.attempt, Completed(at), identity.claim_id
        )
        return bool(conn.execute(self._sql.settle_completed_owned, params).fetchall())

    def reopen_completed(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Undo a :meth:`complete_owned` at ``at`` that the caller committed itself: the row
        of this exact claim, ``completed`` with ``settled_at = at``, goes back to
        ``processing`` (lease kept); committed at once on ``connection``.

        Returns:
            :obj:`bool`: Whether that completion was undone.
        """
        conn = self._conns.caller_connection(connection)
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": at,
        }
        if not conn.in_transaction:
            conn.execute("BEGIN IMMEDIATE")
        try:
            undone = bool(conn.execute(self._sql.reopen_completed, params).fetchall())
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        return undone

    def settle_owned_many(
        self,
        items: Sequence[Tuple[AttemptIdentity, Settlement]],
        *,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    ) -> List[Landing]:
        """:meth:`settle_owned` for several attempts in one transaction (one commit).

        With ``effects``, the outbox calls of each settlement that lands and is
        :class:`~ptb_fence.Completed` are inserted in the same transaction (pending, due at
        the settlement's ``at``); a settle that does not land writes none (see
        :class:`ptb_fence.OutboxStore`). Its state writes land with it in a savepoint, all or
        none: a moved version leaves the item claimed and unsettled (see
        :class:`ptb_fence.StateStore`).

        Returns:
            List[:obj:`bool` | :class:`~ptb_fence.StateConflict`]: Per input position,
            whether that settlement landed, or the conflict that stopped it.
        """
        items = list(items)
        if not items:
            return []
        with self._conns.immediate() as conn:
            return settle_owned_in(self._sql, conn, items, effects)

    def transaction(self) -> ContextManager[sqlite3.Connection]:
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
        return self._conns.transaction()

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
        with self._conns.immediate() as conn:
            return bool(conn.execute(self._sql.exhaust, params).fetchall())

    def due_exhaustions(
        self, *, limit: int, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        """Unacknowledged exhaustions with ``update_id > after_update_id``, by ``update_id``,
        at most ``limit``."""
        with self._conns.using() as conn:
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

    def acknowledge_exhaustion(
        self, identity: AttemptIdentity, at: int, *, effects: Optional[AttemptEffects] = None
    ) -> bool:
        """Acknowledge the exhaustion with exactly this identity; it becomes prunable history.
        With ``effects``, their outbox calls are inserted as pending in the same commit, only
        when it acknowledges (see :class:`ptb_fence.OutboxStore`).

        Returns:
            :obj:`bool`: :obj:`True` once; :obj:`False` for a wrong identity or a second call.
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": at,
        }
        with self._conns.immediate() as conn:
            acknowledged = bool(conn.execute(self._sql.ack_exhaustion, params).fetchall())
            if acknowledged and effects is not None and effects.calls:
                insert_calls(self._sql, conn, effects_params(identity, effects, at))
            return acknowledged

    # -- chat order ------------------------------------------------------------------------
    def add_many_in_chats(
        self, rows: Sequence[Tuple[int, str, int, Optional[int]]]
    ) -> List[bool]:
        """Insert ``(update_id, body, received_at, chat_key)`` rows as pending in one
        transaction, recording each chat key (optional capability, see
        :class:`ptb_fence.ChatOrderedUpdateStore`).

        Returns:
            List[:obj:`bool`]: Per row, as :meth:`add_many`.
        """
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        if not rows:
            return []
        result: List[bool] = []
        with self._conns.immediate() as conn:
            for update_id, body, received_at, chat_key in rows:
                added = add_in(self._sql, conn, update_id, body, received_at)
                if added and chat_key is not None:
                    conn.execute(
                        self._sql.chat.set_key,
                        {"update_id": update_id, "chat_key": int_arg("chat_key", chat_key)},
                    )
                result.append(added)
        return result

    def claim_in_chat_order(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """As :meth:`claim_owned`, in the same one statement, only when the row is its chat's
        turn at ``now`` (optional capability, see :class:`ptb_fence.ChatOrderedUpdateStore`).
        """
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        return take(
            self._conns, self._sql, update_id, terms, self._liveness.mine(),
            self._sql.chat.claim, suspects=self._suspects,
        )

    def due_in_chat_order(
        self, *, now: int, pending_before: int, limit: int, chat_key: Optional[int] = None
    ) -> List[StoredUpdate]:
        """As :meth:`due`, listing only rows that are their chat's turn at ``now`` (with
        ``chat_key``: of that chat only), in one statement."""
        params = {
            "now": int_arg("now", now),
            "pending_before": int_arg("pending_before", pending_before),
            "limit": max(int(limit), 0),
            "chat_key": chat_key,
        }
        sql = self._sql.chat.due if chat_key is None else self._sql.chat.due_of_chat
        with self._conns.using() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [StoredUpdate(int(update_id), body) for update_id, body in rows]

    def unkeyed_in_chats(
        self, *, after_update_id: Optional[int] = None, limit: int
    ) -> List[StoredUpdate]:
        """Unsettled rows (pending, processing, failed) without a chat key, by ``update_id``,
        after ``after_update_id`` (see :class:`ptb_fence.ChatOrderedUpdateStore`)."""
        params = {
            "after": -1 if after_update_id is None else int_arg("after_update_id", after_update_id),
            "limit": max(int(limit), 0),
        }
        with self._conns.using() as conn:
            rows = conn.execute(self._sql.chat.unkeyed, params).fetchall()
        return [StoredUpdate(int(update_id), body) for update_id, body in rows]

    def set_chat_keys(self, keys: Sequence[ChatKey]) -> int:
        """For ``(update_id, body, chat_key)``: record the chat key of the row if it has none,
        is unsettled and holds exactly ``body``; one transaction. Returns how many were set."""
        keys = list(keys)
        if not keys:
            return 0
        done = 0
        with self._conns.immediate() as conn:
            for update_id, body, chat_key in keys:
                params = {
                    "update_id": int_arg("update_id", update_id),
                    "body": body,
                    "chat_key": int_arg("chat_key", chat_key),
                }
                done += conn.execute(self._sql.chat.fill_key, params).rowcount
        return done

    # -- release and liveness --------------------------------------------------------------
    # Liveness is a lock file per instance, held by ``self._liveness`` (a FileLiveness); what
    # proves an instance dead, and why, is in the docstring of ``_liveness``.
    def release_many(self, identities: Sequence[AttemptIdentity], *, at: int) -> List[bool]:
        """Give the exact claims back in one statement (one transaction): each row that is
        ``processing`` with that attempt and claim id becomes ``pending`` with ``attempts - 1``
        and ``due_at = at`` (``error`` and ``claim_id`` kept), claimable by any process at once
        and listed by ``due`` whatever ``pending_before`` (optional capability, see
        :class:`ptb_fence.ReleasingUpdateStore`).

        Returns:
            List[:obj:`bool`]: Per input position, whether that claim was released (an
            identity repeated in the input is released once, at its first position).
        """
        at = int_arg("at", at)
        keys = [(i.update_id, i.attempt, i.claim_id) for i in identities]
        if not keys:
            return []
        released: Set[Tuple[int, int, str]] = set()
        with self._conns.immediate() as conn:
            per_statement = max(1, (max_variables(conn) - 1) // 3)
            for start in range(0, len(keys), per_statement):
                chunk = keys[start : start + per_statement]
                params: List[Any] = [at]
                for key in chunk:
                    params += key
                for row in conn.execute(self._sql.release_many(len(chunk)), params).fetchall():
                    released.add((int(row[0]), int(row[1]), str(row[2])))
        result: List[bool] = []
        for key in keys:
            result.append(key in released)
            released.discard(key)
        return result

    def hold_liveness(self) -> str:
        """Start holding this store object's liveness (idempotent) and return its instance id.

        Takes an exclusive ``flock`` on ``<database>.instances/<instance>.lock`` (the directory
        is created when missing, with the group and permissions of the database's directory;
        the file is readable by others and names the instance) and records the instance in
        ``ptb_fence_instances``. Claims made through this object from now on record the
        instance (optional capability, see :class:`ptb_fence.LivenessStore`).
        """
        holder = self._liveness
        with holder.lock:
            holder.forget_inherited()
            if holder.instance is not None:
                return holder.instance
            instance = uuid.uuid4().hex
            self._hold(instance)
            holder.instance, holder.pid = instance, os.getpid()
            return instance

    def _hold(self, instance: str) -> None:
        """Lock a new lock file of ``instance``, then write its row (in that order)."""
        holder = self._liveness
        directory = lock_directory(self._conns.path)
        make_directory(directory)
        old = new_lock_file(directory, instance, holder)
        try:
            params = {
                "table": self._table,
                "instance": instance,
                "lock_path": holder.lock_path,  # for people: checkers find it themselves
                "started_at": int(time.time() * 1000),
            }
            with self._conns.immediate() as conn:
                conn.execute(self._sql.create_instances)
                conn.execute(self._sql.insert_instance, params)
        except BaseException:
            if old is None:  # a first hold: no instance, no file
                assert holder.lock_path is not None
                unlink(holder.lock_path)
                holder.close_fd(holder.fd)
                holder.lock_path = None
            else:  # holding again: the new file is in place and locked; the row is there
                holder.close_fd(old)
            raise
        holder.close_fd(old)

    def _keep_liveness(self) -> None:
        """If this process's lock file was removed or replaced (by someone, or by another
        process that took the instance for dead), hold the instance again at once."""
        holder = self._liveness
        with holder.lock:
            if holder.mine() is None or holder.fd is None:
                return
            try:
                if os.fstat(holder.fd).st_nlink > 0:
                    return
            except OSError:
                pass
            assert holder.instance is not None
            self._hold(holder.instance)

    def release_liveness(self) -> None:
        """Stop holding liveness (graceful stop; also done by :meth:`close`): delete the
        instance's row, then drop its file lock and remove the lock file. Idempotent."""
        holder = self._liveness
        with holder.lock:
            holder.forget_inherited()
            if holder.instance is None:
                return
            instance, fd, lock_path = holder.instance, holder.fd, holder.lock_path
            holder.instance = holder.lock_path = None
            try:
                with self._conns.immediate() as conn:
                    conn.execute(
                        self._sql.delete_instance, {"table": self._table, "instance": instance}
                    )
            finally:
                if lock_path is not None:
                    unlink(lock_path)
                holder.close_fd(fd)

    def _dead_instances(self, rows: List[Any]) -> List[Tuple[str, str, int]]:
        """Of the listed ``(instance, lock_path)`` rows, the provably dead instances: their
        lock file (next to this process's path to the database), and the descriptor now
        locking it. A lock file this process cannot open is skipped with one WARNING."""
        holder = self._liveness
        directory = lock_directory(self._conns.path)
        dead: List[Tuple[str, str, int]] = []
        for row in rows:
            instance = str(row[0])
            lock_path = os.path.join(directory, instance + ".lock")
            try:
                fd = lock_if_dead(lock_path, instance)
            except OSError as exc:
                if instance not in holder.unreadable:
                    holder.unreadable.add(instance)
                    _LOGGER.warning(
                        "cannot check whether instance %s is alive: %s. Its claims are taken "
                        "over only when their lease ends. Make the lock files of every process "
                        "sharing %s readable by every other (the same OS user, or a shared "
                        "group with umask 002 or 022).",
                        instance, exc, self._conns.path,
                    )
                continue
            if fd is not None:
                dead.append((instance, lock_path, fd))
        return dead

    def take_over_dead(self, *, now: int) -> int:
        """Make the claims of provably dead instances claimable at ``now`` and forget them.

        An instance of this table (not this object's own) is dead when its lock file, found
        next to this process's path to the database, names it and can be locked; a missing,
        replaced or unreadable lock file proves nothing (one WARNING per unreadable file).
        First holds this object's own instance again if its lock file was removed. Of a dead
        instance's ``processing`` rows, one whose claim was marked isolated
        (:meth:`mark_isolated`: its handler ran there alone or on probation, so the crash is
        its own) gets ``due_at = now - 1`` (never later than before; attempts and claim id
        kept); every other row is given back (``pending``, ``attempts - 1``, ``due_at = now``,
        claim id kept; listed by ``due`` at once) and becomes suspect, or suspect again when
        its handler had started there as a suspect. Any process can claim them at
        once; the instance's row is deleted — all in one transaction (optional capabilities,
        see :class:`ptb_fence.LivenessStore` and :class:`ptb_fence.IsolatingUpdateStore`).

        Returns:
            :obj:`int`: How many rows were made claimable.
        """
        now = int_arg("now", now)
        self._keep_liveness()
        mine = {"table": self._table, "me": self._liveness.instance}  # a parent's too
        with self._conns.using() as conn:  # a read first: no write lock when nobody is dead
            if conn.execute(self._sql.instances_table_exists).fetchone() is None:
                return 0
            rows = conn.execute(self._sql.instances_of, mine).fetchall()
        locked: List[Tuple[str, str, int]] = []
        count = 0
        try:
            locked = self._dead_instances(rows)
            if not locked:
                return 0
            with self._conns.immediate() as conn:
                for instance, _path, _fd in locked:
                    params: Dict[str, Any] = {
                        "table": self._table, "instance": instance, "now": now,
                    }
                    count += len(conn.execute(self._sql.take_over, params).fetchall())
                    count += self._take_over_calls(conn, instance, now)
                    conn.execute(self._sql.delete_instance, params)
            for _instance, lock_path, _fd in locked:  # forgotten: its file goes too
                unlink(lock_path)
        finally:
            for _instance, _path, fd in locked:
                close_fd(fd)
        return count

    def claimed_suspect(self, identity: AttemptIdentity) -> int:
        """The suspicion of the row ``identity`` took, a claim made through this object in
        this process: 0, 1 (a dead instance held it) or 2 (its handler had started there as
        a suspect). Read back by the claim statement itself: no statement here; answered once
        per claim (optional capability, see :class:`ptb_fence.IsolatingUpdateStore`)."""
        return self._suspects.take(identity)

    def mark_isolated(self, identity: AttemptIdentity, *, at: int) -> bool:
        """Record, committed, that the handler of this exact live claim starts now on
        probation or alone (``isolated_claim = claim_id``), so that :meth:`take_over_dead`
        counts its attempt as spent if the process dies (optional capability, see
        :class:`ptb_fence.IsolatingUpdateStore`).

        Returns:
            :obj:`bool`: Whether it landed (the row is ``processing`` with this attempt and
            claim id and ``due_at >= at``).
        """
        return self._isolation(self._sql.mark_isolated, identity, at)

    def end_probation(self, identity: AttemptIdentity, *, at: int) -> bool:
        """Record, committed, that the handler of this exact live claim, marked by
        :meth:`mark_isolated`, ran past its probation: a crash from now on is not charged to
        it alone (optional capability, see :class:`ptb_fence.IsolatingUpdateStore`).

        Returns:
            :obj:`bool`: Whether it landed (the claim is live at ``at`` and marked).
        """
        return self._isolation(self._sql.end_probation, identity, at)

    def _isolation(self, sql: str, identity: AttemptIdentity, at: int) -> bool:
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": int_arg("at", at),
        }
        with self._conns.immediate() as conn:
            return bool(conn.execute(sql, params).fetchall())

    @property
    def instance(self) -> Optional[str]:
        """:obj:`str` | :obj:`None`: The instance id while this object holds liveness (in
        this process)."""
        return self._liveness.mine()

    # -- figures ---------------------------------------------------------------------------
    def figures(self) -> StoreFigures:
        """What waits in the table, for operators, in one read-only ``SELECT`` (one snapshot;
        optional capability, see :class:`ptb_fence.FiguresStore`): the unsettled rows and the
        oldest ``received_at`` among them, the unacknowledged exhaustions and the oldest
        ``due_at`` among them, and the chat held longest by one update. It reads only the
        waiting rows (and the abandoned ones) through the table's indexes, never the completed
        history."""
        with self._conns.using() as conn:
            row = conn.execute(self._sql.figures).fetchone()
        return figures_of(row)

    # -- outbox ----------------------------------------------------------------------------
    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        """Inside the caller's transaction on ``connection`` (a :class:`sqlite3.Connection`
        or cursor on this file; joined as in :meth:`owns`): insert the outbox calls of
        ``effects`` as pending at ``at``. Nothing is committed: the caller's commit lands
        them, its rollback discards them (optional capability, see
        :class:`ptb_fence.OutboxStore`).

        Returns:
            List[:obj:`int`]: The call ids, in order.
        """
        writes = check_writes(effects.state)
        conn = self._conns.caller_connection(connection)
        self._conns.join(conn, self._sql.write_lock)
        if writes:
            conn.execute(self._sql.state.savepoint)
            try:
                moved = write_state_in(self._sql, conn, writes, at)
                if moved:
                    conn.execute(self._sql.state.rollback_to)
                    raise StateConflictError(tuple(moved))
            finally:
                conn.execute(self._sql.state.release)
        return insert_calls(self._sql, conn, effects_params(identity, effects, at))

    # -- persisted bot state ---------------------------------------------------------------
    def read_state(self, keys: Sequence[StateKey]) -> Dict[StateKey, StateEntry]:
        """The committed rows of ``keys``, one ``SELECT`` per kind and name, each key a search
        of the primary key (see :class:`ptb_fence.StateStore`); absent keys are left out."""
        with self._conns.using() as conn:
            return read_state_in(self._sql, conn, list(keys))

    def write_state(self, writes: Sequence[StateWrite], at: int) -> Optional[StateConflict]:
        """Apply ``writes`` in one transaction, all or none (see
        :class:`ptb_fence.StateStore`)."""
        checked = check_writes(writes)
        with self._conns.immediate() as conn:
            conn.execute(self._sql.state.savepoint)
            try:
                moved = write_state_in(self._sql, conn, checked, int(at))
                if moved:
                    conn.execute(self._sql.state.rollback_to)
                    return StateConflict(tuple(moved))
                return None
            finally:
                conn.execute(self._sql.state.release)

    def list_state(
        self,
        *,
        kind: Optional[str] = None,
        name: Optional[str] = None,
        after: Optional[StateKey] = None,
        limit: int = 100,
    ) -> List[Tuple[StateKey, StateEntry]]:
        """The rows by ``(kind, name, key)`` after ``after`` (see
        :class:`ptb_fence.StateStore`)."""
        check_kind(kind)
        params = self._sql.state.list_params(kind, name, after, limit)
        with self._conns.using() as conn:
            rows = conn.execute(self._sql.state.list, params).fetchall()
        return list(entries_of(rows).items())

    def claim_calls(
        self, *, now: int, lease_until: int, limit: int, sender: str
    ) -> List[OutboxEntry]:
        """Claim the calls to send now in one ``UPDATE`` under the write lock (see
        :class:`ptb_fence.OutboxStore`): pending and due, or sending with a lapsed lease, and
        in turn in their chat; lowest ``call_id`` first, at most ``limit``."""
        params = {
            "now": int_arg("now", now),
            "lease_until": int_arg("lease_until", lease_until),
            "limit": max(int(limit), 0),
            "sender": str(sender),
        }
        with self._conns.immediate() as conn:
            folded = self._fold_journal(conn)
            rows = conn.execute(self._sql.outbox.claim, params).fetchall()
        self._forget_journaled(folded)
        return sorted((entry_of(row) for row in rows), key=lambda entry: entry.call_id)

    def _sender_write(self, statement: str, params: Dict[str, Any]) -> bool:
        with self._conns.immediate() as conn:
            return conn.execute(statement, params).fetchone() is not None

    def record_sent(self, items: Sequence[Tuple[int, str, str, int]]) -> List[bool]:
        """For ``(call_id, sender, result_json, at)``: a call sending by ``sender`` becomes
        sent at ``at``; per item whether it landed; one transaction."""
        items = list(items)
        if not items:
            return []
        with self._conns.immediate() as conn:
            folded = self._fold_journal(conn)
            landed = self._record_sent_in(conn, items)
        self._forget_journaled(folded + [item[0] for item in items])
        return landed

    def record_sent_and_claim(
        self,
        items: Sequence[Tuple[int, str, str, int]],
        *,
        now: int,
        lease_until: int,
        limit: int,
        sender: str,
    ) -> Tuple[List[bool], List[OutboxEntry]]:
        """:meth:`record_sent` then :meth:`claim_calls` under one write lock, one commit
        (optional capability, see :class:`ptb_fence.RecordAndClaimOutboxStore`)."""
        params = {
            "now": int_arg("now", now),
            "lease_until": int_arg("lease_until", lease_until),
            "limit": max(int(limit), 0),
            "sender": str(sender),
        }
        items = list(items)
        with self._conns.immediate() as conn:
            folded = self._fold_journal(conn)
            landed = self._record_sent_in(conn, items)
            rows = conn.execute(self._sql.outbox.claim, params).fetchall() if limit > 0 else []
        self._forget_journaled(folded + [item[0] for item in items])
        return landed, sorted((entry_of(row) for row in rows), key=lambda e: e.call_id)

    def note_sent(self, items: Sequence[SentRow]) -> None:
        """Record at once that ``(call_id, sender, result_json, at)`` were sent, without the
        database's write lock: in the sent journal next to it (``<database>.sent``). A fenced
        transaction of another chat may hold the write lock for seconds: a sender that dies
        meanwhile would leave the call to be sent again. Every claim folds the journal in first
        (a journaled call is recorded ``sent`` by its sender, never claimed), and the readers
        show a journaled call as ``sent`` (optional, see ``runtime/_port.py``)."""
        self._journal.note(self._sql.outbox.name, list(items))

    def _fold_journal(self, conn: sqlite3.Connection) -> List[int]:
        """Under the write lock, before any claim: record every journaled call ``sent`` as
        :meth:`record_sent` would (only while its journaling sender holds it). Returns the call
        ids, which the journal forgets after the commit."""
        journaled = self._journal.read(self._sql.outbox.name)
        for call_id, sender, result, at in fold_order(journaled):
            conn.execute(self._sql.outbox.record_sent, {
                "call_id": call_id, "sender": sender, "result": result, "at": at,
            })
        return list(journaled)

    def _record_sent_in(
        self, conn: sqlite3.Connection, items: Sequence[SentRow]
    ) -> List[bool]:
        """:meth:`record_sent` of ``items`` on ``conn``. A call a fold (this one or an
        earlier one) recorded from its own sender's journal row landed too."""
        landed = []
        for call_id, sender, result, at in items:
            ok = conn.execute(self._sql.outbox.record_sent, {
                "call_id": call_id, "sender": sender, "result": result, "at": at,
            }).fetchone() is not None
            if not ok:
                found = conn.execute(
                    f'SELECT 1 FROM "{self._sql.outbox.name}" '  # noqa: S608
                    "WHERE call_id = ? AND state = 'sent' AND sender = ?", (call_id, sender),
                ).fetchone()
                ok = found is not None
            landed.append(ok)
        return landed

    def _forget_journaled(self, call_ids: Sequence[int]) -> None:
        """The journal forgets calls whose record committed (a failure leaves rows that a
        later fold records again: a no-op)."""
        try:
            self._journal.forget(self._sql.outbox.name, list(call_ids))
        except sqlite3.Error:
            pass

    def retry_call(self, call_id: int, sender: str, *, due_at: int, error: str) -> bool:
        """A call sending by ``sender`` goes back to pending at ``due_at`` with ``error``."""
        return self._sender_write(self._sql.outbox.retry, {
            "call_id": call_id, "sender": sender, "due_at": int_arg("due_at", due_at),
            "error": error,
        })

    def fail_call(self, call_id: int, sender: str, *, at: int, error: str) -> bool:
        """A call sending by ``sender`` becomes failed at ``at`` (not acknowledged)."""
        return self._sender_write(self._sql.outbox.fail, {
            "call_id": call_id, "sender": sender, "at": int_arg("at", at), "error": error,
        })

    def release_calls(self, call_ids: Sequence[int], sender: str, at: int) -> List[bool]:
        """Each call sending by ``sender`` goes back to pending at ``at`` (``tries - 1``);
        one transaction."""
        call_ids = list(call_ids)
        if not call_ids:
            return []
        at = int_arg("at", at)
        with self._conns.immediate() as conn:
            return [
                conn.execute(self._sql.outbox.release, {
                    "call_id": call_id, "sender": sender, "at": at,
                }).fetchone() is not None
                for call_id in call_ids
            ]

    def _entries(self, statement: str, params: Dict[str, Any]) -> List[OutboxEntry]:
        with self._conns.using() as conn:
            entries = [entry_of(row) for row in conn.execute(statement, params).fetchall()]
            return self._journal.shown(conn, self._sql.outbox.name, entries)

    def claimed_calls(self, sender: str, *, limit: int) -> List[OutboxEntry]:
        """The calls ``sending`` by ``sender`` (claimed at insert or by :meth:`claim_calls`),
        by ``call_id``, at most ``limit``; reads only."""
        entries = self._entries(self._sql.outbox.claimed,
                                {"sender": str(sender), "limit": max(int(limit), 0)})
        return [entry for entry in entries if entry.state == "sending"]

    def due_send_failures(
        self, *, limit: int, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """Failed calls not acknowledged, after ``after_call_id``, by ``call_id``."""
        after = -1 if after_call_id is None else int(after_call_id)
        return self._entries(self._sql.outbox.due_failures,
                             {"after": after, "limit": max(int(limit), 0)})

    def acknowledge_send_failure(self, call_id: int, at: int) -> bool:
        """A failed call not acknowledged becomes acknowledged (``due_at = at``)."""
        return self._sender_write(self._sql.outbox.acknowledge,
                                  {"call_id": call_id, "at": int_arg("at", at)})

    def get_call(self, call_id: int) -> Optional[OutboxEntry]:
        """The call, or :obj:`None`."""
        found = self._entries(self._sql.outbox.get, {"call_id": call_id})
        return found[0] if found else None

    def list_calls(
        self, *, state: Optional[str] = None, limit: int = 100, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """The calls (of ``state``), after ``after_call_id``, by ``call_id``."""
        params: Dict[str, Any] = {
            "after": -1 if after_call_id is None else int(after_call_id),
            "limit": max(int(limit), 0),
            "state": state,
        }
        if state in ("sent", "sending"):
            return self._list_journaled(str(state), params)
        statement = self._sql.outbox.list_all if state is None else self._sql.outbox.list_state
        return self._entries(statement, params)

    def _list_journaled(self, state: str, params: Dict[str, Any]) -> List[OutboxEntry]:
        """:meth:`list_calls` of ``sent`` or ``sending`` calls, a call in the sent journal
        (not folded in yet) counted as ``sent``."""
        outbox = self._sql.outbox
        with self._conns.using() as conn:
            unfolded = self._journal.unfolded(conn, outbox.name)
            wider = dict(params, limit=params["limit"] + len(unfolded))
            rows = conn.execute(outbox.list_state, wider).fetchall()
            if state == "sent":
                for call_id in sorted(unfolded):
                    if call_id > params["after"]:
                        rows += conn.execute(outbox.get, {"call_id": call_id}).fetchall()
            entries = self._journal.shown(conn, outbox.name, [entry_of(row) for row in rows])
        found = sorted((e for e in entries if e.state == state), key=lambda e: e.call_id)
        return found[: params["limit"]]

    def outbox_counts(self) -> Dict[str, int]:
        """Calls per state (``failed``: not acknowledged; ``failed_acknowledged``)."""
        with self._conns.using() as conn:
            counts = counts_of(conn.execute(self._sql.outbox.counts).fetchall())
            journaled = len(self._journal.unfolded(conn, self._sql.outbox.name))
        counts["sending"] -= journaled  # sent: in the journal, not folded in yet
        counts["sent"] += journaled
        return counts

    def retry_failed_call(self, call_id: int, at: int) -> bool:
        """Operators: a failed call goes back to pending at ``at``."""
        return self._sender_write(self._sql.outbox.retry_failed,
                                  {"call_id": call_id, "at": int_arg("at", at)})

    def drop_call(self, call_id: int) -> bool:
        """Operators: delete a pending or failed call."""
        return self._sender_write(self._sql.outbox.drop, {"call_id": call_id})

    def _take_over_calls(self, conn: sqlite3.Connection, instance: str, now: int) -> int:
        """In :meth:`take_over_dead`'s transaction: the calls the dead ``instance``'s
        sender holds become claimable at ``now``. Returns how many."""
        outbox = self._sql.outbox
        if conn.execute(outbox.exists, {"outbox": outbox.name}).fetchone() is None:
            return 0
        params = {"now": now, "pattern": sender_pattern(instance)}
        return len(conn.execute(outbox.take_over, params).fetchall())
