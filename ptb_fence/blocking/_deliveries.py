"""ThreadDeliveries: UpdateIntake's exhaustion handlers, each on a thread of its own.

The decisions (which are due, which start now, acknowledgement, failure, logging) are
:class:`~ptb_fence.runtime._exhaustions.ExhaustionDeliveries`, shared with the PTB processor.
This module only runs them on threads, off the workers, the chats and the sweep.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from ptb_fence._values import AttemptIdentity, Exhaustion
from ptb_fence.runtime._delivered import DeliveredExhaustion
from ptb_fence.runtime._exhaustions import SLOW_DELIVERY_SECONDS, ExhaustionDeliveries

if TYPE_CHECKING:
    from ptb_fence.runtime._runtime import Runtime

__all__ = ["DELIVERY_WAIT_SECONDS", "ThreadDeliveries"]

DELIVERY_WAIT_SECONDS = SLOW_DELIVERY_SECONDS
"""How long a sweep waits for one exhaustion handler it started. A slower one is logged and
left running. It is never entered again for the same exhaustion while it runs. Its exhaustion
is acknowledged when it returns."""


class ThreadDeliveries:
    """Runs each admitted delivery on a daemon thread of its own.

    :meth:`submit` never blocks: the caller (a worker after an update's last attempt, the
    sweep) goes on at once. A handler still running after ``wait_seconds`` is logged and left
    running.
    """

    __slots__ = ("_closed", "_cond", "_decisions", "_handler", "_threads", "_wait_seconds")

    def __init__(
        self,
        runtime: "Runtime",
        handler: Callable[[DeliveredExhaustion], Any],
        wait_seconds: float = DELIVERY_WAIT_SECONDS,
    ) -> None:
        self._decisions = ExhaustionDeliveries(runtime)
        self._handler = handler
        self._wait_seconds = wait_seconds
        self._cond = threading.Condition()
        self._threads: Dict[AttemptIdentity, threading.Thread] = {}
        self._closed = False

    @property
    def full(self) -> bool:
        """As many deliveries run as may: fetching due exhaustions is pointless now."""
        return self._decisions.full

    def due(self) -> List[Exhaustion]:
        """The next page of due exhaustions (store failures reported)."""
        return self._decisions.due()

    def submit(self, exhaustions: List[Exhaustion]) -> List[threading.Event]:
        """Start the deliveries the runtime admits (not being delivered, free slots).

        Returns:
            One event per delivery started now, set when its handler returned or raised, or
            after ``wait_seconds`` (it is then logged as slow and left running).
        """
        started: List[Tuple[threading.Thread, threading.Event]] = []
        with self._cond:
            if self._closed:
                return []
            for exhaustion in self._decisions.admit(exhaustions):
                event = threading.Event()
                thread = threading.Thread(
                    target=self._deliver,
                    args=(exhaustion, event),
                    name=f"ptb_fence-exhaustion-{exhaustion.update_id}-{exhaustion.attempt}",
                    daemon=True,
                )
                self._threads[exhaustion.identity] = thread
                started.append((thread, event))
        for thread, _ in started:
            thread.start()
        return [event for _, event in started]

    def wait_idle(self, timeout: Optional[float]) -> bool:
        """Wait until no handler runs. Returns :obj:`False` on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._threads, timeout)

    def close(self, timeout: Optional[float]) -> List[str]:
        """Start no more deliveries (what is not started stays due in the store) and wait for
        the running threads.

        Returns:
            The names of the threads still running after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._closed = True
            threads = list(self._threads.values())
        running = []
        for thread in threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
            if thread.is_alive():
                running.append(thread.name)
        return running

    def _deliver(self, exhaustion: Exhaustion, event: threading.Event) -> None:
        decisions = self._decisions
        timer = threading.Timer(self._wait_seconds, self._slow, (exhaustion, event))
        timer.daemon = True
        timer.start()
        error: Optional[BaseException] = None
        exhaustion = decisions.delivered(exhaustion)  # with its outbox
        try:
            try:
                self._handler(exhaustion)
            except Exception as exc:
                error = exc
            decisions.finish(exhaustion, error)
            if not self._closed:
                self.submit(decisions.more_due())  # registered before this one leaves
        except BaseException:  # pragma: no cover - finish reports store and handler errors
            decisions.abandon(exhaustion)
            raise
        finally:
            timer.cancel()
            with self._cond:
                if self._threads.get(exhaustion.identity) is threading.current_thread():
                    del self._threads[exhaustion.identity]
                self._cond.notify_all()
            event.set()

    def _slow(self, exhaustion: Exhaustion, event: threading.Event) -> None:
        ExhaustionDeliveries.slow(exhaustion, self._wait_seconds)
        event.set()
