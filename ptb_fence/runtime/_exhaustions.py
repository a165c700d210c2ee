"""ExhaustionDeliveries: the decisions of exhaustion delivery, shared by both front ends.

It decides which exhaustions are due: a sweep fetches as many as there are free delivery slots,
in the order of a rotating cursor, up to :data:`_PER_SWEEP` per sweep. It decides which start
now: one delivery per exhaustion identity, at most :data:`MAX_DELIVERIES` at once. It decides
what the end of a delivery means (acknowledged, or reported and left due) and what is logged.
The front ends keep only the mechanics: ``UpdateIntake`` runs each delivery on a thread
(:class:`~ptb_fence.blocking._deliveries.ThreadDeliveries`), the PTB processor in a task
(:class:`~ptb_fence.ptb._deliveries.AsyncDeliveries`). Thread-safe. The store calls block.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import TYPE_CHECKING, Deque, List, Optional, Set

from ptb_fence._durations import format_duration
from ptb_fence._values import AttemptIdentity, Exhaustion
from ptb_fence.runtime._delivered import DeliveredExhaustion

if TYPE_CHECKING:
    from ptb_fence.runtime._runtime import Runtime

_REMEMBERED = 1024
"""Identities acknowledged here that are remembered: a page read just before an acknowledgement
committed may still list them, and they are not delivered again."""

_PER_SWEEP = 100
"""Deliveries one sweep may lead to (its page and the pages after it): ``EXHAUSTION_PAGE``."""

__all__ = ["MAX_DELIVERIES", "SLOW_DELIVERY_SECONDS", "ExhaustionDeliveries"]

_LOGGER = logging.getLogger("ptb_fence.runtime")

MAX_DELIVERIES = 8
"""Exhaustion deliveries running at once in one process. The others stay due."""

SLOW_DELIVERY_SECONDS = 30.0
"""After this long a running delivery is logged (WARNING) as slow. It is left running and never
started again for the same exhaustion while it runs."""


class ExhaustionDeliveries:
    """The delivery decisions of one runtime (see the module docstring).

    Args:
        runtime: The runtime (store port, exhaustion page cursor, reporting).
        limit: Deliveries running at once (:data:`MAX_DELIVERIES`).
    """

    __slots__ = (
        "_acknowledged",
        "_acknowledged_order",
        "_budget",
        "_delivering",
        "_fetch",
        "_lock",
        "_more",
        "_runtime",
        "_waiting",
        "limit",
    )

    def __init__(self, runtime: "Runtime", limit: int = MAX_DELIVERIES) -> None:
        self._runtime = runtime
        self._lock = threading.Lock()
        self._fetch = threading.Lock()  # the page cursor moves under it
        self._delivering: Set[AttemptIdentity] = set()
        self._acknowledged: Set[AttemptIdentity] = set()
        self._acknowledged_order: Deque[AttemptIdentity] = collections.deque()
        self._budget = 0  # deliveries the current sweep may still lead to
        self._more = False  # the last page was full: more may be due after it
        # due, not started for want of a slot (admitted in this order as slots free). The page
        # cursor may be past them, so the deliveries that end start them, not only a sweep
        self._waiting: "collections.OrderedDict[AttemptIdentity, Exhaustion]" = (
            collections.OrderedDict()
        )
        self.limit = limit

    @property
    def running(self) -> int:
        """:obj:`int`: Deliveries admitted and not finished yet."""
        with self._lock:
            return len(self._delivering)

    @property
    def full(self) -> bool:
        """:obj:`bool`: As many deliveries run as may (fetching more is pointless now)."""
        return self.running >= self.limit

    def due(self) -> List[Exhaustion]:
        """A sweep's exhaustions to start: as many as there are free slots, those waiting for a
        slot first, then a page from the rotating cursor. Starts the sweep's budget of
        deliveries (:data:`_PER_SWEEP`). A store failure is reported (step ``"sweep"``) and
        gives no page. Blocking."""
        with self._fetch:
            self._budget = _PER_SWEEP
            return self._next(page=True)

    def more_due(self) -> List[Exhaustion]:
        """After a delivery ended: those waiting for a slot, then the next page of the current
        sweep while its budget lasts and its last page was full (else no page: the next sweep
        goes on). Blocking."""
        with self._fetch:
            return self._next(page=self._more)

    def _next(self, page: bool) -> List[Exhaustion]:
        with self._lock:
            free = self.limit - len(self._delivering)
            waiting = list(self._waiting.values())[: max(free, 0)]
        if not page:
            return waiting
        taken = {exhaustion.identity for exhaustion in waiting}
        fetched = self._page(free - len(waiting))
        return waiting + [exhaustion for exhaustion in fetched if exhaustion.identity not in taken]

    def _page(self, free: int) -> List[Exhaustion]:
        size = min(free, self._budget)
        if size <= 0:
            self._more = self._budget > 0  # slots full: the next ending delivery goes on
            return []
        runtime = self._runtime
        try:
            page = runtime.exhaustion_page(size)
        except Exception as exc:
            runtime.report_store_error(exc, "sweep")
            self._more = False
            return []
        self._budget -= len(page)
        self._more = len(page) >= size and self._budget > 0
        return page

    def admit(self, exhaustions: List[Exhaustion]) -> List[Exhaustion]:
        """The exhaustions to deliver now: not being delivered (nor just acknowledged) in this
        process, and no more than the free slots. Each one returned holds a slot until
        :meth:`finish` or :meth:`abandon`. The others wait for a slot: the deliveries that end
        start them (:meth:`more_due`), however far the page cursor has moved meanwhile. A slot
        is held now, so one of them ends after this and looks. Beyond :data:`_REMEMBERED`
        waiting, the oldest is left to a later sweep (it stays due in the store)."""
        admitted = []
        with self._lock:
            waiting = self._waiting
            for exhaustion in exhaustions:
                identity = exhaustion.identity
                if identity in self._delivering or identity in self._acknowledged:
                    waiting.pop(identity, None)  # started or acknowledged since it was left out
                    continue
                if len(self._delivering) >= self.limit:
                    waiting[identity] = exhaustion
                    if len(waiting) > _REMEMBERED:
                        waiting.popitem(last=False)
                    continue
                waiting.pop(identity, None)
                self._delivering.add(identity)
                admitted.append(exhaustion)
        return admitted

    def delivered(self, exhaustion: Exhaustion) -> DeliveredExhaustion:
        """What the handler receives for ``exhaustion``: with an ``outbox`` whose calls commit
        with the acknowledgement (:meth:`finish` writes them)."""
        return self._runtime.delivered(exhaustion)

    def finish(self, exhaustion: Exhaustion, error: Optional[BaseException]) -> bool:
        """A delivery ended. Frees its slot. Blocking.

        If the handler returned (``error`` is :obj:`None`), the exhaustion is acknowledged with
        its exact identity. If it raised ``error``, that is reported (an ERROR log and
        ``on_exhaustion_failure``) and the exhaustion stays due for a later sweep. A store
        failure while acknowledging is reported and leaves it due too.

        Returns:
            Whether the exhaustion was acknowledged.
        """
        acknowledged = False
        try:
            if error is not None:
                _drop_calls(exhaustion, "the exhaustion handler raised: it stays due")
                self._runtime.exhaustion_failed(error, exhaustion)
                return False
            acknowledged = self._runtime.acknowledge(exhaustion)
            return acknowledged
        finally:
            with self._lock:
                if acknowledged:
                    self._waiting.pop(exhaustion.identity, None)
                    self._acknowledged.add(exhaustion.identity)
                    self._acknowledged_order.append(exhaustion.identity)
                    if len(self._acknowledged_order) > _REMEMBERED:
                        self._acknowledged.discard(self._acknowledged_order.popleft())
                self._delivering.discard(exhaustion.identity)

    def abandon(self, exhaustion: Exhaustion) -> None:
        """Free the slot of a delivery that ends undecided (cancelled at stop, closed): the
        exhaustion stays due."""
        _drop_calls(exhaustion, "the exhaustion's delivery was cancelled: it stays due")
        with self._lock:
            self._delivering.discard(exhaustion.identity)

    @staticmethod
    def slow(exhaustion: Exhaustion, seconds: float) -> None:
        """Log that a delivery has been running for ``seconds`` (it is left running)."""
        _LOGGER.warning(
            "exhaustion handler for update %s attempt %s still running after %s; other "
            "exhaustions are delivered meanwhile (it is not entered again for this exhaustion "
            "while it runs)",
            exhaustion.update_id,
            exhaustion.attempt,
            format_duration(seconds),
            extra={
                "update_id": exhaustion.update_id,
                "attempt": exhaustion.attempt,
                "claim_id": exhaustion.claim_id,
            },
        )


def _drop_calls(exhaustion: Exhaustion, why: str) -> None:
    """A delivery ended without an acknowledgement: its queued calls are never sent."""
    if isinstance(exhaustion, DeliveredExhaustion):
        exhaustion.calls.discard(why)
