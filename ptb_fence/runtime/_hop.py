"""StoreHop: the lean hop from the event loop to a store thread and back."""

from __future__ import annotations

import contextvars
import queue
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, TypeVar

if TYPE_CHECKING:
    import asyncio  # imported where used: import ptb_fence stays light

__all__ = ["StoreHop"]

T = TypeVar("T")

_Job = Tuple[contextvars.Context, Callable[[], Any], "asyncio.AbstractEventLoop", "asyncio.Future[Any]"]

_STALL_SECONDS = 0.05
"""Calls queued while every store thread is busy and none finished for this long get one
thread more (again after each such interval, up to the limit): slow calls (long fenced
transactions, lock waits) do not hold up the others for long. Shorter waits are ordinary
database latency (a commit on a busy machine): more threads would only compete for the GIL
and the connection pool."""

_SPARE_IDLE_SECONDS = 2.0
"""A thread beyond the core ones ends after idling this long (or at once after a call when
none is queued)."""


def _resolve(future: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    if future.done():  # the awaiting task was cancelled: the result has no one to go to
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class StoreHop:
    """Runs blocking store calls for asyncio callers on a few store threads.

    One call costs one :class:`asyncio.Future`, one context copy and one queue entry. The
    thread runs the call in the caller's context and hands the result straight to the loop,
    without a :class:`concurrent.futures.Future` in between. Results that finish while a
    hand-back is pending go with it, in one wake-up of the loop. Only ``core`` threads take
    calls while they keep finishing, so few threads compete for the GIL. One more thread (up to
    ``limit``) starts only when every thread is busy and none finished for 50 ms. It ends once
    no call is queued.

    Args:
        core: Threads that take calls first (at least 1).
        limit: At most this many threads (at least ``core``).
        name: The threads' name prefix.
    """

    __slots__ = (
        "_armed",
        "_closed",
        "_core",
        "_done",
        "_finished",
        "_idle",
        "_limit",
        "_lock",
        "_name",
        "_queue",
        "_started",
        "_threads",
    )

    def __init__(self, core: int, limit: int, name: str = "ptb_fence-store") -> None:
        self._core = max(1, core)
        self._limit = max(self._core, limit)
        self._name = name
        self._queue: "queue.SimpleQueue[Optional[_Job]]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0  # alive
        self._idle = 0  # waiting for a call
        self._done = 0  # calls finished (progress, for the stall check)
        self._started = 0  # threads ever started (for names)
        self._armed = False
        self._closed = False
        # per loop: results finished on the threads, handed back together (see _hand_back)
        self._finished: "Dict[asyncio.AbstractEventLoop, List[Tuple[Any, bool, Any]]]" = {}

    @property
    def threads(self) -> int:
        """:obj:`int`: The store threads alive now."""
        return self._threads

    def submit(
        self, loop: "asyncio.AbstractEventLoop", fn: Callable[[], T]
    ) -> "asyncio.Future[T]":
        """Queue ``fn()`` (in a copy of the current context) and return the loop's future of
        its result. Called on the event loop ``loop``.

        Raises:
            RuntimeError: After :meth:`stop`.
        """
        if self._closed:
            raise RuntimeError("cannot schedule new calls after the store threads stopped")
        future: "asyncio.Future[T]" = loop.create_future()
        self._queue.put((contextvars.copy_context(), fn, loop, future))
        with self._lock:
            # An idle thread counts as taking one queued call, not this one: a thread that
            # just took a call from the queue is still counted idle for a moment, so several
            # calls can see the same idle thread. Only as many idle threads as queued calls
            # make the stall check unnecessary.
            if self._idle >= self._queue.qsize():
                return future
            if self._threads < self._core:
                self._spawn_locked()
            if self._threads < self._limit and not self._armed:
                # also after starting a core thread: it may take an earlier queued call, and
                # this one must not wait for a stuck call to finish
                self._armed = True
                loop.call_later(_STALL_SECONDS, self._check_stall, loop, self._done)
        return future

    async def run(self, fn: Callable[[], T]) -> T:
        """Await ``fn()`` run on a store thread (in a copy of the current context)."""
        import asyncio

        return await self.submit(asyncio.get_running_loop(), fn)

    def stop(self) -> None:
        """Take no more calls. The threads end once the calls already queued ran (not
        waited for here)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            count = self._threads
        for _ in range(count):
            self._queue.put(None)

    # -- threads -----------------------------------------------------------------------------
    def _check_stall(self, loop: "asyncio.AbstractEventLoop", done_before: int) -> None:
        with self._lock:
            self._armed = False
            if self._closed or self._queue.empty():
                return
            # ``_idle`` may still count a thread that has just taken a call: keep checking
            # while calls are queued, and start a thread only when none finished meanwhile
            if self._done == done_before and self._idle < self._queue.qsize():
                self._spawn_locked()  # stuck: one thread more
            if self._threads < self._limit:
                self._armed = True
                loop.call_later(_STALL_SECONDS, self._check_stall, loop, self._done)

    def _spawn_locked(self) -> None:
        self._threads += 1
        self._started += 1
        spare = self._threads > self._core
        thread = threading.Thread(
            target=self._work,
            args=(spare,),
            name=f"{self._name}_{self._started}",
            daemon=True,
        )
        thread.start()

    def _work(self, spare: bool) -> None:
        get = self._queue.get
        lock = self._lock
        timeout = _SPARE_IDLE_SECONDS if spare else None
        with lock:
            self._idle += 1
        while True:
            try:
                job = get(timeout=timeout)
            except queue.Empty:
                job = None
            with lock:
                if job is None and not self._closed and not self._queue.empty():
                    continue  # a call came as the idle time ran out: take it (still idle)
                self._idle -= 1
                if job is None:
                    self._threads -= 1
                    return
            context, fn, loop, future = job
            try:
                value, ok = context.run(fn), True
            except BaseException as exc:  # handed to the awaiting task
                value, ok = exc, False
            with lock:
                self._done += 1
                # a thread beyond the core ones lives only while calls are queued
                leave = spare and self._queue.empty()
                if leave:
                    self._threads -= 1
                else:
                    self._idle += 1
                finished = self._finished.get(loop)
                if finished is None:  # no hand-back to this loop pending: schedule one
                    self._finished[loop] = [(future, ok, value)]
                else:  # the pending hand-back takes it along: no wake-up of its own
                    finished.append((future, ok, value))
            if finished is None:
                try:
                    loop.call_soon_threadsafe(self._hand_back, loop)
                except RuntimeError:  # the loop is closed: no one awaits the results
                    with lock:
                        self._finished.pop(loop, None)
            del job, context, fn, loop, future, value, finished
            if leave:
                return

    def _hand_back(self, loop: "asyncio.AbstractEventLoop") -> None:
        """On ``loop``: resolve every future finished since the last hand-back (one wake-up
        of the loop for all the calls that finished meanwhile)."""
        with self._lock:
            finished = self._finished.pop(loop, ())
        for future, ok, value in finished:
            _resolve(future, ok, value)
