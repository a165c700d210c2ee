"""SQLiteUpdateStore: the embedded default store (one file, many threads, several processes).

The store is built from small modules: ``_sqlite_connections`` (per-thread connections,
write transactions, lifecycle), ``_sqlite_schema`` (create and upgrade the table),
``_sqlite_writes`` (shared statements), ``_sqlite_base`` (base contract) and this module
(fenced and durable contracts); its SQL is in ``_sqlite_sql``.
"""

from __future__ import annotations

import sqlite3
from typing import Any, ContextManager, List, Optional, Sequence, Set, Tuple

from ptb_fence._values import AttemptIdentity, Completed, Exhaustion, Settlement
from ptb_fence.stores._names import validate_update_id
from ptb_fence.stores._sqlite_base import SQLiteBaseStore
from ptb_fence.stores._sqlite_chats import SQLiteChatOrder
from ptb_fence.stores._sqlite_claims import SQLiteClaims
from ptb_fence.stores._sqlite_recovery import SQLiteRecovery
from ptb_fence.stores._sqlite_writes import (
    add_claimed_in,
    int_arg,
    max_variables,
    settle_owned_in,
    settle_params,
    settle_statement,
    take,
)

__all__ = ["SQLiteUpdateStore"]


class SQLiteUpdateStore(SQLiteClaims, SQLiteChatOrder, SQLiteRecovery, SQLiteBaseStore):
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

    __slots__ = ()

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
        super().close()

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
        return take(
            self._conns, self._sql, update_id, now, lease_until, max_attempts,
            durable_exhaustion, self._liveness.mine(), suspects=self._suspects,
        )

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
    ) -> Tuple[List[Optional[AttemptIdentity]], List[bool]]:
        """:meth:`add_claimed_many` and :meth:`settle_owned_many` in one transaction (one
        commit): fresh updates and finished attempts that arrive together share a commit
        (optional capability)."""
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        settlements = list(settlements)
        lease_until = int_arg("lease_until", lease_until)
        with self._conns.immediate() as conn:
            added = add_claimed_in(self._sql, conn, rows, lease_until, self._liveness.mine())
            landed = settle_owned_in(self._sql, conn, settlements)
        return added, landed

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
        self, items: Sequence[Tuple[AttemptIdentity, Settlement]]
    ) -> List[bool]:
        """:meth:`settle_owned` for several attempts in one transaction (one commit).

        Returns:
            List[:obj:`bool`]: Per input position, whether that settlement landed.
        """
        items = list(items)
        if not items:
            return []
        with self._conns.immediate() as conn:
            return settle_owned_in(self._sql, conn, items)

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
        with self._conns.immediate() as conn:
            return bool(conn.execute(self._sql.ack_exhaustion, params).fetchall())
