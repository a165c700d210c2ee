"""AsyncDeliveries: exhaustions handed to ``handle_exhaustion``, each in a task of its own.

The decisions (which are due, which start now, acknowledgement, failure, logging) are
:class:`~ptb_fence.runtime._exhaustions.ExhaustionDeliveries`, shared with ``UpdateIntake``.
This module only runs them in tasks (a blocking handler in a daemon thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from typing import Any, Callable, List, Optional, Set, TypeVar

from ptb_fence._values import Exhaustion
from ptb_fence.runtime._delivered import DeliveredExhaustion
from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.runtime._runtime import Runtime
from ptb_fence.runtime._exhaustions import SLOW_DELIVERY_SECONDS, ExhaustionDeliveries

__all__ = ["AsyncDeliveries"]

T = TypeVar("T")


class AsyncDeliveries:
    """Delivers exhaustions to ``handler`` in tasks, as the runtime decides.

    At most one delivery of one exhaustion runs at a time in this process, and at most
    :data:`~ptb_fence.runtime._exhaustions.MAX_DELIVERIES` at once. One that is not started
    stays due and waits for a slot: a delivery that ends starts it. A blocking handler runs in
    a daemon thread: a hanging one holds neither the chat, the sweep, the store threads nor
    interpreter exit. A failed delivery (or acknowledgement) is reported and left due: it is
    delivered again.
    """

    __slots__ = ("_decisions", "_handler", "_tasks", "_threads")

    def __init__(
        self,
        runtime: Runtime,
        threads: StoreThreads,
        handler: Optional[Callable[[DeliveredExhaustion], Any]],
    ) -> None:
        self._decisions = ExhaustionDeliveries(runtime)
        self._threads = threads
        self._handler = handler
        self._tasks: "Set[asyncio.Future[None]]" = set()

    @property
    def enabled(self) -> bool:
        """A ``handle_exhaustion`` was given."""
        return self._handler is not None

    def due(self) -> List[Exhaustion]:
        """The next page of due exhaustions (store failures reported). Blocking."""
        return self._decisions.due() if self._handler is not None else []

    def start(self, exhaustion: Exhaustion) -> None:
        """Deliver ``exhaustion`` in a task of its own, if the runtime admits it now."""
        self.start_many([exhaustion])

    def start_many(self, exhaustions: List[Exhaustion]) -> None:
        """Deliver each exhaustion the runtime admits now in a task of its own."""
        if self._handler is None:
            return
        loop = asyncio.get_running_loop()
        for exhaustion in self._decisions.admit(exhaustions):
            task = loop.create_task(
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
        decisions = self._decisions
        assert handler is not None
        slow = asyncio.get_running_loop().call_later(
            SLOW_DELIVERY_SECONDS, decisions.slow, exhaustion, SLOW_DELIVERY_SECONDS
        )
        error: Optional[BaseException] = None
        exhaustion = decisions.delivered(exhaustion)  # with its outbox
        try:
            try:
                if inspect.iscoroutinefunction(handler):
                    await handler(exhaustion)
                else:
                    result = await _in_daemon_thread(handler, exhaustion)
                    if inspect.isawaitable(result):
                        await result
            except Exception as exc:
                error = exc
            slow.cancel()
            await self._threads.call(decisions.finish, exhaustion, error)
            self.start_many(await self._threads.call(decisions.more_due))
        except BaseException:  # cancelled (stopping): undecided, it stays due
            decisions.abandon(exhaustion)
            raise
        finally:
            slow.cancel()


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
