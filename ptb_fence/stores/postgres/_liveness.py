"""The liveness holder of a PostgresUpdateStore (its instance, lock key and dedicated
connection, and the claim statements that record the instance) and the fork hook that keeps a
forked child off its parent's session. How liveness is proven is in the docstring of ``_sql``.

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
import weakref
from typing import Any, List, Optional

from ptb_fence.stores.postgres._connections import detach_in_child
from ptb_fence.stores.postgres._sql import RecoveryStatements, with_instance, with_suspect

__all__ = ["PgLiveness"]

# Liveness connections inherited through os.fork() belong to the parent: closing one in the
# child would end the parent's session (and its lock). They are parked here, never closed.
_INHERITED: List[Any] = []
_HOLDERS: "weakref.WeakSet[PgLiveness]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for holder in list(_HOLDERS):
        holder.lock = threading.Lock()  # a parent thread may have held it: not in the child
        conn = holder.conn
        if conn is not None and holder.pid != os.getpid():
            holder.conn = None
            _INHERITED.append(conn)
            detach_in_child(conn)


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
