"""BackgroundJobs: the runtime's scheduler jobs (the lease keeper's tick, a sweep, the takeover
watch), started and stopped together, each counted while it runs so a stop can wait for it."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional

from ptb_fence.runtime._backoff import Backoff
from ptb_fence.runtime._lease_keeper import EXECUTOR, new_scheduler

if TYPE_CHECKING:
    from ptb_fence.runtime._lease_keeper import LeaseKeeper
    from ptb_fence.runtime._options import RuntimeOptions
    from ptb_fence.runtime._outage import StoreOutage

__all__ = ["BackgroundJobs", "TAKEOVER_EVERY_SECONDS"]

TAKEOVER_EVERY_SECONDS = 1.0
"""How often a runtime whose store has liveness signals looks for dead processes' claims
(at most). It looks never less often than its sweep."""

_LOGGER = logging.getLogger("ptb_fence.runtime")


class BackgroundJobs:
    """The background scheduler of one runtime and the jobs on it.

    Args:
        keeper: The lease keeper whose tick runs as a job.
        options: The runtime's options (``sweep_every_seconds``).
        take_over_dead: Makes dead processes' claims claimable, returns how many. Run every
            :data:`TAKEOVER_EVERY_SECONDS` (:obj:`None`: the store has no liveness signals).
        outage: The store's outage, if any: while it lasts the sweep and the takeover watch
            skip their runs until a back-off passed (the lease keeper's tick never skips: it
            also ends the attempts whose lease lapsed).
    """

    __slots__ = (
        "_counts",
        "_jobs",
        "_keeper",
        "_lock",
        "_options",
        "_outage",
        "_scheduler",
        "_take_over_dead",
    )

    def __init__(
        self,
        keeper: "LeaseKeeper",
        options: "RuntimeOptions",
        take_over_dead: Optional[Callable[[], int]],
        outage: "Optional[StoreOutage]" = None,
    ) -> None:
        self._keeper = keeper
        self._options = options
        self._take_over_dead = take_over_dead
        self._outage = outage
        self._scheduler: Any = None
        self._lock = threading.Lock()  # start/stop
        self._jobs = threading.Condition()  # guards _counts
        self._counts: "dict[str, int]" = {}  # jobs running now, by name

    def start(
        self,
        sweep: Optional[Callable[[], Any]] = None,
        taken_over: Optional[Callable[[], Any]] = None,
    ) -> None:
        """Start a fresh background scheduler with the lease keeper (and ``sweep``) jobs.

        With a store that has liveness signals (``take_over_dead``), also a takeover watch
        every :data:`TAKEOVER_EVERY_SECONDS`: it makes the claims of dead processes claimable
        and, when there were any, calls ``taken_over()`` (the front end sweeps them up at once).
        """
        with self._lock:
            if self._scheduler is not None:
                return
            scheduler = new_scheduler()
            self._keeper.add_job(scheduler, wrap=self._tracked)
            if sweep is not None:
                scheduler.add_job(
                    self._tracked(self._spaced(sweep), "ptb_fence sweep"),
                    "interval",
                    executor=EXECUTOR,
                    seconds=self._options.sweep_every_seconds,
                    id="ptb_fence_sweep",
                    name="ptb_fence sweep",
                    # the sweep has its own non-blocking lock. Extra instances return at once
                    # instead of APScheduler warning that a run was skipped
                    max_instances=3,
                )
            if self._take_over_dead is not None:
                every = min(TAKEOVER_EVERY_SECONDS, self._options.sweep_every_seconds)
                scheduler.add_job(
                    self._tracked(self._spaced(self._watch(taken_over)), "ptb_fence takeover"),
                    "interval",
                    executor=EXECUTOR,
                    seconds=every,
                    id="ptb_fence_takeover",
                    name="ptb_fence takeover",
                    max_instances=3,
                )
            scheduler.start()
            self._scheduler = scheduler

    def _watch(self, taken_over: Optional[Callable[[], Any]]) -> Callable[[], None]:
        take_over_dead = self._take_over_dead
        assert take_over_dead is not None

        def watch() -> None:
            if take_over_dead() and taken_over is not None:
                taken_over()

        return watch

    def _spaced(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn``, skipped while the store does not answer until its back-off passed (a short
        interval would try again and again: 0.1 s doubling to 0.8 s between the tries)."""
        outage = self._outage
        if outage is None:
            return fn
        backoff = Backoff()
        next_try = [0.0]  # monotonic

        def run() -> Any:
            if outage.ongoing and time.monotonic() < next_try[0]:
                return None
            try:
                return fn()
            finally:
                if outage.ongoing:
                    next_try[0] = time.monotonic() + backoff.failed()
                else:
                    backoff.answered()

        return run

    def _tracked(self, fn: Callable[[], Any], name: str) -> Callable[[], Any]:
        """``fn`` counted while it runs, so :meth:`stop` can wait for it with a bound."""

        def run() -> Any:
            with self._jobs:
                self._counts[name] = self._counts.get(name, 0) + 1
            try:
                return fn()
            finally:
                with self._jobs:
                    self._counts[name] -= 1
                    if not self._counts[name]:
                        del self._counts[name]
                    self._jobs.notify_all()

        return run

    def stop(self, timeout: Optional[float] = None) -> List[str]:
        """Stop the background scheduler and wait for a running job (tick or sweep) to end.

        Args:
            timeout: Seconds to wait (:obj:`None`: until the jobs end).

        Returns:
            The names of the jobs still running after ``timeout`` (empty when all ended).
        """
        with self._lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            try:
                scheduler.shutdown(wait=timeout is None)
            except Exception:  # pragma: no cover - already stopped
                _LOGGER.debug("scheduler shutdown failed", exc_info=True)
        with self._jobs:
            self._jobs.wait_for(lambda: not self._counts, timeout)
            return sorted(self._counts)

    @property
    def running(self) -> bool:
        """Whether the background jobs are running."""
        return self._scheduler is not None

