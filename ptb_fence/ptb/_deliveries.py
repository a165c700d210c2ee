"""Deliveries: exhaustions handed to ``handle_exhaustion``, each in a task of its own."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from typing import Any, Callable, Optional, Set, TypeVar

from ptb_fence._values import Exhaustion
from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.runtime._core import Runtime

__all__ = ["Deliveries"]

T = TypeVar("T")

MAX_DELIVERIES = 8  # exhaustion deliveries running at once in one process


class Deliveries:
    """Delivers exhaustions to ``handler`` and acknowledges them once it returned.

    At most one delivery of one exhaustion runs at a time in this process, and at most
    :data:`MAX_DELIVERIES` at once; one that is not started stays due, and a later sweep starts
    it. A blocking handler runs in a daemon thread: a hanging one holds neither the chat, the
    sweep, the store threads nor interpreter exit. A failed delivery (or acknowledgement) is
    reported and left due: it is delivered again.
    """

    __slots__ = ("_delivering", "_handler", "_runtime", "_tasks", "_threads")

    def __init__(
        self,
        runtime: Runtime,
        threads: StoreThreads,
        handler: Optional[Callable[[Exhaustion], Any]],
    ) -> None:
        self._runtime = runtime
        self._threads = threads
        self._handler = handler
        self._delivering: Set[Any] = set()  # identities of exhaustions being delivered
        self._tasks: "Set[asyncio.Future[None]]" = set()

    @property
    def enabled(self) -> bool:
        """A ``handle_exhaustion`` was given."""
        return self._handler is not None

    def start(self, exhaustion: Exhaustion) -> None:
        """Deliver ``exhaustion`` in a task of its own, unless it is being delivered already."""
        if self._handler is None or exhaustion.identity in self._delivering:
            return
        if len(self._delivering) >= MAX_DELIVERIES:
            return  # it stays due: a later sweep starts it once a delivery has finished
        self._delivering.add(exhaustion.identity)
        task = asyncio.get_running_loop().create_task(
            self._deliver(exhaustion), name=f"ptb_fence:exhaustion:{exhaustion.update_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def cancel_all(self) -> None:
        """Cancel the deliveries running (unacknowledged: delivered again at the next start)."""
        deliveries = list(self._tasks)
        for delivery in deliveries:
            delivery.cancel()
        if deliveries:
            await asyncio.gather(*deliveries, return_exceptions=True)

    async def _deliver(self, exhaustion: Exhaustion) -> None:
        handler = self._handler
        identity = exhaustion.identity
        if handler is None:
            self._delivering.discard(identity)
            return
        runtime = self._runtime
        try:
            try:
                if inspect.iscoroutinefunction(handler):
                    await handler(exhaustion)
                else:
                    result = await _in_daemon_thread(handler, exhaustion)
                    if inspect.isawaitable(result):
                        await result
            except Exception as exc:
                runtime.exhaustion_failed(exc, exhaustion)
                return
            try:
                await self._threads.call(runtime.acknowledge, exhaustion)
            except Exception as exc:  # stays due: delivered again by a later sweep
                runtime.report_store_error(exc, "sweep")
        finally:
            self._delivering.discard(identity)


async def _in_daemon_thread(fn: Callable[[Any], T], arg: Any) -> T:
    """Run a blocking ``fn(arg)`` in a daemon thread (a hanging one blocks neither the store
    threads nor interpreter exit)."""
    loop = asyncio.get_running_loop()
    future: "asyncio.Future[T]" = loop.create_future()

    def settle(value: Any, error: Optional[BaseException]) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def work() -> None:
        try:
            value = fn(arg)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(settle, None, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, value, None)

    threading.Thread(target=work, name="ptb_fence-exhaustion", daemon=True).start()
    return await future
