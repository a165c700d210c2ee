"""Release and liveness of a PostgresUpdateStore (see ``_pg_recovery_sql`` for the SQL and
how liveness is proven).

A child made by ``os.fork()`` (``multiprocessing``, ``ProcessPoolExecutor``) inherits the socket
of the liveness connection; while any process has it open the server keeps the session, and
with it the lock of a parent that may have died. Right after a fork the child points its copy of
that descriptor at ``/dev/null`` (``os.register_at_fork``): the parent's session is untouched,
and whatever libpq would later send on it in the child (its goodbye when the object is freed)
goes nowhere.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from typing import Any, Dict, List, Optional, Sequence

from ptb_fence._sockets import cut, cut_after
from ptb_fence._values import AttemptIdentity
from ptb_fence.stores._pg_connections import close_quietly
from ptb_fence.stores._pg_executor import PgExecutor
from ptb_fence.stores._pg_recovery_sql import (
    RecoveryStatements,
    instance_key,
    with_instance,
    with_suspect,
)
from ptb_fence.stores._suspects import SuspectClaims

__all__ = ["PgLiveness", "PostgresRecovery"]

_RELEASE_SECONDS = 2.0
"""How long ``release_liveness`` waits for the server to delete the instance's row."""

# Liveness connections inherited through os.fork() belong to the parent: closing one in the
# child would end the parent's session (and its lock). They are parked here, never closed.
_INHERITED: List[Any] = []
_HOLDERS: "weakref.WeakSet[PgLiveness]" = weakref.WeakSet()


def _detach(conn: Any) -> None:
    """In a forked child: replace the child's copy of ``conn``'s socket by ``/dev/null``."""
    try:
        fd = conn.fileno()
    except Exception:  # closed: no socket
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(devnull, fd, inheritable=False)
    finally:
        os.close(devnull)


def _after_fork_in_child() -> None:
    for holder in list(_HOLDERS):
        holder.lock = threading.Lock()  # a parent thread may have held it: not in the child
        conn = holder.conn
        if conn is not None and holder.pid != os.getpid():
            holder.conn = None
            _INHERITED.append(conn)
            _detach(conn)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _counted(claim: str, claim_id: str) -> str:
    """``claim`` that also marks its take isolated (``isolated_claim = claim_id``, the SQL
    expression ``claim_id``)."""
    head, where = claim.split("\nWHERE update_id", 1)
    return (
        head
        + ",\n    isolated_claim = CASE WHEN attempts < %(max_attempts)s THEN "
        + claim_id
        + " ELSE isolated_claim END\nWHERE update_id"
        + where
    )


class PgLiveness:
    """What one store object needs for release and liveness: the statements, and the
    instance it holds (its id, lock key and dedicated connection)."""

    __slots__ = (
        "__weakref__",
        "beats",
        "claim",
        "claim_fenced",
        "claim_counted",
        "claim_fenced_counted",
        "claim_fenced_suspect",
        "conn",
        "instance",
        "key",
        "lock",
        "pid",
        "sql",
    )

    def __init__(self, table: str, claim: str, claim_fenced: str) -> None:
        self.sql = RecoveryStatements(table)
        self.claim = with_instance(claim)
        self.claim_fenced = with_instance(claim_fenced)
        self.claim_fenced_suspect = with_suspect(self.claim_fenced)
        # claim id NULL (a legacy unary claim writes none): isolated_claim NULL matches it
        self.claim_counted = _counted(self.claim, "claim_id")
        self.claim_fenced_counted = _counted(self.claim_fenced, "%(claim_id)s::TEXT")
        self.lock = threading.Lock()
        self.instance: Optional[str] = None
        self.key = 0
        self.conn: Any = None
        self.pid = 0
        self.beats: Optional[bool] = None  # whether ptb_fence_instances has seen_at
        _HOLDERS.add(self)

    def mine(self) -> Optional[str]:
        """The instance this process holds through the store object, if any."""
        instance = self.instance
        return instance if instance is not None and self.pid == os.getpid() else None

    def forget_inherited(self) -> None:
        """In a forked child: drop the parent's instance, never touching its connection."""
        if self.instance is not None and self.pid != os.getpid():
            if self.conn is not None:  # (the fork hook parked and detached it already)
                _INHERITED.append(self.conn)
            self.instance, self.conn = None, None


