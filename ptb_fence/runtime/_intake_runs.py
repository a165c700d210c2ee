"""IntakeRuns: the attempts running on UpdateIntake's worker threads, each endable once.

A run ends exactly once, whichever comes first: its handler returned (the worker settles it),
``attempt_timeout_seconds`` passed (the attempt is settled failed with
:exc:`~ptb_fence.AttemptTimeout` and ended here, and the chat's turn passes on; the worker
thread cannot be stopped and runs on, abandoned) or :meth:`UpdateIntake.close` gave up
waiting (the attempt is released: claimable at once elsewhere). An abandoned handler's fenced
writes are refused, since its attempt no longer owns the update.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Hashable, List, Optional

from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._core import Runtime
from ptb_fence.runtime._isolation import IsolationGate
from ptb_fence.runtime._outcome import Outcome
from ptb_fence.runtime._recovery import AttemptTimeout
from ptb_fence.runtime._wakeups import Wakeups

__all__ = ["IntakeRun", "IntakeRuns"]

_RETURNED = "returned"
_TIMED_OUT = "timed out"
_RELEASED = "released"


class IntakeRun:
    """One attempt on a worker thread.

    Attributes:
        key: The chat key.
        update_id: The update.
        attempt: The attempt.
        alone: It runs alone (it entered the isolation gate so).
        outcome: How it was settled (:obj:`None` until then, or when released).
    """

    __slots__ = ("_how", "_lock", "alone", "attempt", "key", "outcome", "update_id")

    def __init__(self, key: Hashable, update_id: int, attempt: Attempt, alone: bool) -> None:
        self.key = key
        self.update_id = update_id
        self.attempt = attempt
        self.alone = alone
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
        gate: The isolation gate every run entered; a run leaves it when it ends.
    """

    __slots__ = ("_deliver", "_gate", "_lock", "_runs", "_runtime", "_turn_done", "_wakeups")

    def __init__(
        self,
        runtime: Runtime,
        wakeups: Wakeups,
        turn_done: Callable[[Hashable, int, Optional[Outcome]], None],
        deliver: Callable[[Any], None],
        gate: IsolationGate,
    ) -> None:
        self._gate = gate
        self._runtime = runtime
        self._wakeups = wakeups
        self._turn_done = turn_done
        self._deliver = deliver
        self._lock = threading.Lock()
        self._runs: Dict[int, IntakeRun] = {}

    def begin(self, key: Hashable, update_id: int, attempt: Attempt, alone: bool) -> IntakeRun:
        """Register a run that entered the isolation gate (``alone`` or not), and its
        timeout if ``attempt_timeout_seconds`` is set."""
        run = IntakeRun(key, update_id, attempt, alone)
        with self._lock:
            self._runs[update_id] = run
        timeout = self._runtime.options.attempt_timeout_seconds
        if timeout is not None:
            self._wakeups.call_later(timeout, lambda: self._time_out(run, timeout))
        return run

    def returned(self, run: IntakeRun) -> bool:
        """The handler returned: :obj:`True` if the worker settles it (it was not ended)."""
        self._forget(run)
        return self._end(run, _RETURNED)

    def _end(self, run: IntakeRun, how: str) -> bool:
        """End ``run`` as ``how`` (once) and leave the isolation gate: a handler abandoned
        here (timed out, released) no longer holds an attempt that must run alone."""
        if not run.finish(how):
            return False
        self._gate.leave(run.alone)
        return True

    def _forget(self, run: IntakeRun) -> None:
        with self._lock:
            if self._runs.get(run.update_id) is run:
                del self._runs[run.update_id]

    def _time_out(self, run: IntakeRun, timeout: float) -> None:
        # runs on the wakeup thread: settle on a thread of its own (a store call may block)
        if not self._end(run, _TIMED_OUT):
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

    def release_all(self) -> int:
        """Release every run still going (one ``release_many``); their worker threads are
        abandoned. Returns how many runs were ended here."""
        with self._lock:
            runs = list(self._runs.values())
            self._runs.clear()
        ended: List[IntakeRun] = [run for run in runs if self._end(run, _RELEASED)]
        if ended:
            self._runtime.release([run.attempt for run in ended])
        return len(ended)
