"""The lock-file liveness of a SQLiteUpdateStore.

This module holds the holder of an instance (:class:`FileLiveness`), the fork hooks that keep
a forked child from holding its parent's lock, and the lock-file steps.
:class:`FileLiveness` says how liveness is held. :func:`lock_if_dead` says what proves death.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import uuid
import weakref
from typing import Optional, Set

__all__ = [
    "FileLiveness",
    "close_fd",
    "lock_directory",
    "lock_if_dead",
    "make_directory",
    "new_lock_file",
    "unlink",
]

# Held while a lock file descriptor is opened and recorded in its holder, or closed and
# forgotten, and across os.fork(): a child never inherits a descriptor its holder does not name.
_FORK_GUARD = threading.Lock()
_HOLDERS: "weakref.WeakSet[FileLiveness]" = weakref.WeakSet()


class FileLiveness:
    """The instance a store object holds.

    It keeps the instance's id, its locked file descriptor and the process that holds it.
    A child made by ``os.fork()`` does not hold its parent's instance. It also keeps the lock
    files this object could not check, which are warned about once.

    Liveness holds on one machine. An instance holds an exclusive OS file lock (``flock``) on
    its own lock file ``<database>.instances/<instance>.lock``, which names the instance.
    It also has a row in the table ``ptb_fence_instances`` of the same database.
    The kernel drops the lock when the process ends, however it ends. So a lock that can be
    taken proves the instance dead. A frozen process (SIGSTOP) keeps it.
    The lock is taken before the row is written. The row is deleted before the lock is
    dropped. So a listed instance whose lock is free is dead.
    """

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
            close_fd(fd)
            if self.fd == fd:
                self.fd = None


def _after_fork_in_child() -> None:
    """Close the lock descriptors inherited from the parent, which keeps its locks.

    So a long-lived child does not keep a dead parent alive. A child made by ``os.fork()``
    (``multiprocessing``, ``ProcessPoolExecutor``) must not keep its parent's lock after the
    parent died. So the child closes its copy of the descriptor right after the fork
    (``os.register_at_fork``). The parent's lock stays, since a ``flock`` ends with the last
    descriptor of the open file."""
    for holder in list(_HOLDERS):
        holder.lock = threading.Lock()  # a parent thread may have held it: not in the child
        if holder.fd is not None:
            close_fd(holder.fd)
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


def close_fd(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:  # pragma: no cover - already closed
            pass


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def make_directory(directory: str) -> None:
    """Create the lock directory, when missing, with the group and permissions of the database's.

    So every OS user that may write the database may also hold liveness. Without a setgid
    bit the new directory would get its creator's group."""
    try:
        os.mkdir(directory)
    except FileExistsError:
        return
    try:
        parent = os.stat(os.path.dirname(directory))
    except OSError:  # pragma: no cover - it was just created in there
        return
    try:
        os.chown(directory, -1, parent.st_gid)
    except OSError:  # not a member of that group: the directory keeps the creator's
        pass
    try:
        os.chmod(directory, stat.S_IMODE(parent.st_mode))
    except OSError:  # pragma: no cover - not the owner: the directory stays as created
        pass


def new_lock_file(directory: str, instance: str, holder: FileLiveness) -> Optional[int]:
    """Write and lock a new lock file of ``instance`` under a temporary name, then rename it.

    The rename replaces any file at that place. The new descriptor is recorded in ``holder``.
    It returns the descriptor it replaces. That one is still open, and the caller closes it
    once the new one is in place."""
    lock_path = os.path.join(directory, instance + ".lock")
    temporary = os.path.join(directory, f".{instance}.{uuid.uuid4().hex[:8]}.tmp")
    with _FORK_GUARD:  # short: no fork sees the descriptor before the holder names it
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, instance.encode("ascii") + b"\n")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(temporary, lock_path)
        except BaseException:
            close_fd(fd)
            unlink(temporary)
            raise
        old, holder.fd, holder.lock_path = holder.fd, fd, lock_path
    return old


def _open_for_check(lock_path: str) -> int:
    """Open a lock file and try its lock without waiting.

    It returns the descriptor now holding the lock, or ``-1`` when its process holds it.
    It opens the file read-only, since another user's file needs no write access.
    It opens read-write only where the file system wants it for an exclusive lock (NFS)."""
    fd = os.open(lock_path, os.O_RDONLY)
    for attempt in (0, 1):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:  # its process holds it (alive, perhaps frozen)
            close_fd(fd)
            return -1
        except OSError as exc:
            close_fd(fd)
            if exc.errno != errno.EBADF or attempt:
                raise
            fd = os.open(lock_path, os.O_RDWR)
    raise AssertionError("unreachable")  # pragma: no cover


def lock_if_dead(lock_path: str, instance: str) -> Optional[int]:
    """The descriptor now locking ``instance``'s lock file, if that proves it dead.

    It proves death when the file is there, names the instance, its lock could be taken, and
    it is still the file at that path once locked. It returns :obj:`None` when the instance
    is alive or nothing is proven. Nothing is proven by a missing file, a file that is not the
    instance's, or one replaced meanwhile.

    Only that is proof. The lock file is looked for next to the checking process's own path
    to the database (symlinks resolved). It is never looked for at a path its owner stored,
    since processes may reach the file through different paths. A container mounting the
    volume elsewhere does so. A missing lock file proves nothing. Nor does one that names
    another instance (replaced by someone), or one this process cannot open (another OS
    user's, unreadable). Those claims wait for their lease.

    A live owner whose file was removed or replaced locks a new one at its next check.
    It puts the new file in place whole, written and locked under a temporary name, then
    renamed. So a checker never finds it unlocked. A checker that opened the old file just
    before counts its lock only if the file is still the one at that path once locked.
    The owner closes the old file only after the new one is in place.
    The check opens others' lock files read-only, since ``flock`` needs no write access.
    Lock files are created readable by others."""
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
    if named != instance.encode("ascii", "replace") or not _still_at(fd, lock_path):
        close_fd(fd)
        return None
    return fd


def _still_at(fd: int, lock_path: str) -> bool:
    """Whether ``fd`` is still the file at ``lock_path``.

    Between the open and the lock the file may have been removed. Its live owner may have
    locked a new one there and closed the old one. The old file is then free, yet that proves
    nothing."""
    try:
        here = os.stat(lock_path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)
