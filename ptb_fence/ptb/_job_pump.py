"""JobPump: fires the due runs of durable jobs and hands them to the Application.

It looks every ``min(1, sweep_every_seconds)`` seconds, on the processor's store threads. A
run the store fired here is handed over at once, as a retry is. A run fired by a process that
died before handing it over is a pending update row: a sweep takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Callable, List, Optional, Tuple

from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.runtime._backoff import Backoff
from ptb_fence.runtime._durable_jobs import FIRE_PAGE, DurableJobs

__all__ = ["JobPump"]

_LOGGER = logging.getLogger("ptb_fence.jobs")

LOOK_EVERY_SECONDS = 1.0
"""How often a process looks for due runs (at most: never less often than its sweep)."""


class JobPump:
    """The loop that fires due runs of one processor's durable jobs.

    Args:
        jobs: The durable jobs.
        threads: The processor's store threads.
        hand_over: Queues a run's update (its id and body) in the Application.
        interval: Seconds between looks.
    """

    __slots__ = ("_backoff", "_hand_over", "_interval", "_jobs", "_task", "_threads")

    def __init__(self, jobs: DurableJobs, threads: StoreThreads,
                 hand_over: Callable[[int, str], None], interval: float) -> None:
        self._jobs = jobs
        self._threads = threads
        self._hand_over = hand_over
        self._interval = min(LOOK_EVERY_SECONDS, interval)
        self._task: "Optional[asyncio.Task[None]]" = None
        self._backoff = Backoff()

    def start(self) -> None:
        """Start looking (on the running event loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="ptb_fence:jobs")

    async def stop(self) -> None:
        """Stop looking. Runs fired and not handed over stay pending in the store."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def fire(self) -> List[Tuple[int, str]]:
        """Fire the due runs now and hand them over. Returns them."""
        fired = await self._threads.call(self._jobs.fire_due)
        for update_id, body in fired:
            self._hand_over(update_id, body)
        return fired

    async def _run(self) -> None:
        while True:
            pause = self._interval
            try:
                fired = await self.fire()
                self._backoff.answered()
                if len(fired) >= FIRE_PAGE:
                    pause = 0.0  # a full page: more are due
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                pause = max(self._interval, self._backoff.failed())
                _LOGGER.warning("jobs: looking for due runs failed (%s): trying again in "
                                "%.1f s", exc, pause)
            await asyncio.sleep(pause)
