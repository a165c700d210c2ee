"""AsyncIsolationGate: the handlers of one processor run together, one starts on probation,
or one runs alone.

The asyncio twin of :class:`ptb_fence.blocking._isolation.ThreadIsolationGate`. The rules live in
:class:`~ptb_fence.runtime._isolation.IsolationState`, and this gate waits for them on the
event loop. Everything enters at once without awaiting while no suspect waits, runs alone or
is on probation. An update the stop no longer lets start does not enter (a waiter sees it at
the next change: a handler ending, or its own deadline). Used on the event loop only.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional, Tuple

from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._isolation import IsolationState
from ptb_fence.runtime._recovery import ALONE_WAIT_SECONDS

__all__ = ["AsyncIsolationGate"]


class AsyncIsolationGate:
    """A writer-preferring readers-writer gate for handler tasks of one event loop, with one
    probation at a time."""

    __slots__ = ("_changed", "_state", "_stopping")

    def __init__(self, refused: Callable[[int], bool]) -> None:
        # the loop's clock: the state is read on the loop only
        self._state = IsolationState(lambda: asyncio.get_running_loop().time())
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
        suspicion = attempt.suspicion
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None or not suspicion else loop.time() + timeout
        state = self._state
        state.waiting(suspicion, 1)
        try:
            while not self._stopping(attempt.update_id):
                held = state.held_for(suspicion)
                if held is None:
                    return True, state.start(attempt)
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        return False, None
                    held = min(held, left)
                await self._wait(held)
            return False, None
        finally:
            state.waiting(suspicion, -1)
            if suspicion:
                self._notify()  # starts held for this waiter may go on

    def enter_now(self, attempt: Attempt) -> bool:
        """Let ``attempt``'s handler start at once, without awaiting, when it is not suspect
        and no handler runs alone, is on probation or waits as a suspect (the usual case).
        On :obj:`False` call :meth:`enter`. The caller calls :meth:`leave` once the handler
        ended."""
        if attempt.suspicion or self._state.held_for(0) is not None:
            return False
        if self._stopping(attempt.update_id):
            return False  # enter refuses, and the attempt is given back
        self._state.start(attempt)
        return True

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
        self._state.leave(attempt)
        self._notify()
