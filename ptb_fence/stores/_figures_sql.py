"""The row of ``figures()`` (:class:`~ptb_fence.BatchStore`) as values.

The SQLite and PostgreSQL stores read it with the ``figures`` statement of their
``updates.sql``. :func:`figures_of` says why that statement stays cheap.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ptb_fence._values import StoreFigures

__all__ = ["figures_of"]


def _time(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def figures_of(row: Sequence[Any]) -> StoreFigures:
    """The :class:`~ptb_fence.StoreFigures` of the one row ``figures`` returns.

    Each value is a plain :obj:`int` (or :obj:`None`), whatever integer type the driver gives.

    The runtime's sweep reads the row every few seconds. The table may hold a long settled
    history, since completed rows stay until they are pruned. So every part of the statement
    is restricted to the rows that wait, through the indexes the schema already has:

    * The unsettled rows by ``state IN ('pending', 'processing', 'failed')`` use the
      ``(state, due_at)`` index, or the partial chat index, whose predicate is exactly that.
    * The unacknowledged exhaustions by ``state = 'abandoned'`` use the ``(state, due_at)``
      index. It gives abandoned rows only, then ``settled_at IS NULL`` is checked on each.
    * The held chat comes from the unsettled rows with a chat key. It uses the partial chat
      index ``(chat_key, update_id) WHERE state IN (…)`` in chat-key order, one group per chat.

    One ``SELECT`` gives one consistent view of the four figures (one snapshot)."""
    unsettled, oldest, waiting, exhausted, chat, since = row
    return StoreFigures(
        unsettled=int(unsettled),
        oldest_unsettled_received_at=_time(oldest),
        exhaustions_waiting=int(waiting),
        oldest_exhaustion_at=_time(exhausted),
        held_chat=_time(chat),
        held_chat_since=_time(since),
    )
