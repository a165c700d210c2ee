"""IsolationState: who may start a handler now, for the isolation gates of both front ends.

A process that died while several handlers ran cannot tell which one killed it, so the store
gives its claims back as *suspect* (:class:`~ptb_fence.BatchStore`). A suspect's
handler starts on probation: no other handler starts for :data:`PROBATION_SECONDS`, or until
it ended. A row *suspect again* runs alone: it waits until the running handlers ended, and no
other one starts until it ended (writer preference: waiting suspects hold fresh starts, so
they cannot starve). This class keeps the counters and these rules. It never waits: the gates
(:class:`ptb_fence.blocking._isolation.ThreadIsolationGate` with a lock and a condition,
:class:`ptb_fence.ptb._isolation.AsyncIsolationGate` on the event loop) wait and wake.
"""

from __future__ import annotations

from typing import Callable, Optional

from ptb_fence.runtime._attempt import Attempt

__all__ = ["PROBATION_SECONDS", "IsolationState"]

PROBATION_SECONDS = 0.25
"""How long no other handler starts after the handler of a suspect started (unless it ended
first). A handler that kills its process within this time is charged alone. The suspects of
an ordinary crash start this far apart: 16 of them in 4 s, all running together then."""

_LOOK_AGAIN = 1.0
"""How long a start held by a change (not by the clock) waits before it looks again: it is
woken by the change, so this only guards against a lost wake-up."""


class IsolationState:
    """The state of one isolation gate (guarded by its owner: a lock, or the event loop).

    Args:
        clock: Seconds of a monotonic clock (``time.monotonic``, or the loop's ``time``).
    """

    __slots__ = (
        "_alone",
        "_clock",
        "_probation",
        "_probation_ends",
        "_running",
        "_waiting_alone",
        "_waiting_probation",
    )

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._running = 0  # handlers running together (those on probation among them)
        self._alone = False  # a handler runs alone
        self._waiting_alone = 0  # suspects again waiting to run alone
        self._waiting_probation = 0  # suspects waiting for their probation
        self._probation: Optional[Attempt] = None  # the last suspect that started, until it left
        self._probation_ends = 0.0  # clock: when no start waits for it any more

    def held_for(self, suspicion: int) -> Optional[float]:
        """How long a start of this ``suspicion`` waits at most before it looks again, or
        :obj:`None` when it may start now."""
        if suspicion >= 2:
            return _LOOK_AGAIN if self._alone or self._running else None
        if self._alone or self._waiting_alone or (suspicion == 0 and self._waiting_probation):
            return _LOOK_AGAIN
        if self._probation is not None:
            left = self._probation_ends - self._clock()
            if left > 0:
                return left
        return None

    def waiting(self, suspicion: int, change: int) -> None:
        """A suspect (``suspicion`` 1 or 2) begins (``change`` 1) or ends (-1) waiting."""
        if suspicion >= 2:
            self._waiting_alone += change
        elif suspicion == 1:
            self._waiting_probation += change

    def start(self, attempt: Attempt) -> Optional[Attempt]:
        """Let ``attempt``'s handler start (:meth:`held_for` said it may).

        Returns:
            On probation: the suspect whose probation this start ends, if it still runs (its
            mark must end before this one's is made).
        """
        if attempt.suspicion >= 2:
            self._alone = True
            return None
        self._running += 1
        if attempt.suspicion == 0:
            return None
        previous, self._probation = self._probation, attempt
        self._probation_ends = self._clock() + PROBATION_SECONDS
        return previous

    def leave(self, attempt: Attempt) -> None:
        """A handler that :meth:`start` let start has ended (or was given back)."""
        if attempt.suspicion >= 2:
            self._alone = False
            return
        self._running -= 1
        if self._probation is attempt:
            self._probation = None
