"""The name of the chat-order index (:class:`~ptb_fence.BatchStore`).

The SQLite and PostgreSQL stores share it. The statements that read it are in each dialect's
``chat.sql``, where the rule of a row's turn is written.
"""

from __future__ import annotations

import hashlib

__all__ = ["chat_index_name"]


def chat_index_name(table: str) -> str:
    """The name of the chat-order index of ``table`` (at most 63 characters)."""
    name = f"{table}_chat_key_idx"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(table.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_chat_key_idx"
