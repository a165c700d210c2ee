"""IntakeRuns: the attempts running on UpdateIntake's worker threads, each endable once.

IntakeWorkers are those threads. A run ends exactly once, whichever comes first. Its handler
returns and the worker settles it. Or ``attempt_timeout_seconds`` passes: the attempt is settled
failed with :exc:`~ptb_fence.AttemptTimeout` and the chat's turn passes on. The worker thread
runs on, abandoned, and a new worker takes its place. Or :meth:`UpdateIntake.close` gives up
waiting: the attempt is released, claimable at once elsewhere. An abandoned handler's fenced
writes are refused, since its attempt no longer owns the update.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Deque, Dict, Hashable, List, Optional, Tuple

from ptb_fence._durations import format_duration
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._runtime import Runtime
from ptb_fence.blocking._isolation import ThreadIsolationGate
from ptb_fence.runtime._outcome import Outcome
from ptb_fence.runtime._recovery import AttemptTimeout
from ptb_fence.blocking._wakeups import Wakeups

__all__ = ["IntakeRun", "IntakeRuns", "IntakeWorkers"]

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
    """

    __slots__ = ("_how", "_lock", "attempt", "key", "thread", "update_id")

    def __init__(self, key: Hashable, update_id: int, attempt: Attempt) -> None:
        self.key = key
        self.update_id = update_id
        self.attempt = attempt
        self.thread = threading.current_thread()  # the worker running the handler
        self._lock = threading.Lock()
        self._how: Optional[str] = None

    def finish(self, how: str) -> bool:
        """End the run as ``how``. Returns :obj:`False` if it already ended otherwise."""
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
        workers: The worker threads (a timed-out run's thread stops counting there).
        turn_done: ``turn_done(key, update_id, outcome)``: pass the chat's turn on.
        deliver: ``deliver(exhaustion)``: hand an exhaustion to its delivery.
        gate: The isolation gate every run entered. A run leaves it when it ends.
    """

    __slots__ = (
        "_deliver", "_gate", "_lock", "_runs", "_runtime", "_turn_done", "_wakeups", "_workers"
    )

    def __init__(
        self,
        runtime: Runtime,
        wakeups: Wakeups,
        workers: "IntakeWorkers",
        turn_done: Callable[[Hashable, int, Optional[Outcome]], None],
        deliver: Callable[[Any], None],
        gate: ThreadIsolationGate,
    ) -> None:
        self._gate = gate
        self._runtime = runtime
        self._wakeups = wakeups
        self._workers = workers
        self._turn_done = turn_done
        self._deliver = deliver
        self._lock = threading.Lock()
        self._runs: Dict[int, IntakeRun] = {}

    def begin(self, key: Hashable, update_id: int, attempt: Attempt) -> IntakeRun:
        """Register a run that entered the isolation gate, and its timeout if
        ``attempt_timeout_seconds`` is set."""
        run = IntakeRun(key, update_id, attempt)
        with self._lock:  # counted before release_all may count it gone
            self._runs[update_id] = run
            self._runtime.stats.handler_began()
        timeout = self._runtime.options.attempt_timeout_seconds
        if timeout is not None:
            self._wakeups.call_later(timeout, lambda: self._time_out(run, timeout))
        return run

    def returned(self, run: IntakeRun) -> bool:
        """The handler returned: :obj:`True` if the worker settles it and leaves the isolation
        gate (it was not ended)."""
        self._forget(run)
        return run.finish(_RETURNED)

    def _end(self, run: IntakeRun, how: str) -> bool:
        """End ``run`` as ``how`` (once) and leave the isolation gate: a handler abandoned
        here (timed out, released) no longer holds an attempt that must run alone."""
        if not run.finish(how):
            return False
        self._gate.leave(run.attempt)
        return True

    def count(self) -> int:
        """How many runs are going now."""
        with self._lock:
            return len(self._runs)

    def _forget(self, run: IntakeRun) -> None:
        # once per run (the worker and a timeout may both forget it), before its end is
        # counted: Stats never shows an attempt both running and ended
        with self._lock:
            if self._runs.get(run.update_id) is not run:
                return
            del self._runs[run.update_id]
        self._runtime.stats.handler_gone()

    def _time_out(self, run: IntakeRun, timeout: float) -> None:
        # runs on the wakeup thread: settle on a thread of its own (a store call may block)
        label = f"update {run.update_id} attempt {run.attempt.attempt}"
        if not self._workers.abandon(
            run.thread, label, timeout, lambda: self._end(run, _TIMED_OUT)
        ):
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
        outcome: Optional[Outcome] = None
        try:
            outcome, exhaustion = runtime.settle(run.attempt, error)
        finally:
            runtime.end(run.attempt)
            self._turn_done(run.key, run.update_id, outcome)
        if exhaustion is not None:
            self._deliver(exhaustion)

    def release_all(self, seconds: float) -> int:
        """Release every run still going (:meth:`Recovery.give_back
        <ptb_fence.runtime._recovery.Recovery.give_back>`: their open fenced transactions are
        ended first), waiting at most ``seconds``. Their worker threads are abandoned.
        Returns how many runs were ended here."""
        with self._lock:
            runs = list(self._runs.values())
            self._runs.clear()
        for _ in runs:
            self._runtime.stats.handler_gone()
        ended: List[IntakeRun] = [run for run in runs if self._end(run, _RELEASED)]
        if ended:
            attempts = [run.attempt for run in ended]
            # on a daemon thread waited for a bounded time: a database that does not answer
            # must not hold close() (what is not given back is covered by its lease)
            giving = threading.Thread(
                target=self._runtime.recovery.give_back,
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


_Job = Tuple[Hashable, int, Any]
"""``(chat key, update_id, item)``: one update for a worker."""


class IntakeWorkers:
    """UpdateIntake's worker threads: at most ``size`` handlers run at once.

    A handler that passed ``attempt_timeout_seconds`` keeps its thread (a thread cannot be
    stopped), but from then on it no longer counts against ``size``: its place goes to the next
    update at once, on a new thread. At most ``size`` stuck threads are replaced this way (the
    threads never exceed ``2 * size``). Beyond that the intake runs fewer handlers at once until
    a stuck one returns. A stuck thread that returns takes no more work of its own: its place
    was given away (it stays in the pool as an idle thread).

    Args:
        size: ``max_concurrent``.
        run: ``run(job)`` handles one update on the current worker thread.
        drop: ``drop(job)``: an update that waited for a place when the workers shut down (not
            started).
    """

    __slots__ = ("_backlog", "_drop", "_free", "_lock", "_pool", "_run", "_size", "_stuck")

    def __init__(
        self, size: int, run: Callable[[_Job], None], drop: Callable[[_Job], None]
    ) -> None:
        self._size = size
        self._run = run
        self._drop = drop
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._free = size  # places not taken by a running (not stuck) handler
        self._backlog: Deque[_Job] = deque()  # updates waiting for a free place
        # stuck threads: what they run and since when (monotonic)
        self._stuck: Dict[threading.Thread, Tuple[str, float]] = {}

    def start(self) -> None:
        """Make the threads available (they start as work comes)."""
        with self._lock:
            self._pool = ThreadPoolExecutor(
                max_workers=2 * self._size, thread_name_prefix="ptb_fence-worker"
            )

    def submit(self, job: _Job) -> bool:
        """Run ``job`` when a place is free. Returns :obj:`False` once shut down (not taken)."""
        with self._lock:
            pool = self._pool
            if pool is None:
                return False
            if self._free == 0:
                self._backlog.append(job)
                return True
            self._free -= 1
        try:
            pool.submit(self._work, job)
        except RuntimeError:  # shutting down
            with self._lock:
                self._free += 1
            return False
        return True

    def _work(self, job: Optional[_Job]) -> None:
        me = threading.current_thread()
        while job is not None:
            try:
                self._run(job)
            except BaseException:  # pragma: no cover - run never raises
                _LOGGER.exception("unexpected error on a worker thread")
            with self._lock:
                stuck = self._stuck.pop(me, None)
                if stuck is None:  # still counted: take the next update, or free the place
                    job = self._backlog.popleft() if self._backlog else None
                    if job is None:
                        self._free += 1
                left = len(self._stuck)
            if stuck is not None:
                _LOGGER.info(
                    "worker thread %s returned %s after its attempt (%s) timed out; %d worker "
                    "thread(s) still stuck",
                    me.name,
                    format_duration(time.monotonic() - stuck[1]),
                    stuck[0],
                    left,
                )
                return

    def abandon(
        self, thread: threading.Thread, label: str, timeout: float, finish: Callable[[], bool]
    ) -> bool:
        """``label``'s handler passed its timeout on ``thread``: if ``finish()`` (ending the run
        as timed out) succeeds, ``thread`` stops counting and its place goes to the next update
        (a WARNING names the stuck threads). Returns ``finish()``'s result.

        ``finish`` is called under the same lock the worker takes when its handler returns, so
        the worker and this call agree on who gives the place away.
        """
        with self._lock:
            if not finish():
                return False
            self._stuck[thread] = (label, time.monotonic())
            stuck = len(self._stuck)
            pool = self._pool
            job = self._backlog.popleft() if self._backlog and pool is not None else None
            if job is None:
                self._free += 1
        if job is not None and pool is not None:
            try:
                pool.submit(self._work, job)
            except RuntimeError:  # shut down meanwhile
                self._drop(job)
        replaced = (
            "another thread takes its place"
            if stuck <= self._size
            else f"more than max_concurrent={self._size} are stuck, so fewer handlers run at "
            "once until one returns"
        )
        _LOGGER.warning(
            "%s: its handler still runs after attempt_timeout_seconds=%g; worker thread %s no "
            "longer counts against max_concurrent: %s (%d worker thread(s) stuck in handlers "
            "that passed their timeout)",
            label,
            timeout,
            thread.name,
            replaced,
            stuck,
        )
        return True

    def stuck_count(self) -> int:
        """How many threads are stuck now."""
        with self._lock:
            return len(self._stuck)

    def stuck(self) -> List[str]:
        """The stuck threads, each as ``"<thread> (update … attempt …)"``."""
        with self._lock:
            return [f"{thread.name} ({label})" for thread, (label, _) in self._stuck.items()]

    def shutdown(self) -> None:
        """Take no more work: the updates still waiting for a place are dropped (``drop``).

        Updates already handed to a thread run (they see the intake closed and skip)."""
        with self._lock:
            pool, self._pool = self._pool, None
            backlog = list(self._backlog)
            self._backlog.clear()
        if pool is not None:
            pool.shutdown(wait=False)
        for job in backlog:
            self._drop(job)
