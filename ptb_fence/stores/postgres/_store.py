"""PostgresUpdateStore: the store for several processes or machines (psycopg2), whole in one class.

Its sections: construction and lifecycle, the base, fenced and durable contracts, chat order,
release and liveness, figures, the outbox.
Its collaborators are the connection pools (``_connections``) and the executor
(``_executor``), which runs statements in short transactions with retries. The others are
the batched writes (``_writes``), the liveness holder (``_liveness``) and the named
statements (the package's ``.sql`` files, loaded by ``_sql``).
psycopg2 is imported only when a store is created.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
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

from ptb_fence._errors import SchemaError, StateConflictError, TableBotMismatch
from ptb_fence._fingerprint import update_fingerprint
from ptb_fence.contract import Batch, ChatKey, ClaimTerms, Committed, StoreFeatures
from ptb_fence._sockets import cut, cut_after
from ptb_fence._values import (
    AttemptEffects,
    AttemptIdentity,
    Exhaustion,
    JobFire,
    JobWrite,
    Landing,
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
    broadcast_tables,
    check_chat_ids,
    check_name,
    check_outcomes,
    check_params,
    check_state,
    recipients_of,
)
from ptb_fence.stores._duplicates import warn_conflict
from ptb_fence.stores._figures_sql import figures_of
from ptb_fence.stores._jobs_sql import job_of, jobs_table_name
from ptb_fence.stores._names import (
    validate_schema_name,
    validate_table_name,
    validate_update_id,
)
from ptb_fence.stores._outbox_sql import (
    counts_of,
    effects_params,
    entry_of,
    outbox_table_name,
    sender_pattern,
)
from ptb_fence.stores._state_sql import (
    check_kind,
    check_writes,
    entries_of,
    list_params,
    lock_params,
    read_params,
    state_table_name,
)
from ptb_fence.stores._pace import check_wants, grant, pace_keys, pace_rows, pace_table_name
from ptb_fence.stores._steps_sql import record_of, step_params, steps_table_name
from ptb_fence.stores.memory._pace import MemoryPace
from ptb_fence.stores._suspects import SuspectClaims
from ptb_fence.stores.postgres._connections import close_quietly
from ptb_fence.stores.postgres._sources import open_source
from ptb_fence.stores.postgres._executor import PgExecutor, returns_row
from ptb_fence.stores.postgres._broadcasts import write_broadcasts_in
from ptb_fence.stores.postgres._jobs import cancel_in, fire_in, schedule_in, write_jobs_in
from ptb_fence.stores.postgres._liveness import PgLiveness
from ptb_fence.stores.postgres._sql import instance_key, schema_sql
from ptb_fence.stores.postgres._writes import (
    CallsWritten,
    Records,
    batch_results,
    insert_calls,
    settle_owned_work,
    settle_params,
    write_state_in,
)

if TYPE_CHECKING:  # psycopg2 is imported when a store is created, not with ptb_fence
    import psycopg2.pool

__all__ = ["PostgresUpdateStore", "postgres_update_store_schema"]

_LOGGER = logging.getLogger("ptb_fence.store")

_RELEASE_SECONDS = 2.0
"""How long ``release_liveness`` waits for the server to delete the instance's row."""

_S = TypeVar("_S", bound="PostgresUpdateStore")

ChatRow = Tuple[int, str, int, Optional[int]]


def postgres_update_store_schema(
    table: str = "telegram_updates", *, schema: Optional[str] = None
) -> str:
    """Return the idempotent SQL migration for a :class:`PostgresUpdateStore` table.

    It creates the table if it is missing. It adds the ``claim_id`` column to a table created
    before fencing, and ``fingerprint``, ``instance``, ``isolated_claim`` and ``chat_key`` to
    older tables. It creates the ``(state, due_at)`` index and the partial chat-order index if
    they are missing. Applying it again changes nothing. It takes a transaction-scoped advisory
    lock first, so several processes may apply it at once. Apply it (for example with
    ``psql -1 -f`` or one ``cursor.execute``) when you construct the store with
    ``create_table=False``.

    Args:
        table (:obj:`str`, optional): The table name. Defaults to ``"telegram_updates"``.
        schema (:obj:`str`, optional): A schema of its own. The migration then creates the
            schema if it is missing and runs in it (``SET LOCAL search_path``). So apply it in
            one transaction. Defaults to the connection's ``search_path``.

    Returns:
        :obj:`str`: The migration, several SQL statements separated by semicolons.

    Raises:
        ValueError: If ``table`` is not a valid table name, or ``schema`` not a valid schema
            name (checked before anything else).
    """
    name = validate_table_name(table)
    if schema is None:
        return schema_sql(name)
    schema = validate_schema_name(schema)
    # the whole script in the schema: SET LOCAL lasts until its transaction ends
    return (
        f'CREATE SCHEMA IF NOT EXISTS "{schema}";\n'
        f'SET LOCAL search_path TO "{schema}";\n' + schema_sql(name)
    )


def _identity_params(identity: AttemptIdentity, at: int) -> Dict[str, Any]:
    return {
        "update_id": identity.update_id,
        "attempt": identity.attempt,
        "claim_id": identity.claim_id,
        "at": at,
    }


def _scalar(cur: Any, sql: str) -> Any:
    cur.execute(sql)
    return cur.fetchone()[0]


