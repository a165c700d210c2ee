"""Group commit: work items that arrive together go to the store in one call (one commit).

Its blocking twin is :class:`ptb_fence.blocking._group_commit.ThreadGroupCommit`. One test spec
(``tests/unit/test_group_commit_twins.py``) holds both to the same behaviour.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Generic, List, Optional, Sequence, Tuple, TypeVar

__all__ = ["AsyncGroupCommit"]

MAX_GROUP = 256
"""The most items in one call."""

MAX_GATHER = 8
"""With ``gather=True``: the most loop iterations a group waits for items still arriving."""

_QUIET = 2
"""With ``gather=True``: a group is sent after this many loop iterations in a row added none."""

In = TypeVar("In")
Out = TypeVar("Out")


class AsyncGroupCommit(Generic[In, Out]):
    """Sends items to ``run_many(items) -> results`` in groups, one group in flight at a time.

    The first item is sent at once. Items that arrive while a group is in flight are sent
    together in the next call. Every caller waits for its own result (or exception). So nothing
    is reported done before its store call has returned, with one commit per group.

    Args:
        run_many: An async callable taking a list of items and returning one result per item
            (e.g. a thread-pool hop to the store's ``commit``). A
            result that is an exception is raised to that item's caller.
        name: Task name prefix.
        gather: A group is sent once a loop iteration added no item to it (at most
            :data:`MAX_GATHER` iterations), not after one iteration. So tasks that advance
            together over a few iterations go in one call, not split over two that then stay
            out of step.
    """

    __slots__ = ("_flushing", "_gather", "_name", "_pending", "_run_many")

    def __init__(
        self,
        run_many: Callable[[List[In]], Awaitable[Sequence[Out]]],
        name: str,
        *,
        gather: bool = False,
    ) -> None:
        self._run_many = run_many
        self._name = name
        self._gather = gather
        self._pending: List[Tuple[In, "asyncio.Future[Out]", Optional[Callable[[Out], None]]]] = []
        self._flushing = False

    async def submit(self, item: In, *, orphan: Optional[Callable[[Out], None]] = None) -> Out:
        """Send ``item`` with the next group and return its result (or raise its error).

        If the caller is cancelled while the group is in the store, the item's result (a write
        that still landed) goes to ``orphan(result)`` instead of being lost.
        """
        return await self.enqueue(item, orphan=orphan)

    def enqueue(
        self, item: In, *, orphan: Optional[Callable[[Out], None]] = None
    ) -> "asyncio.Future[Out]":
        """As :meth:`submit`, from a running event loop without awaiting: the future of
        ``item``'s result (no task of its own for a caller that awaits it later, or never:
        then read its result or exception, or asyncio warns)."""
        loop = asyncio.get_running_loop()
        future: "asyncio.Future[Out]" = loop.create_future()
        self._pending.append((item, future, orphan))
        if not self._flushing:
            self._flushing = True
            loop.create_task(self._flush(), name=self._name)
        return future

    async def _flush(self) -> None:
        batch: List[Tuple[In, "asyncio.Future[Out]", Optional[Callable[[Out], None]]]] = []
        try:
            while self._pending:
                await asyncio.sleep(0)  # items of this loop iteration join the group
                if self._gather:
                    quiet = 0
                    for _ in range(MAX_GATHER):
                        arrived = len(self._pending)
                        await asyncio.sleep(0)
                        quiet = quiet + 1 if len(self._pending) == arrived else 0
                        if quiet == _QUIET:
                            break
                batch, self._pending = self._pending[:MAX_GROUP], self._pending[MAX_GROUP:]
                try:
                    results = list(await self._run_many([item for item, _, _ in batch]))
                except Exception as exc:
                    for _, future, _ in batch:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for (_, future, orphan), result in zip(batch, results):
                        if future.done():
                            if orphan is not None and not isinstance(result, BaseException):
                                orphan(result)
                            continue
                        if isinstance(result, BaseException):
                            future.set_exception(result)
                        else:
                            future.set_result(result)
                batch = []
        finally:
            self._flushing = False
            # cancelled (shutdown): nobody is left waiting forever
            for _, future, _ in batch + self._pending:
                if not future.done():
                    future.set_exception(asyncio.CancelledError())
            self._pending = []
