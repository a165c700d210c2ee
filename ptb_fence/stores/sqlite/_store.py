"""SQLiteUpdateStore: the embedded default store, whole in one class.

It keeps one file, serves many threads and several processes.
Its sections: construction and lifecycle, the base, fenced and durable contracts, chat order,
release and liveness, figures, the outbox.
Its collaborators are the per-thread connections (``_connections``), the schema steps
(``_schema``), the statements several methods share (``_writes``), the lock-file liveness
holder (``_liveness``) and the named statements (the package's ``.sql`` files, loaded by
``_sql``).
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
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)

from ptb_fence._errors import StateConflictError, TableBotMismatch
from ptb_fence.contract import Batch, ChatKey, ClaimTerms, Committed, StoreFeatures
from ptb_fence._values import (
    AttemptEffects,
    AttemptIdentity,
    Completed,
    Exhaustion,
    JobFire,
    JobWrite,
    OutboxEntry,
    PaceBucket,
    Recipient,
    RecipientOutcome,
    Settlement,
    StateConflict,
    StateEntry,
    StateKey,
    StateWrite,
    StepRecord,
    StoreFigures,
    StoredBroadcast,
    StoredJob,
    StoredUpdate,
)
from ptb_fence.stores._broadcasts import (
    broadcast_of,
    check_chat_ids,
    check_name,
    check_outcomes,
    check_params,
    check_state,
    recipients_of,
)
from ptb_fence.stores._figures_sql import figures_of
from ptb_fence.stores._jobs_sql import job_of
from ptb_fence.stores._names import validate_table_name, validate_update_id
from ptb_fence.stores._outbox_sql import (
    counts_of,
    effects_params,
    entry_of,
    outbox_table_name,
    sender_pattern,
)
from ptb_fence.stores._state_sql import check_kind, check_writes, entries_of, list_params
from ptb_fence.stores._pace import check_wants, grant, pace_keys, pace_rows
from ptb_fence.stores._steps_sql import record_of, step_params
from ptb_fence.stores._suspects import SuspectClaims
from ptb_fence.stores.sqlite._connections import SQLiteConnections
from ptb_fence.stores.sqlite._broadcasts import write_broadcasts_in
from ptb_fence.stores.sqlite._jobs import cancel_in, fire_in, schedule_in, write_jobs_in
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
from ptb_fence.stores.sqlite._sql import statements
from ptb_fence.stores.sqlite._writes import (
    add_claimed_in,
    add_in,
    claim_params,
    insert_calls,
    int_arg,
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

    The table and its index on ``(state, due_at)`` are created on construction.
    A table from an older version without the ``claim_id`` column gets it added, keeping its rows.
    Several processes may open (and upgrade) the same new or older file at once.
    The database runs in WAL mode with a busy timeout.
    Every write is one conditional statement inside ``BEGIN IMMEDIATE``.
    So each rule of the store contract is atomic across processes.

    Every thread gets its own connection. It is created on first use, and closed by
    :meth:`close` or once its thread has ended. A connection is never closed while a call is
    using it. One that was opened while the file was not writable is reopened.
    Times are integer milliseconds since the epoch.

    **Fenced transactions**: SQLite has one write lock per database. A fenced transaction on
    the store's file (:meth:`transaction`, or ``owns(..., connection=conn)``) holds it until it
    ends. So every other write of every process, lease renewals included, waits meanwhile.
    It fails after ``busy_timeout`` with ``database is locked: the write lock of … was held
    longer than busy_timeout``. **Keep fenced transactions on SQLite well shorter than
    ``busy_timeout`` (30 s by default) and than the lease.**

    Besides the durable contract (:class:`ptb_fence.DurableUpdateStore`), the store offers the
    batched :meth:`add_many`, :meth:`renew_many` and :meth:`renew_owned_many`.
    Its :meth:`transaction` makes exactly-once domain writes in the same file.

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
        path (:obj:`str` | :obj:`os.PathLike`): The database file. It is created if missing.
            Its directory must exist. ``":memory:"`` is refused, since every thread would see
            its own empty database. Use :class:`ptb_fence.MemoryUpdateStore` instead.
        table (:obj:`str`, optional): The table name. It must fully match
            ``[A-Za-z_][A-Za-z0-9_]{0,62}``. Defaults to ``"telegram_updates"``.

    Keyword Args:
        synchronous (:obj:`str`, optional): SQLite's ``PRAGMA synchronous``.
            ``"NORMAL"`` is the default. In WAL mode a power loss may then lose the last
            commits, but never corrupts the file. With ``"FULL"`` every commit is on disk
            before it returns.
        busy_timeout (:obj:`float`, optional): Seconds a statement waits for another
            connection's write lock before failing with ``database is locked``. It also bounds
            the retries while several processes create or upgrade the schema at once.
            Defaults to ``30.0``.

    Raises:
        ValueError: A bad ``table``, ``path``, ``synchronous`` or ``busy_timeout``, raised before
            any file is touched.
        RuntimeError: The SQLite library is older than 3.35.
        ptb_fence.SchemaError: An existing table of that name lacks columns the store needs.
    """

    __slots__ = (
        "__weakref__", "_conns", "_journal", "_liveness", "_outbox", "_sql", "_suspects",
        "_table",
    )

    #: Every optional part of the contract (see :class:`ptb_fence.BatchStore`).
    features = StoreFeatures(
        outbox=True, state=True, liveness=True, chat_order=True, isolation=True, figures=True,
        steps=True, jobs=True, pacing=True, broadcasts=True,
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
        self._sql = statements(self._table)
        self._outbox = outbox_table_name(self._table)
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
        """Stop holding liveness, then close every connection the store opened. Idempotent.

        It calls :meth:`release_liveness` first. It closes the connections of all threads.
        A connection another thread is using right now is never closed under it. That may be a
        statement or an open :meth:`transaction` block. The call finishes normally, and its thread
        closes the connection when the call ends. ``close()`` waits up to 5 seconds for such calls,
        then returns. Calls that start after ``close()`` raise :exc:`RuntimeError`.
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
        """Record that the table belongs to bot ``bot_id``.

        See :meth:`ptb_fence.BatchStore.bind_bot`.

        The owner is kept in the table ``ptb_fence_meta`` of the same file, created when missing.
        Several processes binding a new table at once are safe (``BEGIN IMMEDIATE``).

        Raises:
            ptb_fence.TableBotMismatch: The table was bound to another bot id first.
        """
        bot_id = int(bot_id)
        params = {"table": self._table, "bot_id": bot_id}
        with self._conns.immediate() as conn:
            conn.execute(self._sql["create_meta"])
            conn.execute(self._sql["bind_bot"], params)
            row = conn.execute(self._sql["bot_of"], params).fetchone()
        owner = int(row[0])
        if owner != bot_id:
            raise TableBotMismatch(self._table, repr(self._conns.path), owner, bot_id)

    def add(self, update_id: int, body: str, received_at: int) -> bool:
        """Insert a pending row. See :meth:`ptb_fence.UpdateStore.add`.

        An id that arrives again follows :mod:`ptb_fence.stores._duplicates`.

        Args:
            update_id (:obj:`int`): The Telegram ``update_id``.
            body (:obj:`str`): The update's JSON text.
            received_at (:obj:`int`): When it was received (epoch milliseconds).

        Returns:
            :obj:`bool`: :obj:`True` if inserted, :obj:`False` if the id exists.
        """
        validate_update_id(update_id)
        with self._conns.immediate() as conn:
            return add_in(self._sql, conn, update_id, body, received_at)

    def add_many(self, rows: Sequence[Tuple[int, str, int]]) -> List[bool]:
        """Record ``rows`` pending in one commit.

        It is a convenience over :meth:`commit` for seeding and imports. It is no part of the
        contract.

        Returns:
            List[:obj:`bool`]: Per row, whether it is new (``Committed.recorded``).
        """
        return list(self.commit(Batch(records=tuple(rows))).recorded)

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[int]:
        """Take a claimable row for a new attempt. See :meth:`ptb_fence.UpdateStore.claim`.

        It is one conditional ``UPDATE``.

        Returns:
            :obj:`int` | :obj:`None`: The attempt number, or :obj:`None` when the row was not taken.
        """
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        identity = take(
            self._conns, self._sql, update_id, terms, self._liveness.mine(),
            self._sql["claim"],
        )
        return None if identity is None else identity.attempt

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """Extend a live lease. See :meth:`ptb_fence.UpdateStore.renew`.

        Returns:
            :obj:`bool`: :obj:`True` when the row matched, even if the lease stayed as it was.
        """
        params = {"update_id": update_id, "attempt": attempt, "lease_until": lease_until,
                  "now": now}
        with self._conns.immediate() as conn:
            return bool(conn.execute(self._sql["renew"], params).fetchall())

    def renew_many(
        self, leases: Sequence[Tuple[int, int]], lease_until: int, now: int
    ) -> List[bool]:
        """Renew several leases in one statement. See :meth:`ptb_fence.BatchStore.renew_many`.

        The pairs go as one JSON array, whatever their number.

        Returns:
            List[:obj:`bool`]: Per input position, whether that lease matched.
        """
        leases = [(update_id, attempt) for update_id, attempt in leases]
        if not leases:
            return []
        matched: Set[Tuple[int, int]] = set()
        params = {"leases": json.dumps(leases), "lease_until": lease_until, "now": now}
        with self._conns.immediate() as conn:
            for row in conn.execute(self._sql["renew_many"], params).fetchall():
                matched.add((row[0], row[1]))
        return [lease in matched for lease in leases]

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Record an attempt's result. See :meth:`ptb_fence.UpdateStore.settle`."""
        statement = settle_statement(self._sql, settlement, owned=False)
        with self._conns.immediate() as conn:
            conn.execute(statement, settle_params(update_id, attempt, settlement, None))

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """Rows to hand over, in one statement. See :meth:`ptb_fence.UpdateStore.due`."""
        with self._conns.using() as conn:
            rows = conn.execute(
                self._sql["due"],
                {"now": now, "pending_before": pending_before, "limit": max(int(limit), 0)},
            ).fetchall()
        return [StoredUpdate(int(update_id), body) for update_id, body in rows]

    def prune(self, before: int) -> int:
        """Delete settled rows. See :meth:`ptb_fence.UpdateStore.prune`.

        The same transaction prunes the outbox's sent calls with ``sent_at < before`` and its
        acknowledged failed calls with ``due_at < before``. It also prunes the callback-data
        keyboards (kind ``callback``) of the persisted state written before ``before``. It
        deletes the recorded steps of the update rows it deletes, the pace buckets that are
        free again, and the broadcasts started before ``before`` that nobody is sent to any
        more. None of these is counted. No other state is pruned.

        Returns:
            :obj:`int`: The number of update rows deleted.
        """
        with self._conns.immediate() as conn:
            conn.execute(self._sql["outbox_prune"], {"before": before})
            conn.execute(self._sql["state_prune"], {"before": before})
            conn.execute(self._sql["steps_prune"], {"before": before})
            conn.execute(self._sql["pace_prune"], {"before": before})
            conn.execute(self._sql["broadcast_prune_recipients"], {"before": before})
            conn.execute(self._sql["broadcast_prune"], {"before": before})
            return int(conn.execute(self._sql["prune"], {"before": before}).rowcount)

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
        """Claim with a fresh claim id. See :meth:`ptb_fence.FencedUpdateStore.claim_owned`.

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

    def _claim_many_in(
        self, conn: sqlite3.Connection, ids: List[int], terms: ClaimTerms
    ) -> List[Optional[AttemptIdentity]]:
        """The claims of :meth:`commit` on ``conn``, inside its open transaction."""
        distinct = list(dict.fromkeys(ids))
        if not distinct:
            return []
        params = claim_params(terms, self._liveness.mine())
        params["ids"] = json.dumps(distinct)
        rows = conn.execute(self._sql["claim_many"], params).fetchall()
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
        """Extend a fenced lease. See :meth:`ptb_fence.FencedUpdateStore.renew_owned`.

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
            return bool(conn.execute(self._sql["renew_owned"], params).fetchall())

    def renew_owned_many(
        self, identities: Sequence[AttemptIdentity], lease_until: int, now: int
    ) -> List[bool]:
        """Renew several fenced leases in one statement.

        See :meth:`ptb_fence.BatchStore.renew_owned_many`.

        The identities go as one JSON array, as in :meth:`renew_many`.

        Returns:
            List[:obj:`bool`]: Per input position, whether that claim's lease matched.
        """
        keys = [(i.update_id, i.attempt, i.claim_id) for i in identities]
        if not keys:
            return []
        matched: Set[Tuple[int, int, str]] = set()
        params = {"identities": json.dumps(keys), "lease_until": lease_until, "now": now}
        with self._conns.immediate() as conn:
            for row in conn.execute(self._sql["renew_owned_many"], params).fetchall():
                matched.add((row[0], row[1], row[2]))
        return [key in matched for key in keys]

    def commit(self, batch: Batch) -> Committed:
        """Apply ``batch`` in one write transaction (see :meth:`ptb_fence.BatchStore.commit`).

        Outbox calls return their ids from their inserts.
        """
        for row in (*batch.records, *batch.claimed_records):
            validate_update_id(row[0])
        claims = [validate_update_id(update_id) for update_id in batch.claims]
        if batch.empty:
            return Committed()
        lease_until = 0
        if batch.claimed_records:
            assert batch.terms is not None  # a Batch with claimed records has terms
            lease_until = int_arg("lease_until", batch.terms.lease_until)
        sql, instance = self._sql, self._liveness.mine()
        calls: Dict[AttemptIdentity, Tuple[int, ...]] = {}
        sending: Set[int] = set()
        taken: List[Optional[AttemptIdentity]] = []
        with self._conns.immediate() as conn:
            recorded = [add_in(sql, conn, *row) for row in batch.records]
            claimed = (
                add_claimed_in(sql, conn, batch.claimed_records, lease_until, instance)
                if batch.claimed_records else []
            )
            landed = (
                settle_owned_in(sql, conn, batch.settlements, batch.effects, calls, sending)
                if batch.settlements else []
            )
            if claims:
                assert batch.terms is not None
                taken = self._claim_many_in(conn, claims, batch.terms)
        return Committed(
            tuple(recorded), tuple(claimed), tuple(landed), tuple(taken), calls,
            frozenset(sending),
        )

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """Whether this exact claim holds a live lease.

        See :meth:`ptb_fence.FencedUpdateStore.owns`.

        ``connection`` is the caller's :class:`sqlite3.Connection` to the same file, or a cursor
        of one. The check runs on it, inside the caller's transaction, and nothing is committed.
        If that connection is not in a transaction yet, one is started with ``BEGIN IMMEDIATE``.
        If it is, the check first takes the write lock inside it, with a write that changes
        nothing. Either way the caller then holds the database's write lock.
        So no claim can take the update over until the caller commits or rolls back.

        Raises:
            TypeError: ``connection`` is not a sqlite3 connection or cursor.
            ValueError: ``connection`` is open on another database file.
            sqlite3.OperationalError: ``database is locked``. Either the write lock was not free
                within the busy timeout, or the caller's transaction read data that another
                connection has changed since. Roll back and start again.
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": at,
        }
        if connection is None:
            with self._conns.using() as conn:
                return conn.execute(self._sql["owns"], params).fetchone() is not None
        conn = self._conns.caller_connection(connection)
        self._conns.join(conn, self._sql["write_lock"])
        return conn.execute(self._sql["owns"], params).fetchone() is not None

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        """Settle a fenced attempt. See :meth:`ptb_fence.FencedUpdateStore.settle_owned`.

        With ``connection`` (the caller's sqlite3 connection or cursor, same file) the update
        runs inside the caller's transaction, joined as in :meth:`owns`. It is NOT committed.
        It lands with the caller's commit.

        Returns:
            :obj:`bool`: Whether the settlement landed.
        """
        statement = settle_statement(self._sql, settlement, owned=True)
        params = settle_params(
            identity.update_id, identity.attempt, settlement, identity.claim_id
        )
        if connection is not None:
            conn = self._conns.caller_connection(connection)
            self._conns.join(conn, self._sql["write_lock"])
            return bool(conn.execute(statement, params).fetchall())
        with self._conns.immediate() as conn:
            return bool(conn.execute(statement, params).fetchall())

    def complete_owned(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Complete this exact claim in the caller's transaction.

        See :meth:`ptb_fence.BatchStore.complete_owned`.
        ``connection`` is a :class:`sqlite3.Connection` or cursor on this file.
        ``BEGIN IMMEDIATE`` comes first if no transaction is open.
        The one ``UPDATE`` takes the database's write lock until the caller's transaction ends.

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
        return bool(conn.execute(self._sql["settle_completed_owned"], params).fetchall())

    def reopen_completed(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Undo a :meth:`complete_owned` at ``at`` that the caller committed itself.

        See :meth:`ptb_fence.BatchStore.reopen_completed`.
        It commits at once on ``connection``.

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
            undone = bool(conn.execute(self._sql["reopen_completed"], params).fetchall())
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        return undone

    def transaction(self) -> ContextManager[sqlite3.Connection]:
        """A write transaction on this thread's connection to the store's file.

        See :meth:`ptb_fence.BatchStore.transaction`.
        It starts with ``BEGIN IMMEDIATE`` and yields the :class:`sqlite3.Connection`.
        The connection takes ``?`` placeholders and is in autocommit mode outside the block.
        Do not commit or roll back the yielded connection yourself.
        While the block runs, this thread cannot call the store's own write methods.
        Pass ``connection=`` to :meth:`owns` and :meth:`settle_owned` instead.
        Other threads and processes wait for the write lock.

        Raises:
            RuntimeError: A transaction is already open on this thread.
        """
        return self._conns.transaction()

    # -- durable contract ------------------------------------------------------------------
    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        """Turn the exact live claim into an unacknowledged exhaustion.

        See :meth:`ptb_fence.DurableUpdateStore.exhaust`.

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
            return bool(conn.execute(self._sql["exhaust"], params).fetchall())

    def due_exhaustions(
        self, *, limit: int, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        """Unacknowledged exhaustions. See :meth:`ptb_fence.DurableUpdateStore.due_exhaustions`."""
        with self._conns.using() as conn:
            rows = conn.execute(
                self._sql["due_exhaustions"],
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
        """Acknowledge an exhaustion.

        See :meth:`ptb_fence.DurableUpdateStore.acknowledge_exhaustion`.

        With ``effects``, their outbox calls are inserted as pending in the same commit, only when
        it acknowledges (see :class:`ptb_fence.OutboxStore`).

        Returns:
            :obj:`bool`: :obj:`True` once. :obj:`False` for a wrong identity or a second call.
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": at,
        }
        with self._conns.immediate() as conn:
            acknowledged = bool(conn.execute(self._sql["acknowledge_exhaustion"], params).fetchall())
            if acknowledged and effects is not None and effects.calls:
                insert_calls(self._sql, conn, effects_params(identity, effects, at))
            return acknowledged

    # -- chat order ------------------------------------------------------------------------
    def add_many_in_chats(
        self, rows: Sequence[Tuple[int, str, int, Optional[int]]]
    ) -> List[bool]:
        """Insert rows with their chat keys, in one transaction.

        See :meth:`ptb_fence.BatchStore.add_many_in_chats`.

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
                        self._sql["record_chat_key"],
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
        """Claim a row in its chat's turn, in one statement.

        See :meth:`ptb_fence.BatchStore.claim_in_chat_order`.
        """
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        return take(
            self._conns, self._sql, update_id, terms, self._liveness.mine(),
            self._sql["claim_in_chat_order"], suspects=self._suspects,
        )

    def due_in_chat_order(
        self, *, now: int, pending_before: int, limit: int, chat_key: Optional[int] = None
    ) -> List[StoredUpdate]:
        """Rows in their chat's turn, in one statement.

        See :meth:`ptb_fence.BatchStore.due_in_chat_order`.
        """
        params = {
            "now": int_arg("now", now),
            "pending_before": int_arg("pending_before", pending_before),
            "limit": max(int(limit), 0),
            "chat_key": chat_key,
        }
        sql = self._sql["due_in_chat_order"] if chat_key is None else self._sql["due_of_chat"]
        with self._conns.using() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [StoredUpdate(int(update_id), body) for update_id, body in rows]

    def unkeyed_in_chats(
        self, *, after_update_id: Optional[int] = None, limit: int
    ) -> List[StoredUpdate]:
        """Unsettled rows without a chat key, by ``update_id``, after ``after_update_id``.

        See :class:`ptb_fence.BatchStore`.
        """
        params = {
            "after": -1 if after_update_id is None else int_arg("after_update_id", after_update_id),
            "limit": max(int(limit), 0),
        }
        with self._conns.using() as conn:
            rows = conn.execute(self._sql["unkeyed_in_chats"], params).fetchall()
        return [StoredUpdate(int(update_id), body) for update_id, body in rows]

    def set_chat_keys(self, keys: Sequence[ChatKey]) -> int:
        """Record chat keys of rows that have none, in one transaction.

        For each ``(update_id, body, chat_key)`` the chat key is set if the row has none, is
        unsettled and holds exactly ``body``. Returns how many were set.
        """
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
                done += conn.execute(self._sql["set_chat_key"], params).rowcount
        return done

    # -- release and liveness --------------------------------------------------------------
    # Liveness is a lock file per instance, held by ``self._liveness`` (a FileLiveness). What
    # proves an instance dead, and why, is in the docstrings of ``_liveness``.
    def release_many(self, identities: Sequence[AttemptIdentity], *, at: int) -> List[bool]:
        """Give the exact claims back in one statement.

        See :meth:`ptb_fence.BatchStore.release_many`.

        Returns:
            List[:obj:`bool`]: Per input position, whether that claim was released.
        """
        at = int_arg("at", at)
        keys = [(i.update_id, i.attempt, i.claim_id) for i in identities]
        if not keys:
            return []
        released: Set[Tuple[int, int, str]] = set()
        params = {"identities": json.dumps(keys), "at": at}
        with self._conns.immediate() as conn:
            for row in conn.execute(self._sql["release_many"], params).fetchall():
                released.add((int(row[0]), int(row[1]), str(row[2])))
        result: List[bool] = []
        for key in keys:
            result.append(key in released)
            released.discard(key)
        return result

    def hold_liveness(self) -> str:
        """Start holding liveness. See :meth:`ptb_fence.BatchStore.hold_liveness`.

        It takes an exclusive ``flock`` on ``<database>.instances/<instance>.lock``.
        The directory is created when missing, with the group and permissions of the database's
        directory. The file is readable by others and names the instance.
        The instance is recorded in ``ptb_fence_instances``.
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
                conn.execute(self._sql["create_instances"])
                conn.execute(self._sql["insert_instance"], params)
        except BaseException:
            if old is None:  # a first hold: no instance, no file
                assert holder.lock_path is not None
                unlink(holder.lock_path)
                holder.close_fd(holder.fd)
                holder.lock_path = None
            else:  # holding again: the new file is in place and locked, and the row is there
                holder.close_fd(old)
            raise
        holder.close_fd(old)

    def _keep_liveness(self) -> None:
        """Hold the instance again at once if this process's lock file was removed or replaced.

        Someone may have removed it, or another process that took the instance for dead.
        """
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
        """Stop holding liveness. Idempotent. See :meth:`ptb_fence.BatchStore.release_liveness`.

        It is the graceful stop, also done by :meth:`close`.
        It deletes the instance's row, then drops its file lock and removes the lock file.
        """
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
                        self._sql["delete_instance"], {"table": self._table, "instance": instance}
                    )
            finally:
                if lock_path is not None:
                    unlink(lock_path)
                holder.close_fd(fd)

    def _dead_instances(self, rows: List[Any]) -> List[Tuple[str, str, int]]:
        """Of the listed ``(instance, lock_path)`` rows, the provably dead instances.

        It gives each one's lock file (next to this process's path to the database) and the
        descriptor now locking it. A lock file this process cannot open is skipped with one WARNING.
        """
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

        See :meth:`ptb_fence.BatchStore.take_over_dead` and
        :class:`ptb_fence.BatchStore` for what happens to their rows.
        An instance of this table, not this object's own, is dead when its lock file names it and
        can be locked. The lock file is found next to this process's path to the database.
        A missing, replaced or unreadable lock file proves nothing.
        There is one WARNING per unreadable file.
        It first holds this object's own instance again if its lock file was removed.
        The rows and the instance's row change in one transaction.

        Returns:
            :obj:`int`: How many rows were made claimable.
        """
        now = int_arg("now", now)
        self._keep_liveness()
        mine = {"table": self._table, "me": self._liveness.instance}  # a parent's too
        with self._conns.using() as conn:  # a read first: no write lock when nobody is dead
            if conn.execute(self._sql["instances_table_exists"]).fetchone() is None:
                return 0
            rows = conn.execute(self._sql["instances_of"], mine).fetchall()
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
                    count += len(conn.execute(self._sql["take_over"], params).fetchall())
                    count += self._take_over_calls(conn, instance, now)
                    conn.execute(self._sql["delete_instance"], params)
            for _instance, lock_path, _fd in locked:  # forgotten: its file goes too
                unlink(lock_path)
        finally:
            for _instance, _path, fd in locked:
                close_fd(fd)
        return count

    def claimed_suspect(self, identity: AttemptIdentity) -> int:
        """The suspicion of the row ``identity`` took.

        See :meth:`ptb_fence.BatchStore.claimed_suspect`.

        The claim statement itself reads it back, so there is no statement here.
        """
        return self._suspects.take(identity)

    def mark_isolated(self, identity: AttemptIdentity, *, at: int) -> bool:
        """Record, committed, that this claim's handler runs isolated.

        See :meth:`ptb_fence.BatchStore.mark_isolated`.
        It writes ``isolated_claim = claim_id``.

        Returns:
            :obj:`bool`: Whether it landed.
        """
        return self._isolation(self._sql["mark_isolated"], identity, at)

    def end_probation(self, identity: AttemptIdentity, *, at: int) -> bool:
        """Record, committed, that this claim's handler ran past its probation.

        See :meth:`ptb_fence.BatchStore.end_probation`.

        Returns:
            :obj:`bool`: Whether it landed.
        """
        return self._isolation(self._sql["end_probation"], identity, at)

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
        """:obj:`str` | :obj:`None`: The instance id while this object holds liveness.

        It is the holder in this process.
        """
        return self._liveness.mine()

    # -- figures ---------------------------------------------------------------------------
    def figures(self) -> StoreFigures:
        """What waits in the table, for operators. See :meth:`ptb_fence.BatchStore.figures`.

        It is one read-only ``SELECT``, so one snapshot. It reads only the waiting rows (and the
        abandoned ones) through the table's indexes, never the completed history.
        """
        with self._conns.using() as conn:
            row = conn.execute(self._sql["figures"]).fetchone()
        return figures_of(row)

    # -- outbox ----------------------------------------------------------------------------
    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        """Insert the outbox calls of ``effects`` in the caller's transaction.

        See :meth:`ptb_fence.OutboxStore.write_effects`.
        Its state writes, jobs and broadcasts are written there too.
        ``connection`` is a :class:`sqlite3.Connection` or cursor on this file, joined as in
        :meth:`owns`.

        Returns:
            List[:obj:`int`]: The call ids, in order.
        """
        writes = check_writes(effects.state)
        conn = self._conns.caller_connection(connection)
        self._conns.join(conn, self._sql["write_lock"])
        if writes:
            conn.execute(self._sql["state_savepoint"])
            try:
                moved = write_state_in(self._sql, conn, writes, at)
                if moved:
                    conn.execute(self._sql["state_rollback_to"])
                    raise StateConflictError(tuple(moved))
            finally:
                conn.execute(self._sql["state_release"])
        write_jobs_in(self._sql, conn, effects, at)
        write_broadcasts_in(self._sql, conn, effects.broadcasts, at)
        return insert_calls(self._sql, conn, effects_params(identity, effects, at))

    # -- persisted bot state ---------------------------------------------------------------
    def read_state(self, keys: Sequence[StateKey]) -> Dict[StateKey, StateEntry]:
        """The committed rows of ``keys``. See :meth:`ptb_fence.StateStore.read_state`.

        There is one ``SELECT`` per kind and name. Each key is a search of the primary key.
        """
        with self._conns.using() as conn:
            return read_state_in(self._sql, conn, list(keys))

    def write_state(self, writes: Sequence[StateWrite], at: int) -> Optional[StateConflict]:
        """Apply ``writes`` in one transaction. See :meth:`ptb_fence.StateStore.write_state`."""
        checked = check_writes(writes)
        with self._conns.immediate() as conn:
            conn.execute(self._sql["state_savepoint"])
            try:
                moved = write_state_in(self._sql, conn, checked, int(at))
                if moved:
                    conn.execute(self._sql["state_rollback_to"])
                    return StateConflict(tuple(moved))
                return None
            finally:
                conn.execute(self._sql["state_release"])

    def list_state(
        self,
        *,
        kind: Optional[str] = None,
        name: Optional[str] = None,
        after: Optional[StateKey] = None,
        limit: int = 100,
    ) -> List[Tuple[StateKey, StateEntry]]:
        """The rows after ``after``. See :meth:`ptb_fence.StateStore.list_state`."""
        check_kind(kind)
        params = list_params(kind, name, after, limit)
        with self._conns.using() as conn:
            rows = conn.execute(self._sql["state_list"], params).fetchall()
        return list(entries_of(rows).items())

    def claim_calls(
        self, *, now: int, lease_until: int, limit: int, sender: str
    ) -> List[OutboxEntry]:
        """Claim the calls to send now. See :meth:`ptb_fence.OutboxStore.claim_calls`.

        It is one ``UPDATE`` under the write lock. The sent journal is folded in first.
        """
        params = {
            "now": int_arg("now", now),
            "lease_until": int_arg("lease_until", lease_until),
            "limit": max(int(limit), 0),
            "sender": str(sender),
        }
        with self._conns.immediate() as conn:
            folded = self._fold_journal(conn)
            rows = conn.execute(self._sql["outbox_claim"], params).fetchall()
        self._forget_journaled(folded)
        return sorted((entry_of(row) for row in rows), key=lambda entry: entry.call_id)

    def _sender_write(self, statement: str, params: Dict[str, Any]) -> bool:
        with self._conns.immediate() as conn:
            return conn.execute(statement, params).fetchone() is not None

    def record_sent(self, items: Sequence[Tuple[int, str, str, int]]) -> List[bool]:
        """Record sent calls in one transaction. See :meth:`ptb_fence.OutboxStore.record_sent`."""
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
        """Record, then claim, under one write lock and one commit.

        See :meth:`ptb_fence.OutboxStore.record_sent_and_claim`.
        """
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
            rows = conn.execute(self._sql["outbox_claim"], params).fetchall() if limit > 0 else []
        self._forget_journaled(folded + [item[0] for item in items])
        return landed, sorted((entry_of(row) for row in rows), key=lambda e: e.call_id)

    def note_sent(self, items: Sequence[SentRow]) -> None:
        """Record at once that calls were sent, without the database's write lock.

        Each item is ``(call_id, sender, result_json, at)``.
        The record goes to the sent journal next to the database (``<database>.sent``).
        A fenced transaction of another chat may hold the write lock for seconds.
        A sender that dies meanwhile would leave the call to be sent again.
        Every claim folds the journal in first. A journaled call is recorded ``sent`` by its
        sender and never claimed. The readers show a journaled call as ``sent``.
        It is optional (see ``runtime/_port.py``).
        """
        self._journal.note(self._outbox, list(items))

    def _fold_journal(self, conn: sqlite3.Connection) -> List[int]:
        """Under the write lock, before any claim: record every journaled call ``sent``.

        It does so as :meth:`record_sent` would, only while its journaling sender holds the call.
        It returns the call ids, which the journal forgets after the commit.
        """
        journaled = self._journal.read(self._outbox)
        for call_id, sender, result, at in fold_order(journaled):
            conn.execute(self._sql["outbox_record_sent"], {
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
            ok = conn.execute(self._sql["outbox_record_sent"], {
                "call_id": call_id, "sender": sender, "result": result, "at": at,
            }).fetchone() is not None
            if not ok:
                found = conn.execute(
                    self._sql["outbox_sent_by"], {"call_id": call_id, "sender": sender},
                ).fetchone()
                ok = found is not None
            landed.append(ok)
        return landed

    def _forget_journaled(self, call_ids: Sequence[int]) -> None:
        """The journal forgets calls whose record committed.

        A failure leaves rows that a later fold records again, which is a no-op.
        """
        try:
            self._journal.forget(self._outbox, list(call_ids))
        except sqlite3.Error:
            pass

    def retry_call(self, call_id: int, sender: str, *, due_at: int, error: str) -> bool:
        """A call sending by ``sender`` goes back to pending.

        See :meth:`ptb_fence.OutboxStore.retry_call`.
        """
        return self._sender_write(self._sql["outbox_retry"], {
            "call_id": call_id, "sender": sender, "due_at": int_arg("due_at", due_at),
            "error": error,
        })

    def fail_call(self, call_id: int, sender: str, *, at: int, error: str) -> bool:
        """A call sending by ``sender`` fails. See :meth:`ptb_fence.OutboxStore.fail_call`."""
        return self._sender_write(self._sql["outbox_fail"], {
            "call_id": call_id, "sender": sender, "at": int_arg("at", at), "error": error,
        })

    def release_calls(self, call_ids: Sequence[int], sender: str, at: int) -> List[bool]:
        """Release calls in one transaction. See :meth:`ptb_fence.OutboxStore.release_calls`."""
        call_ids = list(call_ids)
        if not call_ids:
            return []
        at = int_arg("at", at)
        with self._conns.immediate() as conn:
            return [
                conn.execute(self._sql["outbox_release"], {
                    "call_id": call_id, "sender": sender, "at": at,
                }).fetchone() is not None
                for call_id in call_ids
            ]

    def _entries(self, statement: str, params: Dict[str, Any]) -> List[OutboxEntry]:
        with self._conns.using() as conn:
            entries = [entry_of(row) for row in conn.execute(statement, params).fetchall()]
            return self._journal.shown(conn, self._outbox, entries)

    def claimed_calls(self, sender: str, *, limit: int) -> List[OutboxEntry]:
        """The calls ``sending`` by ``sender``.

        See :meth:`ptb_fence.OutboxStore.claimed_calls`.
        """
        entries = self._entries(self._sql["outbox_claimed"],
                                {"sender": str(sender), "limit": max(int(limit), 0)})
        return [entry for entry in entries if entry.state == "sending"]

    def due_send_failures(
        self, *, limit: int, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """Failed calls not acknowledged. See :meth:`ptb_fence.OutboxStore.due_send_failures`."""
        after = -1 if after_call_id is None else int(after_call_id)
        return self._entries(self._sql["outbox_due_failures"],
                             {"after": after, "limit": max(int(limit), 0)})

    def acknowledge_send_failure(self, call_id: int, at: int) -> bool:
        """Acknowledge a failed call. See :meth:`ptb_fence.OutboxStore.acknowledge_send_failure`."""
        return self._sender_write(self._sql["outbox_acknowledge"],
                                  {"call_id": call_id, "at": int_arg("at", at)})

    def get_call(self, call_id: int) -> Optional[OutboxEntry]:
        """The call, or :obj:`None`. See :meth:`ptb_fence.OutboxStore.get_call`."""
        found = self._entries(self._sql["outbox_get"], {"call_id": call_id})
        return found[0] if found else None

    def list_calls(
        self, *, state: Optional[str] = None, limit: int = 100, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """The calls of ``state``, after ``after_call_id``.

        See :meth:`ptb_fence.OutboxStore.list_calls`.

        A call in the sent journal shows as ``sent``.
        """
        params: Dict[str, Any] = {
            "after": -1 if after_call_id is None else int(after_call_id),
            "limit": max(int(limit), 0),
            "state": state,
        }
        if state in ("sent", "sending"):
            return self._list_journaled(str(state), params)
        statement = self._sql["outbox_list_all"] if state is None else self._sql["outbox_list_state"]
        return self._entries(statement, params)

    def _list_journaled(self, state: str, params: Dict[str, Any]) -> List[OutboxEntry]:
        """:meth:`list_calls` of ``sent`` or ``sending`` calls, a call in the sent journal
        (not folded in yet) counted as ``sent``."""
        sql, outbox = self._sql, self._outbox
        with self._conns.using() as conn:
            unfolded = self._journal.unfolded(conn, outbox)
            wider = dict(params, limit=params["limit"] + len(unfolded))
            rows = conn.execute(sql["outbox_list_state"], wider).fetchall()
            if state == "sent":
                for call_id in sorted(unfolded):
                    if call_id > params["after"]:
                        rows += conn.execute(sql["outbox_get"], {"call_id": call_id}).fetchall()
            entries = self._journal.shown(conn, outbox, [entry_of(row) for row in rows])
        found = sorted((e for e in entries if e.state == state), key=lambda e: e.call_id)
        return found[: params["limit"]]

    def outbox_counts(self) -> Dict[str, int]:
        """Calls per state. See :meth:`ptb_fence.OutboxStore.outbox_counts`.

        A call in the sent journal counts as ``sent``.
        """
        with self._conns.using() as conn:
            counts = counts_of(conn.execute(self._sql["outbox_counts"]).fetchall())
            journaled = len(self._journal.unfolded(conn, self._outbox))
        counts["sending"] -= journaled  # sent: in the journal, not folded in yet
        counts["sent"] += journaled
        return counts

    def retry_failed_call(self, call_id: int, at: int) -> bool:
        """Operators: retry a failed call. See :meth:`ptb_fence.OutboxStore.retry_failed_call`."""
        return self._sender_write(self._sql["outbox_retry_failed"],
                                  {"call_id": call_id, "at": int_arg("at", at)})

    def drop_call(self, call_id: int) -> bool:
        """Operators: delete a pending or failed call.

        See :meth:`ptb_fence.OutboxStore.drop_call`.
        """
        return self._sender_write(self._sql["outbox_drop"], {"call_id": call_id})

    def _take_over_calls(self, conn: sqlite3.Connection, instance: str, now: int) -> int:
        """In :meth:`take_over_dead`'s transaction: the calls the dead ``instance``'s
        sender holds become claimable at ``now``. Returns how many."""
        if conn.execute(self._sql["outbox_exists"], {"outbox": self._outbox}).fetchone() is None:
            return 0
        params = {"now": now, "pattern": sender_pattern(instance)}
        return len(conn.execute(self._sql["outbox_take_over"], params).fetchall())

    # -- recorded steps --------------------------------------------------------------------
    def read_step(self, key: str) -> Optional[StepRecord]:
        """The committed record of ``key``, or :obj:`None`.

        See :meth:`ptb_fence.BatchStore.read_step`.
        """
        with self._conns.using() as conn:
            row = conn.execute(self._sql["step_read"], {"key": key}).fetchone()
        return None if row is None else record_of(row)

    def record_step(self, record: StepRecord, *, connection: Any = None) -> bool:
        """Record a step while its attempt owns the update.

        See :meth:`ptb_fence.BatchStore.record_step`.

        The insert is conditional on the owned row. When it inserts nothing, a second read in
        the same transaction tells a recorded key from a lost claim. The write lock is held
        from the insert to the commit. So no claim takes the update over in between.
        With ``connection`` (the caller's sqlite3 connection or cursor, same file) both run
        inside the caller's transaction, joined as in :meth:`owns`. Nothing is committed then.

        Raises:
            ValueError: The key is not 1 to 64 characters of ``[a-z0-9-]``.
        """
        params = step_params(record)
        if connection is not None:
            conn = self._conns.caller_connection(connection)
            self._conns.join(conn, self._sql["write_lock"])
            return self._record_step(conn, params)
        with self._conns.immediate() as conn:
            return self._record_step(conn, params)

    def _record_step(self, conn: sqlite3.Connection, params: Dict[str, Any]) -> bool:
        if conn.execute(self._sql["step_insert"], params).fetchall():
            return True
        return conn.execute(self._sql["step_owned"], params).fetchone() is not None

    def steps_of(self, update_id: int) -> List[StepRecord]:
        """The committed records of ``update_id``, by ``recorded_at`` and then by key.

        See :meth:`ptb_fence.BatchStore.steps_of`.
        """
        with self._conns.using() as conn:
            rows = conn.execute(self._sql["steps_of"], {"update_id": update_id}).fetchall()
        return [record_of(row) for row in rows]

    # -- durable jobs ----------------------------------------------------------------------
    def schedule_jobs(self, jobs: Sequence[JobWrite], at: int, *,
                      connection: Any = None) -> List[StoredJob]:
        """Write jobs in one transaction. See :meth:`ptb_fence.BatchStore.schedule_jobs`.

        A keyed job is one ``INSERT … ON CONFLICT`` on the partial unique index of live names.
        With ``connection`` it runs in the caller's transaction, joined as in :meth:`owns`.
        """
        if connection is not None:
            conn = self._conns.caller_connection(connection)
            self._conns.join(conn, self._sql["write_lock"])
            return schedule_in(self._sql, conn, jobs, int(at))
        with self._conns.immediate() as conn:
            return schedule_in(self._sql, conn, jobs, int(at))

    def cancel_jobs(self, job_ids: Sequence[int], at: int, *,
                    connection: Any = None) -> List[bool]:
        """Cancel jobs. See :meth:`ptb_fence.BatchStore.cancel_jobs`."""
        if connection is not None:
            conn = self._conns.caller_connection(connection)
            self._conns.join(conn, self._sql["write_lock"])
            return cancel_in(self._sql, conn, job_ids, int(at))
        with self._conns.immediate() as conn:
            return cancel_in(self._sql, conn, job_ids, int(at))

    def due_jobs(self, now: int, limit: int) -> List[StoredJob]:
        """The jobs due now, in one ``SELECT``. See :meth:`ptb_fence.BatchStore.due_jobs`."""
        with self._conns.using() as conn:
            rows = conn.execute(
                self._sql["jobs_due"], {"now": int(now), "limit": max(int(limit), 0)}
            ).fetchall()
        return [job_of(row) for row in rows]

    def fire_jobs(self, fires: Sequence[JobFire], at: int) -> List[bool]:
        """Fire runs as update rows in one write transaction.

        See :meth:`ptb_fence.BatchStore.fire_jobs`. Per fire, the job's conditional
        ``UPDATE`` comes first. The run's row is inserted only when it moved the job.
        """
        if not fires:
            return []
        with self._conns.immediate() as conn:
            return fire_in(self._sql, conn, fires, int(at))

    def list_jobs(self, *, name: Optional[str] = None, include_ended: bool = False,
                  after_job_id: int = 0, limit: int = 1000) -> List[StoredJob]:
        """The jobs by id. See :meth:`ptb_fence.BatchStore.list_jobs`."""
        params = {"after": int(after_job_id), "name": name, "every": 1 if include_ended else 0,
                  "limit": max(int(limit), 0)}
        with self._conns.using() as conn:
            rows = conn.execute(self._sql["jobs_list"], params).fetchall()
        return [job_of(row) for row in rows]

    def get_job(self, job_id: int) -> Optional[StoredJob]:
        """One job. See :meth:`ptb_fence.BatchStore.get_job`."""
        with self._conns.using() as conn:
            row = conn.execute(self._sql["job_get"], {"job_id": int(job_id)}).fetchone()
        return None if row is None else job_of(row)

    def run_job_now(self, job_id: int, at: int) -> bool:
        """Make a job due now. See :meth:`ptb_fence.BatchStore.run_job_now`."""
        with self._conns.immediate() as conn:
            row = conn.execute(
                self._sql["job_run_now"], {"job_id": int(job_id), "at": int(at)}
            ).fetchone()
        return row is not None

    # -- pacing ----------------------------------------------------------------------------
    def take_send_slots(
        self, wants: Sequence[Sequence[PaceBucket]], *, now: int, horizon_ms: int
    ) -> List[int]:
        """Take send slots in one write transaction.

        See :meth:`ptb_fence.BatchStore.take_send_slots`. The write lock makes the read and the
        write of the buckets one step for every process.
        """
        checked = check_wants(wants)
        keys = pace_keys(checked)
        if not keys:
            return [int(now)] * len(checked)
        if horizon_ms < 0:  # a read takes nothing: no write lock
            with self._conns.using() as conn:
                rows = conn.execute(self._sql["pace_read"], {"keys": json.dumps(keys)}).fetchall()
            return grant(pace_rows(rows), checked,
                         now=int(now), horizon_ms=int(horizon_ms))[0]
        with self._conns.immediate() as conn:
            rows = conn.execute(self._sql["pace_read"], {"keys": json.dumps(keys)}).fetchall()
            times, changed = grant(pace_rows(rows), checked,
                                   now=int(now), horizon_ms=int(horizon_ms))
            conn.executemany(self._sql["pace_write"], [
                {"key": key, "tat": tat, "held_until": held}
                for key, (tat, held) in sorted(changed.items())
            ])
        return times

    def hold_sends(self, holds: Sequence[Tuple[str, int]]) -> None:
        """Hold buckets in one transaction. See :meth:`ptb_fence.BatchStore.hold_sends`."""
        params = [{"key": str(key), "until": int(until)} for key, until in holds]
        if not params:
            return
        with self._conns.immediate() as conn:
            conn.executemany(self._sql["pace_hold"], params)

    # -- broadcasts ------------------------------------------------------------------------
    def start_broadcast(self, name: str, method: str, params_json: str,
                        at: int) -> StoredBroadcast:
        """Start a broadcast. See :meth:`ptb_fence.BatchStore.start_broadcast`."""
        check_name(name)
        check_params(params_json)
        with self._conns.immediate() as conn:
            conn.execute(self._sql["broadcast_start"], {
                "name": name, "method": str(method), "params": params_json, "at": int(at)})
            row = conn.execute(self._sql["broadcast_list"], {"name": name}).fetchone()
        return broadcast_of(row)

    def add_recipients(self, broadcast_id: int, chat_ids: Sequence[int], at: int) -> int:
        """Add recipients in one transaction. See
        :meth:`ptb_fence.BatchStore.add_recipients`."""
        chats = check_chat_ids(chat_ids)
        if not chats:
            return 0
        with self._conns.immediate() as conn:
            return int(conn.execute(self._sql["broadcast_add_recipients"], {
                "broadcast_id": int(broadcast_id), "chats": json.dumps(chats),
                "at": int(at)}).rowcount)

    def claim_recipients(self, sender: str, *, now: int, lease_until: int,
                         limit: int) -> List[Recipient]:
        """Claim recipients under the write lock. See
        :meth:`ptb_fence.BatchStore.claim_recipients`."""
        with self._conns.immediate() as conn:
            claimed = conn.execute(self._sql["broadcast_claim"], {
                "sender": str(sender), "now": int(now), "lease_until": int(lease_until),
                "limit": int(limit)}).fetchall()
            if not claimed:
                return []
            ids = sorted({int(row[0]) for row in claimed})
            calls = {int(b): (str(m), str(p)) for b, m, p in conn.execute(
                self._sql["broadcast_calls"], {"ids": json.dumps(ids)})}
        return recipients_of(claimed, calls)

    def settle_recipients(self, sender: str, outcomes: Sequence[RecipientOutcome],
                          at: int) -> List[bool]:
        """Record outcomes in one transaction. See
        :meth:`ptb_fence.BatchStore.settle_recipients`."""
        checked = check_outcomes(outcomes)
        if not checked:
            return []
        landed = []
        with self._conns.immediate() as conn:
            for o in checked:
                landed.append(conn.execute(self._sql["broadcast_settle"], {
                    "broadcast_id": o.broadcast_id, "chat_id": o.chat_id, "state": o.state,
                    "due_at": int(o.due_at) if o.state == "pending" else int(at),
                    "error": o.error, "sender": str(sender)}).fetchone() is not None)
        return landed

    def set_broadcast_state(self, name: str, state: str,
                            at: int) -> Optional[StoredBroadcast]:
        """Pause, resume or cancel. See :meth:`ptb_fence.BatchStore.set_broadcast_state`."""
        check_state(state)
        with self._conns.immediate() as conn:
            conn.execute(self._sql["broadcast_set_state"], {"name": name, "state": state})
            conn.execute(self._sql["broadcast_cancel_pending"], {"name": name, "at": int(at)})
            row = conn.execute(self._sql["broadcast_list"], {"name": name}).fetchone()
        return None if row is None else broadcast_of(row)

    def list_broadcasts(self, name: Optional[str] = None) -> List[StoredBroadcast]:
        """The broadcasts. See :meth:`ptb_fence.BatchStore.list_broadcasts`."""
        with self._conns.using() as conn:
            rows = conn.execute(self._sql["broadcast_list"], {"name": name}).fetchall()
        return [broadcast_of(row) for row in rows]