class PostgresRecovery:
    """``release_many``, ``hold_liveness``, ``release_liveness``, ``take_over_dead``,
    ``claimed_suspect`` and ``mark_isolated`` of :class:`ptb_fence.PostgresUpdateStore` (a
    mixin)."""

    __slots__ = ()

    _db: PgExecutor
    _liveness: PgLiveness
    _suspects: SuspectClaims

    def _claim_sql(self, fenced: bool, counted: bool = False) -> str:
        """The claim statement: recording the instance where the table has that column and,
        where it has ``isolated_claim``, either reading back whether the row is suspect
        (``claim_owned``) or, ``counted`` (the base ``claim``: unary handling never runs an
        attempt alone), marking the take isolated at once, so that a crash during it counts
        as it always did."""
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
        ``_pg_recovery_sql``). Of its ``processing`` rows, one whose claim was marked isolated
        (:meth:`mark_isolated`: its handler ran alone there, so the crash is its own) gets
        ``due_at = now - 1`` (never later than before; attempts and claim id kept); every
        other row is given back (``pending``, ``attempts - 1``, ``due_at = now``, claim id
        kept; listed by ``due`` at once) and becomes suspect. Any process can claim them at
        once (optional capabilities, see :class:`ptb_fence.LivenessStore` and
        :class:`ptb_fence.IsolatingUpdateStore`). On a table without the ``isolated_claim``
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
            return int(cur.fetchone()[0])

        try:
            return self._db.run(work)  # the refresh first: holding again may take a while
        finally:
            try:
                self._keep_liveness()
            except Exception:  # the database is unreachable: the next call tries again
                pass

    def _beats(self) -> bool:
        """Whether ``ptb_fence_instances`` has ``seen_at`` (read once). Without it (a schema
        managed with ``create_table=False``, not migrated) nothing is proven dead."""
        holder = self._liveness
        if holder.beats is None:
            holder.beats = bool(self._db.run(lambda cur: _fetch_one(cur, holder.sql.beats)))
        return holder.beats

    def claimed_suspect(self, identity: AttemptIdentity) -> bool:
        """Whether ``identity``, claimed through this object in this process, took a suspect
        row (a row whose earlier claim a dead instance held, given back by
        :meth:`take_over_dead`). Read back by the claim statement itself: no statement here;
        answered once per claim (optional capability, see
        :class:`ptb_fence.IsolatingUpdateStore`)."""
        return self._suspects.take(identity)

    def mark_isolated(self, identity: AttemptIdentity, *, at: int) -> bool:
        """Record, committed, that the handler of this exact live claim starts now alone in its
        process (``isolated_claim = claim_id``), so that :meth:`take_over_dead` counts its
        attempt as spent if the process dies (optional capability, see
        :class:`ptb_fence.IsolatingUpdateStore`).

        Returns:
            :obj:`bool`: Whether it landed (the row is ``processing`` with this attempt and
            claim id and ``due_at >= at``); :obj:`False` on a table without the
            ``isolated_claim`` column (it has no suspect rows).
        """
        if not self._db.has_column("isolated_claim"):
            return False
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": int(at),
        }
        sql = self._liveness.sql.mark_isolated

        def work(cur: Any) -> bool:
            cur.execute(sql, params)
            return cur.fetchone() is not None

        return self._db.run(work)

    @property
    def instance(self) -> Optional[str]:
        """:obj:`str` | :obj:`None`: The instance id while this object holds liveness (in
        this process)."""
        return self._liveness.mine()


def _fetch_one(cur: Any, sql: str) -> Any:
    cur.execute(sql)
    return cur.fetchone()[0]
