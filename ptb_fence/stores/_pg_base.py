"""PostgresBaseStore: the unary (base) contract of the PostgreSQL store, batch recording and
batch renewal, and its lifecycle. :class:`~ptb_fence.PostgresUpdateStore` adds the fenced and
durable contracts."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

from ptb_fence._errors import TableBotMismatch
from ptb_fence._values import Settlement, StoredUpdate
from ptb_fence.stores._names import validate_table_name, validate_update_id
from ptb_fence.stores._pg_batches import add_many, batch_results, settle_params
from ptb_fence.stores._pg_connections import open_source
from ptb_fence.stores._pg_executor import PgExecutor, returns_row
from ptb_fence.stores._pg_recovery import PgLiveness, PostgresRecovery
from ptb_fence.stores._postgres_sql import META_TABLE
from ptb_fence.stores._suspects import SuspectClaims

if TYPE_CHECKING:  # psycopg2 is imported when a store is created, not with ptb_fence
    import psycopg2.pool

__all__ = ["PostgresBaseStore"]

_S = TypeVar("_S", bound="PostgresBaseStore")


class PostgresBaseStore(PostgresRecovery):
    """The base and batch operations of :class:`ptb_fence.PostgresUpdateStore` (see there for
    the constructor's arguments and the connection rules)."""

    __slots__ = ("_create_table", "_db", "_liveness", "_suspects")

    def __init__(
        self,
        dsn_or_pool: Union[str, "psycopg2.pool.AbstractConnectionPool"],
        table: str = "telegram_updates",
        create_table: bool = True,
        *,
        pool_size: int = 8,
        pool_timeout: float = 30.0,
    ) -> None:
        table = validate_table_name(table)
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be a positive integer, not {pool_size!r}")
        if (
            isinstance(pool_timeout, bool)
            or not isinstance(pool_timeout, (int, float))
            or not pool_timeout > 0
        ):
            raise ValueError(f"pool_timeout must be a positive number of seconds, not {pool_timeout!r}")
        source = open_source(dsn_or_pool, pool_size)
        self._create_table = bool(create_table)
        self._db = PgExecutor(source, table, self._create_table, float(pool_timeout))
        self._liveness = PgLiveness(table, self._db.sql.claim, self._db.sql.claim_fenced)
        self._suspects = SuspectClaims()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(table={self._db.table!r}, create_table={self._create_table!r}, "
            f"pool_size={self._db.source.capacity}, pool_timeout={self._db.pool_timeout:g})"
        )

    @property
    def table(self) -> str:
        """:obj:`str`: The name of the store's table."""
        return self._db.table

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Close the store's connections (a pool given by the caller stays open).

        Connections still lent out (an open :meth:`transaction`) are closed when returned.
        Calling it again does nothing.
        """
        self._db.close()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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

    def bind_bot(self, bot_id: int) -> None:
        """Record that the table belongs to bot ``bot_id``; the first binder wins.

        The owner is kept in the table ``ptb_fence_meta`` (created when missing, also by
        :func:`postgres_update_store_schema`) in one ``INSERT … ON CONFLICT`` statement, so
        processes binding a new table at once are safe. Binding the same id again is a no-op.

        Raises:
            ptb_fence.TableBotMismatch: The table was bound to another bot id first.
        """
        bot_id = int(bot_id)
        params = {"table": self._db.table, "bot_id": bot_id}

        def work(cur: Any) -> int:
            cur.execute("SELECT to_regclass(%s) IS NULL", (f'"{META_TABLE}"',))
            if cur.fetchone()[0]:  # created only when missing (needs the CREATE privilege)
                cur.execute(self._db.sql.create_meta)
            cur.execute(self._db.sql.bind_bot, params)
            return int(cur.fetchone()[0])

        owner = self._db.run(work)
        if owner != bot_id:
            raise TableBotMismatch(self._db.table, "this PostgreSQL database", owner, bot_id)

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
        return add_many(self._db, rows)

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
            "instance": self._liveness.mine(),
        }

    def _fetch_one(self, sql: str, params: Any) -> Optional[Tuple[Any, ...]]:
        def work(cur: Any) -> Optional[Tuple[Any, ...]]:
            cur.execute(sql, params)
            row = cur.fetchone()
            return None if row is None else tuple(row)

        return self._db.run(work)

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
        row = self._fetch_one(self._claim_sql(bool(durable_exhaustion), counted=True), params)
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
        return self._db.renew_one(update_id, self._db.sql.renew, params)

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
        sql = self._db.sql.renew_many(len(leases))
        params: List[Any] = []
        for position, (update_id, attempt) in enumerate(leases):
            params += [position, update_id, attempt]
        params += [now, lease_until, now]

        def work(cur: Any) -> List[Optional[bool]]:
            cur.execute(sql, params)
            return batch_results(cur.fetchall(), len(leases))

        return self._db.run_renewal(work)

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Record the result of ``attempt`` if it still holds its lease at ``settlement.at``.

        A settle that does not land is ignored. Legacy-safe.

        Args:
            update_id (:obj:`int`): The Telegram ``update_id``.
            attempt (:obj:`int`): The attempt whose result this is.
            settlement (:class:`ptb_fence.Completed` | :class:`ptb_fence.Failed` |
                :class:`ptb_fence.Abandoned`): The result.
        """
        sql, params = settle_params(
            self._db.sql, update_id, attempt, settlement, owned=False
        )
        self._db.run(lambda cur: returns_row(cur, sql, params))

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """Rows to hand over, ordered by ``update_id``, at most ``limit``. Legacy-safe.

        Pending rows with ``received_at <= pending_before``, released rows (pending with a
        claim id, see :meth:`release_many`) whatever ``pending_before``, failed rows with
        ``due_at <= now`` and processing rows whose lease lapsed (``due_at < now``).

        Args:
            now (:obj:`int`): The current time (epoch milliseconds).
            pending_before (:obj:`int`): Pending rows received at or before this time count.
            limit (:obj:`int`): The most rows to return.

        Returns:
            List[:class:`ptb_fence.StoredUpdate`]: The rows.
        """
        params = {"now": now, "pending_before": pending_before, "limit": max(int(limit), 0)}
        sql = self._due_sql()

        def work(cur: Any) -> List[StoredUpdate]:
            cur.execute(sql, params)
            return [StoredUpdate(int(u), body) for u, body in cur.fetchall()]

        return self._db.run(work)

    def prune(self, before: int) -> int:
        """Delete completed and abandoned rows with ``settled_at < before``. Legacy-safe.

        Pending, processing and failed rows and unacknowledged exhaustions are never pruned.

        Args:
            before (:obj:`int`): The strict bound (epoch milliseconds).

        Returns:
            :obj:`int`: How many rows were deleted.
        """

        def work(cur: Any) -> int:
            cur.execute(self._db.sql.prune, {"before": before})
            return int(cur.rowcount)

        return self._db.run(work)
