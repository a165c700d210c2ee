"""StoreChatOrder: chat order across processes (``strict_chat_order``), for both front ends.

It is a collaborator of :class:`~ptb_fence.runtime._runtime.Runtime` (``runtime.chat_order``).
The store keeps each chat's order (:class:`~ptb_fence.BatchStore`). Updates are
recorded with their chat key and never claimed at ingest. A claim takes an update only at its
chat's turn, and a sweep lists only such updates. A process done with a chat's update looks up
the chat's next update at once (:meth:`StoreChatOrder.successor`). In one process the front ends
also run one update per chat at a time (:class:`~ptb_fence.runtime._chats.ChatOrder`). A chat
waiting for its turn holds no worker and no slot.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Hashable, Optional

from ptb_fence._values import StoredUpdate
from ptb_fence.runtime._chats import chat_key, stored_chat_key
from ptb_fence.runtime._outcome import Outcome

if TYPE_CHECKING:
    from ptb_fence.runtime._lease_keeper import ReportStoreError
    from ptb_fence.runtime._options import RuntimeOptions
    from ptb_fence.runtime._port import StorePort

__all__ = ["KEYING_PAGE", "StoreChatOrder"]

_LOGGER = logging.getLogger("ptb_fence.runtime")

_RELEASES_CHAT = (Outcome.COMPLETED, Outcome.ABANDONED, Outcome.EXHAUSTED)
"""Outcomes after which the update no longer holds its chat."""

KEYING_PAGE = 500
"""Rows read and keyed per commit when a strict runtime keys the rows recorded without a chat
key."""


def _stored_key_of(body: str) -> Optional[int]:
    """The chat key to record for a stored update body (:obj:`None`: no chat, or not an
    update dict)."""
    try:
        update = json.loads(body)
    except ValueError:
        return None
    return stored_chat_key(chat_key(update)) if isinstance(update, dict) else None


class StoreChatOrder:
    """``strict_chat_order`` across processes: keying a backlog recorded without chat keys,
    and the successor of a chat.

    Args:
        port: The store port.
        options: The runtime's options (``strict_chat_order``, the clock).
        report: How a store error is reported (the runtime's ``report_store_error``).
    """

    __slots__ = ("_options", "_port", "_report")

    def __init__(
        self, port: "StorePort", options: "RuntimeOptions", report: "ReportStoreError"
    ) -> None:
        self._port = port
        self._options = options
        self._report = report

    @property
    def strict(self) -> bool:
        """:obj:`bool`: The option ``strict_chat_order`` (the store keeps chat order)."""
        return self._options.strict_chat_order

    def key_unkeyed(self) -> int:
        """Under ``strict_chat_order``, at start: give the unsettled rows recorded without a
        chat key (by a process without the option, or before it was turned on) the key of
        their chat, derived from the stored body as at recording. Returns how many.

        Run before this process's first claim: a claim's turn check only sees rows that have
        their key, so a backlog left unkeyed would run beside its chat's later updates. Rows
        of no chat stay without one. A store without ``unkeyed_in_chats``/``set_chat_keys``
        gets a WARNING instead. A store error is reported (step ``"sweep"``) and the rows not
        keyed yet stay unordered (the next sweep tries again: :meth:`key_recorded_since`).
        """
        if not self._options.strict_chat_order:
            return 0
        if not self._port.keys_chats:
            _LOGGER.warning(
                "strict_chat_order: %s has no unkeyed_in_chats/set_chat_keys, so updates "
                "recorded without a chat key (by a process without strict_chat_order, or "
                "before it was turned on) are not kept in order; let such a backlog drain "
                "before relying on the order",
                type(self._port.store).__name__,
            )
            return 0
        keyed = self._key_all()
        if keyed:
            _LOGGER.warning(
                "strict_chat_order: %d update(s) recorded without a chat key (by a process "
                "without strict_chat_order, or before it was turned on) now have their chat's "
                "key and are kept in order; a process still running without the option "
                "records more, which the sweeps key in turn",
                keyed,
            )
        return keyed

    def key_recorded_since(self) -> int:
        """Under ``strict_chat_order``, at each sweep, before it lists the due updates: key
        the rows recorded without a chat key since the last time (by a process still running
        without the option beside this one, e.g. during a rolling switch), as
        :meth:`key_unkeyed` does at start. Returns how many, with a WARNING when there are
        any. So a sweep never hands such a row over out of its chat's order. The process
        without the option still runs what it claims itself unordered, and a row it records
        is ordered only from the next sweep of a process with it (within
        ``sweep_every_seconds``): every process sharing the table must use the option.

        One indexed read of the unsettled rows without a key (usually none, and rows of no
        chat are read again each time) and nothing else. A store error is reported (step
        ``"sweep"``).
        """
        if not (self._options.strict_chat_order and self._port.keys_chats):
            return 0
        keyed = self._key_all()
        if keyed:
            _LOGGER.warning(
                "strict_chat_order: %d update(s) were recorded without a chat key since the "
                "last sweep: a process without strict_chat_order records into this table "
                "(every process sharing it must use the option). They now have their chat's "
                "key and are kept in order here; that process runs the updates it claims "
                "itself without regard to their chat's order",
                keyed,
            )
        return keyed

    def _key_all(self) -> int:
        """Key every unsettled row without a chat key that belongs to a chat (pages of
        :data:`KEYING_PAGE`, one commit each). Returns how many were keyed."""
        port = self._port
        keyed = 0
        after: Optional[int] = None
        try:
            while True:
                rows = port.unkeyed_in_chats(after_update_id=after, limit=KEYING_PAGE)
                keys = []
                for row in rows:
                    key = _stored_key_of(row.body)
                    if key is not None:  # an update of no chat stays without a key
                        keys.append((row.update_id, row.body, key))
                if keys:
                    keyed += port.set_chat_keys(keys)
                if len(rows) < KEYING_PAGE:
                    break
                after = rows[-1].update_id
        except Exception as exc:
            self._report(exc, "sweep")
        return keyed

    def successor(
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
        step ``"sweep"``). A sweep hands it over later then."""
        if not self._options.strict_chat_order or waiting:
            return None  # per settle on the default path: nothing to compute
        chat = stored_chat_key(key)
        if chat is None:
            return None
        if outcome is not None and outcome not in _RELEASES_CHAT:
            return None  # retrying or lost: the chat is still held
        now = self._options.now_ms()
        try:
            rows = self._port.due_in_chat_order(
                now=now, pending_before=now, limit=1, chat_key=chat
            )
        except Exception as exc:
            self._report(exc, "sweep")
            return None
        return rows[0] if rows else None
