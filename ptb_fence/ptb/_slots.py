"""Slots: the processor's concurrency slots, a lean FIFO semaphore for one event loop.

Every update waits for a slot when the processor is busy, so the slot's wait and hand-over
run once per update. A released slot goes straight to the oldest waiter (no waiter can be
overtaken). Unlike ``asyncio.Semaphore`` a release wakes its waiter without scanning the
waiters already woken.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Deque

__all__ = ["Slots"]


class Slots:
    """``count`` slots, taken in the order asked (used on one event loop only).

    Args:
        count: How many slots there are.
    """

    __slots__ = ("_free", "_waiters")

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiters: "Deque[asyncio.Future[None]]" = collections.deque()

    @property
    def free(self) -> int:
        """:obj:`int`: Slots neither held nor handed to a waiter."""
        return self._free

    async def acquire(self) -> None:
        """Take a slot, waiting behind the tasks that asked first.

        Raises:
            asyncio.CancelledError: The wait was cancelled. No slot is held then (one that
                came as it was cancelled is passed on).
        """
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        future: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot came as the wait was cancelled
            elif future in self._waiters:  # else a release already dropped it
                self._waiters.remove(future)
            raise

    def release(self) -> None:
        """Give a slot back: to the oldest waiter, else to the free ones."""
        waiters = self._waiters
        while waiters:
            future = waiters.popleft()
            if not future.done():  # a cancelled wait's future is done
                future.set_result(None)
                return
        self._free += 1
