"""Reservations: claims about to be taken, counted against the claim budget until they are
registered with the lease keeper."""

from __future__ import annotations

import threading
from typing import Callable

__all__ = ["Reservations"]


class Reservations:
    """A thread-safe count of reserved claims (see
    :meth:`~ptb_fence.runtime._claiming.ClaimingOps.reserve_claims`)."""

    __slots__ = ("_lock", "count", "running", "tracks_running")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.running = 0  # updates holding a slot (when a front end tracks them)
        self.tracks_running = False

    def take(self, wanted: int, free: Callable[[], int], *, own: int = 0) -> int:
        """Reserve ``own`` (the claims of updates that hold a slot: they never need budget)
        and up to ``wanted`` of ``free()`` (the budget, reservations already counted), as
        one step; returns how many of ``wanted``."""
        with self._lock:
            self.count += own
            granted = max(0, min(int(wanted), free()))
            self.count += granted
            return granted

    def started(self) -> None:
        """An update took a slot (it holds, or is about to take, its own claim)."""
        with self._lock:
            self.running += 1

    def ended(self) -> None:
        """An update left its slot."""
        with self._lock:
            self.running -= 1

    def give_back(self, count: int) -> None:
        """End a reservation of ``count``."""
        with self._lock:
            self.count -= count
