"""Stopping: what a processor gives back when ``Application.stop()`` begins, in bounded time.

Once stopping begins nothing new starts. The attempts claimed but not started (claimed at
ingest, queued, or recorded while stopping) are released in one ``release_many``: claimable
at once by any process, the attempt not counted as spent. Running handlers get
``stop_timeout_seconds`` to finish; then their attempts are released the same way (their
fenced writes are refused from then on) and their tasks cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from typing import List, Set

from ptb_fence.ptb._handlers import RunningHandlers
from ptb_fence.ptb._state import SharedState
from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._core import Runtime

__all__ = ["Stopping"]

_LOGGER = logging.getLogger("ptb_fence.ptb")


class Stopping:
    """The stop of one processor.

    Args:
        runtime: The processor's runtime.
        threads: The store threads.
        handlers: The processor's running handlers.
    """

    __slots__ = ("_handlers", "_pending", "_runtime", "_threads")

    def __init__(
        self, runtime: Runtime, threads: StoreThreads, handlers: RunningHandlers
    ) -> None:
        self._runtime = runtime
        self._threads = threads
        self._handlers = handlers
        self._pending: "Set[asyncio.Task[int]]" = set()

    def release_soon(self, attempts: List[Attempt]) -> None:
        """Release ``attempts`` on a store thread (called on the event loop; see
        :meth:`drain`). Without a running loop or store threads: stop renewing them (their
        leases lapse)."""
        if not attempts:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self._threads.executor is None:
            for attempt in attempts:
                self._runtime.end(attempt)
            return
        task = loop.create_task(self._release(attempts), name="ptb_fence:release")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _release(self, attempts: List[Attempt]) -> int:
        return await self._threads.call(self._runtime.release, attempts)

    async def stop(self, unstarted: List[Attempt]) -> None:
        """Stopping began: release ``unstarted`` (one call), give the running handlers
        ``stop_timeout_seconds``, then release what still runs (one call) and cancel it."""
        if unstarted:
            await self._release(unstarted)
        timeout = self._runtime.options.stop_timeout_seconds
        if await self._handlers.wait_idle(timeout):
            return
        runs = self._handlers.snapshot()
        if not runs:
            return
        _LOGGER.warning(
            "%d handler(s) still running %.3g s after stopping began "
            "(stop_timeout_seconds): releasing their updates (claimable at once elsewhere; "
            "their fenced writes are refused from now on) and cancelling them",
            len(runs),
            timeout,
        )
        await self._release([run.attempt for run in runs])
        self._handlers.end_released(runs)

    async def drain(self) -> None:
        """Wait for the releases started with :meth:`release_soon` (before the store threads
        stop)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
