"""PostgresUpdateStore: the store for several processes or machines (psycopg2), whole in one
class.

Sections: construction and lifecycle, the base contract, the fenced contract, the durable
contract, chat order, release and liveness, figures, the outbox. Its collaborators: the connection pools
(``_connections``), the executor that runs statements in short transactions with retries
(``_executor``), the batched writes (``_writes``), the liveness holder (``_liveness``) and all
its SQL (``_sql``). psycopg2 is imported only when a store is created.
"""

from __future__ import annotations

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
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)

from ptb_fence._errors import StateConflictError, TableBotMismatch
from ptb_fence._fingerprint import update_fingerprint
from ptb_fence.contract import ChatKey, ClaimTerms
from ptb_fence._sockets import cut, cut_after
from ptb_fence._values import (
    AttemptEffects,
    AttemptIdentity,
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
from ptb_fence.stores._duplicates import warn_conflict
from ptb_fence.stores._figures_sql import figures_of
from ptb_fence.stores._names import (
    validate_schema_name,
    validate_table_name,
    validate_update_id,
)
from ptb_fence.stores._outbox_sql import counts_of, effects_params, entry_of, sender_pattern
from ptb_fence.stores._state_sql import check_kind, check_writes, entries_of
from ptb_fence.stores._suspects import SuspectClaims
from ptb_fence.stores.postgres._connections import close_quietly
from ptb_fence.stores.postgres._sources import open_source
from ptb_fence.stores.postgres._executor import PgExecutor, returns_row
from ptb_fence.stores.postgres._liveness import PgLiveness
from ptb_fence.stores.postgres._sql import (
    META_TABLE,
    ClaimStatements,
    chat_statements,
    instance_key,
    schema_sql,
)
from ptb_fence.stores.postgres._writes import (
    add_claimed,
    add_many,
    batch_results,
    insert_calls,
    settle_owned_work,
    settle_params,
    write_state_in,
)

if TYPE_CHECKING:  # psycopg2 is imported when a store is created, not with ptb_fence
    import psycopg2.pool

__all__ = ["PostgresUpdateStore", "postgres_update_store_schema"]

_RELEASE_SECONDS = 2.0
"""How long ``release_liveness`` waits for the server to delete the instance's row."""

_S = TypeVar("_S", bound="PostgresUpdateStore")

ChatRow = Tuple[int, str, int, Optional[int]]


def postgres_update_store_schema(
    table: str = "telegram_updates", *, schema: Optional[str] = None
) -> str:
    """Return the idempotent SQL migration for a :class:`PostgresUpdateStore` table.

    It creates the table if it is missing, adds the ``claim_id`` column to a table created
    before fencing (and ``fingerprint``, ``instance`` and ``chat_key`` to older tables), and
    creates the ``(state, due_at)`` index and the partial chat-order index if they are missing. Applying it
    again changes nothing, and it takes a transaction-scoped advisory lock first, so several
    processes may apply it at once. Apply it (for example with ``psql -1 -f`` or one
    ``cursor.execute``) when you construct the store with ``create_table=False``.

    Args:
        table (:obj:`str`, optional): The table name. Defaults to ``"telegram_updates"``.
        schema (:obj:`str`, optional): A schema of its own: the migration then creates the
            schema if it is missing and runs in it (``SET LOCAL search_path``, so apply it in
            one transaction). Defaults to the connection's ``search_path``.

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
        dsn_or_pool (:obj:`str` | :class:`psycopg2.pool.AbstractConnectionPool` | \
            :class:`sqlalchemy.engine.Engine` | :obj:`callable`): Where connections come from.
            A libpq connection string or URI (with no ``connect_timeout`` in it, connections
            are opened with ``connect_timeout=10``). A psycopg2 connection pool (for example a
            :class:`psycopg2.pool.ThreadedConnectionPool`): its ``maxconn`` bounds the store's
            concurrent connections, and the renewal and liveness connections are opened with
            the pool's connection arguments. An application's SQLAlchemy ``Engine`` on
            ``postgresql+psycopg2``: the store borrows the engine's pooled connections (at most
            ``pool_size`` at once) and gives them back, so the bot opens no second pool; its
            two dedicated connections (lease renewals, the liveness lock) are made by the
            engine and detached from its pool, so they never take a pooled slot. A connection
            factory (a callable returning a new psycopg2 connection, e.g. with the
            application's SSL and ``application_name`` settings): the store opens its pooled
            and dedicated connections with it. The store never closes a pool or disposes an
            engine it was given.
        table (:obj:`str`, optional): The table name; must fully match
            ``[A-Za-z_][A-Za-z0-9_]{0,62}``. It is used double-quoted, i.e. exactly as given.
            Defaults to ``"telegram_updates"``.
        create_table (:obj:`bool`, optional): Ensure the schema (see
            :func:`postgres_update_store_schema`) before first use. If that fails (for example
            because the server is down) it is retried on the next use. Pass :obj:`False` to
            manage the schema yourself. Defaults to :obj:`True`.

    Keyword Args:
        schema (:obj:`str`, optional): A schema of its own (the rule of table names): the
            store's connections (a DSN's or a connection factory's) get ``search_path`` set to
            it, so every table of the store lives there. The schema must exist
            (``ptb-fence migrate --table schema.table`` creates it). Defaults to the
            connections' ``search_path``.
        pool_size (:obj:`int`, optional): With a DSN or a connection factory, the most pooled
            connections the store opens; with an engine, the most of its connections the store
            holds at once (renewals and liveness use one more each). Ignored when a psycopg2
            pool is given. Defaults to ``8``.
        pool_timeout (:obj:`float`, optional): Seconds a caller waits for a free connection
            before :exc:`ptb_fence.StoreBusy`. Defaults to ``30.0``.

    Raises:
        ValueError: For a bad table or schema name, a malformed DSN (its password is not repeated) or a
            non-positive ``pool_size``/``pool_timeout``.
        TypeError: If ``dsn_or_pool`` is none of these.
        ptb_fence.UsageError: An engine that is not a synchronous one on psycopg2.
    """

    __slots__ = ("_create_table", "_db", "_liveness", "_suspects")

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
        """Stop holding liveness (:meth:`release_liveness`), then close the store's
        connections (a pool given by the caller stays open). Idempotent.

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

    def _claim_params(self, terms: ClaimTerms, update_id: Optional[int] = None) -> Dict[str, Any]:
        """The parameters of a claim statement; with ``update_id``, of the claim of that one
        row (with its fresh claim id)."""
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

    def _claim_sql(self, fenced: bool, counted: bool = False) -> str:
        """The claim statement: recording the instance where the table has that column and,
        where it has ``isolated_claim``, either reading back whether the row is suspect
        (``claim_owned``) or, ``counted`` (the base ``claim``, whose attempt never runs alone:
        the runtime claims with ``claim_owned`` wherever it isolates), marking the take
        isolated at once, so that a crash during it counts as it always did."""
        liveness = self._liveness
        if self._db.has_column("instance"):
            if self._db.has_column("isolated_claim"):
                if counted:
                    return liveness.claim_fenced_counted if fenced else liveness.claim_counted
                if fenced:
                    return liveness.claim_fenced_suspect
            return liveness.claim_fenced if fenced else liveness.claim
        return self._db.sql.claim_fenced if fenced else self._db.sql.claim

    def _due_sql(self) -> str:
        """``due``, listing released rows at once where the table has ``claim_id``."""
        if self._db.has_column("claim_id"):
            return self._liveness.sql.due_released
        return self._db.sql.due

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
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        params = self._claim_params(terms, update_id)
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
            settlement: The result (:class:`ptb_fence.Completed`, :class:`ptb_fence.Failed` or
                :class:`ptb_fence.Abandoned`).
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

        In the same transaction the outbox table, where it exists, loses its sent calls with
        ``sent_at < before`` and its acknowledged failed calls with ``due_at < before``, and
        the state table, where it exists, its callback-data keyboards (kind ``callback``)
        written before ``before`` (neither counted; no other state is pruned).

        Returns:
            :obj:`int`: How many update rows were deleted.
        """
        outbox = self._db.sql.outbox
        state = self._db.sql.state

        def work(cur: Any) -> int:
            # a table managed with create_table=False may have no outbox yet: prune as before
            cur.execute(outbox.exists, {"outbox": f'"{outbox.name}"'})
            if cur.fetchone()[0]:
                cur.execute(outbox.prune, {"before": before})
            cur.execute(state.exists, {"state": f'"{state.name}"'})
            if cur.fetchone()[0]:
                cur.execute(state.prune, {"before": before})
            cur.execute(self._db.sql.prune, {"before": before})
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
        """As :meth:`claim`, returning the attempt's identity.

        The claim id is generated fresh for the claim and **read back from the row**
        (``RETURNING``).

        Returns:
            :class:`ptb_fence.AttemptIdentity` | :obj:`None`: The identity, or :obj:`None` if
            not taken.

        Raises:
            ptb_fence.SchemaError: On a table without ``claim_id``.
        """
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        row = self._fetch_one(self._claim_sql(True), self._claim_params(terms, update_id))
        if row is None or row[0] != "processing":
            return None
        identity = AttemptIdentity(update_id=update_id, attempt=int(row[1]), claim_id=str(row[2]))
        if len(row) > 3:  # the row's suspicion (IsolatingUpdateStore)
            self._suspects.note(identity, int(row[3]))
        return identity

    def claim_owned_many(
        self, update_ids: Sequence[int], terms: ClaimTerms
    ) -> List[Optional[AttemptIdentity]]:
        """:meth:`claim_owned` for each id in one statement and commit (the rows are locked
        in ``update_id`` order; a row held by an open transaction is waited for, as
        ``claim_owned`` waits).

        Returns:
            List[:class:`~ptb_fence.AttemptIdentity` | :obj:`None`]: Per input position, the
            identity the row was claimed with, or :obj:`None` where ``claim_owned`` gives
            :obj:`None` (not claimable, attempts spent, unknown) and at the later positions of
            an id repeated in ``update_ids``.
        """
        ids = [validate_update_id(update_id) for update_id in update_ids]
        if not ids:
            return []
        claim, taken = self._claim_many_work(ids, terms)
        self._db.run(claim)
        return taken()

    def _claim_many_work(
        self, ids: List[int], terms: ClaimTerms
    ) -> Tuple[
        Callable[[Any], None], Callable[[], List[Optional[AttemptIdentity]]]
    ]:
        """The claims of :meth:`claim_owned_many`: the work to run on a cursor inside a
        transaction, and what gives the identities per position once it has run."""
        distinct = list(dict.fromkeys(ids))
        params = self._claim_params(terms)
        params["update_ids"] = distinct
        params["claim_ids"] = [uuid.uuid4().hex for _ in distinct]
        instance = self._db.has_column("instance")
        suspect = instance and self._db.has_column("isolated_claim")
        sql = ClaimStatements(self._db.table).claim_owned_many(instance, suspect)
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
                    if suspect:
                        self._suspects.note(identity, int(row[4]))
            return [by_id.pop(update_id, None) for update_id in ids]

        return work, taken

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
        items = list(settlements)
        if not ids and not items:
            return [], []
        settle = settle_owned_work(self._db.sql, items, effects) if items else None
        claim, taken = self._claim_many_work(ids, terms)

        def work(cur: Any) -> List[Landing]:
            landed: List[Landing] = settle(cur) if settle is not None else []
            claim(cur)
            return landed

        landed = self._db.run(work)
        return landed, taken()

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
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    ) -> Tuple[List[Optional[AttemptIdentity]], List[Landing]]:
        """:meth:`add_claimed_many` and :meth:`settle_owned_many` (with its ``effects``) in one
        transaction (one commit): fresh updates and finished attempts that arrive together
        share a commit (optional capability). Needs the ``claim_id`` column."""
        return add_claimed(
            self._db, rows, lease_until, settlements, self._liveness.mine(), effects
        )

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
        self,
        items: Sequence[Tuple[AttemptIdentity, Settlement]],
        *,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    ) -> List[Landing]:
        """:meth:`settle_owned` for several attempts in one transaction (one commit).

        Completions go in one statement; failures and abandonments one statement each. With
        ``effects``, the outbox calls of each completion that lands are inserted in the same
        transaction (pending, due at the settlement's ``at``); a settle that does not land
        writes none (see :class:`ptb_fence.OutboxStore`). A completion with state writes
        settles in a savepoint with them, all or none: a moved version leaves it claimed and
        unsettled (see :class:`ptb_fence.StateStore`).

        Returns:
            List[:obj:`bool` | :class:`~ptb_fence.StateConflict`]: Per input position,
            whether that settlement landed, or the conflict that stopped it.
        """
        items = list(items)
        if not items:
            return []
        return self._db.run(settle_owned_work(self._db.sql, items, effects))

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

    def acknowledge_exhaustion(
        self, identity: AttemptIdentity, at: int, *, effects: Optional[AttemptEffects] = None
    ) -> bool:
        """Acknowledge the exhaustion with exactly this identity; it becomes prunable. With
        ``effects``, their outbox calls are inserted as pending in the same commit, only when
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
            if not returns_row(cur, sql.acknowledge_exhaustion, params):
                return False
            if calls:
                insert_calls(sql, cur, calls)
            return True

        return self._db.run(work)

    # -- chat order ------------------------------------------------------------------------
    def add_many_in_chats(self, rows: Sequence[ChatRow]) -> List[bool]:
        """Insert ``(update_id, body, received_at, chat_key)`` rows as pending in one
        statement and commit, recording each chat key (optional capability, see
        :class:`ptb_fence.ChatOrderedUpdateStore`).

        Returns:
            List[:obj:`bool`]: Per input position, as :meth:`add_many` (:obj:`False` if the
            id existed, or appeared earlier in ``rows``).
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
        sql = chat_statements(self._db.table).add_many(len(batch))
        params: List[Any] = []
        for (update_id, body, received_at, chat_key), fingerprint in zip(batch, prints):
            chat = None if chat_key is None else int(chat_key)
            params += [update_id, body, received_at, fingerprint, chat]

        def work(cur: Any) -> Tuple[Set[int], List[Any]]:
            cur.execute(sql, params)
            done = {int(row[0]) for row in cur.fetchall()}
            missing = [
                (u, fp) for (u, _, _, _), fp in zip(batch, prints) if u not in done and fp
            ]
            if not missing:
                return done, []
            cur.execute(self._db.sql.conflicts, ([u for u, _ in missing], [f for _, f in missing]))
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
        """As :meth:`claim_owned`, in the same one ``UPDATE``, only when the row is its chat's
        turn at ``now`` (optional capability, see :class:`ptb_fence.ChatOrderedUpdateStore`).
        """
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        params = self._claim_params(terms, update_id)
        suspect = self._db.has_column("isolated_claim")
        sql = chat_statements(self._db.table, suspect).claim

        def work(cur: Any) -> Optional[Tuple[Any, ...]]:
            cur.execute(sql, params)
            row = cur.fetchone()
            return None if row is None else tuple(row)

        row = self._db.run(work)
        if row is None or row[0] != "processing":
            return None
        identity = AttemptIdentity(update_id=update_id, attempt=int(row[1]), claim_id=str(row[2]))
        if suspect:
            self._suspects.note(identity, int(row[3]))
        return identity

    def due_in_chat_order(
        self, *, now: int, pending_before: int, limit: int, chat_key: Optional[int] = None
    ) -> List[StoredUpdate]:
        """As :meth:`due`, listing only rows that are their chat's turn at ``now`` (with
        ``chat_key``: of that chat only), in one statement."""
        params = {
            "now": now,
            "pending_before": pending_before,
            "limit": max(int(limit), 0),
            "chat_key": chat_key,
        }
        chat = chat_statements(self._db.table)
        sql = chat.due if chat_key is None else chat.due_of_chat

        def work(cur: Any) -> List[StoredUpdate]:
            cur.execute(sql, params)
            return [StoredUpdate(int(u), body) for u, body in cur.fetchall()]

        return self._db.run(work)

    def unkeyed_in_chats(
        self, *, after_update_id: Optional[int] = None, limit: int
    ) -> List[StoredUpdate]:
        """Unsettled rows (pending, processing, failed) without a chat key, by ``update_id``,
        after ``after_update_id`` (see :class:`ptb_fence.ChatOrderedUpdateStore`)."""
        params = {
            "after": -1 if after_update_id is None else int(after_update_id),
            "limit": max(int(limit), 0),
        }
        sql = chat_statements(self._db.table).unkeyed

        def work(cur: Any) -> List[StoredUpdate]:
            cur.execute(sql, params)
            return [StoredUpdate(int(u), body) for u, body in cur.fetchall()]

        return self._db.run(work)

    def set_chat_keys(self, keys: Sequence[ChatKey]) -> int:
        """For ``(update_id, body, chat_key)``: record the chat key of the row if it has none,
        is unsettled and holds exactly ``body``; one transaction. Returns how many were set."""
        params = [
            {"update_id": int(update_id), "body": body, "chat_key": int(chat_key)}
            for update_id, body, chat_key in keys
        ]
        if not params:
            return 0
        sql = chat_statements(self._db.table).fill_key

        def work(cur: Any) -> int:
            done = 0
            for values in params:
                cur.execute(sql, values)
                done += max(cur.rowcount, 0)
            return done

        return self._db.run(work)

    # -- release and liveness --------------------------------------------------------------
    # Liveness is a session advisory lock per instance, held by ``self._liveness`` (a
    # PgLiveness); what proves an instance dead, and why, is in the docstring of ``_sql``.
    def release_many(self, identities: Sequence[AttemptIdentity], *, at: int) -> List[bool]:
        """Give the exact claims back in one statement and commit: each row that is
        ``processing`` with that attempt and claim id becomes ``pending`` with ``attempts - 1``
        and ``due_at = at`` (``error`` and ``claim_id`` kept), claimable by any process at once
        and listed by ``due`` whatever ``pending_before`` (optional capability, see
        :class:`ptb_fence.ReleasingUpdateStore`). Needs the ``claim_id`` column.

        A row locked right now by an open transaction (a fenced transaction's
        ``FOR UPDATE``) is skipped, never waited for: it is not released and its lease holds.

        Returns:
            List[:obj:`bool`]: Per input position, whether that claim was released (an
            identity repeated in the input is released once, at its first position).
        """
        identities = list(identities)
        if not identities:
            return []
        sql = self._liveness.sql.release_many(len(identities), self._db.has_column("instance"))
        params: List[Any] = []
        for position, identity in enumerate(identities):
            params += [position, identity.update_id, identity.attempt, identity.claim_id]
        params.append(int(at))

        def work(cur: Any) -> List[bool]:
            cur.execute(sql, params)
            released = {int(row[0]) for row in cur.fetchall()}
            return [position in released for position in range(len(identities))]

        return self._db.run(work)

    def hold_liveness(self) -> str:
        """Start holding this store object's liveness (idempotent); return its instance id.

        Opens a dedicated connection that holds the session advisory lock
        ``pg_advisory_lock(0x70746266, <key of the instance>)`` — PostgreSQL drops it with the
        backend when the process dies — and records the instance in ``ptb_fence_instances``.
        Claims made through this object from now on record the instance (optional capability,
        see :class:`ptb_fence.LivenessStore`). If that connection breaks while the process
        lives (the backend terminated, the server restarted), :meth:`take_over_dead` holds the
        instance again on a new connection; meanwhile the refreshes of its row that every
        :meth:`take_over_dead` makes keep others from taking it for dead (they wait for the
        lease of its claims). A process holding liveness must therefore call
        :meth:`take_over_dead` at least every second or two (the runtime does, every second).

        Raises:
            ptb_fence.SchemaError: The table was not migrated (``create_table=False``): apply
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
        sql = self._liveness.sql
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
                cur.execute(sql.lock_instance, params)  # before the row is visible
                cur.execute(sql.insert_instance, params)
        except BaseException as exc:
            close_quietly(conn)
            schema_error = self._db.schema_error(exc)
            if schema_error is not None:
                raise schema_error from exc
            raise
        return conn

    def _keep_liveness(self) -> None:
        """If this process holds an instance whose connection broke (the server restarted,
        the backend was terminated), hold it again on a new connection. Skipped while another
        thread does it (a new connection may take up to ``connect_timeout``)."""
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
                        cur.execute("SELECT 1")
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
        """Stop holding liveness (graceful stop; also done by :meth:`close`): delete the
        instance's row, then end its advisory lock by closing its connection. Idempotent."""
        holder = self._liveness
        if not holder.lock.acquire(timeout=1.0):
            # a liveness check is stuck on a server that does not answer: end it
            if holder.pid == os.getpid():
                cut(holder.conn)
            if not holder.lock.acquire(timeout=1.0):
                # still held (reconnecting, bounded by connect_timeout): give up; the lock
                # ends with this process, and the row left behind is then recognised as dead
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
                            holder.sql.delete_instance,
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
                        holder.sql.delete_instance,
                        {"table": self._db.table, "instance": instance},
                    )
            except Exception:  # a broken connection: the lock is gone with it
                pass
            finally:
                close_quietly(conn)
        finally:
            holder.lock.release()

    def take_over_dead(self, *, now: int) -> int:
        """Make the claims of provably dead instances claimable at ``now`` and forget them,
        in one statement.

        An instance of this table (not this object's own) is dead when its advisory lock can
        be taken and its row was not refreshed for a few seconds since the server started (see
        ``_sql``). Of its ``processing`` rows, one whose claim was marked isolated
        (:meth:`mark_isolated`: its handler ran there alone or on probation, so the crash is
        its own) gets ``due_at = now - 1`` (never later than before; attempts and claim id
        kept); every other row is given back (``pending``, ``attempts - 1``, ``due_at = now``,
        claim id kept; listed by ``due`` at once) and becomes suspect, or suspect again when
        its handler had started there as a suspect. Any process can claim them at
        once (optional capabilities, see :class:`ptb_fence.LivenessStore` and
        :class:`ptb_fence.IsolatingUpdateStore`). A row that another session still locks (one
        the server keeps after the process died) is skipped, never waited for, and its instance
        stays listed until a later call takes it. On a table without the ``isolated_claim``
        column (``create_table=False``, not migrated) every row keeps its attempts (a crash
        counts against every update its process had claimed).

        Also refreshes this object's own instance row and, if its liveness connection broke,
        holds its lock again on a new one.

        Returns:
            :obj:`int`: How many rows were made claimable (``0`` on a table without the
            ``instance`` column).
        """
        now = int(now)
        if not self._db.has_column("instance") or not self._beats():
            return 0
        params = {"table": self._db.table, "me": self._liveness.mine(), "now": now}
        statements = self._liveness.sql
        if self._db.has_column("isolated_claim"):
            sql = statements.take_over_dead_isolating
        else:
            sql = statements.take_over_dead

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
        outbox = self._db.sql.outbox
        cur.execute(outbox.exists, {"outbox": f'"{outbox.name}"'})
        if not cur.fetchone()[0]:  # a table managed with create_table=False: no outbox
            return 0
        cur.execute(outbox.take_over, {"now": now, "pattern": sender_pattern(instance)})
        return len(cur.fetchall())

    def _beats(self) -> bool:
        """Whether ``ptb_fence_instances`` has ``seen_at`` (read once). Without it (a schema
        managed with ``create_table=False``, not migrated) nothing is proven dead."""
        holder = self._liveness
        if holder.beats is None:
            holder.beats = bool(self._db.run(lambda cur: _scalar(cur, holder.sql.beats)))
        return holder.beats

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
            claim id and ``due_at >= at``); :obj:`False` on a table without the
            ``isolated_claim`` column (it has no suspect rows).
        """
        return self._isolation(self._liveness.sql.mark_isolated, identity, at)

    def end_probation(self, identity: AttemptIdentity, *, at: int) -> bool:
        """Record, committed, that the handler of this exact live claim, marked by
        :meth:`mark_isolated`, ran past its probation: a crash from now on is not charged to
        it alone (optional capability, see :class:`ptb_fence.IsolatingUpdateStore`).

        Returns:
            :obj:`bool`: Whether it landed (the claim is live at ``at`` and marked).
        """
        return self._isolation(self._liveness.sql.end_probation, identity, at)

    def _isolation(self, sql: str, identity: AttemptIdentity, at: int) -> bool:
        if not self._db.has_column("isolated_claim"):
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
        """:obj:`str` | :obj:`None`: The instance id while this object holds liveness (in
        this process)."""
        return self._liveness.mine()

    # -- figures ---------------------------------------------------------------------------
    def figures(self) -> StoreFigures:
        """What waits in the table, for operators, in one read-only transaction of one
        ``SELECT`` (optional capability, see :class:`ptb_fence.FiguresStore`): the unsettled
        rows and the oldest ``received_at`` among them, the unacknowledged exhaustions and the
        oldest ``due_at`` among them, and the chat held longest by one update. It reads only
        the waiting rows (and the abandoned ones) through the table's indexes, never the
        completed history. Legacy-safe: it needs no ``claim_id``, and on a table without the
        ``chat_key`` column ``held_chat`` is :obj:`None`."""
        sql = self._db.sql.figures if self._db.has_column("chat_key") else (
            self._db.sql.figures_unkeyed
        )

        def work(cur: Any) -> StoreFigures:
            cur.execute(sql)
            return figures_of(cur.fetchone())

        return self._db.run(work)

    # -- outbox ----------------------------------------------------------------------------
    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        """Inside the caller's open transaction on ``connection`` (a psycopg2 connection or
        cursor): insert the outbox calls of ``effects`` as pending at ``at``. Nothing is
        committed: the caller's commit lands them, its rollback discards them (optional
        capability, see :class:`ptb_fence.OutboxStore`).

        Returns:
            List[:obj:`int`]: The call ids, in order.

        Raises:
            ValueError: If ``connection`` is in autocommit mode outside a transaction.
        """
        calls = effects_params(identity, effects, at)
        writes = check_writes(effects.state)
        sql = self._db.sql

        def work(cur: Any) -> List[int]:
            if writes:
                cur.execute(sql.state.lock, sql.state.lock_params(writes))
                cur.execute(sql.state.savepoint)
                moved = write_state_in(sql, cur, writes, at)
                if moved:
                    cur.execute(sql.state.rollback_to)
                    cur.execute(sql.state.release)
                    raise StateConflictError(tuple(moved))
                cur.execute(sql.state.release)
            return insert_calls(sql, cur, calls)

        return self._db.caller_work(connection, work)

    # -- persisted bot state ---------------------------------------------------------------
    def read_state(self, keys: Sequence[StateKey]) -> Dict[StateKey, StateEntry]:
        """The committed rows of ``keys`` in one ``SELECT`` (see
        :class:`ptb_fence.StateStore`); absent keys are left out."""
        keys = list(dict.fromkeys(keys))
        if not keys:
            return {}
        state = self._db.sql.state

        def work(cur: Any) -> Dict[StateKey, StateEntry]:
            groups, params = state.read_any_params(keys)
            cur.execute(state.read_any(groups), params)
            return entries_of(cur.fetchall(), keys)

        return self._db.read(work)  # one SELECT: no transaction around it

    def write_state(self, writes: Sequence[StateWrite], at: int) -> Optional[StateConflict]:
        """Apply ``writes`` in one transaction, all or none (see
        :class:`ptb_fence.StateStore`)."""
        checked = check_writes(writes)
        sql = self._db.sql

        def work(cur: Any) -> Optional[StateConflict]:
            if checked:
                cur.execute(sql.state.lock, sql.state.lock_params(checked))
            cur.execute(sql.state.savepoint)
            moved = write_state_in(sql, cur, checked, int(at))
            if moved:
                cur.execute(sql.state.rollback_to)
                cur.execute(sql.state.release)
                return StateConflict(tuple(moved))
            cur.execute(sql.state.release)
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
        """The rows by ``(kind, name, key)`` after ``after`` (see
        :class:`ptb_fence.StateStore`)."""
        check_kind(kind)
        state = self._db.sql.state
        params = state.list_params(kind, name, after, limit)

        def work(cur: Any) -> List[Tuple[StateKey, StateEntry]]:
            cur.execute(state.list, params)
            return list(entries_of(cur.fetchall()).items())

        return self._db.run(work)

    def claim_calls(
        self, *, now: int, lease_until: int, limit: int, sender: str
    ) -> List[OutboxEntry]:
        """Claim the calls to send now in one statement (see :class:`ptb_fence.OutboxStore`):
        the candidates (pending and due, or sending with a lapsed lease, and in turn in their
        chat; lowest ``call_id`` first, at most ``limit``) are locked ``FOR UPDATE SKIP
        LOCKED`` and taken in the same ``UPDATE``, so concurrent claimers never share one."""
        params = {
            "now": int(now), "lease_until": int(lease_until), "limit": max(int(limit), 0),
            "sender": str(sender),
        }
        sql = self._db.sql.outbox.claim

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
        """For ``(call_id, sender, result_json, at)``: a call sending by ``sender`` becomes
        sent at ``at``; per item whether it landed; one transaction."""
        return self._each(self._db.sql.outbox.record_sent, [
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
        """:meth:`record_sent` then :meth:`claim_calls` in one transaction (optional
        capability, see :class:`ptb_fence.RecordAndClaimOutboxStore`): the claim's statement
        runs after the records, so it sees a chat's recorded call as sent and takes the
        chat's next one."""
        record = self._db.sql.outbox.record_sent
        claim = self._db.sql.outbox.claim
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
        """A call sending by ``sender`` goes back to pending at ``due_at`` with ``error``."""
        return self._one(self._db.sql.outbox.retry, {
            "call_id": call_id, "sender": sender, "due_at": int(due_at), "error": error,
        })

    def fail_call(self, call_id: int, sender: str, *, at: int, error: str) -> bool:
        """A call sending by ``sender`` becomes failed at ``at`` (not acknowledged)."""
        return self._one(self._db.sql.outbox.fail, {
            "call_id": call_id, "sender": sender, "at": int(at), "error": error,
        })

    def release_calls(self, call_ids: Sequence[int], sender: str, at: int) -> List[bool]:
        """Each call sending by ``sender`` goes back to pending at ``at`` (``tries - 1``);
        one transaction."""
        return self._each(self._db.sql.outbox.release, [
            {"call_id": call_id, "sender": sender, "at": int(at)} for call_id in call_ids
        ])

    def _entries(self, sql: str, params: Dict[str, Any]) -> List[OutboxEntry]:
        def work(cur: Any) -> List[OutboxEntry]:
            cur.execute(sql, params)
            return [entry_of(row) for row in cur.fetchall()]

        return self._db.read(work)  # one SELECT: no transaction around it

    def claimed_calls(self, sender: str, *, limit: int) -> List[OutboxEntry]:
        """The calls ``sending`` by ``sender`` (claimed at insert or by :meth:`claim_calls`),
        by ``call_id``, at most ``limit``; reads only."""
        return self._entries(self._db.sql.outbox.claimed,
                             {"sender": str(sender), "limit": max(int(limit), 0)})

    def due_send_failures(
        self, *, limit: int, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """Failed calls not acknowledged, after ``after_call_id``, by ``call_id``."""
        after = -1 if after_call_id is None else int(after_call_id)
        return self._entries(self._db.sql.outbox.due_failures,
                             {"after": after, "limit": max(int(limit), 0)})

    def acknowledge_send_failure(self, call_id: int, at: int) -> bool:
        """A failed call not acknowledged becomes acknowledged (``due_at = at``)."""
        return self._one(self._db.sql.outbox.acknowledge, {"call_id": call_id, "at": int(at)})

    def get_call(self, call_id: int) -> Optional[OutboxEntry]:
        """The call, or :obj:`None`."""
        found = self._entries(self._db.sql.outbox.get, {"call_id": call_id})
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
        outbox = self._db.sql.outbox
        return self._entries(outbox.list_all if state is None else outbox.list_state, params)

    def outbox_counts(self) -> Dict[str, int]:
        """Calls per state (``failed``: not acknowledged; ``failed_acknowledged``)."""
        sql = self._db.sql.outbox.counts

        def work(cur: Any) -> Dict[str, int]:
            cur.execute(sql)
            return counts_of(cur.fetchall())

        return self._db.run(work)

    def retry_failed_call(self, call_id: int, at: int) -> bool:
        """Operators: a failed call goes back to pending at ``at``."""
        return self._one(self._db.sql.outbox.retry_failed, {"call_id": call_id, "at": int(at)})

    def drop_call(self, call_id: int) -> bool:
        """Operators: delete a pending or failed call."""
        return self._one(self._db.sql.outbox.drop, {"call_id": call_id})
