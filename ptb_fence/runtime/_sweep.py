"""The sweep and wake policy both front ends follow: what one sweep fetches, when the next
page follows at once, and when a retry due before the next sweep is handed back.

The front ends only wait and hand over: the PTB processor in tasks and event-loop timers,
``UpdateIntake`` on threads and its :class:`~ptb_fence.blocking._wakeups.Wakeups`. The numbers
live here, once.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

from ptb_fence._values import StoredUpdate

__all__ = [
    "RETRY_LATE_SECONDS",
    "SWEEP_PAGE",
    "SweepPage",
    "recheck_delay",
    "retry_delay",
]

SWEEP_PAGE = 500
"""Due updates one sweep fetches (one store call). A full page that handed something over is
followed by the next page as soon as the front end's handlers have drained it, not after
``sweep_every_seconds``: a backlog after a restart is taken page after page."""

RETRY_LATE_SECONDS = 0.005
"""A retry due before the next sweep is handed back this much after its time, so the store
sees the retry time as come (``due_at <= now``) when the handover claims it."""

RECHECK_SECONDS = 0.05
"""A retry whose failed attempt is still finishing here is looked at again after this long."""

RECHECK_TRIES = 200
"""At most this many looks (10 s at :data:`RECHECK_SECONDS`). The sweep takes it after."""


class SweepPage(NamedTuple):
    """One page of due updates fetched by a sweep.

    Attributes:
        rows: The due updates, in the order to hand them over.
        full: The page was full: more may be due.
    """

    rows: List[StoredUpdate]
    full: bool

    def more(self, handed: int) -> bool:
        """Whether the next page should follow at once: the page was full and ``handed``
        (how many of its updates the front end handed over) is not zero (a full page of
        updates all still in flight here would only be fetched again)."""
        return self.full and handed > 0


def retry_delay(delay: float) -> float:
    """When to hand back a retry due in ``delay`` seconds (a little late, see
    :data:`RETRY_LATE_SECONDS`)."""
    return delay + RETRY_LATE_SECONDS


def recheck_delay(tries: int) -> Optional[float]:
    """After ``tries`` looks found the retry's previous attempt still finishing here: when to
    look again, or :obj:`None` to leave it to the sweep."""
    return RECHECK_SECONDS if tries < RECHECK_TRIES else None
