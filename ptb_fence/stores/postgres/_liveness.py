"""The liveness holder of a PostgresUpdateStore and the fork hook of its connection.

The holder keeps the store's instance, lock key and dedicated connection.
The fork hook (:func:`_after_fork_in_child`) keeps a forked child off its parent's session.
How liveness is proven is in the docstring of ``_sql``.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, List, Optional

from ptb_fence.stores.postgres._connections import detach_in_child

__all__ = ["PgLiveness"]

# Liveness connections inherited through os.fork() belong to the parent: closing one in the
# child would end the parent's session (and its lock). They are parked here, never closed.
_INHERITED: List[Any] = []
_HOLDERS: "weakref.WeakSet[PgLiveness]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """Keep a forked child off its parent's liveness session.

    A child made by ``os.fork()`` (``multiprocessing``, ``ProcessPoolExecutor``) inherits the
    socket of the liveness connection. While any process has it open, the server keeps the
    session, and with it the lock of a parent that may have died. So right after a fork the
    child points its copy of that descriptor at ``/dev/null`` (``os.register_at_fork``).
    The parent's session is untouched. Whatever libpq would later send on it in the child,
    such as its goodbye when the object is freed, goes nowhere.
    """
    for holder in list(_HOLDERS):
        holder.lock = threading.Lock()  # a parent thread may have held it: not in the child
        conn = holder.conn
        if conn is not None and holder.pid != os.getpid():
            holder.conn = None
            _INHERITED.append(conn)
            detach_in_child(conn)


os.register_at_fork(after_in_child=_after_fork_in_child)


class PgLiveness:
    """The instance one store object holds for liveness: its id, lock key and dedicated
    connection."""

    __slots__ = (
        "__weakref__",
        "beats",
        "conn",
        "instance",
        "key",
        "lock",
        "pid",
    )

    def __init__(self) -> None:
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
