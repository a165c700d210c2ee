"""Wakeups: one thread that runs small callbacks at their time (retries due before a sweep)."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Callable, List, Optional, Tuple

__all__ = ["Wakeups"]

_LOGGER = logging.getLogger("ptb_fence.runtime")


class Wakeups:
    """Runs ``fn()`` at ``delay`` seconds from now, on one daemon thread, in due order.

    Guarantee: a scheduled callback runs once, not before its time, unless :meth:`close` came
    first (then it never runs). Callbacks must be short (they hand work on). One that raises is
    logged and the others still run.
    """

    __slots__ = ("_closed", "_cond", "_heap", "_name", "_seq", "_thread")

    def __init__(self, name: str = "ptb_fence-wakeups") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._heap: List[Tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def call_later(self, delay: float, fn: Callable[[], None]) -> bool:
        """Run ``fn`` after ``delay`` seconds.

        Returns :obj:`False` (nothing scheduled) once closed."""
        due = time.monotonic() + max(0.0, delay)
        with self._cond:
            if self._closed:
                return False
            heapq.heappush(self._heap, (due, next(self._seq), fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return True

    def pending(self) -> int:
        """How many callbacks wait for their time."""
        with self._cond:
            return len(self._heap)

    def close(self, timeout: Optional[float] = None) -> List[str]:
        """Drop what has not run yet and stop the thread. Returns its name if still running."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return []
        thread.join(timeout)
        return [thread.name] if thread.is_alive() else []

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (
                    not self._heap or self._heap[0][0] > time.monotonic()
                ):
                    wait = None if not self._heap else self._heap[0][0] - time.monotonic()
                    self._cond.wait(wait)
                if self._closed:
                    return
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:  # one broken callback must not stop the others
                _LOGGER.exception("a scheduled wakeup failed")
