"""AsyncIsolationGate: the handlers of one processor run together, one starts on probation,
or one runs alone.

The asyncio twin of :class:`ptb_fence.blocking._isolation.IsolationGate` (see there for why):
the attempt of a suspect row starts on probation (no other handler starts for
:data:`~ptb_fence.runtime._recovery.PROBATION_SECONDS`, or until it ended); the attempt of a
row suspect again waits until the handlers running now have ended, and no handler starts
until it has ended. Everything else enters at once without awaiting while no suspect waits,
runs alone or is on probation. An update the stop no longer lets start does not enter (a
waiter sees it at the next change: a handler ending, or its own deadline). Used on the event
loop only.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional, Tuple

from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._recovery import ALONE_WAIT_SECONDS, PROBATION_SECONDS
from ptb_fence.runtime._runtime import Runtime

__all__ = ["AsyncIsolationGate"]


class AsyncIsolationGate:
    """A writer-preferring readers-writer gate for handler tasks of one event loop, with one
    probation at a time."""

    __slots__ = (
        "_alone",
        "_changed",
        "_probation",
        "_probation_ends",
        "_running",
        "_stopping",
        "_waiting_alone",
        "_waiting_probation",
    )

    def __init__(self, refused: Callable[[int], bool]) -> None:
        self._running = 0  # handlers running together (those on probation among them)
        self._alone = False  # a handler runs alone
        self._waiting_alone = 0  # handlers waiting to run alone (new starts wait for them)
        self._waiting_probation = 0  # suspects waiting for their probation (fresh ones wait)
        self._probation: Optional[Attempt] = None  # the last suspect that started, until it left
        self._probation_ends = 0.0  # loop time: when no start waits for it any more
        self._stopping = refused  # refused(update_id): the stop no longer lets it start
        self._changed: Optional[asyncio.Event] = None  # set (and replaced) on every change

    async def enter(
        self, attempt: Attempt, timeout: Optional[float] = ALONE_WAIT_SECONDS
    ) -> Tuple[bool, Optional[Attempt]]:
        """Wait for the right to start ``attempt``'s handler: together, on probation
        (:attr:`Attempt.suspicion` 1) or alone (2).

        Returns:
            Whether it may start (:obj:`False` when the stop no longer lets the update start
            or, for a suspect, when ``timeout`` seconds passed first) and, on probation, the
            suspect whose probation this one ends (still running and marked: end its mark
            first).
        """
        update_id = attempt.update_id
        suspicion = attempt.suspicion
        loop = asyncio.get_running_loop()
        if suspicion == 0:
            while not self._stopping(update_id):
                held = self._held_for(loop, waiting_suspects=True)
                if held is None:
                    break
                await self._wait(held)
            if self._stopping(update_id):
                return False, None
            self._running += 1
            return True, None
        deadline = None if timeout is None else loop.time() + timeout
        if suspicion >= 2:
            self._waiting_alone += 1
            try:
                while (self._alone or self._running) and not self._stopping(update_id):
                    left = None if deadline is None else deadline - loop.time()
                    if left is not None and left <= 0:
                        return False, None
                    await self._wait(left)
                if self._stopping(update_id):
                    return False, None
                self._alone = True
                return True, None
            finally:
                self._waiting_alone -= 1
                self._notify()  # starts held for this waiter may go on
        self._waiting_probation += 1
        try:
            while not self._stopping(update_id):
                held = self._held_for(loop, waiting_suspects=False)
                if held is None:
                    break
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    return False, None
                await self._wait(held if left is None else min(held, left))
            if self._stopping(update_id):
                return False, None
            previous, self._probation = self._probation, attempt
            self._probation_ends = loop.time() + PROBATION_SECONDS
            self._running += 1
            return True, previous
        finally:
            self._waiting_probation -= 1
            self._notify()

    def _held_for(
        self, loop: asyncio.AbstractEventLoop, *, waiting_suspects: bool
    ) -> Optional[float]:
        """How long a start waits at most before it looks again (:obj:`None`: it may start):
        while a handler runs or waits to run alone, while a probation lasts and, for a fresh
        start (``waiting_suspects``), while suspects wait for theirs."""
        if self._alone or self._waiting_alone or (waiting_suspects and self._waiting_probation):
            return 1.0  # woken by the change; the timeout only guards a lost wake-up
        if self._probation is not None:
            left = self._probation_ends - loop.time()
            if left > 0:
                return left
        return None

    def enter_now(self, attempt: Attempt) -> bool:
        """Let ``attempt``'s handler start at once, without awaiting, when it is not suspect
        and no handler runs alone, is on probation or waits as a suspect (the usual case);
        :obj:`False`: call :meth:`admit`. The caller calls :meth:`leave` once the handler
        ended."""
        if attempt.suspicion or self._alone or self._waiting_alone or self._waiting_probation:
            return False
        if self._probation is not None:
            return False  # admit looks at the clock
        if self._stopping(attempt.update_id):
            return False  # admit refuses and gives it back
        self._running += 1
        return True

    async def admit(self, attempt: Attempt, runtime: Runtime, threads: StoreThreads) -> bool:
        """Enter for ``attempt``'s handler (on probation or alone when it is suspect, after
        marking it in the store). The caller calls :meth:`leave` once the handler ended.

        Returns:
            :obj:`False` when the handler must not start: the stop no longer lets it, the handlers running
            here did not end in time, or the claim was lost. The attempt was then given back
            (its attempt not spent) and ended.
        """
        entered = False
        try:
            entered, previous = await self.enter(attempt)
            if entered and previous is not None:  # its probation is over
                await threads.call(runtime.end_probation, previous)
            if entered and attempt.suspicion and not await threads.call(
                runtime.mark_isolated, attempt
            ):
                self.leave(attempt)
                entered = False
        except BaseException:  # cancelled: stop renewing it (the lease lapses)
            if entered:
                self.leave(attempt)
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

    def leave(self, attempt: Attempt) -> None:
        """A handler that :meth:`enter` let start has ended (or was released)."""
        if attempt.suspicion >= 2:
            self._alone = False
        else:
            self._running -= 1
            if self._probation is attempt:
                self._probation = None
        self._notify()
