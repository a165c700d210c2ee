"""StoreThreads: the store threads that run blocking store calls off the event loop."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional, TypeVar

from ptb_fence.runtime._hop import StoreHop

__all__ = ["StoreThreads"]

T = TypeVar("T")

_CORE_THREADS = 8
"""Store threads that take calls first (see :class:`~ptb_fence.runtime._hop.StoreHop`): few
threads competing for the GIL (as many as PostgresUpdateStore's default pool has connections).
More start only while every one is stuck in a slow call."""


class StoreThreads:
    """A processor's store threads: started at ``initialize``, released at ``shutdown``.

    Without started threads, calls run on the event loop's default executor.
    """

    __slots__ = ("_hop",)

    def __init__(self) -> None:
        self._hop: Optional[StoreHop] = None

    @property
    def executor(self) -> Optional[StoreHop]:
        """The store threads, or :obj:`None` when not started."""
        return self._hop

    def start(self, max_workers: int) -> StoreHop:
        """Start store threads (at most ``max_workers`` at once) and return them."""
        self._hop = StoreHop(min(_CORE_THREADS, max_workers), max_workers, "ptb_fence-store")
        return self._hop

    def stop(self) -> None:
        """Release the threads without waiting for calls still running."""
        hop, self._hop = self._hop, None
        if hop is not None:
            hop.stop()

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a store thread."""
        hop = self._hop
        if hop is None:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, lambda: fn(*args, **kwargs))
        if args or kwargs:
            return await hop.run(lambda: fn(*args, **kwargs))
        return await hop.run(fn)

    async def call_handing_on(self, fn: Callable[[], T], on_orphan: Callable[[T], None]) -> T:
        """Run ``fn`` on the store threads. If the caller is cancelled while it runs, its
        result (a write that still lands) goes to ``on_orphan`` instead of being lost."""
        loop = asyncio.get_running_loop()
        hop = self._hop
        inner = loop.run_in_executor(None, fn) if hop is None else hop.submit(loop, fn)
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:

            def orphaned(future: "asyncio.Future[T]") -> None:
                if not future.cancelled() and future.exception() is None:
                    on_orphan(future.result())

            inner.add_done_callback(orphaned)
            raise
