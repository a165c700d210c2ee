"""ChatOrderPort: the chat-order operations of :class:`~ptb_fence.runtime._port.StorePort`.

The store's :class:`~ptb_fence.ChatOrderedUpdateStore` methods, called as they are: there is
no fallback (``strict_chat_order`` refuses a store without them, in the port's constructor,
the one place that probes).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from ptb_fence.contract import ChatKey, ChatRow
from ptb_fence._values import AttemptIdentity, StoredUpdate

__all__ = ["ChatOrderPort"]


class ChatOrderPort:
    """A mixin of :class:`~ptb_fence.runtime._port.StorePort`."""

    __slots__ = ()

    store: Any
    _chat_order: bool
    _chat_keying: bool

    @property
    def orders_chats(self) -> bool:
        """:obj:`bool`: The store keeps chat order (``add_many_in_chats``,
        ``claim_in_chat_order``, ``due_in_chat_order``)."""
        return self._chat_order

    @property
    def keys_chats(self) -> bool:
        """:obj:`bool`: The store can key rows recorded without a chat key
        (``unkeyed_in_chats``, ``set_chat_keys``)."""
        return self._chat_keying

    def unkeyed_in_chats(self, *, after_update_id: Optional[int], limit: int) -> List[StoredUpdate]:
        """``store.unkeyed_in_chats``: unsettled rows without a chat key, by ``update_id``."""
        return list(self.store.unkeyed_in_chats(after_update_id=after_update_id, limit=limit))

    def set_chat_keys(self, keys: Sequence[ChatKey]) -> int:
        """``store.set_chat_keys``: key the rows that still have none (one commit)."""
        return int(self.store.set_chat_keys(list(keys)))

    def add_many_in_chats(self, rows: Sequence[ChatRow]) -> List[bool]:
        """``store.add_many_in_chats``: record rows with their chat keys (one commit)."""
        return [bool(added) for added in self.store.add_many_in_chats(list(rows))]

    def claim_in_chat_order(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """``store.claim_in_chat_order``: claim only when the row is its chat's turn."""
        identity: Optional[AttemptIdentity] = self.store.claim_in_chat_order(
            update_id,
            now=now,
            lease_until=lease_until,
            max_attempts=max_attempts,
            durable_exhaustion=durable_exhaustion,
        )
        return identity

    def due_in_chat_order(
        self, *, now: int, pending_before: int, limit: int, chat_key: Optional[int] = None
    ) -> List[StoredUpdate]:
        """``store.due_in_chat_order``: due rows that are their chat's turn (with
        ``chat_key``: of that chat only)."""
        rows = self.store.due_in_chat_order(
            now=now, pending_before=pending_before, limit=limit, chat_key=chat_key
        )
        return list(rows)
