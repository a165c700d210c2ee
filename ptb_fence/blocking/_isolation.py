"""ThreadIsolationGate: the handlers of one blocking front end run together, one starts on
probation, or one runs alone.

The rules live in :class:`~ptb_fence.runtime._isolation.IsolationState`. This gate waits for
them with a lock and a condition (its asyncio twin is
:class:`ptb_fence.ptb._isolation.AsyncIsolationGate`). A start that needs no isolation takes
the lock and a counter, no store call. The wait of a suspect is bounded
(:data:`~ptb_fence.runtime._recovery.ALONE_WAIT_SECONDS`), so a handler that never ends
(without ``attempt_timeout_seconds``) cannot stop the process. The suspect is then given back
(its attempt not spent) and runs at a later sweep.
"""

from __future__ import annotations

import threading
import time
from typing import Optional, Tuple

from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._isolation import IsolationState
from ptb_fence.runtime._recovery import ALONE_WAIT_SECONDS

__all__ = ["ThreadIsolationGate"]


class ThreadIsolationGate:
    """A writer-preferring readers-writer gate for handler threads (thread-safe), with one
    probation at a time."""

    __slots__ = ("_closed", "_cond", "_state")

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._state = IsolationState(time.monotonic)
        self._closed = False

    def enter_now(self, attempt: Attempt) -> bool:
        """Let ``attempt``'s handler start at once when it is not suspect and no handler runs
        alone, is on probation or waits as a suspect (the usual case). On :obj:`False` call
        :meth:`enter`. The caller calls :meth:`leave` once the handler ended."""
        if attempt.suspicion:
            return False
        with self._cond:
            if self._closed or self._state.held_for(0) is not None:
                return False  # enter refuses a closed gate, and the attempt is given back
            self._state.start(attempt)
            return True

    def enter(
        self, attempt: Attempt, timeout: Optional[float] = ALONE_WAIT_SECONDS
    ) -> Tuple[bool, Optional[Attempt]]:
        """Wait for the right to start ``attempt``'s handler: together, on probation
        (:attr:`Attempt.suspicion` 1) or alone (2).

        Returns:
            Whether it may start (:obj:`False` when the gate was closed meanwhile or, for a
            suspect, when ``timeout`` seconds passed first) and, on probation, the suspect
            whose probation this one ends (still running and marked: end its mark first).
        """
        suspicion = attempt.suspicion
        deadline = None if timeout is None or not suspicion else time.monotonic() + timeout
        state = self._state
        with self._cond:
            state.waiting(suspicion, 1)
            try:
                while not self._closed:
                    held = state.held_for(suspicion)
                    if held is None:
                        return True, state.start(attempt)
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return False, None
                        held = min(held, left)
                    self._cond.wait(held)
                return False, None
            finally:
                state.waiting(suspicion, -1)
                if suspicion:
                    self._cond.notify_all()  # starts held for this waiter may go on

    def leave(self, attempt: Attempt) -> None:
        """A handler that :meth:`enter` let start has ended (or is abandoned)."""
        with self._cond:
            self._state.leave(attempt)
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse every waiting and later :meth:`enter` (the front end stops)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
