"""The rules every store applies to broadcasts, before any SQL: checked names, states and
chat ids, and the table names of the SQL stores."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from ptb_fence._values import BROADCAST_STATES, Recipient, RecipientOutcome, StoredBroadcast

__all__ = ["NAME_LIMIT", "broadcast_of", "broadcast_tables", "recipients_of", "check_chat_ids", "check_name", "check_outcomes",
           "check_params", "check_state"]

NAME_LIMIT = 200
"""The longest broadcast name, in characters."""


def check_name(name: object) -> str:
    """``name`` if it is a broadcast name, else :exc:`ValueError`."""
    if not isinstance(name, str) or not 0 < len(name) <= NAME_LIMIT:
        raise ValueError(f"a broadcast's name is 1 to {NAME_LIMIT} characters, got {name!r}")
    return name


def check_state(state: object) -> str:
    """``state`` if it is one of :data:`~ptb_fence.BROADCAST_STATES`, else :exc:`ValueError`."""
    if state not in BROADCAST_STATES:
        raise ValueError(f"a broadcast's state is one of {', '.join(BROADCAST_STATES)}, "
                         f"got {state!r}")
    return str(state)


def check_params(params_json: object) -> str:
    """``params_json`` if it is the text of a JSON object without ``chat_id``."""
    if not isinstance(params_json, str):
        raise ValueError(f"a broadcast's parameters are JSON text, got {params_json!r}")
    params = json.loads(params_json)
    if not isinstance(params, dict) or "chat_id" in params:
        raise ValueError("a broadcast's parameters are a JSON object without chat_id")
    return params_json


def check_chat_ids(chat_ids: Sequence[object]) -> List[int]:
    """The chat ids as ints, in order, each once."""
    seen = set()
    out = []
    for chat in chat_ids:
        if isinstance(chat, bool) or not isinstance(chat, int):
            raise ValueError(f"a recipient is an int chat id, got {chat!r}")
        if chat not in seen:
            seen.add(chat)
            out.append(chat)
    return out


def check_outcomes(outcomes: Sequence[object]) -> List[RecipientOutcome]:
    """The outcomes, each a :class:`~ptb_fence.RecipientOutcome`."""
    for outcome in outcomes:
        if not isinstance(outcome, RecipientOutcome):
            raise TypeError(f"settle_recipients takes RecipientOutcome values, got {outcome!r}")
    return list(outcomes)  # type: ignore[arg-type]


def _derived(table: str, suffix: str) -> str:
    name = f"{table}_{suffix}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(f"{table}/{suffix}".encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_{suffix}"


def broadcast_tables(table: str) -> Dict[str, str]:
    """The names of the broadcast tables and index of the update table ``table``:
    ``<table>_broadcasts``, ``<table>_recipients`` and ``<table>_recipients_due_idx``, each
    derived from a digest when it would be longer than 63 characters (PostgreSQL would
    truncate it silently)."""
    return {
        "broadcasts": _derived(table, "broadcasts"),
        "recipients": _derived(table, "recipients"),
        "recipients_due_idx": _derived(table, "recipients_due_idx"),
    }


def broadcast_of(row: Sequence[Any]) -> StoredBroadcast:
    """A :class:`~ptb_fence.StoredBroadcast` from a row of ``broadcast_list``: id, name,
    method, parameters, state, created_at and the six counts."""
    return StoredBroadcast(int(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]),
                           int(row[5]), *(int(count) for count in row[6:12]))


def recipients_of(claimed: Sequence[Sequence[Any]],
                  calls: Mapping[int, Tuple[str, str]]) -> List[Recipient]:
    """Claimed ``(broadcast_id, chat_id, tries)`` rows as recipients, by broadcast and chat
    id, with each broadcast's ``(method, params)`` from ``calls``."""
    out = []
    for broadcast_id, chat_id, tries in sorted((int(a), int(b), int(c)) for a, b, c in claimed):
        method, params = calls[broadcast_id]
        out.append(Recipient(broadcast_id, chat_id, method, params, tries))
    return out
