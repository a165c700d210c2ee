"""The row value a MemoryUpdateStore holds, and its claim ids."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Optional

__all__ = ["CallRow", "Row", "new_claim_id"]


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


@dataclass
class CallRow:
    """One stored outbox call (the columns of the outbox table)."""

    call_id: int
    update_id: int
    attempt: int
    claim_id: str
    seq: int
    chat_key: Optional[int]
    method: str
    params_json: str
    at_most_once: bool
    state: str
    tries: int
    due_at: int
    created_at: int
    sent_at: Optional[int] = None
    sender: Optional[str] = None
    error: Optional[str] = None
    result_json: Optional[str] = None
    acknowledged: bool = False