class PostgresUpdateStore:
    """A durable, fenced update store in PostgreSQL, for one or several processes or machines.

    Thread-safe. Every operation takes a connection from the store's pool for one short
    transaction. When all are busy, a caller waits up to ``pool_timeout`` seconds and then gets
    :exc:`ptb_fence.StoreBusy`, never psycopg2's "connection pool exhausted". Lease renewals
    (:meth:`renew`, :meth:`renew_owned`, :meth:`renew_many`, :meth:`renew_owned_many`) use a
    dedicated connection of their own. So an exhausted pool cannot stop them.

    **Fenced transactions and renewals**: ``owns(identity, at, connection=conn)`` locks the
    update's row ``FOR UPDATE`` until the caller's transaction ends. Renewals never wait for
    such a lock. The batched renewals skip a locked row (``SKIP LOCKED``) and report it as
    :obj:`None`, neither renewed nor refused. A single renewal waits at most 200 ms and then
    raises :exc:`ptb_fence.RowLocked`. So a long fenced transaction delays only its own row's
    renewal, and the other attempts keep renewing. Its own lease is not extended while the
    transaction is open. So **a fenced transaction may stay open at most until its lease
    expires**, that is ``lease_seconds`` after the last renewal, minus a safety margin. No other
    claim can take the row while the lock is held. But once the lease has expired, the
    attempt's settle is refused.

    A connection that breaks (the server restarted, the backend was terminated) is discarded.
    The operation is retried on a new connection when the break happened before the commit,
    since then nothing was written. A break during the commit raises, as the outcome is
    unknown. An operation reports success only after its commit. Connection errors never
    contain the DSN's password.

    **Legacy tables**: :meth:`add`, :meth:`claim` (without ``durable_exhaustion``),
    :meth:`renew`, :meth:`settle`, :meth:`due`, :meth:`prune`, :meth:`add_many` and
    :meth:`renew_many` never reference the ``claim_id`` column. So with ``create_table=False``
    a table created before fencing keeps working with the unary API. The fenced and durable
    methods, and :meth:`claim` with ``durable_exhaustion=True``, need that column. They raise
    :exc:`ptb_fence.SchemaError` naming :func:`postgres_update_store_schema` when it is missing.
    A table that has ``claim_id`` but lacks a later column (``fingerprint``, ``instance``,
    ``isolated_claim``, ``chat_key``) is refused at first use. The :exc:`ptb_fence.SchemaError`
    names ``ptb-fence migrate`` and ``create_table=True``.

    Args:
        dsn_or_pool (:obj:`str` | :class:`psycopg2.pool.AbstractConnectionPool` | \
            :class:`sqlalchemy.engine.Engine` | :obj:`callable`): Where connections come from.
            It is one of four sources.
            A libpq connection string or URI. With no ``connect_timeout`` in it, connections
            are opened with ``connect_timeout=10``.
            A psycopg2 connection pool, for example a
            :class:`psycopg2.pool.ThreadedConnectionPool`. Its ``maxconn`` bounds the store's
            concurrent connections. The renewal and liveness connections are opened with the
            pool's connection arguments.
            An application's SQLAlchemy ``Engine`` on ``postgresql+psycopg2``. The store borrows
            the engine's pooled connections (at most ``pool_size`` at once) and gives them back.
            So the bot opens no second pool. The engine makes its two dedicated connections
            (lease renewals, the liveness lock), which are detached from its pool. So they never
            take a pooled slot.
            A connection factory: a callable returning a new psycopg2 connection, for example
            with the application's SSL and ``application_name`` settings. The store opens its
            pooled and dedicated connections with it.
            The store never closes a pool or disposes an engine it was given.
        table (:obj:`str`, optional): The table name. It must fully match
            ``[A-Za-z_][A-Za-z0-9_]{0,62}``. It is used double-quoted, i.e. exactly as given.
            Defaults to ``"telegram_updates"``.
        create_table (:obj:`bool`, optional): Ensure the schema (see
            :func:`postgres_update_store_schema`) before first use. If that fails, for example
            because the server is down, it is retried on the next use. Pass :obj:`False` to
            manage the schema yourself. Defaults to :obj:`True`.

    Keyword Args:
        schema (:obj:`str`, optional): A schema of its own (the rule of table names). The
            store's connections (a DSN's or a connection factory's) get ``search_path`` set to
            it. So every table of the store lives there. The schema must exist
            (``ptb-fence migrate --table schema.table`` creates it). Defaults to the
            connections' ``search_path``.
        pool_size (:obj:`int`, optional): With a DSN or a connection factory, the most pooled
            connections the store opens. With an engine, the most of its connections the store
            holds at once. Renewals and liveness use one more each. Ignored when a psycopg2
            pool is given. Defaults to ``8``.
        pool_timeout (:obj:`float`, optional): Seconds a caller waits for a free connection
            before :exc:`ptb_fence.StoreBusy`. Defaults to ``30.0``.

    Raises:
        ValueError: For a bad table or schema name, a malformed DSN (its password is not
            repeated) or a non-positive ``pool_size``/``pool_timeout``.
        TypeError: If ``dsn_or_pool`` is none of these.
        ptb_fence.UsageError: An engine that is not a synchronous one on psycopg2.
    """

    __slots__ = ("_broadcasts_seen", "_create_table", "_db", "_jobs_seen", "_liveness", "_local_pace", "_pace_seen",
                 "_suspects")

    #: Every optional part of the contract (see :class:`ptb_fence.BatchStore`).
    features = StoreFeatures(
        outbox=True, state=True, liveness=True, chat_order=True, isolation=True, figures=True,
        steps=True, jobs=True, pacing=True, broadcasts=True,
    )

    def __init__(
        self,
        dsn_or_pool: Union[str, "psycopg2.pool.AbstractConnectionPool", Callable[[], Any], Any],
        table: str = "telegram_updates",
        create_table: bool = True,
        *,
        schema: Optional[str] = None,
        pool_size: int = 8,
        pool_timeout: float = 30.0,
    ) -> None:
        table = validate_table_name(table)
        if schema is not None:
            schema = validate_schema_name(schema)
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be a positive integer, not {pool_size!r}")
        if (
            isinstance(pool_timeout, bool)
            or not isinstance(pool_timeout, (int, float))
            or not pool_timeout > 0
        ):
            raise ValueError(f"pool_timeout must be a positive number of seconds, not {pool_timeout!r}")
        source = open_source(dsn_or_pool, pool_size, schema)
        self._create_table = bool(create_table)
        self._db = PgExecutor(source, table, self._create_table, float(pool_timeout))
        self._liveness = PgLiveness()
        self._jobs_seen = False  # the jobs table was seen: the reads need not look again
        # None: the pace table was not looked up yet. A table managed with create_table=False
        # and made before pacing has none: this process then paces alone (_local_pace).
        self._pace_seen: Optional[bool] = None
        # False until the broadcast tables were seen (a table managed with create_table=False
        # and made before broadcasts has none until it is migrated)
        self._broadcasts_seen = False
        self._local_pace: Optional[MemoryPace] = None
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
        """Stop holding liveness, then close the store's connections. Idempotent.

        It calls :meth:`release_liveness` first. A pool given by the caller stays open.
        Connections still lent out (an open :meth:`transaction`) are closed when returned.
        """
        try:
            self.release_liveness()
        finally:
            self._db.close()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- base contract ---------------------------------------------------------------------
    def add(self, update_id: int, body: str, received_at: int) -> bool:
        """Insert a pending row. See :meth:`ptb_fence.UpdateStore.add`.

        It is a :meth:`commit` of one record. It returns only after the row is committed.
        Legacy-safe. An id that arrives again follows :mod:`ptb_fence.stores._duplicates`. On the
        seed's legacy table, which has no ``fingerprint`` column, every existing id is a plain
        duplicate.

        Args:
            update_id (:obj:`int`): The Telegram ``update_id``.
            body (:obj:`str`): The update's JSON text.
            received_at (:obj:`int`): When it was received (epoch milliseconds).

        Returns:
            :obj:`bool`: Whether the row was inserted.
        """
        validate_update_id(update_id)
        return self.commit(Batch(records=((update_id, body, received_at),))).recorded[0]

    def bind_bot(self, bot_id: int) -> None:
        """Record that the table belongs to bot ``bot_id``.

        See :meth:`ptb_fence.BatchStore.bind_bot`.

        The owner is kept in the table ``ptb_fence_meta``. It is created when missing, also by
        :func:`postgres_update_store_schema`. The binding is one ``INSERT … ON CONFLICT``
        statement, so processes binding a new table at once are safe.

        Raises:
            ptb_fence.TableBotMismatch: The table was bound to another bot id first.
        """
        bot_id = int(bot_id)
        params = {"table": self._db.table, "bot_id": bot_id}

        def work(cur: Any) -> int:
            cur.execute(self._db.sql["meta_exists"])
            if not cur.fetchone()[0]:  # created only when missing (needs the CREATE privilege)
                cur.execute(self._db.sql["create_meta"])
            cur.execute(self._db.sql["bind_bot"], params)
            return int(cur.fetchone()[0])

        owner = self._db.run(work)
        if owner != bot_id:
            raise TableBotMismatch(self._db.table, "this PostgreSQL database", owner, bot_id)

    def add_many(self, rows: Sequence[Tuple[int, str, int]]) -> List[bool]:
        """Record ``rows`` pending in one commit.

        It is a convenience over :meth:`commit` for seeding and imports. It is no part of the
        contract. Legacy-safe.

        Returns:
            List[:obj:`bool`]: Per row, whether it is new (``Committed.recorded``).
        """
        return list(self.commit(Batch(records=tuple(rows))).recorded)

    def _claim_params(self, terms: ClaimTerms, update_id: Optional[int] = None) -> Dict[str, Any]:
        """The parameters of a claim statement.

        With ``update_id`` they are those of the claim of that one row, with its fresh claim id.
        """
        params: Dict[str, Any] = {
            "now": int(terms.now),
            "lease_until": int(terms.lease_until),
            "max_attempts": int(terms.max_attempts),
            "durable": bool(terms.durable_exhaustion),
            "instance": self._liveness.mine(),
        }
        if update_id is not None:
            params.update(update_id=update_id, claim_id=uuid.uuid4().hex)
        return params

    def _fetch_one(self, sql: str, params: Any) -> Optional[Tuple[Any, ...]]:
        def work(cur: Any) -> Optional[Tuple[Any, ...]]:
            cur.execute(sql, params)
            row = cur.fetchone()
            return None if row is None else tuple(row)

        return self._db.run(work)

    def _legacy(self, name: str) -> str:
        """The statement ``name``, or its ``_legacy`` form on the seed's legacy table."""
        return self._db.sql[name + "_legacy" if self._db.legacy() else name]

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

        It is one conditional ``UPDATE``. Without ``durable_exhaustion`` it leaves ``claim_id``
        alone, so it is legacy-safe. With it, it writes a fresh claim id and needs that column.

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
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        params = self._claim_params(terms, update_id)
        # the base claim's attempt never runs alone (the runtime claims with claim_owned
        # wherever it isolates): its take is marked isolated at once
        sql = self._db.sql["claim_durable"] if durable_exhaustion else self._legacy("claim")
        row = self._fetch_one(sql, params)
        if row is None or row[0] != "processing":
            return None
        return int(row[1])

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """Extend a live lease on the dedicated connection. See :meth:`ptb_fence.UpdateStore.renew`.

        Legacy-safe.

        Args:
            update_id (:obj:`int`): The Telegram ``update_id``.
            attempt (:obj:`int`): The attempt holding the lease.
            lease_until (:obj:`int`): The new lease expiry (epoch milliseconds).
            now (:obj:`int`, optional): The current time. The lease must not have expired.

        Returns:
            :obj:`bool`: :obj:`True` when the row matched, even if the lease stayed as it was.

        Raises:
            ptb_fence.RowLocked: Another open transaction held the row for more than 200 ms.
                Typically it is the attempt's own fenced transaction. The lease is neither renewed
                nor refused.
        """
        params = {
            "update_id": update_id,
            "attempt": attempt,
            "lease_until": lease_until,
            "now": now,
        }
        return self._db.renew_one(update_id, self._db.sql["renew"], params)

    def renew_many(
        self, leases: Sequence[Tuple[int, int]], lease_until: int, now: int
    ) -> List[Optional[bool]]:
        """Renew several leases in one statement. See :meth:`ptb_fence.BatchStore.renew_many`.

        It runs on the dedicated renewal connection. Legacy-safe.
        It never waits on a row lock. A row held by another open transaction (a fenced
        transaction's ``FOR UPDATE``) is skipped (``SKIP LOCKED``) and reported as :obj:`None`.
        So one long transaction cannot stop the other renewals.

        Args:
            leases: The ``(update_id, attempt)`` pairs.
            lease_until (:obj:`int`): The new lease expiry (epoch milliseconds).
            now (:obj:`int`): The current time (epoch milliseconds).

        Returns:
            List[:obj:`bool` | :obj:`None`]: Per input position, :obj:`True` when renewed
            (matched). :obj:`False` when refused: no such attempt, or its lease expired before
            ``now``. :obj:`None` when undecided: the row still matches, but another open
            transaction holds it right now. The lease was not extended. Do not treat it as lost.
        """
        leases = [(update_id, attempt) for update_id, attempt in leases]
        if not leases:
            return []
        sql = self._db.sql["renew_many"]
        params = {
            "positions": list(range(len(leases))),
            "update_ids": [update_id for update_id, _ in leases],
            "attempts": [attempt for _, attempt in leases],
            "now": now,
            "lease_until": lease_until,
        }

        def work(cur: Any) -> List[Optional[bool]]:
            cur.execute(sql, params)
            return batch_results(cur.fetchall(), len(leases))

        return self._db.run_renewal(work)

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Record an attempt's result. See :meth:`ptb_fence.UpdateStore.settle`.

        Legacy-safe.

        Args:
            update_id (:obj:`int`): The Telegram ``update_id``.
            attempt (:obj:`int`): The attempt whose result this is.
            settlement: The result (:class:`ptb_fence.Completed`, :class:`ptb_fence.Failed` or
                :class:`ptb_fence.Abandoned`).
        """
        sql, params = settle_params(
            self._db.sql, update_id, attempt, settlement, owned=False
        )
        self._db.run(lambda cur: returns_row(cur, sql, params))

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """Rows to hand over. See :meth:`ptb_fence.UpdateStore.due`.

        Legacy-safe.

        Args:
            now (:obj:`int`): The current time (epoch milliseconds).
            pending_before (:obj:`int`): Pending rows received at or before this time count.
            limit (:obj:`int`): The most rows to return.

        Returns:
            List[:class:`ptb_fence.StoredUpdate`]: The rows.
        """
        params = {"now": now, "pending_before": pending_before, "limit": max(int(limit), 0)}
        sql = self._legacy("due")

        def work(cur: Any) -> List[StoredUpdate]:
            cur.execute(sql, params)
            return [StoredUpdate(int(u), body) for u, body in cur.fetchall()]

        return self._db.run(work)

    def prune(self, before: int) -> int:
        """Delete settled rows. See :meth:`ptb_fence.UpdateStore.prune`.

        Legacy-safe. The same transaction prunes the outbox table, where it exists. It loses its
        sent calls with ``sent_at < before`` and its acknowledged failed calls with
        ``due_at < before``. The state table, where it exists, loses its callback-data keyboards
        (kind ``callback``) written before ``before``. The steps table, where it exists, loses
        the records of the update rows deleted, in the same statement. The pace table loses the
        buckets that are free again. The broadcasts started before ``before`` that nobody is
        sent to any more go, with their recipients. None of these is counted. No other state is pruned.

        Args:
            before (:obj:`int`): The strict bound (epoch milliseconds).

        Returns:
            :obj:`int`: How many update rows were deleted.
        """
        sql = self._db.sql
        outbox = {"outbox": f'"{outbox_table_name(self._db.table)}"'}
        state = {"state": f'"{state_table_name(self._db.table)}"'}
        steps = {"steps": f'"{steps_table_name(self._db.table)}"'}
        pace = {"pace": f'"{pace_table_name(self._db.table)}"'}

        recipients = {"recipients": f'"{broadcast_tables(self._db.table)["recipients"]}"'}

        def work(cur: Any) -> int:
            cur.execute(sql["pace_exists"], pace)
            if cur.fetchone()[0]:
                cur.execute(sql["pace_prune"], {"before": before})
            cur.execute(sql["broadcasts_exists"], recipients)
            if cur.fetchone()[0]:
                cur.execute(sql["broadcast_prune"], {"before": before})
            # a table managed with create_table=False may have no outbox yet: prune as before
            cur.execute(sql["outbox_exists"], outbox)
            if cur.fetchone()[0]:
                cur.execute(sql["outbox_prune"], {"before": before})
            cur.execute(sql["state_exists"], state)
            if cur.fetchone()[0]:
                cur.execute(sql["state_prune"], {"before": before})
            cur.execute(sql["steps_exists"], steps)
            if cur.fetchone()[0]:
                cur.execute(sql["prune_with_steps"], {"before": before})
                return int(cur.fetchone()[0])
            cur.execute(sql["prune"], {"before": before})
            return int(cur.rowcount)

        return self._db.run(work)

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

        The claim id is generated fresh and **read back from the row** (``RETURNING``).

        Returns:
            :class:`ptb_fence.AttemptIdentity` | :obj:`None`: The identity, or :obj:`None` if
            not taken.

        Raises:
            ptb_fence.SchemaError: On a table without ``claim_id``.
        """
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        row = self._fetch_one(self._db.sql["claim_owned"], self._claim_params(terms, update_id))
        if row is None or row[0] != "processing":
            return None
        identity = AttemptIdentity(update_id=update_id, attempt=int(row[1]), claim_id=str(row[2]))
        self._suspects.note(identity, int(row[3]))  # the row's suspicion
        return identity

    def _claim_many_work(
        self, ids: List[int], terms: ClaimTerms
    ) -> Tuple[
        Callable[[Any], None], Callable[[], List[Optional[AttemptIdentity]]]
    ]:
        """The claims of :meth:`commit`.

        It gives the work to run on a cursor inside a transaction. It also gives what yields the
        identities per position once the work has run.
        """
        distinct = list(dict.fromkeys(ids))
        params = self._claim_params(terms)
        params["update_ids"] = distinct
        params["claim_ids"] = [uuid.uuid4().hex for _ in distinct]
        sql = self._db.sql["claim_many"]
        fetched: List[Tuple[Any, ...]] = []

        def work(cur: Any) -> None:
            fetched.clear()  # a retried transaction runs the work again
            if distinct:
                cur.execute(sql, params)
                fetched.extend(cur.fetchall())

        def taken() -> List[Optional[AttemptIdentity]]:
            by_id: Dict[int, AttemptIdentity] = {}
            for row in fetched:
                if row[1] == "processing":
                    identity = AttemptIdentity(int(row[0]), int(row[2]), str(row[3]))
                    by_id[identity.update_id] = identity
                    self._suspects.note(identity, int(row[4]))
            return [by_id.pop(update_id, None) for update_id in ids]

        return work, taken

    def commit(self, batch: Batch) -> Committed:
        """Apply ``batch`` in one transaction (see :meth:`ptb_fence.BatchStore.commit`).

        The parts run in order on one connection and commit once. Outbox calls return their
        ids from their inserts.
        """
        claims = [validate_update_id(update_id) for update_id in batch.claims]
        if batch.empty:
            return Committed()
        db = self._db
        records = Records(db, batch.records)
        instance = self._liveness.mine()
        lease_until = batch.terms.lease_until if batch.terms is not None else None
        claimed = Records(db, batch.claimed_records, lease_until=lease_until, instance=instance)
        calls = CallsWritten()
        items = list(batch.settlements)
        settle = settle_owned_work(db, items, batch.effects, calls) if items else None
        claim = taken = None
        if claims:
            assert batch.terms is not None  # a Batch with claims has terms
            claim, taken = self._claim_many_work(claims, batch.terms)

        def work(cur: Any) -> List[Landing]:
            if batch.records:
                records.run(cur)
            if batch.claimed_records:
                claimed.run(cur)
            landed: List[Landing] = settle(cur) if settle is not None else []
            if claim is not None:
                claim(cur)
            return landed

        landed = db.run(work)
        return Committed(
            tuple(records.recorded()) if batch.records else (),
            tuple(claimed.identities()) if batch.claimed_records else (),
            tuple(landed),
            tuple(taken()) if taken is not None else (),
            {identity: tuple(ids) for identity, ids in calls.ids.items()},
            frozenset(calls.sending),
        )

    def renew_owned(
        self, identity: AttemptIdentity, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """Extend a fenced lease on the dedicated connection.

        See :meth:`ptb_fence.FencedUpdateStore.renew_owned`.

        Returns:
            :obj:`bool`: :obj:`True` when this exact claim's row matched.

        Raises:
            ptb_fence.RowLocked: Another open transaction held the row for more than 200 ms.
                Typically it is this attempt's own fenced transaction. The lease is neither renewed
                nor refused.
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "lease_until": lease_until,
            "now": now,
        }
        return self._db.renew_one(identity.update_id, self._db.sql["renew_owned"], params)

    def renew_owned_many(
        self, identities: Sequence[AttemptIdentity], lease_until: int, now: int
    ) -> List[Optional[bool]]:
        """Renew several fenced leases in one statement.

        See :meth:`ptb_fence.BatchStore.renew_owned_many`.
        It runs on the dedicated renewal connection. Like :meth:`renew_many`, it never waits on a
        row lock.

        Returns:
            List[:obj:`bool` | :obj:`None`]: Per input position, :obj:`True` when renewed.
            :obj:`False` when refused: not this claim, or its lease expired before ``now``.
            :obj:`None` when undecided: the row still matches, but another open transaction locks
            it right now. Typically it is the attempt's own fenced transaction. The lease was not
            extended. The caller must not treat it as refused.
        """
        identities = list(identities)
        if not identities:
            return []
        sql = self._db.sql["renew_owned_many"]
        params = {
            "positions": list(range(len(identities))),
            "update_ids": [identity.update_id for identity in identities],
            "attempts": [identity.attempt for identity in identities],
            "claim_ids": [identity.claim_id for identity in identities],
            "now": now,
            "lease_until": lease_until,
        }

        def work(cur: Any) -> List[Optional[bool]]:
            cur.execute(sql, params)
            return batch_results(cur.fetchall(), len(identities))

        return self._db.run_renewal(work)

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """Whether this exact claim holds a live lease.

        See :meth:`ptb_fence.FencedUpdateStore.owns`.

        Args:
            identity (:class:`ptb_fence.AttemptIdentity`): The attempt's identity.
            at (:obj:`int`): The time the lease must hold at (epoch milliseconds).
            connection (optional): A psycopg2 connection (or cursor) with the caller's open
                transaction. The check then runs on it as ``SELECT … FOR UPDATE`` and does not
                commit. The row stays locked until the caller's transaction ends. So a competing
                claim waits for it. A competing claim in flight makes this wait and see its result.
                Without it the store uses its own connection, and the answer is advisory only.

        Raises:
            ValueError: If ``connection`` is in autocommit mode outside a transaction.
            ptb_fence.SchemaError: On a table without ``claim_id``.
        """
        params = _identity_params(identity, at)
        if connection is not None:
            sql = self._db.sql["owns_for_update"]
            return self._db.on_caller(connection, sql, params, locking=True)
        return self._db.run(lambda cur: returns_row(cur, self._db.sql["owns"], params))

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        """Settle a fenced attempt. See :meth:`ptb_fence.FencedUpdateStore.settle_owned`.

        Args:
            identity (:class:`ptb_fence.AttemptIdentity`): The attempt's identity.
            settlement: The result (:class:`ptb_fence.Completed`, :class:`ptb_fence.Failed` or
                :class:`ptb_fence.Abandoned`).
            connection (optional): A psycopg2 connection (or cursor) with the caller's open
                transaction. The update runs on it and is **not** committed here. The caller's
                commit makes it land, atomically with the caller's own writes.

        Returns:
            :obj:`bool`: Whether the settlement landed. With ``connection``, whether it will land
            when the caller commits.
        """
        sql, params = settle_params(
            self._db.sql, identity.update_id, identity.attempt, settlement, owned=True
        )
        params["claim_id"] = identity.claim_id
        if connection is not None:
            return self._db.on_caller(connection, sql, params)
        return self._db.run(lambda cur: returns_row(cur, sql, params))

    def complete_owned(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Complete this exact claim in the caller's open transaction.

        See :meth:`ptb_fence.BatchStore.complete_owned`.
        ``connection`` is a psycopg2 connection or cursor. The one ``UPDATE … RETURNING`` keeps
        its row lock until the caller's transaction ends. A competing claim waits, then sees the
        completed row.

        Returns:
            :obj:`bool`: Whether the claim was owned at ``at`` and is now completed in the
            caller's transaction.

        Raises:
            ValueError: If ``connection`` is in autocommit mode outside a transaction.
        """
        params = _identity_params(identity, at)
        return self._db.on_caller(
            connection, self._db.sql["settle_completed_owned"], params, locking=True
        )

    def reopen_completed(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Undo a :meth:`complete_owned` at ``at`` that the caller committed itself.

        See :meth:`ptb_fence.BatchStore.reopen_completed`.
        It commits at once on ``connection``.

        Returns:
            :obj:`bool`: Whether that completion was undone.
        """
        conn = getattr(connection, "connection", connection)
        try:
            undone = self._db.on_caller(
                connection, self._db.sql["reopen_completed"], _identity_params(identity, at)
            )
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        return undone

    def transaction(self) -> ContextManager[Any]:
        """Open a transaction on a pooled psycopg2 connection.

        See :meth:`ptb_fence.BatchStore.transaction`.
        It yields the connection (``%s`` placeholders) for the caller's writes. It returns the
        connection to the pool afterwards. Do not commit or roll back the yielded connection
        yourself. It waits for a free connection like every other call, and raises
        :exc:`ptb_fence.StoreBusy` after ``pool_timeout``.

        Returns:
            A context manager yielding a psycopg2 connection inside an open transaction.
        """
        return self._db.transaction()

    # -- durable contract ------------------------------------------------------------------
    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        """Turn the exact live claim into an unacknowledged exhaustion.

        See :meth:`ptb_fence.DurableUpdateStore.exhaust`.

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
        return self._db.run(lambda cur: returns_row(cur, self._db.sql["exhaust"], params))

    def due_exhaustions(
        self, *, limit: int, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        """Unacknowledged exhaustions. See :meth:`ptb_fence.DurableUpdateStore.due_exhaustions`.

        Args:
            limit (:obj:`int`): The most rows to return.
            after_update_id (:obj:`int`, optional): The paging cursor.

        Returns:
            List[:class:`ptb_fence.Exhaustion`]: The exhaustions.
        """
        params = {"limit": max(int(limit), 0), "after_update_id": after_update_id}

        def work(cur: Any) -> List[Exhaustion]:
            cur.execute(self._db.sql["due_exhaustions"], params)
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

    def acknowledge_exhaustion(
        self, identity: AttemptIdentity, at: int, *, effects: Optional[AttemptEffects] = None
    ) -> bool:
        """Acknowledge an exhaustion.

        See :meth:`ptb_fence.DurableUpdateStore.acknowledge_exhaustion`.

        With ``effects``, their outbox calls are inserted as pending in the same commit, only when
        it acknowledges (see :class:`ptb_fence.OutboxStore`).

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
        sql = self._db.sql
        calls = effects_params(identity, effects, at) if effects is not None else []

        def work(cur: Any) -> bool:
            if not returns_row(cur, sql["acknowledge_exhaustion"], params):
                return False
            if calls:
                insert_calls(sql, self._db.table, cur, calls)
            return True

        return self._db.run(work)

    # -- chat order ------------------------------------------------------------------------
    def add_many_in_chats(self, rows: Sequence[ChatRow]) -> List[bool]:
        """Insert rows with their chat keys, in one statement and commit.

        See :meth:`ptb_fence.BatchStore.add_many_in_chats`.

        Returns:
            List[:obj:`bool`]: Per input position, as :meth:`add_many`.
        """
        rows = list(rows)
        first: Dict[int, int] = {}
        for position, row in enumerate(rows):
            validate_update_id(row[0])
            first.setdefault(row[0], position)
        if not rows:
            return []
        batch = [rows[position] for position in sorted(first.values())]
        prints = [update_fingerprint(body) for _, body, _, _ in batch]
        sql = self._db.sql["add_many_in_chats"]
        params = {
            "update_ids": [row[0] for row in batch],
            "bodies": [row[1] for row in batch],
            "received_ats": [row[2] for row in batch],
            "fingerprints": prints,
            "chat_keys": [None if row[3] is None else int(row[3]) for row in batch],
        }

        def work(cur: Any) -> Tuple[Set[int], List[Any]]:
            cur.execute(sql, params)
            done = {int(row[0]) for row in cur.fetchall()}
            missing = [
                (u, fp) for (u, _, _, _), fp in zip(batch, prints) if u not in done and fp
            ]
            if not missing:
                return done, []
            cur.execute(self._db.sql["conflicts"], {
                "update_ids": [u for u, _ in missing], "fingerprints": [f for _, f in missing],
            })
            return done, [tuple(row) for row in cur.fetchall()]

        inserted, conflicts = self._db.run(work)
        for update_id, stored, state, settled_at, new in conflicts:
            warn_conflict(int(update_id), stored, new, str(state), settled_at)
        return [
            first[row[0]] == position and row[0] in inserted for position, row in enumerate(rows)
        ]

    def claim_in_chat_order(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """Claim a row in its chat's turn, in one ``UPDATE``.

        See :meth:`ptb_fence.BatchStore.claim_in_chat_order`.
        """
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        params = self._claim_params(terms, update_id)
        sql = self._db.sql["claim_in_chat_order"]

        def work(cur: Any) -> Optional[Tuple[Any, ...]]:
            cur.execute(sql, params)
            row = cur.fetchone()
            return None if row is None else tuple(row)

        row = self._db.run(work)
        if row is None or row[0] != "processing":
            return None
        identity = AttemptIdentity(update_id=update_id, attempt=int(row[1]), claim_id=str(row[2]))
        self._suspects.note(identity, int(row[3]))
        return identity

    def due_in_chat_order(
        self, *, now: int, pending_before: int, limit: int, chat_key: Optional[int] = None
    ) -> List[StoredUpdate]:
        """Rows in their chat's turn, in one statement.

        See :meth:`ptb_fence.BatchStore.due_in_chat_order`.
        """
        params = {
            "now": now,
            "pending_before": pending_before,
            "limit": max(int(limit), 0),
            "chat_key": chat_key,
        }
        sql = self._db.sql["due_in_chat_order" if chat_key is None else "due_of_chat"]

        def work(cur: Any) -> List[StoredUpdate]:
            cur.execute(sql, params)
            return [StoredUpdate(int(u), body) for u, body in cur.fetchall()]

        return self._db.run(work)

    def unkeyed_in_chats(
        self, *, after_update_id: Optional[int] = None, limit: int
    ) -> List[StoredUpdate]:
        """Unsettled rows without a chat key, by ``update_id``, after ``after_update_id``.

        See :class:`ptb_fence.BatchStore`.
        """
        params = {
            "after": -1 if after_update_id is None else int(after_update_id),
            "limit": max(int(limit), 0),
        }
        sql = self._db.sql["unkeyed_in_chats"]

        def work(cur: Any) -> List[StoredUpdate]:
            cur.execute(sql, params)
            return [StoredUpdate(int(u), body) for u, body in cur.fetchall()]

        return self._db.run(work)

    def set_chat_keys(self, keys: Sequence[ChatKey]) -> int:
        """Record chat keys of rows that have none, in one transaction.

        For each ``(update_id, body, chat_key)`` the chat key is set if the row has none, is
        unsettled and holds exactly ``body``. Returns how many were set.
        """
        params = [
            {"update_id": int(update_id), "body": body, "chat_key": int(chat_key)}
            for update_id, body, chat_key in keys
        ]
        if not params:
            return 0
        sql = self._db.sql["set_chat_key"]

        def work(cur: Any) -> int:
            done = 0
            for values in params:
                cur.execute(sql, values)
                done += max(cur.rowcount, 0)
            return done

        return self._db.run(work)

    # -- release and liveness --------------------------------------------------------------
    # Liveness is a session advisory lock per instance, held by ``self._liveness`` (a
    # PgLiveness). What proves an instance dead, and why, is in the docstring of ``_sql``.
    def release_many(self, identities: Sequence[AttemptIdentity], *, at: int) -> List[bool]:
        """Give the exact claims back in one statement and commit.

        See :meth:`ptb_fence.BatchStore.release_many`.
        It needs the ``claim_id`` column.
        A row locked right now by an open transaction (a fenced transaction's ``FOR UPDATE``) is
        skipped, never waited for. It is not released, and its lease holds.

        Returns:
            List[:obj:`bool`]: Per input position, whether that claim was released.
        """
        identities = list(identities)
        if not identities:
            return []
        sql = self._db.sql["release_many"]
        params = {
            "positions": list(range(len(identities))),
            "update_ids": [identity.update_id for identity in identities],
            "attempts": [identity.attempt for identity in identities],
            "claim_ids": [identity.claim_id for identity in identities],
            "at": int(at),
        }

        def work(cur: Any) -> List[bool]:
            cur.execute(sql, params)
            released = {int(row[0]) for row in cur.fetchall()}
            return [position in released for position in range(len(identities))]

        return self._db.run(work)

    def hold_liveness(self) -> str:
        """Start holding liveness. See :meth:`ptb_fence.BatchStore.hold_liveness`.

        It opens a dedicated connection that holds the session advisory lock
        ``pg_advisory_lock(0x70746266, <key of the instance>)``. PostgreSQL drops it with the
        backend when the process dies. The instance is recorded in ``ptb_fence_instances``.
        That connection may break while the process lives (the backend terminated, the server
        restarted). Then :meth:`take_over_dead` holds the instance again on a new connection.
        Meanwhile every :meth:`take_over_dead` refreshes its row. That keeps others from taking it
        for dead, so they wait for the lease of its claims. A process holding liveness must
        therefore call :meth:`take_over_dead` at least every second or two. The runtime does,
        every second.

        Raises:
            ptb_fence.SchemaError: The table was not migrated (``create_table=False``). Apply
                :func:`ptb_fence.postgres_update_store_schema`.
        """
        holder = self._liveness
        with holder.lock:
            holder.forget_inherited()
            if holder.instance is not None:
                return holder.instance
            self._db.run(lambda cur: None)  # the schema (instances table) before the lock
            instance = uuid.uuid4().hex
            holder.conn = self._hold(instance)
            holder.instance, holder.key = instance, instance_key(instance)
            holder.pid = os.getpid()
            return instance

    def _hold(self, instance: str) -> Any:
        """A new connection holding ``instance``'s advisory lock, its row written."""
        sql = self._db.sql
        params: Dict[str, Any] = {
            "table": self._db.table,
            "instance": instance,
            "lock_key": instance_key(instance),
            "started_at": int(time.time() * 1000),
        }
        conn = self._db.source.connect()
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql["lock_instance"], params)  # before the row is visible
                cur.execute(sql["insert_instance"], params)
        except BaseException as exc:
            close_quietly(conn)
            schema_error = self._db.schema_error(exc)
            if schema_error is not None:
                raise schema_error from exc
            raise
        return conn

    def _keep_liveness(self) -> None:
        """Hold this process's instance again on a new connection if its connection broke.

        The server may have restarted, or the backend was terminated. It is skipped while another
        thread does it, since a new connection may take up to ``connect_timeout``.
        """
        holder = self._liveness
        if not holder.lock.acquire(blocking=False):
            return
        try:
            if holder.mine() is None:
                return
            if holder.conn is not None:
                try:
                    # not cut after a time: a slow server must not cost a live process its lock
                    # (a stop that finds this check stuck cuts the connection itself)
                    with holder.conn.cursor() as cur:
                        cur.execute(self._db.sql["probe"])
                        cur.fetchone()
                    return
                except Exception:
                    close_quietly(holder.conn)
                    holder.conn = None
            assert holder.instance is not None
            holder.conn = self._hold(holder.instance)
        finally:
            holder.lock.release()

    def release_liveness(self) -> None:
        """Stop holding liveness. Idempotent. See :meth:`ptb_fence.BatchStore.release_liveness`.

        It is the graceful stop, also done by :meth:`close`.
        It deletes the instance's row, then ends its advisory lock by closing its connection.
        """
        holder = self._liveness
        if not holder.lock.acquire(timeout=1.0):
            # a liveness check is stuck on a server that does not answer: end it
            if holder.pid == os.getpid():
                cut(holder.conn)
            if not holder.lock.acquire(timeout=1.0):
                # Still held (reconnecting, bounded by connect_timeout): give up. The lock
                # ends with this process, and the row left behind is then recognised as dead.
                return
        try:
            holder.forget_inherited()
            if holder.instance is None:
                return
            instance, conn = holder.instance, holder.conn
            holder.instance, holder.conn = None, None
            if conn is None:  # not held again since its connection broke
                try:
                    self._db.run(
                        lambda cur: cur.execute(
                            self._db.sql["delete_instance"],
                            {"table": self._db.table, "instance": instance},
                        )
                    )
                except Exception:  # unreachable: its row goes stale and is taken for dead
                    pass
                return
            try:
                # bounded: a server that does not answer must not hold a stopping process
                # (the row left behind is recognised as dead, its lock gone with the socket)
                with cut_after(conn, _RELEASE_SECONDS), conn.cursor() as cur:
                    cur.execute(
                        self._db.sql["delete_instance"],
                        {"table": self._db.table, "instance": instance},
                    )
            except Exception:  # a broken connection: the lock is gone with it
                pass
            finally:
                close_quietly(conn)
        finally:
            holder.lock.release()

    def take_over_dead(self, *, now: int) -> int:
        """Make the claims of provably dead instances claimable at ``now`` and forget them.

        See :meth:`ptb_fence.BatchStore.take_over_dead` and
        :class:`ptb_fence.BatchStore` for what happens to their rows.
        It is one statement. An instance of this table, not this object's own, is dead when its
        advisory lock can be taken and its row was not refreshed for a few seconds since the server
        started (see ``_sql``). A row that another session still locks is skipped, never waited
        for. The server may keep such a session after the process died. Its instance stays listed
        until a later call takes it.
        It also refreshes this object's own instance row. If its liveness connection broke, it
        holds its lock again on a new one.

        Returns:
            :obj:`int`: How many rows were made claimable. It is ``0`` on the seed's legacy table,
            which has no ``instance`` column.
        """
        now = int(now)
        if self._db.legacy() or not self._beats():
            return 0
        params = {"table": self._db.table, "me": self._liveness.mine(), "now": now}
        sql = self._db.sql["take_over_dead"]

        def work(cur: Any) -> int:
            cur.execute(sql, params)
            count, dead = cur.fetchone()
            # the dead instances' advisory locks are this transaction's until its commit
            return int(count) + sum(self._take_over_calls(cur, instance, now)
                                    for instance in dead or ())

        try:
            return self._db.run(work)  # the refresh first: holding again may take a while
        finally:
            try:
                self._keep_liveness()
            except Exception:  # the database is unreachable: the next call tries again
                pass

    def _take_over_calls(self, cur: Any, instance: str, now: int) -> int:
        """In :meth:`take_over_dead`'s transaction: the calls the dead ``instance``'s
        sender holds become claimable at ``now``. Returns how many."""
        cur.execute(self._db.sql["outbox_exists"],
                    {"outbox": f'"{outbox_table_name(self._db.table)}"'})
        if not cur.fetchone()[0]:  # a table managed with create_table=False: no outbox
            return 0
        cur.execute(self._db.sql["outbox_take_over"],
                    {"now": now, "pattern": sender_pattern(instance)})
        return len(cur.fetchall())

    def _beats(self) -> bool:
        """Whether ``ptb_fence_instances`` has ``seen_at``, read once.

        Without it nothing is proven dead. That is a schema managed with ``create_table=False``
        and not migrated.
        """
        holder = self._liveness
        if holder.beats is None:
            holder.beats = bool(self._db.run(lambda cur: _scalar(cur, self._db.sql["instances_have_beats"])))
        return holder.beats

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
            :obj:`bool`: Whether it landed. It is :obj:`False` on the seed's legacy table, which
            has no suspect rows.
        """
        return self._isolation(self._db.sql["mark_isolated"], identity, at)

    def end_probation(self, identity: AttemptIdentity, *, at: int) -> bool:
        """Record, committed, that this claim's handler ran past its probation.

        See :meth:`ptb_fence.BatchStore.end_probation`.

        Returns:
            :obj:`bool`: Whether it landed.
        """
        return self._isolation(self._db.sql["end_probation"], identity, at)

    def _isolation(self, sql: str, identity: AttemptIdentity, at: int) -> bool:
        if self._db.legacy():
            return False
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": int(at),
        }

        def work(cur: Any) -> bool:
            cur.execute(sql, params)
            return cur.fetchone() is not None

        return self._db.run(work)

    @property
    def instance(self) -> Optional[str]:
        """:obj:`str` | :obj:`None`: The instance id while this object holds liveness.

        It is the holder in this process.
        """
        return self._liveness.mine()

    # -- figures ---------------------------------------------------------------------------
    def figures(self) -> StoreFigures:
        """What waits in the table, for operators. See :meth:`ptb_fence.BatchStore.figures`.

        It is one read-only transaction of one ``SELECT``. It reads only the waiting rows (and the
        abandoned ones) through the table's indexes, never the completed history. Legacy-safe.
        It needs no ``claim_id``. On the seed's legacy table, which has no ``chat_key`` column,
        ``held_chat`` is :obj:`None`.
        """
        sql = self._legacy("figures")

        def work(cur: Any) -> StoreFigures:
            cur.execute(sql)
            return figures_of(cur.fetchone())

        return self._db.run(work)

    # -- outbox ----------------------------------------------------------------------------
    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        """Insert the outbox calls of ``effects`` in the caller's open transaction.

        See :meth:`ptb_fence.OutboxStore.write_effects`.
        Its state writes, jobs and broadcasts are written there too.
        ``connection`` is a psycopg2 connection or cursor.

        Returns:
            List[:obj:`int`]: The call ids, in order.

        Raises:
            ValueError: If ``connection`` is in autocommit mode outside a transaction.
        """
        calls = effects_params(identity, effects, at)
        writes = check_writes(effects.state)
        sql, table = self._db.sql, self._db.table

        def work(cur: Any) -> List[int]:
            if writes:
                cur.execute(sql["state_lock"], lock_params(state_table_name(table), writes))
                cur.execute(sql["state_savepoint"])
                moved = write_state_in(sql, cur, writes, at)
                if moved:
                    cur.execute(sql["state_rollback_to"])
                    cur.execute(sql["state_release"])
                    raise StateConflictError(tuple(moved))
                cur.execute(sql["state_release"])
            write_jobs_in(sql, cur, effects, at)  # before the calls: their chat locks come last
            write_broadcasts_in(sql, cur, effects.broadcasts, at)
            return insert_calls(sql, table, cur, calls)

        return self._db.caller_work(connection, work)

    # -- persisted bot state ---------------------------------------------------------------
    def read_state(self, keys: Sequence[StateKey]) -> Dict[StateKey, StateEntry]:
        """The committed rows of ``keys`` in one ``SELECT``.

        See :meth:`ptb_fence.StateStore.read_state`.
        """
        keys = list(dict.fromkeys(keys))
        if not keys:
            return {}
        sql, params = self._db.sql["state_read"], read_params(keys)

        def work(cur: Any) -> Dict[StateKey, StateEntry]:
            cur.execute(sql, params)
            return entries_of(cur.fetchall(), keys)

        return self._db.read(work)  # one SELECT: no transaction around it

    def write_state(self, writes: Sequence[StateWrite], at: int) -> Optional[StateConflict]:
        """Apply ``writes`` in one transaction. See :meth:`ptb_fence.StateStore.write_state`."""
        checked = check_writes(writes)
        sql, name = self._db.sql, state_table_name(self._db.table)

        def work(cur: Any) -> Optional[StateConflict]:
            if checked:
                cur.execute(sql["state_lock"], lock_params(name, checked))
            cur.execute(sql["state_savepoint"])
            moved = write_state_in(sql, cur, checked, int(at))
            if moved:
                cur.execute(sql["state_rollback_to"])
                cur.execute(sql["state_release"])
                return StateConflict(tuple(moved))
            cur.execute(sql["state_release"])
            return None

        return self._db.run(work)

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
        sql, params = self._db.sql["state_list"], list_params(kind, name, after, limit)

        def work(cur: Any) -> List[Tuple[StateKey, StateEntry]]:
            cur.execute(sql, params)
            return list(entries_of(cur.fetchall()).items())

        return self._db.run(work)

    def claim_calls(
        self, *, now: int, lease_until: int, limit: int, sender: str
    ) -> List[OutboxEntry]:
        """Claim the calls to send now in one statement.

        See :meth:`ptb_fence.OutboxStore.claim_calls`.

        The candidates are locked ``FOR UPDATE SKIP LOCKED`` and taken in the same ``UPDATE``.
        So concurrent claimers never share one.
        """
        params = {
            "now": int(now), "lease_until": int(lease_until), "limit": max(int(limit), 0),
            "sender": str(sender),
        }
        sql = self._db.sql["outbox_claim"]

        def work(cur: Any) -> List[OutboxEntry]:
            cur.execute(sql, params)
            return sorted((entry_of(row) for row in cur.fetchall()), key=lambda e: e.call_id)

        return self._db.run(work)

    def _one(self, sql: str, params: Dict[str, Any]) -> bool:
        return self._db.run(lambda cur: returns_row(cur, sql, params))

    def _each(self, sql: str, params: List[Dict[str, Any]]) -> List[bool]:
        if not params:
            return []
        return self._db.run(lambda cur: [returns_row(cur, sql, one) for one in params])

    def record_sent(self, items: Sequence[Tuple[int, str, str, int]]) -> List[bool]:
        """Record sent calls in one transaction. See :meth:`ptb_fence.OutboxStore.record_sent`."""
        return self._each(self._db.sql["outbox_record_sent"], [
            {"call_id": call_id, "sender": sender, "result": result, "at": int(at)}
            for call_id, sender, result, at in items
        ])

    def record_sent_and_claim(
        self,
        items: Sequence[Tuple[int, str, str, int]],
        *,
        now: int,
        lease_until: int,
        limit: int,
        sender: str,
    ) -> Tuple[List[bool], List[OutboxEntry]]:
        """Record, then claim, in one transaction.

        See :meth:`ptb_fence.OutboxStore.record_sent_and_claim`.
        The claim's statement runs after the records. So it sees a chat's recorded call as sent
        and takes the chat's next one.
        """
        record = self._db.sql["outbox_record_sent"]
        claim = self._db.sql["outbox_claim"]
        rows = [{"call_id": call_id, "sender": who, "result": result, "at": int(at)}
                for call_id, who, result, at in items]
        limit = max(int(limit), 0)
        params = {
            "now": int(now), "lease_until": int(lease_until), "limit": limit,
            "sender": str(sender),
        }

        def work(cur: Any) -> Tuple[List[bool], List[OutboxEntry]]:
            landed = [returns_row(cur, record, one) for one in rows]
            if limit <= 0:
                return landed, []
            cur.execute(claim, params)
            claimed = sorted((entry_of(row) for row in cur.fetchall()), key=lambda e: e.call_id)
            return landed, claimed

        return self._db.run(work)

    def retry_call(self, call_id: int, sender: str, *, due_at: int, error: str) -> bool:
        """A call sending by ``sender`` goes back to pending.

        See :meth:`ptb_fence.OutboxStore.retry_call`.
        """
        return self._one(self._db.sql["outbox_retry"], {
            "call_id": call_id, "sender": sender, "due_at": int(due_at), "error": error,
        })

    def fail_call(self, call_id: int, sender: str, *, at: int, error: str) -> bool:
        """A call sending by ``sender`` fails. See :meth:`ptb_fence.OutboxStore.fail_call`."""
        return self._one(self._db.sql["outbox_fail"], {
            "call_id": call_id, "sender": sender, "at": int(at), "error": error,
        })

    def release_calls(self, call_ids: Sequence[int], sender: str, at: int) -> List[bool]:
        """Release calls in one transaction. See :meth:`ptb_fence.OutboxStore.release_calls`."""
        return self._each(self._db.sql["outbox_release"], [
            {"call_id": call_id, "sender": sender, "at": int(at)} for call_id in call_ids
        ])

    def _entries(self, sql: str, params: Dict[str, Any]) -> List[OutboxEntry]:
        def work(cur: Any) -> List[OutboxEntry]:
            cur.execute(sql, params)
            return [entry_of(row) for row in cur.fetchall()]

        return self._db.read(work)  # one SELECT: no transaction around it

    def claimed_calls(self, sender: str, *, limit: int) -> List[OutboxEntry]:
        """The calls ``sending`` by ``sender``.

        See :meth:`ptb_fence.OutboxStore.claimed_calls`.
        """
        return self._entries(self._db.sql["outbox_claimed"],
                             {"sender": str(sender), "limit": max(int(limit), 0)})

    def due_send_failures(
        self, *, limit: int, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """Failed calls not acknowledged. See :meth:`ptb_fence.OutboxStore.due_send_failures`."""
        after = -1 if after_call_id is None else int(after_call_id)
        return self._entries(self._db.sql["outbox_due_failures"],
                             {"after": after, "limit": max(int(limit), 0)})

    def acknowledge_send_failure(self, call_id: int, at: int) -> bool:
        """Acknowledge a failed call. See :meth:`ptb_fence.OutboxStore.acknowledge_send_failure`."""
        return self._one(self._db.sql["outbox_acknowledge"], {"call_id": call_id, "at": int(at)})

    def get_call(self, call_id: int) -> Optional[OutboxEntry]:
        """The call, or :obj:`None`. See :meth:`ptb_fence.OutboxStore.get_call`."""
        found = self._entries(self._db.sql["outbox_get"], {"call_id": call_id})
        return found[0] if found else None

    def list_calls(
        self, *, state: Optional[str] = None, limit: int = 100, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """The calls of ``state``, after ``after_call_id``.

        See :meth:`ptb_fence.OutboxStore.list_calls`.
        """
        params: Dict[str, Any] = {
            "after": -1 if after_call_id is None else int(after_call_id),
            "limit": max(int(limit), 0),
            "state": state,
        }
        name = "outbox_list_all" if state is None else "outbox_list_state"
        return self._entries(self._db.sql[name], params)

    def outbox_counts(self) -> Dict[str, int]:
        """Calls per state. See :meth:`ptb_fence.OutboxStore.outbox_counts`."""
        sql = self._db.sql["outbox_counts"]

        def work(cur: Any) -> Dict[str, int]:
            cur.execute(sql)
            return counts_of(cur.fetchall())

        return self._db.run(work)

    def retry_failed_call(self, call_id: int, at: int) -> bool:
        """Operators: retry a failed call. See :meth:`ptb_fence.OutboxStore.retry_failed_call`."""
        return self._one(self._db.sql["outbox_retry_failed"], {"call_id": call_id, "at": int(at)})

    def drop_call(self, call_id: int) -> bool:
        """Operators: delete a pending or failed call.

        See :meth:`ptb_fence.OutboxStore.drop_call`.
        """
        return self._one(self._db.sql["outbox_drop"], {"call_id": call_id})

    # -- recorded steps --------------------------------------------------------------------
    def read_step(self, key: str) -> Optional[StepRecord]:
        """The committed record of ``key``, or :obj:`None`, in one ``SELECT``.

        See :meth:`ptb_fence.BatchStore.read_step`.
        """
        sql = self._db.sql["step_read"]

        def work(cur: Any) -> Optional[StepRecord]:
            cur.execute(sql, {"key": key})
            row = cur.fetchone()
            return None if row is None else record_of(row)

        return self._db.read(work)

    def record_step(self, record: StepRecord, *, connection: Any = None) -> bool:
        """Record a step while its attempt owns the update, in one statement.

        See :meth:`ptb_fence.BatchStore.record_step`.

        The statement locks the owned row ``FOR SHARE`` and inserts the record ``ON CONFLICT
        DO NOTHING``. It returns whether the row was owned. So the database decides. A claim
        that would take the update over waits for the record's transaction.

        Args:
            record (:class:`ptb_fence.StepRecord`): The record.
            connection (optional): A psycopg2 connection (or cursor) with the caller's open
                transaction. The statement then runs on it and is **not** committed here.

        Raises:
            ValueError: The key is not 1 to 64 characters of ``[a-z0-9-]``. Or ``connection``
                is in autocommit mode outside a transaction.
        """
        sql, params = self._db.sql["step_record"], step_params(record)

        def work(cur: Any) -> bool:
            cur.execute(sql, params)
            return bool(cur.fetchone()[0])

        if connection is not None:
            return self._db.caller_work(connection, work)
        return self._db.run(work)

    def steps_of(self, update_id: int) -> List[StepRecord]:
        """The committed records of ``update_id``, by ``recorded_at`` and then by key.

        See :meth:`ptb_fence.BatchStore.steps_of`.
        """
        sql = self._db.sql["steps_of"]

        def work(cur: Any) -> List[StepRecord]:
            cur.execute(sql, {"update_id": update_id})
            return [record_of(row) for row in cur.fetchall()]

        return self._db.read(work)

    # -- durable jobs ----------------------------------------------------------------------
    def schedule_jobs(self, jobs: Sequence[JobWrite], at: int, *,
                      connection: Any = None) -> List[StoredJob]:
        """Write jobs in one transaction. See :meth:`ptb_fence.BatchStore.schedule_jobs`.

        A keyed job is one ``INSERT … ON CONFLICT`` on the partial unique index of live names.
        So concurrent declarations of one name leave one job. With ``connection`` (a psycopg2
        connection or cursor) it runs in the caller's open transaction, uncommitted.
        """
        sql = self._db.sql

        def work(cur: Any) -> List[StoredJob]:
            return schedule_in(sql, cur, jobs, int(at))

        if connection is not None:
            return self._db.caller_work(connection, work)
        return self._db.run(work)

    def cancel_jobs(self, job_ids: Sequence[int], at: int, *,
                    connection: Any = None) -> List[bool]:
        """Cancel jobs. See :meth:`ptb_fence.BatchStore.cancel_jobs`."""
        sql = self._db.sql

        def work(cur: Any) -> List[bool]:
            return cancel_in(sql, cur, job_ids, int(at))

        if connection is not None:
            return self._db.caller_work(connection, work)
        return self._db.run(work)

    # -- pacing ----------------------------------------------------------------------------
    def take_send_slots(
        self, wants: Sequence[Sequence[PaceBucket]], *, now: int, horizon_ms: int
    ) -> List[int]:
        """Take send slots in one transaction. See :meth:`ptb_fence.BatchStore.take_send_slots`.

        The rows of the keys are made to exist, then locked ``FOR UPDATE`` in key order. So
        concurrent takers queue on the rows they share and never deadlock. A negative horizon
        only reads, without locks. A table made before pacing and managed with
        ``create_table=False`` has no pace table until it is migrated. This process then paces
        alone, with a WARNING.
        """
        checked = check_wants(wants)
        keys = pace_keys(checked)
        if not keys:
            return [int(now)] * len(checked)
        local = self._pace_alone()
        if local is not None:
            return local.take_send_slots(checked, now=now, horizon_ms=horizon_ms)
        sql = self._db.sql
        now, horizon_ms = int(now), int(horizon_ms)

        def read(cur: Any) -> List[int]:
            cur.execute(sql["pace_read"], {"keys": keys})
            rows = pace_rows(cur.fetchall())
            return grant(rows, checked, now=now, horizon_ms=horizon_ms)[0]

        if horizon_ms < 0:
            return self._db.read(read)

        def work(cur: Any) -> List[int]:
            cur.execute(sql["pace_ensure"], {"keys": keys})
            cur.execute(sql["pace_lock"], {"keys": keys})
            rows = pace_rows(cur.fetchall())
            times, changed = grant(rows, checked, now=now, horizon_ms=horizon_ms)
            if changed:
                moved = sorted(changed)
                cur.execute(sql["pace_write"], {"keys": moved,
                                                "tats": [changed[k][0] for k in moved]})
            return times

        return self._db.run(work)

    def hold_sends(self, holds: Sequence[Tuple[str, int]]) -> None:
        """Hold buckets in one transaction. See :meth:`ptb_fence.BatchStore.hold_sends`."""
        if not holds:
            return
        local = self._pace_alone()
        if local is not None:
            local.hold_sends(holds)
            return
        sql = self._db.sql["pace_hold"]

        def work(cur: Any) -> None:
            for key, until in sorted((str(k), int(u)) for k, u in holds):
                cur.execute(sql, {"key": key, "until": until})

        self._db.run(work)

    def _pace_alone(self) -> Optional[MemoryPace]:
        """The pace of this process alone when the table has no pace table, else :obj:`None`."""
        if self._pace_seen is None:
            sql, params = self._db.sql["pace_exists"], {
                "pace": f'"{pace_table_name(self._db.table)}"'}

            def work(cur: Any) -> bool:
                cur.execute(sql, params)
                return bool(cur.fetchone()[0])

            self._pace_seen = self._db.read(work)
            if not self._pace_seen:
                _LOGGER.warning(
                    "the update table %r has no pace table: this process paces its sends "
                    "alone, not with the others. Run 'ptb-fence migrate' to add it",
                    self._db.table)
                self._local_pace = MemoryPace()
        return self._local_pace

    # -- broadcasts ------------------------------------------------------------------------
    def _broadcast_tables(self) -> None:
        """Raise :exc:`ptb_fence.SchemaError` until the broadcast tables exist."""
        if self._broadcasts_seen:
            return
        sql = self._db.sql["broadcasts_exists"]
        params = {"recipients": f'"{broadcast_tables(self._db.table)["recipients"]}"'}

        def work(cur: Any) -> bool:
            cur.execute(sql, params)
            return bool(cur.fetchone()[0])

        self._broadcasts_seen = self._db.read(work)
        if not self._broadcasts_seen:
            raise SchemaError(
                f"the update table {self._db.table!r} has no broadcast tables (made before "
                "broadcasts and managed with create_table=False): run 'ptb-fence migrate' to "
                "add them")

    def start_broadcast(self, name: str, method: str, params_json: str,
                        at: int) -> StoredBroadcast:
        """Start a broadcast. See :meth:`ptb_fence.BatchStore.start_broadcast`."""
        check_name(name)
        check_params(params_json)
        self._broadcast_tables()
        sql = self._db.sql

        def work(cur: Any) -> StoredBroadcast:
            cur.execute(sql["broadcast_start"], {"name": name, "method": str(method),
                                                 "params": params_json, "at": int(at)})
            cur.execute(sql["broadcast_list"], {"name": name})
            return broadcast_of(cur.fetchone())

        return self._db.run(work)

    def add_recipients(self, broadcast_id: int, chat_ids: Sequence[int], at: int) -> int:
        """Add recipients in one statement. See
        :meth:`ptb_fence.BatchStore.add_recipients`."""
        chats = check_chat_ids(chat_ids)
        if not chats:
            return 0
        self._broadcast_tables()
        sql = self._db.sql["broadcast_add_recipients"]
        params = {"broadcast_id": int(broadcast_id), "chats": chats, "at": int(at)}

        def work(cur: Any) -> int:
            cur.execute(sql, params)
            return int(cur.rowcount)

        return self._db.run(work)

    def claim_recipients(self, sender: str, *, now: int, lease_until: int,
                         limit: int) -> List[Recipient]:
        """Claim recipients in one statement, ``SKIP LOCKED``. See
        :meth:`ptb_fence.BatchStore.claim_recipients`."""
        self._broadcast_tables()
        sql = self._db.sql
        params = {"sender": str(sender), "now": int(now), "lease_until": int(lease_until),
                  "limit": max(int(limit), 0)}

        def work(cur: Any) -> List[Recipient]:
            cur.execute(sql["broadcast_claim"], params)
            claimed = cur.fetchall()
            if not claimed:
                return []
            cur.execute(sql["broadcast_calls"], {"ids": sorted({int(r[0]) for r in claimed})})
            calls = {int(b): (str(m), str(p)) for b, m, p in cur.fetchall()}
            return recipients_of(claimed, calls)

        return self._db.run(work)

    def settle_recipients(self, sender: str, outcomes: Sequence[RecipientOutcome],
                          at: int) -> List[bool]:
        """Record outcomes in one statement. See
        :meth:`ptb_fence.BatchStore.settle_recipients`."""
        checked = check_outcomes(outcomes)
        if not checked:
            return []
        self._broadcast_tables()
        sql = self._db.sql["broadcast_settle"]
        params = {
            "sender": str(sender),
            "ids": [o.broadcast_id for o in checked],
            "chats": [o.chat_id for o in checked],
            "states": [o.state for o in checked],
            "dues": [int(o.due_at) if o.state == "pending" else int(at) for o in checked],
            "errors": [o.error for o in checked],
        }

        def work(cur: Any) -> List[bool]:
            cur.execute(sql, params)
            landed = {(int(b), int(c)) for b, c in cur.fetchall()}
            return [(o.broadcast_id, o.chat_id) in landed for o in checked]

        return self._db.run(work)

    def set_broadcast_state(self, name: str, state: str,
                            at: int) -> Optional[StoredBroadcast]:
        """Pause, resume or cancel. See :meth:`ptb_fence.BatchStore.set_broadcast_state`."""
        check_state(state)
        self._broadcast_tables()
        sql = self._db.sql

        def work(cur: Any) -> Optional[StoredBroadcast]:
            cur.execute(sql["broadcast_set_state"], {"name": name, "state": state})
            cur.execute(sql["broadcast_cancel_pending"], {"name": name, "at": int(at)})
            cur.execute(sql["broadcast_list"], {"name": name})
            row = cur.fetchone()
            return None if row is None else broadcast_of(row)

        return self._db.run(work)

    def list_broadcasts(self, name: Optional[str] = None) -> List[StoredBroadcast]:
        """The broadcasts. See :meth:`ptb_fence.BatchStore.list_broadcasts`."""
        self._broadcast_tables()
        sql = self._db.sql["broadcast_list"]

        def work(cur: Any) -> List[StoredBroadcast]:
            cur.execute(sql, {"name": name})
            return [broadcast_of(row) for row in cur.fetchall()]

        return self._db.read(work)

    def _has_jobs_table(self) -> bool:
        """Whether the jobs table exists, looked up until it is seen once.

        A table made before jobs and managed with ``create_table=False`` has none until it is
        migrated. Its reads of jobs find none. Its writes of jobs raise
        :exc:`ptb_fence.SchemaError`.
        """
        if self._jobs_seen:
            return True
        sql = self._db.sql["jobs_exists"]
        params = {"jobs": f'"{jobs_table_name(self._db.table)}"'}

        def work(cur: Any) -> bool:
            cur.execute(sql, params)
            return bool(cur.fetchone()[0])

        self._jobs_seen = self._db.read(work)
        return self._jobs_seen

    def due_jobs(self, now: int, limit: int) -> List[StoredJob]:
        """The jobs due now, in one ``SELECT``. See :meth:`ptb_fence.BatchStore.due_jobs`.

        A table without a jobs table has none due.
        """
        if not self._has_jobs_table():
            return []
        sql, params = self._db.sql["jobs_due"], {"now": int(now), "limit": max(int(limit), 0)}

        def work(cur: Any) -> List[StoredJob]:
            cur.execute(sql, params)
            return [job_of(row) for row in cur.fetchall()]

        return self._db.read(work)

    def fire_jobs(self, fires: Sequence[JobFire], at: int) -> List[bool]:
        """Fire runs as update rows in one transaction.

        See :meth:`ptb_fence.BatchStore.fire_jobs`. Each fire is one statement. It moves the
        job on and records the run's row only when it did. The fires go by job id, so two
        processes lock the jobs in one order.
        """
        if not fires:
            return []
        sql = self._db.sql

        def work(cur: Any) -> List[bool]:
            return fire_in(sql, cur, fires, int(at))

        return self._db.run(work)

    def list_jobs(self, *, name: Optional[str] = None, include_ended: bool = False,
                  after_job_id: int = 0, limit: int = 1000) -> List[StoredJob]:
        """The jobs by id. See :meth:`ptb_fence.BatchStore.list_jobs`."""
        if not self._has_jobs_table():
            return []
        sql = self._db.sql["jobs_list"]
        params = {"after": int(after_job_id), "name": name, "every": bool(include_ended),
                  "limit": max(int(limit), 0)}

        def work(cur: Any) -> List[StoredJob]:
            cur.execute(sql, params)
            return [job_of(row) for row in cur.fetchall()]

        return self._db.read(work)

    def get_job(self, job_id: int) -> Optional[StoredJob]:
        """One job. See :meth:`ptb_fence.BatchStore.get_job`."""
        if not self._has_jobs_table():
            return None
        sql = self._db.sql["job_get"]

        def work(cur: Any) -> Optional[StoredJob]:
            cur.execute(sql, {"job_id": int(job_id)})
            row = cur.fetchone()
            return None if row is None else job_of(row)

        return self._db.read(work)

    def run_job_now(self, job_id: int, at: int) -> bool:
        """Make a job due now. See :meth:`ptb_fence.BatchStore.run_job_now`."""
        sql, params = self._db.sql["job_run_now"], {"job_id": int(job_id), "at": int(at)}
        return self._db.run(lambda cur: returns_row(cur, sql, params))
