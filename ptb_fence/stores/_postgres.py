"""PostgresUpdateStore: the store for several processes or machines (psycopg2).

The store is built from small modules: ``_pg_connections`` (pools, redaction),
``_pg_executor`` (transactions, retries, renewal connection, schema check), ``_pg_batches``
(batched statements), ``_pg_base`` (base contract) and this module (fenced and durable
contracts); its SQL is in ``_postgres_sql``. psycopg2 is imported only when a store is created.
"""

from __future__ import annotations

from typing import Any, ContextManager, Dict, List, Optional, Sequence, Tuple

from ptb_fence._values import AttemptIdentity, Exhaustion, Settlement
from ptb_fence.stores._names import validate_table_name, validate_update_id
from ptb_fence.stores._pg_base import PostgresBaseStore
from ptb_fence.stores._pg_chats import PostgresChatOrder
from ptb_fence.stores._pg_claims import PostgresClaims
from ptb_fence.stores._pg_batches import (
    add_claimed,
    batch_results,
    settle_owned_work,
    settle_params,
)
from ptb_fence.stores._pg_executor import returns_row
from ptb_fence.stores._postgres_sql import schema_sql

__all__ = ["PostgresUpdateStore", "postgres_update_store_schema"]


def postgres_update_store_schema(table: str = "telegram_updates") -> str:
    """Return the idempotent SQL migration for a :class:`PostgresUpdateStore` table.

    It creates the table if it is missing, adds the ``claim_id`` column to a table created
    before fencing (and ``fingerprint``, ``instance`` and ``chat_key`` to older tables), and
    creates the ``(state, due_at)`` index and the partial chat-order index if they are missing. Applying it
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


def _identity_params(identity: AttemptIdentity, at: int) -> Dict[str, Any]:
    return {
        "update_id": identity.update_id,
        "attempt": identity.attempt,
        "claim_id": identity.claim_id,
        "at": at,
    }


class PostgresUpdateStore(PostgresClaims, PostgresChatOrder, PostgresBaseStore):
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

    __slots__ = ()

    def close(self) -> None:
        """Stop holding liveness (:meth:`release_liveness`), then close the store's
        connections (a pool given by the caller stays open). Idempotent."""
        try:
            self.release_liveness()
        finally:
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

        The claim id is generated fresh for the claim and **read back from the row**
        (``RETURNING``).

        Returns:
            :class:`ptb_fence.AttemptIdentity` | :obj:`None`: The identity, or :obj:`None` if
            not taken.

        Raises:
            ptb_fence.SchemaError: On a table without ``claim_id``.
        """
        params = self._claim_params(update_id, now, lease_until, max_attempts, durable_exhaustion)
        row = self._fetch_one(self._claim_sql(True), params)
        if row is None or row[0] != "processing":
            return None
        identity = AttemptIdentity(update_id=update_id, attempt=int(row[1]), claim_id=str(row[2]))
        if len(row) > 3 and row[3]:  # a suspect row (IsolatingUpdateStore)
            self._suspects.note(identity)
        return identity

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
        return self._db.renew_one(identity.update_id, self._db.sql.renew_owned, params)

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
        sql = self._db.sql.renew_owned_many(len(identities))
        params: List[Any] = []
        for position, identity in enumerate(identities):
            params += [position, identity.update_id, identity.attempt, identity.claim_id]
        params += [now, lease_until, now]

        def work(cur: Any) -> List[Optional[bool]]:
            cur.execute(sql, params)
            return batch_results(cur.fetchall(), len(identities))

        return self._db.run_renewal(work)

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
        return add_claimed(self._db, rows, lease_until, [], self._liveness.mine())[0]

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
        return add_claimed(self._db, rows, lease_until, settlements, self._liveness.mine())

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
        params = _identity_params(identity, at)
        if connection is not None:
            sql = self._db.sql.owns_for_update
            return self._db.on_caller(connection, sql, params, locking=True)
        return self._db.run(lambda cur: returns_row(cur, self._db.sql.owns, params))

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
        sql, params = settle_params(
            self._db.sql, identity.update_id, identity.attempt, settlement, owned=True
        )
        params["claim_id"] = identity.claim_id
        if connection is not None:
            return self._db.on_caller(connection, sql, params)
        return self._db.run(lambda cur: returns_row(cur, sql, params))

    def complete_owned(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Inside the caller's open transaction on ``connection`` (a psycopg2 connection or
        cursor): complete this exact claim at ``at`` if its lease holds at ``at``
        (``due_at >= at``), in one ``UPDATE … RETURNING`` whose row lock lasts until the
        caller's transaction ends (a competing claim waits, then sees the completed row).
        Nothing is committed: the caller's rollback restores the claim (optional capability,
        :class:`ptb_fence.CompletingUpdateStore`).

        Returns:
            :obj:`bool`: Whether the claim was owned at ``at`` and is now completed in the
            caller's transaction.

        Raises:
            ValueError: If ``connection`` is in autocommit mode outside a transaction.
        """
        params = _identity_params(identity, at)
        return self._db.on_caller(
            connection, self._db.sql.settle_completed_owned, params, locking=True
        )

    def reopen_completed(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Undo a :meth:`complete_owned` at ``at`` that the caller committed itself: the row
        of this exact claim, ``completed`` with ``settled_at = at``, goes back to
        ``processing`` (lease kept); committed at once on ``connection``.

        Returns:
            :obj:`bool`: Whether that completion was undone.
        """
        conn = getattr(connection, "connection", connection)
        try:
            undone = self._db.on_caller(
                connection, self._db.sql.reopen_completed, _identity_params(identity, at)
            )
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        return undone

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
        return self._db.run(settle_owned_work(self._db.sql, items))

    def transaction(self) -> ContextManager[Any]:
        """Open a transaction on a pooled psycopg2 connection (optional capability).

        Yields the connection (``%s`` placeholders) for the caller's writes; commits on normal
        exit, rolls back on an exception (and re-raises), and returns the connection to the
        pool. Do not commit or roll back the yielded connection yourself. Waits for a free
        connection like every other call (:exc:`ptb_fence.StoreBusy` after ``pool_timeout``).

        Returns:
            A context manager yielding a psycopg2 connection inside an open transaction.
        """
        return self._db.transaction()

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
        return self._db.run(lambda cur: returns_row(cur, self._db.sql.exhaust, params))

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
            cur.execute(self._db.sql.due_exhaustions, params)
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

        return self._db.run(work)

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
        sql = self._db.sql.acknowledge_exhaustion
        return self._db.run(lambda cur: returns_row(cur, sql, params))
