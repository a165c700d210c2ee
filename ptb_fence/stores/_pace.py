"""Store-wide pacing (the declared part ``pacing``): the buckets' arithmetic and table name.

The table ``<table>_pace`` holds one row per bucket: when its next send is due without a
burst (``tat``, the theoretical arrival time) and the end of a hold on it. Every store runs the
same arithmetic, :func:`grant`, on the rows it read and locked in one transaction. So every
process of the bot shares one pace.
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

from ptb_fence._values import PaceBucket

__all__ = ["PaceRow", "check_wants", "grant", "hold", "pace_keys", "pace_rows",
           "pace_table_name"]

PaceRow = Tuple[int, int]
"""A bucket's row: ``(tat, held_until)``, epoch milliseconds."""


def pace_table_name(table: str) -> str:
    """The pace table of the update table ``table``: ``<table>_pace``.

    When that would be longer than 63 characters, the name is derived from a digest.
    """
    name = f"{table}_pace"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(table.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_pace"


def check_wants(wants: Sequence[Sequence[PaceBucket]]) -> List[Tuple[PaceBucket, ...]]:
    """The wants as tuples, refused before any write when one is not a bucket.

    Raises:
        TypeError: An item of a want is not a :class:`~ptb_fence.PaceBucket`.
    """
    checked = []
    for want in wants:
        buckets = tuple(want)
        for bucket in buckets:
            if not isinstance(bucket, PaceBucket):
                raise TypeError(f"a send's buckets are PaceBucket values, got {bucket!r}")
        checked.append(buckets)
    return checked


def pace_keys(wants: Sequence[Sequence[PaceBucket]]) -> List[str]:
    """The distinct keys of ``wants``, sorted: the order rows are locked in."""
    return sorted({bucket.key for want in wants for bucket in want})


def pace_rows(rows: Iterable[Sequence[Any]]) -> Dict[str, PaceRow]:
    """The buckets of rows read as ``(key, tat, held_until)``."""
    return {str(key): (int(tat), int(held)) for key, tat, held in rows}


def grant(
    rows: Mapping[str, PaceRow], wants: Sequence[Sequence[PaceBucket]], *, now: int,
    horizon_ms: int,
) -> Tuple[List[int], Dict[str, PaceRow]]:
    """Decide the slots of ``wants`` in order, from the rows as read.

    A send may go at the latest of ``now``, each bucket's ``tat - tolerance`` and each
    bucket's hold. When that is at most ``horizon_ms`` away, the slot is granted: each of its
    buckets moves on by its interval from then. Otherwise nothing moves. The time says when
    to ask again.

    Returns:
        The time of each want, and the rows that changed.
    """
    state: Dict[str, PaceRow] = dict(rows)
    changed: Dict[str, PaceRow] = {}
    times: List[int] = []
    limit = now + horizon_ms  # a negative horizon takes nothing: it reads
    for want in wants:
        at = now
        for bucket in want:
            tat, held = state.get(bucket.key, (0, 0))
            at = max(at, tat - bucket.tolerance_ms, held)
        if at <= limit:
            for bucket in want:
                tat, held = state.get(bucket.key, (0, 0))
                state[bucket.key] = changed[bucket.key] = (max(tat, at) + bucket.interval_ms,
                                                           held)
        times.append(at)
    return times, changed


def hold(row: PaceRow, until: int) -> PaceRow:
    """``row`` held until ``until`` at least."""
    return (row[0], max(row[1], until))
