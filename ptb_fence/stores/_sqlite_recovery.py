"""Release and liveness of a SQLiteUpdateStore.

Liveness on one machine: an instance holds an exclusive OS file lock (``flock``) on its own
lock file ``<database>.instances/<instance>.lock`` and has a row in the table
``ptb_fence_instances`` of the same database. The kernel drops the lock when the process ends
(however it ends), so a lock that can be taken proves the instance dead; a frozen process
(SIGSTOP) keeps it. The lock is taken before the row is written and the row is deleted before
the lock is dropped, so a listed instance whose lock is free is dead.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ptb_fence._values import AttemptIdentity
from ptb_fence.stores._sqlite_connections import SQLiteConnections
from ptb_fence.stores._sqlite_sql import SQLiteStatements
from ptb_fence.stores._sqlite_writes import int_arg, max_variables
from ptb_fence.stores._suspects import SuspectClaims

__all__ = ["FileLiveness", "SQLiteRecovery"]


class FileLiveness:
    """The instance a store object holds: its id, its locked file descriptor and the process
    that holds it (a child made by ``os.fork()`` does not hold its parent's instance)."""

    __slots__ = ("fd", "instance", "lock", "lock_path", "pid")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.instance: Optional[str] = None
        self.fd: Optional[int] = None
        self.lock_path: Optional[str] = None
        self.pid = 0

    def mine(self) -> Optional[str]:
        """The instance this process holds through the store object, if any."""
        instance = self.instance
        return instance if instance is not None and self.pid == os.getpid() else None

    def forget_inherited(self) -> None:
        """In a forked child: drop the parent's instance without touching its row or lock
        file (closing the inherited descriptor leaves the parent's lock in place)."""
        if self.instance is not None and self.pid != os.getpid():
            _close_fd(self.fd)
            self.instance = self.fd = self.lock_path = None


def _close_fd(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:  # pragma: no cover - already closed
            pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _lock_if_dead(lock_path: str) -> Tuple[bool, Optional[int]]:
    """Whether the instance of ``lock_path`` is dead, and the descriptor now locking it."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return True, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: its process holds it (alive, perhaps frozen)
        _close_fd(fd)
        return False, None
    return True, fd


class SQLiteRecovery:
    """``release_many``, ``hold_liveness``, ``release_liveness``, ``take_over_dead``,
    ``claimed_suspect`` and ``mark_isolated`` of :class:`ptb_fence.SQLiteUpdateStore` (a
    mixin; see the module docstring)."""

    __slots__ = ()

    _conns: SQLiteConnections
    _sql: SQLiteStatements
    _table: str
    _liveness: FileLiveness
    _suspects: SuspectClaims

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
        is created when missing) and records the instance in ``ptb_fence_instances``. Claims
        made through this object from now on record the instance (optional capability, see
        :class:`ptb_fence.LivenessStore`).
        """
        holder = self._liveness
        with holder.lock:
            holder.forget_inherited()
            if holder.instance is not None:
                return holder.instance
            instance = uuid.uuid4().hex
            holder.fd, holder.lock_path = self._hold(instance)
            holder.instance, holder.pid = instance, os.getpid()
            return instance

    def _hold(self, instance: str) -> Tuple[int, str]:
        """Lock a new lock file of ``instance``, then write its row (in that order)."""
        directory = self._conns.path + ".instances"
        os.makedirs(directory, exist_ok=True)
        lock_path = os.path.join(directory, instance + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            params = {
                "table": self._table,
                "instance": instance,
                "lock_path": lock_path,
                "started_at": int(time.time() * 1000),
            }
            with self._conns.immediate() as conn:
                conn.execute(self._sql.create_instances)
                conn.execute(self._sql.insert_instance, params)
        except BaseException:
            _close_fd(fd)
            _unlink(lock_path)
            raise
        return fd, lock_path

    def _keep_liveness(self) -> None:
        """If this process's lock file was removed (another process took the instance for
        dead, e.g. after someone deleted the file), hold the instance again."""
        holder = self._liveness
        with holder.lock:
            if holder.mine() is None or holder.fd is None:
                return
            try:
                if os.fstat(holder.fd).st_nlink > 0:
                    return
            except OSError:
                pass
            _close_fd(holder.fd)
            assert holder.instance is not None
            holder.fd, holder.lock_path = self._hold(holder.instance)

    def release_liveness(self) -> None:
        """Stop holding liveness (graceful stop; also done by :meth:`close`): delete the
        instance's row, then drop its file lock and remove the lock file. Idempotent."""
        holder = self._liveness
        with holder.lock:
            holder.forget_inherited()
            if holder.instance is None:
                return
            instance, fd, lock_path = holder.instance, holder.fd, holder.lock_path
            holder.instance = holder.fd = holder.lock_path = None
            try:
                with self._conns.immediate() as conn:
                    conn.execute(
                        self._sql.delete_instance, {"table": self._table, "instance": instance}
                    )
            finally:
                if lock_path is not None:
                    _unlink(lock_path)
                _close_fd(fd)

    def take_over_dead(self, *, now: int) -> int:
        """Make the claims of provably dead instances claimable at ``now`` and forget them.

        An instance of this table (not this object's own) is dead when its lock file can be
        locked (or is gone). Of its ``processing`` rows, one whose claim was marked isolated
        (:meth:`mark_isolated`: its handler ran alone there, so the crash is its own) gets
        ``due_at = now - 1`` (never later than before; attempts and claim id kept); every
        other row is given back (``pending``, ``attempts - 1``, ``due_at = now``, claim id
        kept; listed by ``due`` at once) and becomes suspect. Any process can claim them at
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
        locked: List[Tuple[str, str, Optional[int]]] = []
        count = 0
        try:
            for instance, lock_path in rows:
                dead, fd = _lock_if_dead(str(lock_path))
                if dead:
                    locked.append((str(instance), str(lock_path), fd))
            if not locked:
                return 0
            with self._conns.immediate() as conn:
                for instance, _path, _fd in locked:
                    params: Dict[str, Any] = {
                        "table": self._table, "instance": instance, "now": now,
                    }
                    count += len(conn.execute(self._sql.take_over, params).fetchall())
                    conn.execute(self._sql.delete_instance, params)
        finally:
            for _instance, lock_path, fd in locked:
                _unlink(lock_path)
                _close_fd(fd)
        return count

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
            claim id and ``due_at >= at``).
        """
        params = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "at": int_arg("at", at),
        }
        with self._conns.immediate() as conn:
            return bool(conn.execute(self._sql.mark_isolated, params).fetchall())

    @property
    def instance(self) -> Optional[str]:
        """:obj:`str` | :obj:`None`: The instance id while this object holds liveness (in
        this process)."""
        return self._liveness.mine()
