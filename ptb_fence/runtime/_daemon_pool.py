"""DaemonThreadPool: a small executor whose threads never keep the interpreter alive."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Any, Callable, Dict, Optional, Tuple

__all__ = ["DaemonThreadPool"]

_IDLE_SECONDS = 5.0
"""A thread ends after idling this long (the pool starts a new one when work comes)."""

_Work = Tuple["concurrent.futures.Future[Any]", Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]


class DaemonThreadPool(concurrent.futures.Executor):
    """A :class:`concurrent.futures.Executor` on at most ``max_workers`` daemon threads.

    :class:`concurrent.futures.ThreadPoolExecutor` joins its threads when the interpreter
    exits: one job blocked in a store call (a database that does not answer: frozen,
    partitioned) would keep the process from exiting however the stop bounded its own waits.
    These threads are daemon threads: the process exits with them still blocked. The work they
    did not finish is covered by the store's leases.

    Args:
        max_workers: The most threads at once.
        name: The threads' name prefix.
    """

    def __init__(self, max_workers: int, name: str) -> None:
        self._max = max(1, max_workers)
        self._name = name
        self._queue: "queue.SimpleQueue[Optional[_Work]]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: "set[threading.Thread]" = set()
        self._idle = 0
        self._waiting = 0  # jobs queued and not yet taken by a thread
        self._started = 0
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> "concurrent.futures.Future[Any]":
        """Run ``fn(*args, **kwargs)`` on a pool thread and return its future."""
        future: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._queue.put((future, fn, args, kwargs))
            self._waiting += 1
            # a thread for every job no idle thread will take: an idle thread takes one job,
            # and one woken by the first of a burst of submits still counts as idle when the
            # next comes (counting idle threads alone ran a burst on one thread, its other
            # jobs waiting for a whole job each: the outbox sent fewer calls at once than
            # outbox_concurrency, a queued call waiting for a slow send, maybe past its lease)
            if self._waiting > self._idle and len(self._threads) < self._max:
                self._started += 1
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{self._started}", daemon=True
                )
                self._threads.add(thread)
                thread.start()
        return future

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                self._idle += 1
            try:
                item = self._queue.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                item = None
            with self._lock:
                self._idle -= 1
                if item is not None:
                    self._waiting -= 1
                if item is None:
                    if not self._closed and not self._queue.empty():
                        continue
                    self._threads.discard(me)
                    return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # handed to the future's owner
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del item, future, fn, args, kwargs

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work. The threads end once the queued work ran (joined if ``wait``)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
                thread.join()
