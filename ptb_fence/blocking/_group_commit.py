"""ThreadGroupCommit: items that threads submit together go to the store in one call (one commit).

The blocking twin of :class:`ptb_fence.ptb._group_commit.AsyncGroupCommit`, for worker threads
(:class:`~ptb_fence.UpdateIntake`): one guarantee, the same as one call per item — nothing is
reported done before the store call that does it has returned — with one call per group.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Generic, List, Optional, Sequence, TypeVar

__all__ = ["ThreadGroupCommit"]

MAX_GROUP = 256
"""The most items in one call (as :data:`ptb_fence.ptb._group_commit.MAX_GROUP`)."""

In = TypeVar("In")
Out = TypeVar("Out")


class _Waiter(Generic[In, Out]):
    """One submitted item and what its thread waits for: its result, or the lead."""

    __slots__ = ("done", "error", "item", "result", "wake")

    def __init__(self, item: In) -> None:
        self.item = item
        self.done = False
        self.result: Optional[Out] = None
        self.error: Optional[BaseException] = None
        self.wake = threading.Event()


class ThreadGroupCommit(Generic[In, Out]):
    """Sends items to ``run_many(items) -> results`` in groups, one group in flight at a time.

    A thread that submits while no group is in flight sends its item at once. Items submitted
    while a group is in flight wait and go together in the next call, which the first of them
    makes (the lead passes from thread to thread, so no thread works for others forever).
    Every thread returns its own result or raises the exception of its group's call. A result
    that is an exception is raised to that item's thread alone.

    Args:
        run_many: Takes a list of items and returns one result per item, in order (e.g.
            :meth:`Runtime.claim_many <ptb_fence.runtime._runtime.Runtime.claim_many>`).
        max_group: The most items in one call.
    """

    __slots__ = ("_busy", "_lock", "_max_group", "_pending", "_run_many")

    def __init__(
        self, run_many: Callable[[List[In]], Sequence[Out]], max_group: int = MAX_GROUP
    ) -> None:
        if max_group < 1:
            raise ValueError(f"max_group must be at least 1, got {max_group!r}")
        self._run_many = run_many
        self._max_group = max_group
        self._lock = threading.Lock()
        self._pending: List[_Waiter[In, Out]] = []
        self._busy = False  # a group is in flight, or a thread was handed the lead

    def submit(self, item: In) -> Out:
        """Send ``item`` with the next group and return its result (or raise its group's error)."""
        waiter: _Waiter[In, Out] = _Waiter(item)
        with self._lock:
            self._pending.append(waiter)
            lead = not self._busy
            self._busy = True
        if not lead:
            waiter.wake.wait()
        if not waiter.done:  # this thread leads: its own item is in the group it sends
            self._send_group()
        if waiter.error is not None:
            raise waiter.error
        if isinstance(waiter.result, BaseException):
            raise waiter.result
        return waiter.result  # type: ignore[return-value]

    def _send_group(self) -> None:
        # let the threads that are ready to run now submit first: they join this group (the
        # blocking twin of AsyncGroupCommit's one loop iteration)
        time.sleep(0)
        with self._lock:
            group = self._pending[: self._max_group]
            del self._pending[: self._max_group]
        try:
            results = list(self._run_many([waiter.item for waiter in group]))
            if len(results) != len(group):
                raise RuntimeError(
                    f"run_many returned {len(results)} results for {len(group)} items"
                )
        except BaseException as exc:  # noqa: B036 - every waiter of the group gets it
            for waiter in group:
                waiter.error = exc
        else:
            for waiter, result in zip(group, results):
                waiter.result = result
        finally:
            for waiter in group:
                waiter.done = True
                waiter.wake.set()
            with self._lock:
                if self._pending:
                    self._pending[0].wake.set()  # the lead passes on (still busy)
                else:
                    self._busy = False
