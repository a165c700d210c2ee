"""ChatTurns: the runtime's per-chat order (:class:`~ptb_fence.runtime._chats.ChatOrder`)
for asyncio tasks, without holding a concurrency slot while waiting."""

from __future__ import annotations

import asyncio
from typing import Any, Hashable

from ptb_fence.runtime._chats import ChatOrder

__all__ = ["ChatTurns"]


class ChatTurns:
    """Lets one task per chat key run at a time. Waiters are woken in ``update_id`` order.

    Used on the event loop thread only. A turn is handed on by resolving the waiter's future.
    A waiter cancelled before its turn leaves the queue, one cancelled as its turn came passes
    it on.
    """

    __slots__ = ("_order",)

    def __init__(self) -> None:
        self._order = ChatOrder(self._start)

    def _start(self, key: Hashable, update_id: int, future: Any) -> None:
        if future.done():  # its task was cancelled meanwhile: pass the turn on
            self._order.done(key, update_id)
        else:
            future.set_result(None)

    async def acquire(self, key: Hashable, update_id: int) -> bool:
        """Wait for ``key``'s turn. Returns :obj:`False` (no turn taken) if ``update_id`` is already
        waiting or running here."""
        future: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        if not self._order.submit(key, update_id, future):
            return False
        try:
            await future
        except asyncio.CancelledError:
            handed = future.done() and not future.cancelled()
            if not self._order.withdraw(key, update_id) and handed:
                self._order.done(key, update_id)  # the turn came as we were cancelled
            raise
        return True

    def waiting_count(self) -> int:
        """How many tasks wait for their chat's turn."""
        return self._order.waiting_count()

    def waiting(self, key: Hashable) -> bool:
        """Whether a task of ``key``'s chat waits for its turn."""
        return self._order.waiting(key)

    def release(self, key: Hashable, update_id: int) -> None:
        """End ``update_id``'s turn and hand it to the chat's waiter with the lowest id."""
        self._order.done(key, update_id)
