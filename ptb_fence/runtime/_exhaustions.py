"""ExhaustionDeliveries: the decisions of exhaustion delivery, shared by both front ends.

Which exhaustions are due (a sweep fetches as many as there are free delivery slots, in the
order of a rotating cursor; each delivery that ends fetches the next ones, up to
:data:`_PER_SWEEP` (100) per sweep, so a failing first page can never
starve the rest and a failing handler is entered at most that often per sweep), which of them
start now (one delivery per exhaustion identity in a process, at most :data:`MAX_DELIVERIES`
at once), what the end of a delivery means (acknowledged with its exact identity, or reported
and left due so that a later sweep delivers it again) and what is logged. The front ends keep only the mechanics: ``UpdateIntake`` runs each delivery on
a thread (:class:`~ptb_fence.runtime._delivery.ExhaustionDelivery`), the PTB processor in a task
(:class:`~ptb_fence.ptb._deliveries.Deliveries`). Thread-safe; the store calls block.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import TYPE_CHECKING, Deque, List, Optional, Set

from ptb_fence._durations import format_duration
from ptb_fence._values import AttemptIdentity, Exhaustion

if TYPE_CHECKING:
    from ptb_fence.runtime._core import Runtime

_REMEMBERED = 1024
"""Identities acknowledged here that are remembered: a page read just before an acknowledgement
committed may still list them, and they are not delivered again."""

_PER_SWEEP = 100
"""Deliveries one sweep may lead to (its page and the pages after it): ``EXHAUSTION_PAGE``."""

__all__ = ["MAX_DELIVERIES", "SLOW_DELIVERY_SECONDS", "ExhaustionDeliveries"]

_LOGGER = logging.getLogger("ptb_fence.runtime")

MAX_DELIVERIES = 8
"""Exhaustion deliveries running at once in one process; the others stay due."""

SLOW_DELIVERY_SECONDS = 30.0
"""After this long a running delivery is logged (WARNING) as slow; it is left running and never
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
        """A sweep's page of due exhaustions: as many as there are free slots, from the
        rotating cursor. Starts the sweep's budget of deliveries (:data:`_PER_SWEEP`). A store
        failure is reported (step ``"sweep"``) and gives none. Blocking."""
        with self._fetch:
            self._budget = _PER_SWEEP
            return self._page()

    def more_due(self) -> List[Exhaustion]:
        """After a delivery ended: the next page of the current sweep, while its budget lasts
        and its last page was full (else none: the next sweep goes on). Blocking."""
        with self._fetch:
            return self._page() if self._more else []

    def _page(self) -> List[Exhaustion]:
        size = min(self.limit - self.running, self._budget)
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
        process, and no more than the free slots. Each one returned holds a slot until :meth:`finish` or
        :meth:`abandon`; the others stay due, fetched again as deliveries end
        (:meth:`more_due`) or by a later sweep."""
        admitted = []
        with self._lock:
            for exhaustion in exhaustions:
                if len(self._delivering) >= self.limit:
                    # more are due than can start: the deliveries that end fetch them
                    # (:meth:`more_due`), not only the next sweep
                    self._budget = max(self._budget, _PER_SWEEP)
                    self._more = True
                    break
                if (
                    exhaustion.identity in self._delivering
                    or exhaustion.identity in self._acknowledged
                ):
                    continue
                self._delivering.add(exhaustion.identity)
                admitted.append(exhaustion)
        return admitted

    def finish(self, exhaustion: Exhaustion, error: Optional[BaseException]) -> bool:
        """A delivery ended: the handler returned (``error`` :obj:`None`: acknowledge the
        exhaustion with its exact identity) or raised ``error`` (reported: ERROR log and
        ``on_exhaustion_failure``; it stays due and a later sweep delivers it again). A store
        failure while acknowledging is reported and leaves it due too. Frees its slot.
        Blocking.

        Returns:
            Whether the exhaustion was acknowledged.
        """
        acknowledged = False
        try:
            if error is not None:
                self._runtime.exhaustion_failed(error, exhaustion)
                return False
            acknowledged = self._runtime.acknowledge(exhaustion)
            return acknowledged
        finally:
            with self._lock:
                if acknowledged:
                    self._acknowledged.add(exhaustion.identity)
                    self._acknowledged_order.append(exhaustion.identity)
                    if len(self._acknowledged_order) > _REMEMBERED:
                        self._acknowledged.discard(self._acknowledged_order.popleft())
                self._delivering.discard(exhaustion.identity)

    def abandon(self, exhaustion: Exhaustion) -> None:
        """Free the slot of a delivery that ends undecided (cancelled at stop, closed): the
        exhaustion stays due."""
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
