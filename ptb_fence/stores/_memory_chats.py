"""Chat order of a MemoryUpdateStore (:class:`~ptb_fence.ChatOrderedUpdateStore`): the
executable statement of "in turn"."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from ptb_fence._protocols import ChatKey
from ptb_fence._values import AttemptIdentity, StoredUpdate
from ptb_fence.stores._memory_rows import Row
from ptb_fence.stores._names import validate_update_id

__all__ = ["MemoryChatOrder", "UNSETTLED"]

UNSETTLED = ("pending", "processing", "failed")
"""The states of a row that holds its chat (completed and abandoned rows release it)."""


class MemoryChatOrder:
    """``add_many_in_chats``, ``claim_in_chat_order`` and ``due_in_chat_order`` of
    :class:`~ptb_fence.MemoryUpdateStore` (a mixin), and ``unkeyed_in_chats`` and
    ``set_chat_keys`` for the rows recorded without a chat key."""

    __slots__ = ()

    _lock: "threading.RLock"
    _rows: Dict[int, Row]

    if TYPE_CHECKING:  # provided by MemoryUpdateStore

        def _admit(self, update_id: int, body: str) -> Tuple[bool, Optional[str]]: ...

        def _take(
            self, update_id: int, now: int, lease_until: int, max_attempts: int, durable: bool
        ) -> Optional[Row]: ...

        def _listed_due(self, row: Row, now: int, pending_before: int) -> bool: ...

    def _blockers(self, now: int) -> Dict[int, Tuple[int, int]]:
        """Per chat key: its lowest unsettled ``update_id`` and the id of a row processing
        with a live lease (``-1`` if none)."""
        chats: Dict[int, Tuple[int, int]] = {}
        for row in self._rows.values():
            if row.chat_key is None or row.state not in UNSETTLED:
                continue
            low, live = chats.get(row.chat_key, (row.update_id, -1))
            low = min(low, row.update_id)
            if row.state == "processing" and row.due_at is not None and row.due_at >= now:
                live = row.update_id
            chats[row.chat_key] = (low, live)
        return chats

    def _in_turn(self, row: Row, now: int) -> bool:
        """No other row of the chat unsettled below ``row``, none with a live lease."""
        if row.chat_key is None:
            return True
        for other in self._rows.values():
            if (
                other.chat_key != row.chat_key
                or other.update_id == row.update_id
                or other.state not in UNSETTLED
            ):
                continue
            if other.update_id < row.update_id:
                return False
            if other.state == "processing" and other.due_at is not None and other.due_at >= now:
                return False
        return True

    def add_many_in_chats(
        self, rows: Sequence[Tuple[int, str, int, Optional[int]]]
    ) -> List[bool]:
        """Insert ``(update_id, body, received_at, chat_key)`` rows as pending, recording each
        chat key (see :class:`ptb_fence.ChatOrderedUpdateStore`); per row whether it was
        inserted (the rules of ``add``)."""
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        with self._lock:
            result: List[bool] = []
            for update_id, body, received_at, chat_key in rows:
                admitted, fingerprint = self._admit(update_id, body)
                if admitted:
                    self._rows[update_id] = Row(
                        update_id, body, "pending", 0, received_at, received_at,
                        fingerprint=fingerprint,
                        chat_key=None if chat_key is None else int(chat_key),
                    )
                result.append(admitted)
            return result

    def claim_in_chat_order(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """As ``claim_owned``, only when the row is in turn at ``now``."""
        with self._lock:
            row = self._rows.get(update_id)
            if row is None or not self._in_turn(row, now):
                return None
            taken = self._take(update_id, now, lease_until, max_attempts, durable_exhaustion)
            if taken is None or taken.claim_id is None:
                return None
            return AttemptIdentity(update_id, taken.attempts, taken.claim_id)

    def due_in_chat_order(
        self, *, now: int, pending_before: int, limit: int, chat_key: Optional[int] = None
    ) -> List[StoredUpdate]:
        """As ``due``, only rows in turn at ``now`` (with ``chat_key``: of that chat)."""
        with self._lock:
            result: List[StoredUpdate] = []
            if limit <= 0:
                return result
            blockers = self._blockers(now)
            for update_id in sorted(self._rows):
                row = self._rows[update_id]
                if chat_key is not None and row.chat_key != chat_key:
                    continue
                if not self._listed_due(row, now, pending_before):
                    continue
                if row.chat_key is not None:
                    low, live = blockers[row.chat_key]
                    if low != update_id or live not in (-1, update_id):
                        continue
                result.append(StoredUpdate(update_id, row.body))
                if len(result) >= limit:
                    break
            return result

    def unkeyed_in_chats(
        self, *, after_update_id: Optional[int] = None, limit: int
    ) -> List[StoredUpdate]:
        """Unsettled rows without a chat key, by ``update_id``, after ``after_update_id``."""
        with self._lock:
            after = -1 if after_update_id is None else after_update_id
            rows = sorted(
                update_id
                for update_id, row in self._rows.items()
                if row.chat_key is None and row.state in UNSETTLED and update_id > after
            )[: max(int(limit), 0)]
            return [StoredUpdate(update_id, self._rows[update_id].body) for update_id in rows]

    def set_chat_keys(self, keys: Sequence[ChatKey]) -> int:
        """For ``(update_id, body, chat_key)``: record the chat key of the row if it has none,
        is unsettled and holds exactly ``body``. Returns how many were set."""
        done = 0
        with self._lock:
            for update_id, body, chat_key in keys:
                row = self._rows.get(update_id)
                if (
                    row is not None
                    and row.chat_key is None
                    and row.state in UNSETTLED
                    and row.body == body
                ):
                    row.chat_key = int(chat_key)
                    done += 1
        return done
