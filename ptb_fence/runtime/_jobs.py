"""The runtime's background jobs: the lease keeper's tick and a sweep (a mixin of Runtime)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, List, Optional

from ptb_fence.runtime._lease_keeper import EXECUTOR, new_scheduler

if TYPE_CHECKING:
    from ptb_fence.runtime._lease_keeper import LeaseKeeper
    from ptb_fence.runtime._options import RuntimeOptions
    from ptb_fence.runtime._port import StorePort

__all__ = ["Jobs", "TAKEOVER_EVERY_SECONDS"]

TAKEOVER_EVERY_SECONDS = 1.0
"""How often a runtime whose store has liveness signals looks for dead processes' claims
(at most; never less often than its sweep)."""

_LOGGER = logging.getLogger("ptb_fence.runtime")


class Jobs:
    """``start_jobs``, ``stop_jobs`` and ``running``."""

    __slots__ = ()

    if TYPE_CHECKING:
        port: StorePort
        keeper: LeaseKeeper
        options: RuntimeOptions
        _scheduler: Any
        _scheduler_lock: threading.Lock
        _jobs: threading.Condition
        _jobs_running: "dict[str, int]"

        def take_over_dead(self) -> int: ...

    def start_jobs(
        self,
        sweep: Optional[Callable[[], Any]] = None,
        taken_over: Optional[Callable[[], Any]] = None,
    ) -> None:
        """Start a fresh background scheduler with the lease keeper (and ``sweep``) jobs.

        With a store that has liveness signals, also a takeover watch every
        :data:`TAKEOVER_EVERY_SECONDS`: it makes the claims of dead processes claimable and,
        when there were any, calls ``taken_over()`` (the front end sweeps them up at once).
        """
        with self._scheduler_lock:
            if self._scheduler is not None:
                return
            scheduler = new_scheduler()
            self.keeper.add_job(scheduler, wrap=self._tracked)
            if sweep is not None:
                scheduler.add_job(
                    self._tracked(sweep, "ptb_fence sweep"),
                    "interval",
                    executor=EXECUTOR,
                    seconds=self.options.sweep_every_seconds,
                    id="ptb_fence_sweep",
                    name="ptb_fence sweep",
                    # the sweep has its own non-blocking lock; extra instances return at once
                    # instead of APScheduler warning that a run was skipped
                    max_instances=3,
                )
            if self.port.has_liveness:
                every = min(TAKEOVER_EVERY_SECONDS, self.options.sweep_every_seconds)
                scheduler.add_job(
                    self._tracked(self._watch(taken_over), "ptb_fence takeover"),
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
        def watch() -> None:
            if self.take_over_dead() and taken_over is not None:
                taken_over()

        return watch

    def _tracked(self, fn: Callable[[], Any], name: str) -> Callable[[], Any]:
        """``fn`` counted while it runs, so :meth:`stop_jobs` can wait for it with a bound."""

        def run() -> Any:
            with self._jobs:
                self._jobs_running[name] = self._jobs_running.get(name, 0) + 1
            try:
                return fn()
            finally:
                with self._jobs:
                    self._jobs_running[name] -= 1
                    if not self._jobs_running[name]:
                        del self._jobs_running[name]
                    self._jobs.notify_all()

        return run

    def stop_jobs(self, timeout: Optional[float] = None) -> List[str]:
        """Stop the background scheduler and wait for a running job (tick or sweep) to end.

        Args:
            timeout: Seconds to wait (:obj:`None`: until the jobs end).

        Returns:
            The names of the jobs still running after ``timeout`` (empty when all ended).
        """
        with self._scheduler_lock:
            scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            try:
                scheduler.shutdown(wait=timeout is None)
            except Exception:  # pragma: no cover - already stopped
                _LOGGER.debug("scheduler shutdown failed", exc_info=True)
        with self._jobs:
            self._jobs.wait_for(lambda: not self._jobs_running, timeout)
            return sorted(self._jobs_running)

    @property
    def running(self) -> bool:
        """Whether the background jobs are running."""
        return self._scheduler is not None

