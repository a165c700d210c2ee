"""The statement behind ``figures()`` (:class:`~ptb_fence.FiguresStore`), shared by the SQLite
and PostgreSQL stores: plain SQL without parameters, the same in both dialects.

The runtime's sweep reads it every few seconds on a table that may hold a long settled history
(completed rows until they are pruned), so every part of it is restricted to the rows that
wait, through the indexes the schema already has:

* the unsettled rows by ``state IN ('pending', 'processing', 'failed')``: the ``(state,
  due_at)`` index, or the partial chat index, whose predicate is exactly that;
* the unacknowledged exhaustions by ``state = 'abandoned'``: the ``(state, due_at)`` index
  (abandoned rows only, then ``settled_at IS NULL`` on each);
* the held chat by the unsettled rows with a chat key: the partial chat index ``(chat_key,
  update_id) WHERE state IN (…)`` in chat-key order, one group per chat.

One ``SELECT`` gives one consistent view of the four figures (one snapshot).

Table names are validated before they reach this module and always double-quoted.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ptb_fence._values import StoreFigures
from ptb_fence.stores._chat_order_sql import UNSETTLED

__all__ = ["figures_of", "figures_sql"]


def figures_sql(table: str, *, chat_keys: bool = True) -> str:
    """The one ``SELECT`` of ``figures()`` for ``table`` (already quoted).

    It returns one row: ``unsettled, oldest_unsettled_received_at, exhaustions_waiting,
    oldest_exhaustion_at, held_chat, held_chat_since`` (the last two NULL when no chat key is
    carried by two unsettled rows). With ``chat_keys=False`` (a PostgreSQL table managed with
    ``create_table=False`` that has no ``chat_key`` column yet) the last two are always NULL.
    """
    if chat_keys:
        # of the chats with two or more unsettled rows, the one whose oldest unsettled row is
        # the oldest (ties: the smaller chat key)
        held = f"""
    SELECT chat_key, MIN(received_at) AS since FROM {table}
    WHERE chat_key IS NOT NULL AND state IN {UNSETTLED}
    GROUP BY chat_key
    HAVING COUNT(*) >= 2
    ORDER BY since, chat_key
    LIMIT 1"""
    else:
        held = "SELECT CAST(NULL AS BIGINT) AS chat_key, CAST(NULL AS BIGINT) AS since WHERE 1 = 0"
    return f"""
SELECT u.n, u.oldest, e.n, e.oldest, h.chat_key, h.since
FROM (
    SELECT COUNT(*) AS n, MIN(received_at) AS oldest FROM {table}
    WHERE state IN {UNSETTLED}
) AS u
CROSS JOIN (
    SELECT COUNT(*) AS n, MIN(due_at) AS oldest FROM {table}
    WHERE state = 'abandoned' AND settled_at IS NULL
) AS e
LEFT JOIN ({held}
) AS h ON 1 = 1"""


def _time(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def figures_of(row: Sequence[Any]) -> StoreFigures:
    """The :class:`~ptb_fence.StoreFigures` of the one row :func:`figures_sql` returns, each
    value a plain :obj:`int` (or :obj:`None`) whatever integer type the driver gives."""
    unsettled, oldest, waiting, exhausted, chat, since = row
    return StoreFigures(
        unsettled=int(unsettled),
        oldest_unsettled_received_at=_time(oldest),
        exhaustions_waiting=int(waiting),
        oldest_exhaustion_at=_time(exhausted),
        held_chat=_time(chat),
        held_chat_since=_time(since),
    )
