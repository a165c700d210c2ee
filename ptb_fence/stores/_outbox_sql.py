"""The outbox (:class:`~ptb_fence.OutboxStore`) for the SQLite and PostgreSQL stores.

It holds the names of the table ``<table>_outbox`` and its indexes, and the sender tokens.
It also holds the parameters and rows of the statements. Those are in each dialect's
``outbox.sql``, where the rules are written.

A sender's token ends with ``@<instance>``, its store instance. When ``take_over_dead``
takes that instance over, its process is provably dead. Its calls are then claimable at once.
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ptb_fence._values import (
    OUTBOX_STATES,
    AttemptEffects,
    AttemptIdentity,
    CallClaim,
    OutboxCall,
    OutboxEntry,
)

__all__ = [
    "call_params",
    "counts_of",
    "effects_params",
    "entry_of",
    "outbox_index_name",
    "outbox_table_name",
    "sender_pattern",
    "sender_token",
]


def outbox_table_name(table: str) -> str:
    """The outbox table of the update table ``table``: ``<table>_outbox``.

    When that would be longer than 63 characters, the name is derived from a digest.
    PostgreSQL would truncate a longer name silently. Two long names with a common prefix
    would then share one table."""
    name = f"{table}_outbox"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(table.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_outbox"


def outbox_index_name(outbox: str, suffix: str) -> str:
    """The name of the outbox ``outbox``'s index ``suffix`` (at most 63 characters)."""
    name = f"{outbox}_{suffix}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(outbox.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_{suffix}"


def sender_pattern(instance: str) -> str:
    """The ``LIKE`` pattern (escape ``!``) of every sender token of store instance
    ``instance`` (see :func:`sender_token`)."""
    escaped = instance.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return "%@" + escaped


def sender_token(base: str, instance: Optional[str]) -> str:
    """A sender token: ``base`` (``host:pid:random``), with ``@<instance>`` when the
    sender's process holds a store liveness instance (its calls are then taken over with
    its updates when the process dies)."""
    return base if not instance else f"{base}@{instance}"


def call_params(
    identity: AttemptIdentity, call: OutboxCall, at: int, claim: Optional[CallClaim] = None
) -> Dict[str, Any]:
    """The parameters of the ``outbox_insert`` statement for one call (``claim``: inserted
    claimed by its sender when the chat has no unsent call)."""
    return {
        "claim": claim is not None,
        "sender": None if claim is None else claim.sender,
        "lease_until": int(at) if claim is None else int(claim.lease_until),
        "update_id": identity.update_id,
        "attempt": identity.attempt,
        "claim_id": identity.claim_id,
        "seq": int(call.seq),
        "chat_key": None if call.chat_key is None else int(call.chat_key),
        "method": call.method,
        "params": call.params_json,
        "at_most_once": bool(call.at_most_once),
        "at": int(at),
    }


def effects_params(
    identity: AttemptIdentity, effects: Optional[AttemptEffects], at: int
) -> List[Dict[str, Any]]:
    """The insert parameters of every call of ``effects`` (none for :obj:`None`)."""
    if effects is None:
        return []
    claim = effects.claim
    limit = 0 if claim is None else max(int(claim.limit), 0)
    return [
        call_params(identity, call, at, claim if i < limit else None)
        for i, call in enumerate(effects.calls)
    ]


def _optional_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def entry_of(row: Sequence[Any]) -> OutboxEntry:
    """The :class:`~ptb_fence.OutboxEntry` of a row of the outbox's columns in its field order
    (plain ints and bools whatever the driver gives)."""
    (call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
     state, tries, due_at, created_at, sent_at, error, result, acknowledged) = row
    return OutboxEntry(
        int(call_id), int(update_id), int(attempt), str(claim_id), int(seq),
        _optional_int(chat_key), str(method), str(params), bool(at_most_once), str(state),
        int(tries), int(due_at), int(created_at), _optional_int(sent_at), error, result,
        bool(acknowledged),
    )


def counts_of(rows: Sequence[Sequence[Any]]) -> Dict[str, int]:
    """``outbox_counts()`` from the rows of the ``outbox_counts`` statement."""
    counts = {state: 0 for state in OUTBOX_STATES}
    counts["failed_acknowledged"] = 0
    for state, acknowledged, count in rows:
        key = "failed_acknowledged" if state == "failed" and acknowledged else str(state)
        counts[key] = counts.get(key, 0) + int(count)
    return counts
