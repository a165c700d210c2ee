"""Chat order across processes (``strict_chat_order``): runtime operations shared by both
front ends.

A mixin of :class:`~ptb_fence.runtime._core.Runtime`. Under ``strict_chat_order`` the store
keeps each chat's order (:class:`~ptb_fence.ChatOrderedUpdateStore`): updates are recorded
with their chat key (never claimed at ingest), a claim takes an update only when it is its
chat's turn (no earlier update of the chat unsettled, no attempt of the chat running
anywhere), a sweep lists only such updates, and when a process is done with an update of a
chat (settled for good, or not claimed) and holds no other update of that chat, it looks up
the chat's next update at once (:meth:`ChatOrderOps.chat_successor`): a chat whose update was
refused elsewhere does not wait for a sweep. In one process the front ends also run one update per chat at a time
(:class:`~ptb_fence.runtime._chats.ChatOrder`). A chat waiting (for its turn or for a retry)
holds no worker and no slot: other chats run at full concurrency.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Hashable, List, Optional

from ptb_fence._values import StoredUpdate
from ptb_fence.runtime._chats import stored_chat_key
from ptb_fence.runtime._outcome import Outcome

if TYPE_CHECKING:
    from ptb_fence.runtime._options import RuntimeOptions
    from ptb_fence.runtime._port import StorePort

__all__ = ["ChatOrderOps"]

_LOGGER = logging.getLogger("ptb_fence.runtime")

_RELEASES_CHAT = (Outcome.COMPLETED, Outcome.ABANDONED, Outcome.EXHAUSTED)
"""Outcomes after which the update no longer holds its chat."""


class ChatOrderOps:
    """``strict_chat_order``: ordered claims and sweeps, and the successor of a chat."""

    __slots__ = ()

    if TYPE_CHECKING:
        port: StorePort
        options: RuntimeOptions

        def report_store_error(
            self, error: BaseException, step: str, *, ids: "Optional[dict[str, Any]]" = None
        ) -> None: ...

    @property
    def strict_chat_order(self) -> bool:
        """:obj:`bool`: The option ``strict_chat_order`` (the store keeps chat order)."""
        return self.options.strict_chat_order

    def _due_in_chat_order(self, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        return self.port.due_in_chat_order(now=now, pending_before=pending_before, limit=limit)

    def chat_successor(
        self, key: Hashable, outcome: Optional[Outcome], *, waiting: bool = False
    ) -> Optional[StoredUpdate]:
        """The next update of ``key``'s chat to hand over now, under ``strict_chat_order``.

        Looked up when this process is done with an update of the chat and no other update of
        the chat waits here (``waiting``: that one goes first, and looks up in turn): after
        ``outcome`` released the chat (completed, abandoned, exhausted), or after the update
        was not claimed (``outcome`` :obj:`None`: its chat's turn is elsewhere, e.g. an
        earlier update recorded by another process, refused there while this one ran). Then:
        the chat's lowest unsettled update if it is due and its turn (pending ones whatever
        ``pending_grace_seconds``). :obj:`None` otherwise, also on a store error (reported as
        step ``"sweep"``; a sweep hands it over later)."""
        if not self.options.strict_chat_order or waiting:
            return None  # per settle on the default path: nothing to compute
        chat = stored_chat_key(key)
        if chat is None:
            return None
        if outcome is not None and outcome not in _RELEASES_CHAT:
            return None  # retrying or lost: the chat is still held
        now = self.options.now_ms()
        try:
            rows = self.port.due_in_chat_order(
                now=now, pending_before=now, limit=1, chat_key=chat
            )
        except Exception as exc:
            self.report_store_error(exc, "sweep")
            return None
        return rows[0] if rows else None
