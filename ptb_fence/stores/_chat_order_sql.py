"""The chat-order predicates shared by the SQLite and PostgreSQL stores
(:class:`~ptb_fence.ChatOrderedUpdateStore`); each dialect's statements are in its ``_sql``.

A row is *in turn* at ``now`` when no other row of its chat (same ``chat_key``) is unsettled
(``pending``, ``processing``, ``failed``) with a smaller ``update_id``, and none is
``processing`` with a live lease (``due_at >= now``); a row without ``chat_key`` always is.
The predicate is part of the one conditional statement that claims or lists, and runs on a
partial index of the unsettled rows, ``(chat_key, update_id) WHERE state IN ('pending',
'processing', 'failed')``, so it reads only the waiting rows of one chat.

Table names are validated before they reach this module and always double-quoted.
"""

from __future__ import annotations

import hashlib

__all__ = [
    "UNSETTLED",
    "chat_index_name",
    "due_predicate",
    "in_turn",
]

UNSETTLED = "('pending', 'processing', 'failed')"
"""The states of a row that holds its chat."""


def chat_index_name(table: str) -> str:
    """The name of the chat-order index of ``table`` (at most 63 characters)."""
    name = f"{table}_chat_key_idx"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(table.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_chat_key_idx"


def in_turn(row: str, table: str, now: str) -> str:
    """The predicate "``row`` (an alias or the quoted table) is in turn at ``now`` (a
    placeholder)", one ``NOT EXISTS`` on the partial chat index."""
    return f"""({row}.chat_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {table} AS o
        WHERE o.chat_key = {row}.chat_key AND o.state IN {UNSETTLED}
          AND o.update_id <> {row}.update_id
          AND (o.update_id < {row}.update_id
               OR (o.state = 'processing' AND o.due_at >= {now}))))"""


def due_predicate(row: str, pending: str, now: str) -> str:
    # as the stores' due: pending after the grace period (or released: a claim id), failed
    # and due, processing with a lapsed lease
    return f"""(({row}.state = 'pending' AND ({row}.received_at <= {pending}
                                          OR {row}.claim_id IS NOT NULL))
        OR ({row}.state = 'failed' AND {row}.due_at <= {now})
        OR ({row}.state = 'processing' AND {row}.due_at < {now}))"""
