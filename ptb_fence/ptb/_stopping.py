"""Stopping: how a processor ends its work when ``Application.stop()`` begins, in bounded time.

Once stopping begins nothing new is queued. The queued updates and the running handlers get
``stop_timeout_seconds``, as PTB's ``stop()`` promises ("after processing any pending updates").
At that deadline what is claimed but not started is released in one ``release_many``. The
handlers still running are cancelled and their attempts released the same way, their open
fenced transactions ended first. Every store call of the stop is waited for only until
:data:`STOP_MARGIN_SECONDS` after that deadline, so a server that does not answer cannot hold
the process. What such a call did not give back is covered by its lease.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import weakref
from typing import Any, Callable, List, Optional, Set, TypeVar

from ptb_fence.ptb._handlers import RunningHandlers
from ptb_fence.ptb._state import SharedState
from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._runtime import Runtime
from ptb_fence.runtime._recovery import STOP_MARGIN_SECONDS

__all__ = ["STOP_MARGIN_SECONDS", "Stopping"]

_LOGGER = logging.getLogger("ptb_fence.ptb")

T = TypeVar("T")


class Stopping:
    """The stop of one processor.

    Args:
        runtime: The processor's runtime.
        threads: The store threads.
        handlers: The processor's running handlers.
    """

    __slots__ = ("_abandoned", "_handlers", "_pending", "_processing", "_runtime", "_threads")

    def __init__(
        self, runtime: Runtime, threads: StoreThreads, handlers: RunningHandlers
    ) -> None:
        self._runtime = runtime
        self._threads = threads
        self._handlers = handlers
        self._pending: "Set[asyncio.Task[int]]" = set()
        # the tasks processing an update now (PTB's update_queue.join() waits for each), and
        # those a stop cancelled because they still waited for the store past its margin
        self._processing: "Set[asyncio.Task[Any]]" = set()
        self._abandoned: "weakref.WeakSet[asyncio.Task[Any]]" = weakref.WeakSet()

    def processing(self) -> "Optional[asyncio.Task[Any]]":
        """Count the current task as processing an update (until :meth:`processed`)."""
        task = asyncio.current_task()
        if task is not None:
            self._processing.add(task)
        return task

    def processed(self, task: "Optional[asyncio.Task[Any]]") -> None:
        """The task's processing of an update ended."""
        if task is not None:
            self._processing.discard(task)

    def end_abandoned(self, task: "Optional[asyncio.Task[Any]]") -> bool:
        """Called where ``task`` (the current task) caught a CancelledError: :obj:`True` if
        the stop cancelled it (it waited for the store past the stop's margin, so the cancel
        request is withdrawn and the task ends normally), :obj:`False` if someone else did (the
        caller re-raises)."""
        if task is None or task not in self._abandoned:
            return False
        self._abandoned.discard(task)
        uncancel_current_task()
        return True

    def release_soon(self, attempts: List[Attempt]) -> None:
        """Release ``attempts`` on a store thread, called on the event loop (see
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
        return await self._threads.call(self._runtime.recovery.release, attempts)

    async def call_until(self, fn: Callable[[], T], until: float, what: str) -> Optional[T]:
        """``fn()`` on a store thread, waited for until the loop time ``until``. Returns :obj:`None`
        (logged as a WARNING naming ``what``) when it did not return by then: it goes on on
        its store thread (a daemon thread: it never keeps the process alive)."""
        loop = asyncio.get_running_loop()
        hop = self._threads.executor
        if hop is None:  # not started (or shut down): nothing to give back through it
            return None
        future = hop.submit(loop, fn)
        try:
            return await asyncio.wait_for(asyncio.shield(future), max(until - loop.time(), 0.0))
        except asyncio.TimeoutError:
            _LOGGER.warning(
                "%s: the store did not answer in time; going on without it (what it did not "
                "give back is claimable elsewhere once its lease ran out)",
                what,
            )
            return None

    async def stop(self, state: SharedState) -> None:
        """Stopping began (``state.stopping`` is set and :attr:`SharedState.finishing`
        holds the updates queued or running): handle them within ``stop_timeout_seconds``,
        then release what is left and cancel what still runs."""
        runtime = self._runtime
        loop = asyncio.get_running_loop()
        timeout = runtime.options.stop_timeout_seconds
        deadline = loop.time() + timeout
        final = deadline + STOP_MARGIN_SECONDS
        # getUpdates answers PTB never put in the queue: they will not start here
        unqueued = state.take_unstarted(ingested_only=True)
        if unqueued:
            await self.call_until(
                lambda: runtime.recovery.release(unqueued), final, "releasing unqueued updates"
            )
        finished = await state.wait_finished(deadline - loop.time())
        if finished and await self._handlers.wait_idle(max(deadline - loop.time(), 0.0)):
            await self._abandon_stragglers(final)
            return
        # the deadline: nothing more starts. What is claimed and waits is given back
        unstarted = state.take_unstarted()
        runs = self._handlers.snapshot()
        if runs:
            _LOGGER.warning(
                "%d handler(s) still running %.3g s after stopping began "
                "(stop_timeout_seconds): cancelling them and releasing their updates where "
                "possible (open fenced transactions are ended first; what is not released is "
                "logged)",
                len(runs),
                timeout,
            )
        attempts = unstarted + [run.attempt for run in runs]
        self._handlers.end_released(runs)
        if attempts:
            grace = max(final - loop.time() - 0.5, 0.0)
            await self.call_until(
                lambda: runtime.recovery.give_back(attempts, grace), final, "releasing updates at the stop"
            )
        await self._abandon_stragglers(final)

    async def _abandon_stragglers(self, until: float) -> None:
        """Wait until the loop time ``until`` for the updates still being processed (their
        settles, completions and releases), then cancel those still waiting: a database that
        does not answer must not keep PTB's ``update_queue.join()`` waiting. What they did
        not write is covered by its lease."""
        loop = asyncio.get_running_loop()
        current = asyncio.current_task()
        tasks = [task for task in self._processing if task is not current]
        if not tasks:
            return
        _, waited = await asyncio.wait(tasks, timeout=max(until - loop.time(), 0.0))
        # only those still processing: a task that processed its update meanwhile and went on
        # (PTB's own update fetcher with max_concurrent 1, waiting for its queue's next item)
        # is not a straggler, and a cancel would end PTB's fetcher with the stop's CancelledError
        late = [task for task in waited if task in self._processing]
        if not late:
            return
        _LOGGER.warning(
            "%d update(s) still being processed %.3g s after stop_timeout_seconds (waiting for "
            "the store, or for a slot held by one that does): cancelling their processing "
            "(what they did not write is claimable elsewhere once its lease ran out)",
            len(late),
            STOP_MARGIN_SECONDS,
        )
        for task in late:
            self._abandoned.add(task)
            task.cancel()

    async def shutdown(self) -> None:
        """The processor's shutdown, before its store threads stop: wait for the releases
        started with :meth:`release_soon`, stop the runtime's jobs and give back the liveness
        signal, all within :data:`STOP_MARGIN_SECONDS` (a database that does not answer must
        not hold the process: what is not given back is covered by its lease, and a liveness
        row left behind is recognised as dead once the process is gone)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + STOP_MARGIN_SECONDS
        while self._pending and loop.time() < until:
            await asyncio.wait(list(self._pending), timeout=max(until - loop.time(), 0.0))
        runtime = self._runtime
        stuck = await loop.run_in_executor(
            None, runtime.jobs.stop, max(until - loop.time(), 0.0)
        )
        if stuck:
            _LOGGER.warning(
                "shutdown: still running after %.3g s: %s (waiting for the store?); going on",
                STOP_MARGIN_SECONDS,
                ", ".join(stuck),
            )
        await self.call_until(
            runtime.recovery.release_liveness,
            max(until, loop.time() + 0.5),
            "giving back this process's liveness signal",
        )


def uncancel_current_task() -> None:
    """Undo one cancel request of the current task (Python 3.11+, Python 3.10 keeps no count).

    Called where a cancellation made by the processor itself is swallowed."""
    task = asyncio.current_task()
    if sys.version_info >= (3, 11) and task is not None:
        task.uncancel()
