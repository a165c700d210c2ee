"""Release and liveness of a PostgresUpdateStore (see ``_pg_recovery_sql`` for the SQL and
how liveness is proven)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence

from ptb_fence._sockets import cut, cut_after
from ptb_fence._values import AttemptIdentity
from ptb_fence.stores._pg_connections import close_quietly
from ptb_fence.stores._pg_executor import PgExecutor
from ptb_fence.stores._pg_recovery_sql import RecoveryStatements, instance_key, with_instance

__all__ = ["PgLiveness", "PostgresRecovery"]

_RELEASE_SECONDS = 2.0
"""How long ``release_liveness`` waits for the server to delete the instance's row."""

# Liveness connections inherited through os.fork() belong to the parent: closing one in the
# child would end the parent's session (and its lock). They are parked here, never closed.
_INHERITED: List[Any] = []


class PgLiveness:
    """What one store object needs for release and liveness: the statements, and the
    instance it holds (its id, lock key and dedicated connection)."""

    __slots__ = ("claim", "claim_fenced", "conn", "instance", "key", "lock", "pid", "sql")

    def __init__(self, table: str, claim: str, claim_fenced: str) -> None:
        self.sql = RecoveryStatements(table)
        self.claim = with_instance(claim)
        self.claim_fenced = with_instance(claim_fenced)
        self.lock = threading.Lock()
        self.instance: Optional[str] = None
        self.key = 0
        self.conn: Any = None
        self.pid = 0

    def mine(self) -> Optional[str]:
        """The instance this process holds through the store object, if any."""
        instance = self.instance
        return instance if instance is not None and self.pid == os.getpid() else None

    def forget_inherited(self) -> None:
        """In a forked child: drop the parent's instance, never touching its connection."""
        if self.instance is not None and self.pid != os.getpid():
            _INHERITED.append(self.conn)
            self.instance, self.conn = None, None


class PostgresRecovery:
    """``release_many``, ``hold_liveness``, ``release_liveness`` and ``take_over_dead`` of
    :class:`ptb_fence.PostgresUpdateStore` (a mixin)."""

    __slots__ = ()

    _db: PgExecutor
    _liveness: PgLiveness

    def _claim_sql(self, fenced: bool) -> str:
        """The claim statement: recording the instance where the table has that column."""
        if self._db.has_column("instance"):
            return self._liveness.claim_fenced if fenced else self._liveness.claim
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
        lives, other processes see the instance as dead and may take its claims over (the
        fence then refuses its writes); :meth:`take_over_dead` holds the instance again on a
        new connection first.

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
        the backend was terminated), hold it again on a new connection. Others may have taken
        its claims over meanwhile (their fenced writes are then refused): nothing more."""
        holder = self._liveness
        with holder.lock:
            if holder.mine() is None:
                return
            try:
                # not cut after a time: a slow server must not cost a live process its lock (a
                # stop that finds this check stuck cuts the connection itself)
                with holder.conn.cursor() as cur:
                    cur.execute("SELECT 1")
                    cur.fetchone()
                return
            except Exception:
                close_quietly(holder.conn)
            assert holder.instance is not None
            holder.conn = self._hold(holder.instance)

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
        """Make the live leases of provably dead instances lapse at ``now`` and forget them,
        in one statement.

        An instance of this table (not this object's own) is dead when its advisory lock can
        be taken. Its ``processing`` rows get ``due_at = now - 1`` (never later than before;
        attempts and claim id kept), so any process can claim them at once.

        Returns:
            :obj:`int`: How many rows were made claimable (``0`` on a table without the
            ``instance`` column).
        """
        now = int(now)
        if not self._db.has_column("instance"):
            return 0
        try:
            self._keep_liveness()
        except Exception:  # the database is unreachable: the statement below says so
            pass
        params = {"table": self._db.table, "me": self._liveness.instance, "now": now}
        sql = self._liveness.sql.take_over_dead

        def work(cur: Any) -> int:
            cur.execute(sql, params)
            return int(cur.fetchone()[0])

        return self._db.run(work)

    @property
    def instance(self) -> Optional[str]:
        """:obj:`str` | :obj:`None`: The instance id while this object holds liveness (in
        this process)."""
        return self._liveness.mine()
