"""ChatTurns: per-chat order for asyncio tasks without holding a concurrency slot."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Dict, Hashable, List, Set, Tuple

__all__ = ["ChatTurns"]


class ChatTurns:
    """Lets one task per chat key run at a time; waiters are woken in ``update_id`` order."""

    __slots__ = ("_busy", "_seq", "_waiters")

    def __init__(self) -> None:
        self._busy: Set[Hashable] = set()
        self._waiters: Dict[Hashable, List[Tuple[int, int, "asyncio.Future[None]"]]] = {}
        self._seq = itertools.count()

    async def acquire(self, key: Hashable, update_id: int) -> None:
        """Wait for ``key``'s turn (no other task of the chat running)."""
        if key not in self._busy:
            self._busy.add(key)
            return
        future: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters.setdefault(key, []), (update_id, next(self._seq), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                # the turn was handed to us while we were being cancelled: pass it on
                self.release(key)
            raise

    def release(self, key: Hashable) -> None:
        """End the current turn of ``key`` and hand it to the waiter with the lowest id."""
        queue = self._waiters.get(key)
        while queue:
            _, _, future = heapq.heappop(queue)
            if not future.done():
                future.set_result(None)
                return
        self._waiters.pop(key, None)
        self._busy.discard(key)
