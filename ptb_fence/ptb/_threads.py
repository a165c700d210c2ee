"""StoreThreads: the thread pool that runs blocking store calls off the event loop."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, TypeVar

__all__ = ["StoreThreads"]

T = TypeVar("T")


class StoreThreads:
    """A processor's store threads: started at ``initialize``, released at ``shutdown``.

    Without a started pool, calls run on the event loop's default executor.
    """

    __slots__ = ("_executor",)

    def __init__(self) -> None:
        self._executor: Optional[ThreadPoolExecutor] = None

    @property
    def executor(self) -> Optional[ThreadPoolExecutor]:
        """The pool, or :obj:`None` when not started."""
        return self._executor

    def start(self, max_workers: int) -> ThreadPoolExecutor:
        """Start a pool of ``max_workers`` threads and return it."""
        self._executor = ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="ptb_fence-store"
        )
        return self._executor

    def stop(self) -> None:
        """Release the pool without waiting for calls still running."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=False)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a store thread."""
        loop = asyncio.get_running_loop()
        executor = self._executor
        if kwargs:
            return await loop.run_in_executor(executor, lambda: fn(*args, **kwargs))
        return await loop.run_in_executor(executor, fn, *args)

    async def call_handing_on(self, fn: Callable[[], T], on_orphan: Callable[[T], None]) -> T:
        """Run ``fn`` on the store threads; if the caller is cancelled while it runs, its
        result (a write that still lands) goes to ``on_orphan`` instead of being lost."""
        loop = asyncio.get_running_loop()
        inner = loop.run_in_executor(self._executor, fn)
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:

            def orphaned(future: "asyncio.Future[T]") -> None:
                if not future.cancelled() and future.exception() is None:
                    on_orphan(future.result())

            inner.add_done_callback(orphaned)
            raise
