"""MemoryBroadcasts: the broadcasts of a MemoryUpdateStore, in dicts under a lock."""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence

from ptb_fence._values import (
    RECIPIENT_STATES,
    BroadcastWrite,
    Recipient,
    RecipientOutcome,
    StoredBroadcast,
)
from ptb_fence.stores._broadcasts import (
    check_chat_ids,
    check_name,
    check_outcomes,
    check_params,
    check_state,
)

__all__ = ["MemoryBroadcasts"]


class _Row:
    __slots__ = ("due_at", "error", "sender", "state", "tries")

    def __init__(self, due_at: int) -> None:
        self.state = "pending"
        self.due_at = due_at
        self.tries = 0
        self.sender: Optional[str] = None
        self.error: Optional[str] = None


class MemoryBroadcasts:
    """The broadcasts part of the contract (see :class:`ptb_fence.BatchStore`) in memory."""

    __slots__ = ("_broadcasts", "_by_name", "_lock", "_recipients")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._broadcasts: Dict[int, StoredBroadcast] = {}
        self._by_name: Dict[str, int] = {}
        self._recipients: Dict[int, Dict[int, _Row]] = {}

    def start_broadcast(self, name: str, method: str, params_json: str,
                        at: int) -> StoredBroadcast:
        """See :meth:`ptb_fence.BatchStore.start_broadcast`."""
        check_name(name)
        check_params(params_json)
        with self._lock:
            found = self._by_name.get(name)
            if found is None:
                found = max(self._broadcasts, default=0) + 1
                self._broadcasts[found] = StoredBroadcast(found, name, str(method), params_json,
                                                          "active", int(at))
                self._by_name[name] = found
                self._recipients[found] = {}
            return self._counted(found)

    def add_recipients(self, broadcast_id: int, chat_ids: Sequence[int], at: int) -> int:
        """See :meth:`ptb_fence.BatchStore.add_recipients`."""
        chats = check_chat_ids(chat_ids)
        with self._lock:
            rows = self._recipients.get(int(broadcast_id))
            if rows is None:
                raise ValueError(f"there is no broadcast {broadcast_id}")
            new = 0
            for chat in chats:
                if chat not in rows:
                    rows[chat] = _Row(int(at))
                    new += 1
            return new

    def write(self, writes: Sequence[BroadcastWrite], at: int) -> None:
        """The broadcasts a landed completion started. See :class:`ptb_fence.BroadcastWrite`."""
        for write in writes:
            started = self.start_broadcast(write.name, write.method, write.params_json, at)
            if (started.method, started.params_json) == (write.method, write.params_json):
                self.add_recipients(started.broadcast_id, write.chat_ids, at)

    def claim_recipients(self, sender: str, *, now: int, lease_until: int,
                         limit: int) -> List[Recipient]:
        """See :meth:`ptb_fence.BatchStore.claim_recipients`."""
        out: List[Recipient] = []
        with self._lock:
            for broadcast_id in sorted(self._broadcasts):
                broadcast = self._broadcasts[broadcast_id]
                if broadcast.state != "active":
                    continue
                rows = self._recipients[broadcast_id]
                for chat in sorted(rows):
                    if len(out) >= limit:
                        return out
                    row = rows[chat]
                    if ((row.state == "pending" and row.due_at <= now)
                            or (row.state == "sending" and row.due_at < now)):
                        row.state, row.due_at, row.sender = "sending", int(lease_until), sender
                        row.tries += 1
                        out.append(Recipient(broadcast_id, chat, broadcast.method,
                                             broadcast.params_json, row.tries))
        return out

    def settle_recipients(self, sender: str, outcomes: Sequence[RecipientOutcome],
                          at: int) -> List[bool]:
        """See :meth:`ptb_fence.BatchStore.settle_recipients`."""
        landed = []
        with self._lock:
            for outcome in check_outcomes(outcomes):
                row = self._recipients.get(outcome.broadcast_id, {}).get(outcome.chat_id)
                if row is None or row.state != "sending" or row.sender != sender:
                    landed.append(False)
                    continue
                row.state, row.error = outcome.state, outcome.error
                row.due_at = int(outcome.due_at) if outcome.state == "pending" else int(at)
                row.sender = None
                landed.append(True)
        return landed

    def set_broadcast_state(self, name: str, state: str,
                            at: int) -> Optional[StoredBroadcast]:
        """See :meth:`ptb_fence.BatchStore.set_broadcast_state`."""
        check_state(state)
        with self._lock:
            found = self._by_name.get(name)
            if found is None:
                return None
            broadcast = self._broadcasts[found]
            if broadcast.state != "cancelled":
                self._broadcasts[found] = _with_state(broadcast, state)
                if state == "cancelled":
                    for row in self._recipients[found].values():
                        if row.state == "pending":
                            row.state, row.due_at = "cancelled", int(at)
            return self._counted(found)

    def list_broadcasts(self, name: Optional[str] = None) -> List[StoredBroadcast]:
        """See :meth:`ptb_fence.BatchStore.list_broadcasts`."""
        with self._lock:
            ids = sorted(self._broadcasts) if name is None else (
                [self._by_name[name]] if name in self._by_name else [])
            return [self._counted(found) for found in ids]

    def prune(self, before: int) -> None:
        """Forget the broadcasts started before ``before`` that nobody is sent to any more."""
        with self._lock:
            for found, broadcast in list(self._broadcasts.items()):
                rows = self._recipients[found]
                if broadcast.created_at < before and not any(
                        row.state in ("pending", "sending") for row in rows.values()):
                    del self._broadcasts[found], self._recipients[found]
                    del self._by_name[broadcast.name]

    def _counted(self, found: int) -> StoredBroadcast:
        counts: Dict[str, int] = dict.fromkeys(RECIPIENT_STATES, 0)
        for row in self._recipients[found].values():
            counts[row.state] += 1
        b = self._broadcasts[found]
        return StoredBroadcast(b.broadcast_id, b.name, b.method, b.params_json, b.state,
                               b.created_at, **counts)


def _with_state(broadcast: StoredBroadcast, state: str) -> StoredBroadcast:
    b = broadcast
    return StoredBroadcast(b.broadcast_id, b.name, b.method, b.params_json, state, b.created_at)
