"""IsolationGate: the handlers of one blocking front end run together, one starts on
probation, or one runs alone.

A process that dies while several handlers run cannot tell which one killed it, so the store
gives every attempt of it back and marks the rows *suspect*
(:class:`~ptb_fence.IsolatingUpdateStore`). The attempt of a suspect row starts on probation:
it waits until no other suspect is on probation, then no other handler starts for
:data:`~ptb_fence.runtime._recovery.PROBATION_SECONDS` (or until it ended). A handler that
kills its process as it starts is so charged alone, and the rest of a crash runs together
again after a short stagger. A row suspect again runs alone: it waits until the running
handlers have ended, and no other handler starts until it has ended (writer preference).
Everything else enters together, a lock and a counter, no store call.

The wait of a suspect is bounded (:data:`~ptb_fence.runtime._recovery.ALONE_WAIT_SECONDS`): a
handler that never ends (without ``attempt_timeout_seconds``) must not stop the process; the
suspect is then given back (its attempt not spent) and runs at a later sweep.
"""

from __future__ import annotations

import threading
import time
from typing import Optional, Tuple

from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._recovery import ALONE_WAIT_SECONDS, PROBATION_SECONDS

__all__ = ["IsolationGate"]


class IsolationGate:
    """A writer-preferring readers-writer gate for handler threads (thread-safe), with one
    probation at a time."""

    __slots__ = (
        "_alone",
        "_closed",
        "_cond",
        "_probation",
        "_probation_ends",
        "_running",
        "_waiting_alone",
        "_waiting_probation",
    )

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0  # handlers running together (those on probation among them)
        self._alone = False  # a handler runs alone
        self._waiting_alone = 0  # handlers waiting to run alone (new starts wait for them)
        self._waiting_probation = 0  # suspects waiting for their probation (fresh ones wait)
        self._probation: Optional[Attempt] = None  # the last suspect that started, until it left
        self._probation_ends = 0.0  # monotonic: when no start waits for it any more
        self._closed = False

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
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if suspicion == 0:
                while not self._closed:
                    held = self._held_for(waiting_suspects=True)
                    if held is None:
                        break
                    self._cond.wait(held)
                if self._closed:
                    return False, None
                self._running += 1
                return True, None
            if suspicion >= 2:
                self._waiting_alone += 1
                try:
                    while (self._alone or self._running) and not self._closed:
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            return False, None
                        self._cond.wait(left)
                    if self._closed:
                        return False, None
                    self._alone = True
                    return True, None
                finally:
                    self._waiting_alone -= 1
                    self._cond.notify_all()  # starts held for this waiter may go on
            self._waiting_probation += 1
            try:
                while not self._closed:
                    held = self._held_for(waiting_suspects=False)
                    if held is None:
                        break
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False, None
                    self._cond.wait(held if left is None else min(held, left))
                if self._closed:
                    return False, None
                previous, self._probation = self._probation, attempt
                self._probation_ends = time.monotonic() + PROBATION_SECONDS
                self._running += 1
                return True, previous
            finally:
                self._waiting_probation -= 1
                self._cond.notify_all()

    def _held_for(self, *, waiting_suspects: bool) -> Optional[float]:
        """How long a start waits at most before it looks again (:obj:`None`: it may start):
        while a handler runs or waits to run alone, while a probation lasts and, for a fresh
        start (``waiting_suspects``), while suspects wait for theirs."""
        if self._alone or self._waiting_alone or (waiting_suspects and self._waiting_probation):
            return 1.0  # woken by the change; the timeout only guards a lost wake-up
        if self._probation is not None:
            left = self._probation_ends - time.monotonic()
            if left > 0:
                return left
        return None

    def leave(self, attempt: Attempt) -> None:
        """A handler that :meth:`enter` let start has ended (or is abandoned)."""
        with self._cond:
            if attempt.suspicion >= 2:
                self._alone = False
            else:
                self._running -= 1
                if self._probation is attempt:
                    self._probation = None
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse every waiting and later :meth:`enter` (the front end stops)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
