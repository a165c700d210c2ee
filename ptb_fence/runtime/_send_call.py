"""send_call: the request of one outbox call, as the dispatcher's sender threads make it.

Two answers are settled here, next to the request, so both front ends get them:

- ``ChatMigrated``: the group became a supergroup. The call is sent once more, to the new
  chat, within the same claim. The answer to that send decides the call.
- An answer that says an earlier try did the call (see
  :func:`~ptb_fence.runtime._send_outcome.decide`): the result is ``true``.

Every other error is raised to the dispatcher, which decides it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Optional

from ptb_fence._values import OutboxEntry
from ptb_fence.runtime._bot_answers import MIGRATE, outcome_of
from ptb_fence.runtime._outcome import error_text
from ptb_fence.runtime._send_outcome import DONE_RESULT, decide

__all__ = ["SUPERGROUP_IDS_BELOW", "send_call"]

_LOGGER = logging.getLogger("ptb_fence.outbox")

Send = Callable[[str, Dict[str, Any]], Any]

SUPERGROUP_IDS_BELOW = -(10 ** 12)
"""Supergroup and channel ids are this or lower (``-100…``). Ids above it and below 0 are
basic groups, the only chats that migrate."""


def _group_id(value: Any) -> Optional[int]:
    """``value`` as a basic group's id (:obj:`None`: it is none)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return None
    if isinstance(value, int) and SUPERGROUP_IDS_BELOW < value < 0:
        return value
    return None


def _new_chat(error: Exception, params: Dict[str, Any]) -> Optional[int]:
    """The chat to send again to after ``error`` (:obj:`None`: not a migration to follow).

    The call must name a basic group as ``chat_id``. A ``from_chat_id`` of a basic group
    makes it unclear which chat moved. Such a call is not sent again.
    """
    if outcome_of(error) != MIGRATE:
        return None
    new = getattr(error, "new_chat_id", None)
    if not isinstance(new, int) or isinstance(new, bool):
        return None
    old = _group_id(params.get("chat_id"))
    if old is None or old == new or _group_id(params.get("from_chat_id")) is not None:
        return None
    return new


def _send_following_migration(send: Send, entry: OutboxEntry, params: Dict[str, Any]) -> Any:
    """Send the call, and once more to the supergroup on a ``ChatMigrated``."""
    try:
        return send(entry.method, params)
    except Exception as exc:
        new = _new_chat(exc, params)
        if new is None:
            raise
    old = params.get("chat_id")
    _LOGGER.warning(
        "outbox: %s call %s of update %s: chat %s became the supergroup %s (ChatMigrated), "
        "the call is sent once more, to the supergroup", entry.method, entry.call_id,
        entry.update_id, old, new,
    )
    result = send(entry.method, dict(params, chat_id=new))
    _LOGGER.info("outbox: %s call %s sent to the supergroup %s instead of chat %s",
                 entry.method, entry.call_id, new, old)
    return result


def send_call(send: Send, entry: OutboxEntry, params: Dict[str, Any]) -> Any:
    """Send ``entry`` with ``params`` through ``send``: its Bot API result.

    A ``ChatMigrated`` sends it once more, with ``chat_id`` the supergroup's.
    An answer that says an earlier try did the call returns :data:`DONE_RESULT`.

    Raises:
        Exception: What ``send`` raised otherwise. For a migrated call, what its second
            send raised.
    """
    try:
        return _send_following_migration(send, entry, params)
    except Exception as exc:
        if not decide(entry, exc).done:
            raise
        _LOGGER.info(
            "outbox: %s call %s of update %s (chat %s): an earlier try whose outcome was "
            "unknown did it, as Telegram answers now (%s). It is recorded sent.",
            entry.method, entry.call_id, entry.update_id, entry.chat_key, error_text(exc),
        )
    return DONE_RESULT
