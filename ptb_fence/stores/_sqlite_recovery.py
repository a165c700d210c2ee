"""Release and liveness of a SQLiteUpdateStore.

Liveness on one machine: an instance holds an exclusive OS file lock (``flock``) on its own
lock file ``<database>.instances/<instance>.lock``, which names the instance, and has a row in
the table ``ptb_fence_instances`` of the same database. The kernel drops the lock when the
process ends (however it ends), so a lock that can be taken proves the instance dead; a frozen
process (SIGSTOP) keeps it. The lock is taken before the row is written and the row is deleted
before the lock is dropped, so a listed instance whose lock is free is dead.

Only that is proof. The lock file is looked for next to the checking process's own path to the
database (symlinks resolved), never at a path its owner stored: processes may reach the file
through different paths (a container mounting the volume elsewhere). A missing lock file, one
that names another instance (replaced by someone) or one this process cannot open (another OS
user's, unreadable) proves nothing: those claims wait for their lease. A live owner whose file
was removed or replaced locks a new one at its next check, put in place whole (written and
locked under a temporary name, then renamed), so a checker never finds it unlocked. The check
opens others' lock files read-only (``flock`` needs no write access) and lock files are
created readable by others.

A child made by ``os.fork()`` (``multiprocessing``, ``ProcessPoolExecutor``) must not keep its
parent's lock after the parent died: the child closes its copy of the descriptor right after the
fork (``os.register_at_fork``); the parent's lock stays, since a ``flock`` ends with the last
descriptor of the open file.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import threading
import time
import uuid
import weakref
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ptb_fence._values import AttemptIdentity
from ptb_fence.stores._sqlite_connections import SQLiteConnections
from ptb_fence.stores._sqlite_sql import SQLiteStatements
from ptb_fence.stores._sqlite_writes import int_arg, max_variables
from ptb_fence.stores._suspects import SuspectClaims

__all__ = ["FileLiveness", "SQLiteRecovery", "lock_directory"]

_LOGGER = logging.getLogger("ptb_fence.store")

# Held while a lock file descriptor is opened and recorded in its holder, or closed and
# forgotten, and across os.fork(): a child never inherits a descriptor its holder does not name.
_FORK_GUARD = threading.Lock()
_HOLDERS: "weakref.WeakSet[FileLiveness]" = weakref.WeakSet()


class FileLiveness:
    """The instance a store object holds: its id, its locked file descriptor and the process
    that holds it (a child made by ``os.fork()`` does not hold its parent's instance), and the
    lock files this object could not check (warned about once)."""

    __slots__ = ("__weakref__", "fd", "instance", "lock", "lock_path", "pid", "unreadable")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.instance: Optional[str] = None
        self.fd: Optional[int] = None
        self.lock_path: Optional[str] = None
        self.pid = 0
        self.unreadable: Set[str] = set()
        _HOLDERS.add(self)

    def mine(self) -> Optional[str]:
        """The instance this process holds through the store object, if any."""
        instance = self.instance
        return instance if instance is not None and self.pid == os.getpid() else None

    def forget_inherited(self) -> None:
        """In a forked child: drop the parent's instance without touching its row or lock
        file (the inherited descriptor was closed right after the fork)."""
        if self.instance is not None and self.pid != os.getpid():
            self.instance = self.fd = self.lock_path = None

    def close_fd(self, fd: Optional[int]) -> None:
        """Close ``fd``, a descriptor this holder locked (now or before), and forget it."""
        with _FORK_GUARD:
            _close_fd(fd)
            if self.fd == fd:
                self.fd = None


def _after_fork_in_child() -> None:
    """Close the lock descriptors inherited from the parent (the parent keeps its locks), so
    that a long-lived child does not keep a dead parent alive."""
    for holder in list(_HOLDERS):
        holder.lock = threading.Lock()  # a parent thread may have held it: not in the child
        if holder.fd is not None:
            _close_fd(holder.fd)
            holder.fd = None
    _FORK_GUARD.release()


os.register_at_fork(
    before=_FORK_GUARD.acquire,
    after_in_parent=_FORK_GUARD.release,
    after_in_child=_after_fork_in_child,
)


def lock_directory(database: str) -> str:
    """The directory of the lock files of ``database``: next to the file, found from this
    process's path to it with symlinks resolved."""
    return os.path.realpath(database) + ".instances"


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


def _make_directory(directory: str) -> None:
    """Create the lock directory (when missing) with the permissions of the database's
    directory, so every OS user that may write the database may also hold liveness."""
    try:
        os.mkdir(directory)
    except FileExistsError:
        return
    try:
        os.chmod(directory, stat.S_IMODE(os.stat(os.path.dirname(directory)).st_mode))
    except OSError:  # pragma: no cover - not the owner: the directory stays as created
        pass


def _new_lock_file(directory: str, instance: str, holder: FileLiveness) -> Optional[int]:
    """Write and lock a new lock file of ``instance`` under a temporary name, then rename it
    into place (replacing any file there); record its descriptor in ``holder`` and return the
    descriptor it replaces (still open: the caller closes it once the new one is in place)."""
    lock_path = os.path.join(directory, instance + ".lock")
    temporary = os.path.join(directory, f".{instance}.{uuid.uuid4().hex[:8]}.tmp")
    with _FORK_GUARD:  # short: no fork sees the descriptor before the holder names it
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, instance.encode("ascii") + b"\n")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(temporary, lock_path)
        except BaseException:
            _close_fd(fd)
            _unlink(temporary)
            raise
        old, holder.fd, holder.lock_path = holder.fd, fd, lock_path
    return old


def _open_for_check(lock_path: str) -> int:
    """Open a lock file and try its lock without waiting: the descriptor now holding it, or
    ``-1`` when its process holds it. Read-only (another user's file needs no write access);
    read-write only where the file system wants it for an exclusive lock (NFS)."""
    fd = os.open(lock_path, os.O_RDONLY)
    for attempt in (0, 1):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:  # its process holds it (alive, perhaps frozen)
            _close_fd(fd)
            return -1
        except OSError as exc:
            _close_fd(fd)
            if exc.errno != errno.EBADF or attempt:
                raise
            fd = os.open(lock_path, os.O_RDWR)
    raise AssertionError("unreachable")  # pragma: no cover


def _lock_if_dead(lock_path: str, instance: str) -> Optional[int]:
    """The descriptor now locking ``instance``'s lock file if that proves it dead: the file
    is there, names the instance and its lock could be taken. :obj:`None` when it is alive or
    nothing is proven (no such file, or a file that is not the instance's)."""
    try:
        fd = _open_for_check(lock_path)
    except FileNotFoundError:
        return None
    if fd < 0:
        return None
    try:
        named = os.pread(fd, 200, 0).strip()
    except OSError:
        named = b""
    if named != instance.encode("ascii", "replace"):
        _close_fd(fd)
        return None
    return fd


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
        is created when missing, with the permissions of the database's directory; the file is
        readable by others and names the instance) and records the instance in
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
        _make_directory(directory)
        old = _new_lock_file(directory, instance, holder)
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
                _unlink(holder.lock_path)
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
                    _unlink(lock_path)
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
                fd = _lock_if_dead(lock_path, instance)
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
                    conn.execute(self._sql.delete_instance, params)
            for _instance, lock_path, _fd in locked:  # forgotten: its file goes too
                _unlink(lock_path)
        finally:
            for _instance, _path, fd in locked:
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
