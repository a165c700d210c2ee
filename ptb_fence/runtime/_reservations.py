"""Reservations: claims about to be taken, counted against the claim budget until they are
registered with the lease keeper."""

from __future__ import annotations

import threading
from typing import Callable

__all__ = ["Reservations"]


class Reservations:
    """A thread-safe count of reserved claims (see
    :meth:`~ptb_fence.runtime._claiming.ClaimingOps.reserve_claims`)."""

    __slots__ = ("_lock", "count")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def take(self, wanted: int, free: Callable[[], int]) -> int:
        """Reserve up to ``wanted`` of ``free()`` (the budget, reservations already counted);
        returns how many."""
        with self._lock:
            granted = max(0, min(int(wanted), free()))
            self.count += granted
            return granted

    def give_back(self, count: int) -> None:
        """End a reservation of ``count``."""
        with self._lock:
            self.count -= count
