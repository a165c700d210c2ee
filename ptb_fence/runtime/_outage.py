"""StoreOutage: what the log says about a store that does not answer.

While the database is down every background loop keeps failing: the lease keeper, the sweep,
the outbox's sender, the figures. Each of their errors is counted (``Stats.store_errors``) and
passed to ``on_store_error``, but only the first :data:`ERRORS_LOGGED` of each step per outage
are logged at ERROR (with a note that the rest are counted, not logged). The others go to
DEBUG. The first store call that answers again ends the outage with one line: how long it
lasted and how many errors each step met (WARNING when errors went unlogged, else INFO).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, Optional

from ptb_fence._events import event

__all__ = ["ERRORS_LOGGED", "StoreOutage"]

_LOGGER = logging.getLogger("ptb_fence.store")

ERRORS_LOGGED = 2
"""Store errors logged at ERROR per step and outage (the rest at DEBUG)."""


class StoreOutage:
    """The current outage of one runtime's store (if any) and its errors per step.

    Args:
        clock: Monotonic seconds (default :func:`time.monotonic`).
    """

    __slots__ = ("_clock", "_errors", "_lock", "_since")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._since: Optional[float] = None  # monotonic: the outage's first error
        self._errors: Dict[str, int] = {}

    @property
    def ongoing(self) -> bool:
        """Whether store errors were seen and no store call answered since."""
        return self._since is not None

    def failed(self, step: str) -> int:
        """Count a store error of ``step`` (an outage begins with the first).

        Returns:
            :obj:`int`: The log level the error gets: ERROR for the first
            :data:`ERRORS_LOGGED` of the step in this outage, DEBUG after.
        """
        with self._lock:
            if self._since is None:
                self._since = self._clock()
            count = self._errors.get(step, 0) + 1
            self._errors[step] = count
        return logging.ERROR if count <= ERRORS_LOGGED else logging.DEBUG

    def note(self, step: str) -> str:
        """What an error logged at ERROR adds when it is the step's last one logged so."""
        with self._lock:
            last = self._errors.get(step, 0) == ERRORS_LOGGED
        return (f" (further store errors during {step} are counted and logged at DEBUG "
                "until the store answers again)" if last else "")

    def answered(self) -> None:
        """A store call answered: end the outage, with one line if there was one (WARNING when
        some of its errors were logged at DEBUG only, else INFO)."""
        if self._since is None:  # the usual case: no lock taken
            return
        with self._lock:
            since, self._since = self._since, None
            errors, self._errors = self._errors, {}
        if since is None:
            return
        # a WARNING when errors went unlogged (at DEBUG): the line that closes them. A lone
        # error that was logged whole gets an INFO line
        muted = any(count > ERRORS_LOGGED for count in errors.values())
        _LOGGER.log(
            logging.WARNING if muted else logging.INFO,
            "the store answers again after %.1f s of errors: %d store error(s) during the "
            "outage (%s)",
            self._clock() - since,
            sum(errors.values()),
            ", ".join(f"{step} {n}" for step, n in sorted(errors.items())),
            extra=event("store_answers_again", outage_seconds=round(self._clock() - since, 3),
                        store_errors=dict(errors)),
        )
