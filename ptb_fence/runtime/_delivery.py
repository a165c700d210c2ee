"""ExhaustionDelivery: exhaustion handlers run off the workers, the chats and the sweep."""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from ptb_fence._durations import format_duration
from ptb_fence._values import AttemptIdentity, Exhaustion

if TYPE_CHECKING:
    from ptb_fence.runtime._core import Runtime

__all__ = ["DELIVERY_WAIT_SECONDS", "ExhaustionDelivery"]

_LOGGER = logging.getLogger("ptb_fence.intake")

DELIVERY_WAIT_SECONDS = 30.0
"""How long the delivery thread waits for one exhaustion handler before it goes on with the
next exhaustions. The slow handler is left running (never entered again for the same
exhaustion while it runs); its exhaustion is acknowledged when it returns."""


class ExhaustionDelivery:
    """Delivers exhaustions one at a time on its own thread, each handler call on a thread of
    its own, at most one delivery per exhaustion identity at a time in this process.

    :meth:`submit` never blocks: the caller (a worker after an update's last attempt, the
    sweep) goes on at once. A handler still running after ``wait_seconds`` is left running and
    the next exhaustion is delivered.
    """

    __slots__ = (
        "_closed",
        "_cond",
        "_delivering",
        "_dispatcher",
        "_handler",
        "_queue",
        "_queued",
        "_runtime",
        "_threads",
        "_wait_seconds",
    )

    def __init__(
        self,
        runtime: "Runtime",
        handler: Callable[[Exhaustion], Any],
        wait_seconds: float = DELIVERY_WAIT_SECONDS,
    ) -> None:
        self._runtime = runtime
        self._handler = handler
        self._wait_seconds = wait_seconds
        self._cond = threading.Condition()
        self._queue: Deque[Tuple[Exhaustion, threading.Event]] = collections.deque()
        self._queued: Set[AttemptIdentity] = set()
        self._delivering: Set[AttemptIdentity] = set()
        self._threads: Dict[AttemptIdentity, threading.Thread] = {}
        self._dispatcher: Optional[threading.Thread] = None
        self._closed = False

    @property
    def backlog(self) -> int:
        """Exhaustions waiting for the delivery thread."""
        with self._cond:
            return len(self._queue)

    def submit(self, exhaustions: List[Exhaustion]) -> List[threading.Event]:
        """Queue exhaustions not already queued or being delivered here.

        Returns:
            One event per exhaustion queued now, set when its handler returned or raised, when
            the delivery thread stopped waiting for it, or when it was dropped at close.
        """
        events = []
        with self._cond:
            if self._closed:
                return []
            for exhaustion in exhaustions:
                identity = exhaustion.identity
                if identity in self._queued or identity in self._delivering:
                    continue
                event = threading.Event()
                self._queue.append((exhaustion, event))
                self._queued.add(identity)
                events.append(event)
            if events and self._dispatcher is None:
                self._dispatcher = threading.Thread(
                    target=self._dispatch, name="ptb_fence-exhaustions", daemon=True
                )
                self._dispatcher.start()
            self._cond.notify_all()
        return events

    def wait_idle(self, timeout: Optional[float]) -> bool:
        """Wait until nothing is queued and no handler runs; :obj:`False` on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._queue and not self._delivering, timeout
            )

    def close(self, timeout: Optional[float]) -> List[str]:
        """Drop what is queued (it stays due in the store) and wait for the running threads.

        Returns:
            The names of the threads still running after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            self._queued.clear()
            self._cond.notify_all()
            threads = list(self._threads.values())
            if self._dispatcher is not None:
                threads.append(self._dispatcher)
        for _, event in dropped:
            event.set()
        running = []
        for thread in threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
            if thread.is_alive():
                running.append(thread.name)
        return running

    def _dispatch(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                exhaustion, event = self._queue.popleft()
                identity = exhaustion.identity
                self._queued.discard(identity)
                self._delivering.add(identity)
                thread = threading.Thread(
                    target=self._deliver,
                    args=(exhaustion, event),
                    name=f"ptb_fence-exhaustion-{exhaustion.update_id}-{exhaustion.attempt}",
                    daemon=True,
                )
                self._threads[identity] = thread
            thread.start()
            if not event.wait(self._wait_seconds):
                _LOGGER.warning(
                    "exhaustion handler for update %s attempt %s still running after %s; "
                    "delivering the next exhaustions meanwhile (it is not entered again for "
                    "this exhaustion while it runs)",
                    exhaustion.update_id,
                    exhaustion.attempt,
                    format_duration(self._wait_seconds),
                    extra={
                        "update_id": exhaustion.update_id,
                        "attempt": exhaustion.attempt,
                        "claim_id": exhaustion.claim_id,
                    },
                )

    def _deliver(self, exhaustion: Exhaustion, event: threading.Event) -> None:
        identity = exhaustion.identity
        try:
            self._runtime.deliver_exhaustion(exhaustion, self._handler)
        except BaseException:  # pragma: no cover - deliver_exhaustion reports handler errors
            _LOGGER.exception("exhaustion delivery of update %s failed", exhaustion.update_id)
        finally:
            with self._cond:
                self._delivering.discard(identity)
                if self._threads.get(identity) is threading.current_thread():
                    del self._threads[identity]
                self._cond.notify_all()
            event.set()
