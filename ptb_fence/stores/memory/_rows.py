"""The row value a MemoryUpdateStore holds, and its claim ids."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Optional

__all__ = ["Row", "new_claim_id"]


@dataclass
class Row:
    """One stored update (the columns of the store table, plus the claiming instance)."""

    update_id: int
    body: str
    state: str
    attempts: int
    due_at: Optional[int]
    received_at: int
    settled_at: Optional[int] = None
    error: Optional[str] = None
    claim_id: Optional[str] = None
    fingerprint: Optional[str] = None
    instance: Optional[str] = None
    chat_key: Optional[int] = None


def new_claim_id() -> str:
    """A fresh claim id."""
    return uuid.uuid4().hex
