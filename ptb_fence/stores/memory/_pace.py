"""MemoryPace: the pace buckets of a MemoryUpdateStore, and of a process whose store has none."""

from __future__ import annotations

import threading
from typing import Dict, List, Sequence, Tuple

from ptb_fence._values import PaceBucket
from ptb_fence.stores._pace import PaceRow, check_wants, grant, hold

__all__ = ["MemoryPace"]


class MemoryPace:
    """Pace buckets in a dict under a lock. The rules are :func:`ptb_fence.stores._pace.grant`."""

    __slots__ = ("_lock", "_rows")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: Dict[str, PaceRow] = {}

    def take_send_slots(
        self, wants: Sequence[Sequence[PaceBucket]], *, now: int, horizon_ms: int
    ) -> List[int]:
        """See :meth:`ptb_fence.BatchStore.take_send_slots`."""
        checked = check_wants(wants)
        with self._lock:
            times, changed = grant(self._rows, checked, now=int(now), horizon_ms=int(horizon_ms))
            self._rows.update(changed)
        return times

    def hold_sends(self, holds: Sequence[Tuple[str, int]]) -> None:
        """See :meth:`ptb_fence.BatchStore.hold_sends`."""
        with self._lock:
            for key, until in holds:
                self._rows[str(key)] = hold(self._rows.get(str(key), (0, 0)), int(until))

    def prune(self, before: int) -> None:
        """Forget the buckets whose next time and hold are both before ``before``."""
        with self._lock:
            for key in [k for k, (tat, held) in self._rows.items()
                        if tat < before and held < before]:
                del self._rows[key]
