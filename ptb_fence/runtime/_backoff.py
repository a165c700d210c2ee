"""Backoff: how long a background loop waits after a store error before it tries again."""

from __future__ import annotations

import random

__all__ = ["BACKOFF_FIRST", "BACKOFF_LAST", "Backoff"]

BACKOFF_FIRST = 0.1
"""Seconds waited after the first error."""

BACKOFF_LAST = 0.8
"""The longest wait: short enough that work resumes within a second of the store answering
again (a refused connection costs microseconds, so a try per loop and second is no load)."""


class Backoff:
    """The waits of one loop between store errors: :data:`BACKOFF_FIRST`, doubling to
    :data:`BACKOFF_LAST`, each with jitter (half to all of it, so the loops of many
    processes do not try in step), back to the first once a call answered.

    Args:
        first: The first wait (seconds).
        last: The longest wait (seconds).
    """

    __slots__ = ("_first", "_last", "_next", "_random")

    def __init__(self, first: float = BACKOFF_FIRST, last: float = BACKOFF_LAST) -> None:
        self._first = first
        self._last = last
        self._next = first
        self._random = random.Random()

    def failed(self) -> float:
        """A call failed: the seconds to wait before the next try."""
        wait = self._next
        self._next = min(self._last, wait * 2)
        return wait * self._random.uniform(0.5, 1.0)

    def answered(self) -> None:
        """A call answered: the next error waits the first wait again."""
        self._next = self._first
