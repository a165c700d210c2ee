"""Sweeper: hands due updates back to the Application (the sweep loop and the retry timers)
and starts the delivery of due exhaustions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, Callable, Hashable, List, Optional, Set, Tuple

from telegram import Update

from ptb_fence.ptb._bodies import parse_update
from ptb_fence.ptb._deliveries import AsyncDeliveries
from ptb_fence.ptb._state import SharedState
from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.runtime._runtime import Runtime
from ptb_fence.runtime._backoff import Backoff
from ptb_fence.runtime._sweep import recheck_delay, retry_delay

__all__ = ["Sweeper"]

_LOGGER = logging.getLogger("ptb_fence.ptb")


class Sweeper:
    """The sweep of one processor.

    Every ``sweep_every_seconds`` (and page after page while full pages keep coming): queue
    the due updates not in flight here, start delivering the due exhaustions, prune. A retry
    due before the next sweep is queued at its time by a timer (the runtime calls
    :meth:`retry_soon`). Nothing is queued once ``Application.stop()`` began: due updates stay
    in the store for the next start or another process.

    Args:
        runtime: The processor's runtime.
        state: The state shared with the processor and its ingest.
        threads: The store threads.
        deliveries: Where due exhaustions are delivered.
        application: Returns the attached Application (or :obj:`None`).
        redeliver: Queues an update that is already recorded. Returns :obj:`False` when stopping.
    """

    __slots__ = (
        "_application",
        "_backoff",
        "_deliveries",
        "_extra",
        "_loop",
        "_redeliver",
        "_retry_timers",
        "_runtime",
        "_state",
        "_task",
        "_threads",
    )

    def __init__(
        self,
        runtime: Runtime,
        state: SharedState,
        threads: StoreThreads,
        deliveries: AsyncDeliveries,
        application: Callable[[], Any],
        redeliver: Callable[[Update], bool],
    ) -> None:
        self._runtime = runtime
        self._state = state
        self._threads = threads
        self._deliveries = deliveries
        self._application = application
        self._redeliver = redeliver
        self._backoff = Backoff()  # the sweeps' waits while the store does not answer
        self._task: Optional["asyncio.Task[None]"] = None
        self._extra: "Set[asyncio.Task[None]]" = set()
        # a retry due before the next sweep is handed back at its time (same fenced claim)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._retry_timers: "Set[asyncio.TimerHandle]" = set()

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop on which retry timers run (set at ``initialize``)."""
        self._loop = loop

    # -- the sweep loop ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the sweep loop (if not running)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ptb_fence:sweep")

    async def stop(self) -> None:
        """Stop the sweep loop and cancel the retry timers (the retries stay due)."""
        self.cancel_retry_timers()
        task, self._task = self._task, None
        tasks = list(self._extra) + ([task] if task is not None else [])
        for each in tasks:
            each.cancel()
        for each in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await each

    def sweep_soon(self) -> None:
        """Run one sweep on the event loop soon (thread-safe), fresh pending rows included:
        called after a takeover of a dead process's claims, whose pending rows (recorded past
        its claim budget) would otherwise wait for ``pending_grace_seconds``. Nothing once
        stopping began."""
        loop = self._loop
        if loop is None or self._state.stopping:
            return
        try:
            loop.call_soon_threadsafe(self._start_one_sweep)
        except RuntimeError:  # the loop is closed
            pass

    def _start_one_sweep(self) -> None:
        if self._state.stopping or not self._state.started or self._loop is None:
            return
        task = self._loop.create_task(self._one_sweep(), name="ptb_fence:sweep-now")
        self._extra.add(task)
        task.add_done_callback(self._extra.discard)

    async def _one_sweep(self) -> None:
        try:
            await self.sweep(True)
        except Exception:
            _LOGGER.exception("sweep failed; trying again at the next interval")

    async def _run(self) -> None:
        include_fresh = True  # the first sweep takes every pending row at once
        interval = self._runtime.options.sweep_every_seconds
        while True:
            full = False
            try:
                _, full = await self.sweep(include_fresh)
            except asyncio.CancelledError:
                raise
            except Exception:
                _LOGGER.exception("sweep failed; trying again at the next interval")
            if full:
                # more rows are waiting: fetch the next page once these are done
                await self._wait_drained(interval)
                continue
            include_fresh = False
            await asyncio.sleep(self._pause(interval))

    def _pause(self, interval: float) -> float:
        """The wait before the next sweep: the interval, or while the store does not answer
        the back-off if that is longer (a short interval would try at once again and again)."""
        if not self._runtime.stats.outage.ongoing:
            self._backoff.answered()
            return interval
        return max(interval, self._backoff.failed())

    async def _wait_drained(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        threshold = max(1, self._runtime.options.max_concurrent)
        while len(self._state.inflight) > threshold and loop.time() < deadline:
            await asyncio.sleep(0.01)

    async def sweep(self, include_fresh: bool) -> Tuple[int, bool]:
        """One sweep. Returns the number of updates queued and whether the page was full."""
        runtime = self._runtime
        state = self._state
        application = self._application()
        handed = 0
        page = await self._threads.call(runtime.sweep_page, include_fresh=include_fresh)
        for row in page.rows:
            if state.held(row.update_id):
                continue
            if state.stopping:
                break  # Application.stop() began: the rows stay due for the next start
            try:
                update = parse_update(json.loads(row.body), application.bot)
            except Exception:
                _LOGGER.exception(
                    "stored update %s cannot be parsed; left as it is",
                    row.update_id,
                    extra={"update_id": row.update_id},
                )
                continue
            if update is None:
                continue
            state.inflight.add(row.update_id)
            if not self._redeliver(update):
                state.inflight.discard(row.update_id)
                break
            handed += 1
        if self._deliveries.enabled and not state.stopping:
            due = await self._threads.call(self._deliveries.due)
            self._deliveries.start_many(due)
        await self._threads.call(runtime.sweep_done, handed)
        return handed, page.more(handed)

    # -- retries due before the next sweep ---------------------------------------------------
    def retry_soon(self, update_id: int, delay: float, body: Optional[str]) -> None:
        """Called by the runtime (on a store thread) for a retry due before the next sweep."""
        loop = self._loop
        if body is None or loop is None or self._state.stopping:
            return  # the sweep takes it
        try:
            loop.call_soon_threadsafe(self._start_retry_timer, update_id, delay, body)
        except RuntimeError:  # the loop is closed: the next start's sweep takes it
            pass

    def _start_retry_timer(self, update_id: int, delay: float, body: str, tries: int = 0) -> None:
        if self._state.stopping or not self._state.started or self._loop is None:
            return
        handle: "List[asyncio.TimerHandle]" = []

        def fire() -> None:
            self._retry_timers.discard(handle[0])
            self._retry_now(update_id, body, tries)

        handle.append(self._loop.call_later(retry_delay(delay), fire))
        self._retry_timers.add(handle[0])

    def _retry_now(self, update_id: int, body: str, tries: int) -> None:
        state = self._state
        if state.stopping or not state.started:
            return  # stays due in the store
        if state.held(update_id):
            # its failed attempt is still finishing here: look again shortly
            again = recheck_delay(tries)
            if again is not None:
                self._start_retry_timer(update_id, again, body, tries + 1)
            return
        self._hand_over(update_id, body)

    def hand_over(self, update_id: int, body: str) -> None:
        """Queue a recorded update that is not in flight here (a durable job's run)."""
        self._hand_over(update_id, body)

    def _hand_over(self, update_id: int, body: str) -> None:
        """Queue a stored update that is not in flight here (a failure to parse is left to
        the sweep, which reports it)."""
        state = self._state
        if state.stopping or not state.started or state.held(update_id):
            return
        try:
            update = parse_update(json.loads(body), self._application().bot)
        except Exception:
            return
        if update is None:
            return
        state.inflight.add(update_id)
        if not self._redeliver(update):
            state.inflight.discard(update_id)

    def chat_successor_soon(self, key: Hashable, outcome: Any, waiting: bool) -> None:
        """Under ``strict_chat_order``, when the processor is done with an update of ``key``'s
        chat (``outcome``, :obj:`None` if not claimed) and no other waits here, look up the
        chat's next update in a task and queue it (:meth:`StoreChatOrder.successor
        <ptb_fence.runtime._store_chat_order.StoreChatOrder.successor>`)."""
        state = self._state
        if not self._runtime.chat_order.strict or waiting or state.stopping or not state.started:
            return
        task = asyncio.get_running_loop().create_task(
            self._chat_successor(key, outcome), name="ptb_fence:chat-successor"
        )
        self._extra.add(task)
        task.add_done_callback(self._extra.discard)

    async def _chat_successor(self, key: Hashable, outcome: Any) -> None:
        try:
            row = await self._threads.call(self._runtime.chat_order.successor, key, outcome)
        except Exception:  # pragma: no cover - chat_successor reports store errors itself
            _LOGGER.exception("looking up the next update of a chat failed")
            return
        if row is not None:
            self._hand_over(row.update_id, row.body)

    def cancel_retry_timers(self) -> None:
        """Cancel the retry timers (the retries stay due in the store)."""
        timers, self._retry_timers = self._retry_timers, set()
        for timer in timers:
            timer.cancel()
