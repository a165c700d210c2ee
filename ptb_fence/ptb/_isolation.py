"""AsyncIsolationGate: the handlers of one processor run together, or one runs alone.

The asyncio twin of :class:`ptb_fence.blocking._isolation.IsolationGate` (see there for why):
the attempt of a suspect row waits until the handlers running now have ended, and no handler
starts until it has ended (a waiting suspect holds new starts). Everything else enters at once
without awaiting while no suspect waits or runs. An update the stop no longer lets start does
not enter (a waiter sees it at the next change: a handler ending, or its own deadline). Used on
the event loop only.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional

from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._runtime import Runtime
from ptb_fence.runtime._recovery import ALONE_WAIT_SECONDS

__all__ = ["AsyncIsolationGate"]


class AsyncIsolationGate:
    """A writer-preferring readers-writer gate for handler tasks of one event loop."""

    __slots__ = ("_alone", "_changed", "_running", "_stopping", "_waiting_alone")

    def __init__(self, refused: Callable[[int], bool]) -> None:
        self._running = 0  # handlers running together
        self._alone = False  # a handler runs alone
        self._waiting_alone = 0  # handlers waiting to run alone (new starts wait for them)
        self._stopping = refused  # refused(update_id): the stop no longer lets it start
        self._changed: Optional[asyncio.Event] = None  # set (and replaced) on every change

    async def enter(
        self, alone: bool, update_id: int, timeout: Optional[float] = ALONE_WAIT_SECONDS
    ) -> bool:
        """Wait for the right to start ``update_id``'s handler (``alone``: with no other one
        running).

        Returns:
            :obj:`False` when the stop no longer lets the update start or, alone, when
            ``timeout`` seconds passed first; the handler must not start then.
        """
        if not alone:
            while (self._alone or self._waiting_alone) and not self._stopping(update_id):
                await self._wait(None)
            if self._stopping(update_id):
                return False
            self._running += 1
            return True
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        self._waiting_alone += 1
        try:
            while (self._alone or self._running) and not self._stopping(update_id):
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    return False
                await self._wait(left)
            if self._stopping(update_id):
                return False
            self._alone = True
            return True
        finally:
            self._waiting_alone -= 1
            self._notify()  # starts held for this waiter may go on

    def enter_now(self, attempt: Attempt) -> bool:
        """Let ``attempt``'s handler start at once, without awaiting, when it needs no
        isolation and no handler runs or waits to run alone (the usual case); :obj:`False`:
        call :meth:`admit`. The caller calls :meth:`leave` once the handler ended."""
        if attempt.runs_alone or self._alone or self._waiting_alone:
            return False
        if self._stopping(attempt.update_id):
            return False  # admit refuses and gives it back
        self._running += 1
        return True

    async def admit(self, attempt: Attempt, runtime: Runtime, threads: StoreThreads) -> bool:
        """Enter for ``attempt``'s handler (alone when :attr:`Attempt.runs_alone`, after
        marking it isolated in the store). The caller calls :meth:`leave` once the handler ended.

        Returns:
            :obj:`False` when the handler must not start: the stop no longer lets it, the handlers running
            here did not end in time, or the claim was lost. The attempt was then given back
            (its attempt not spent) and ended.
        """
        alone = attempt.runs_alone
        try:
            entered = await self.enter(alone, attempt.update_id)
            if entered and alone and not await threads.call(runtime.mark_isolated, attempt):
                self.leave(alone)
                entered = False
        except BaseException:  # cancelled: stop renewing it (the lease lapses)
            runtime.end(attempt)
            raise
        if not entered:
            await threads.call(runtime.recovery.release, [attempt])
        return entered

    async def _wait(self, timeout: Optional[float]) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def leave(self, alone: bool) -> None:
        """A handler that :meth:`enter` let start has ended (or was released)."""
        if alone:
            self._alone = False
        else:
            self._running -= 1
        self._notify()

