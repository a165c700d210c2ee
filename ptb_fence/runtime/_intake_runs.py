"""IntakeRuns: the attempts running on UpdateIntake's worker threads, each endable once.

A run ends exactly once, whichever comes first: its handler returned (the worker settles it),
``attempt_timeout_seconds`` passed (the attempt is settled failed with
:exc:`~ptb_fence.AttemptTimeout` and ended here, and the chat's turn passes on; the worker
thread cannot be stopped and runs on, abandoned) or :meth:`UpdateIntake.close` gave up
waiting (the attempt is released: claimable at once elsewhere). An abandoned handler's fenced
writes are refused, since its attempt no longer owns the update.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, Hashable, List, Optional

from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._core import Runtime
from ptb_fence.runtime._outcome import Outcome
from ptb_fence.runtime._recovery import AttemptTimeout
from ptb_fence.runtime._wakeups import Wakeups

__all__ = ["IntakeRun", "IntakeRuns"]

_LOGGER = logging.getLogger("ptb_fence.intake")

_RETURNED = "returned"
_TIMED_OUT = "timed out"
_RELEASED = "released"


class IntakeRun:
    """One attempt on a worker thread.

    Attributes:
        key: The chat key.
        update_id: The update.
        attempt: The attempt.
        outcome: How it was settled (:obj:`None` until then, or when released).
    """

    __slots__ = ("_how", "_lock", "attempt", "key", "outcome", "update_id")

    def __init__(self, key: Hashable, update_id: int, attempt: Attempt) -> None:
        self.key = key
        self.update_id = update_id
        self.attempt = attempt
        self._lock = threading.Lock()
        self._how: Optional[str] = None
        self.outcome: Optional[Outcome] = None

    def finish(self, how: str) -> bool:
        """End the run as ``how``; :obj:`False` if it already ended otherwise."""
        with self._lock:
            if self._how is not None:
                return False
            self._how = how
            return True

    @property
    def timed_out(self) -> bool:
        """:obj:`bool`: Ended by ``attempt_timeout_seconds`` (the chat's turn was passed on)."""
        return self._how == _TIMED_OUT


class IntakeRuns:
    """The running attempts of one :class:`~ptb_fence.UpdateIntake`.

    Args:
        runtime: The intake's runtime.
        wakeups: Where the attempt timeouts are scheduled.
        turn_done: ``turn_done(key, update_id, outcome)``: pass the chat's turn on.
        deliver: ``deliver(exhaustion)``: hand an exhaustion to its delivery.
    """

    __slots__ = ("_deliver", "_lock", "_runs", "_runtime", "_turn_done", "_wakeups")

    def __init__(
        self,
        runtime: Runtime,
        wakeups: Wakeups,
        turn_done: Callable[[Hashable, int, Optional[Outcome]], None],
        deliver: Callable[[Any], None],
    ) -> None:
        self._runtime = runtime
        self._wakeups = wakeups
        self._turn_done = turn_done
        self._deliver = deliver
        self._lock = threading.Lock()
        self._runs: Dict[int, IntakeRun] = {}

    def begin(self, key: Hashable, update_id: int, attempt: Attempt) -> IntakeRun:
        """Register a run (and its timeout, if ``attempt_timeout_seconds`` is set)."""
        run = IntakeRun(key, update_id, attempt)
        with self._lock:
            self._runs[update_id] = run
        timeout = self._runtime.options.attempt_timeout_seconds
        if timeout is not None:
            self._wakeups.call_later(timeout, lambda: self._time_out(run, timeout))
        return run

    def returned(self, run: IntakeRun) -> bool:
        """The handler returned: :obj:`True` if the worker settles it (it was not ended)."""
        self._forget(run)
        return run.finish(_RETURNED)

    def count(self) -> int:
        """How many runs are going now."""
        with self._lock:
            return len(self._runs)

    def _forget(self, run: IntakeRun) -> None:
        with self._lock:
            if self._runs.get(run.update_id) is run:
                del self._runs[run.update_id]

    def _time_out(self, run: IntakeRun, timeout: float) -> None:
        # runs on the wakeup thread: settle on a thread of its own (a store call may block)
        if not run.finish(_TIMED_OUT):
            return
        threading.Thread(
            target=self._settle_timed_out,
            args=(run, timeout),
            name="ptb_fence-attempt-timeout",
            daemon=True,
        ).start()

    def _settle_timed_out(self, run: IntakeRun, timeout: float) -> None:
        self._forget(run)
        runtime = self._runtime
        error = AttemptTimeout(run.update_id, run.attempt.attempt, timeout)
        try:
            run.outcome, exhaustion = runtime.settle(run.attempt, error)
        finally:
            runtime.end(run.attempt)
            self._turn_done(run.key, run.update_id, run.outcome)
        if exhaustion is not None:
            self._deliver(exhaustion)

    def release_all(self, seconds: float) -> int:
        """Release every run still going (:meth:`Runtime.give_back
        <ptb_fence.runtime._recovery.Recovery.give_back>`: their open fenced transactions are
        ended first), waiting at most ``seconds``; their worker threads are abandoned.
        Returns how many runs were ended here."""
        with self._lock:
            runs = list(self._runs.values())
            self._runs.clear()
        ended: List[IntakeRun] = [run for run in runs if run.finish(_RELEASED)]
        if ended:
            attempts = [run.attempt for run in ended]
            # on a daemon thread waited for a bounded time: a database that does not answer
            # must not hold close() (what is not given back is covered by its lease)
            giving = threading.Thread(
                target=self._runtime.give_back,
                args=(attempts, max(seconds - 0.5, 0.0)),
                name="ptb_fence-give-back",
                daemon=True,
            )
            giving.start()
            giving.join(seconds)
            if giving.is_alive():
                _LOGGER.warning(
                    "close(): releasing %d update(s): the store did not answer in time; going "
                    "on without it (what it did not give back is claimable elsewhere once its "
                    "lease ran out)",
                    len(attempts),
                )
        return len(ended)
