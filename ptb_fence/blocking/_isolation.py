"""IsolationGate: the handlers of one blocking front end run together, or one runs alone.

A process that dies while several handlers run cannot tell which one killed it, so the store
gives every attempt of it back and marks the rows *suspect*
(:class:`~ptb_fence.IsolatingUpdateStore`). The attempt of a suspect row runs alone: it waits
until the handlers running now have ended, and no other handler starts until it has ended
(writer preference: a waiting suspect holds new starts, so it cannot starve). Its crash is then
its own and counts against it alone. Everything else enters together, a lock and a counter, no
store call.

The wait of a suspect is bounded (:data:`~ptb_fence.runtime._recovery.ALONE_WAIT_SECONDS`): a handler that never ends
(without ``attempt_timeout_seconds``) must not stop the process; the suspect is then given back
(its attempt not spent) and runs at a later sweep.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

from ptb_fence.runtime._recovery import ALONE_WAIT_SECONDS

__all__ = ["IsolationGate"]



class IsolationGate:
    """A writer-preferring readers-writer gate for handler threads (thread-safe)."""

    __slots__ = ("_alone", "_closed", "_cond", "_running", "_waiting_alone")

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0  # handlers running together
        self._alone = False  # a handler runs alone
        self._waiting_alone = 0  # handlers waiting to run alone (new starts wait for them)
        self._closed = False

    def enter(self, alone: bool, timeout: Optional[float] = ALONE_WAIT_SECONDS) -> bool:
        """Wait for the right to start a handler (``alone``: with no other one running).

        Returns:
            :obj:`False` when the gate was closed meanwhile (the front end stops) or, alone,
            when ``timeout`` seconds passed first; the handler must not start then.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if not alone:
                while (self._alone or self._waiting_alone) and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return False
                self._running += 1
                return True
            self._waiting_alone += 1
            try:
                while (self._alone or self._running) and not self._closed:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(left)
                if self._closed:
                    return False
                self._alone = True
                return True
            finally:
                self._waiting_alone -= 1
                self._cond.notify_all()  # starts held for this waiter may go on

    def leave(self, alone: bool) -> None:
        """A handler that :meth:`enter` let start has ended (or is abandoned)."""
        with self._cond:
            if alone:
                self._alone = False
            else:
                self._running -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse every waiting and later :meth:`enter` (the front end stops)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
