"""The fingerprint of an update body: which update it is, independent of its serialization.

The same update may be recorded from two serializations: ``json.dumps(raw)`` of Telegram's dict
on the polling batch path, PTB's ``update.to_json()`` on the ``put`` path. The fingerprint
hashes only fields that identify an update and that both keep: the update's kind and, inside
it, the object's identity (:data:`KINDS`, see the rules below). Stores use it to tell "the same
update again" from "the same ``update_id`` with a different update". A body of no known kind
has no fingerprint (:obj:`None`). It never replaces a stored row and is never replaced, so a
completed update is not handled twice.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["KINDS", "fingerprint_known", "update_fingerprint"]

KINDS = frozenset(
    {
        "message", "edited_message", "channel_post", "edited_channel_post",
        "business_connection", "business_message", "edited_business_message",
        "deleted_business_messages", "message_reaction", "message_reaction_count",
        "inline_query", "chosen_inline_result", "callback_query", "shipping_query",
        "pre_checkout_query", "purchased_paid_media", "poll", "poll_answer", "my_chat_member",
        "chat_member", "chat_join_request", "chat_boost", "removed_chat_boost",
    }
)
"""The update kinds (the optional fields of Telegram's ``Update`` object) a fingerprint uses."""

# What identifies the object inside an update, first match wins (paths inside the kind's object):
# a query/poll by its id. A message (or reaction) by its chat and message id (message ids are
# unique per chat, so its date adds nothing, and an edit adds edit_date). Anything else by date,
# chat, sender and poll id.
_BY_ID: Tuple[Tuple[str, ...], ...] = (("id",), ("from", "id"))
_BY_MESSAGE: Tuple[Tuple[str, ...], ...] = (("message_id",), ("chat", "id"), ("edit_date",))
_OTHERWISE: Tuple[Tuple[str, ...], ...] = (
    ("date",),
    ("chat", "id"),
    ("from", "id"),
    ("user", "id"),
    ("poll_id",),
)


def _get(obj: Any, path: Tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj if isinstance(obj, (int, float, str, bool)) else None


def _identity(obj: Dict[str, Any]) -> Dict[str, Any]:
    if _get(obj, ("id",)) is not None:
        paths = _BY_ID
    elif _get(obj, ("message_id",)) is not None:
        paths = _BY_MESSAGE
    else:
        paths = _OTHERWISE
    fields: Dict[str, Any] = {}
    for path in paths:
        value = _get(obj, path)
        if value is not None:
            fields[".".join(path)] = value
    return fields


_KNOWN: Dict[str, Optional[str]] = {}
"""Fingerprints of bodies serialized from a parsed update (see :func:`fingerprint_known`),
taken (once) by :func:`update_fingerprint` instead of parsing the body again."""

_KNOWN_MOST = 4096
"""The most fingerprints kept for bodies no store asked about yet (then all are dropped: a
store that does not fingerprint never makes the table grow)."""

_MISSING = object()

# json.dumps with non-default options builds a new encoder per call. One, made once, writes the
# same text (the fingerprint must never change: stored rows are compared with it)
_IDENTITY_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=True, separators=(",", ":"))


def fingerprint_known(body: str, data: Any) -> None:
    """Note the fingerprint of ``body``, the JSON text of the parsed update ``data``, so that
    the store's :func:`update_fingerprint` of it does not parse it again (a polled batch is
    parsed once, then serialized per update)."""
    if len(_KNOWN) >= _KNOWN_MOST:
        _KNOWN.clear()
    _KNOWN[body] = _of_data(data)


def update_fingerprint(body: str) -> Optional[str]:
    """A short, stable hash saying which update ``body`` is.

    Two serializations of one update (Telegram's raw JSON and PTB's ``Update.to_json()``)
    give the same fingerprint. Two different updates differ (another kind, date, message,
    chat, sender or query id).

    Args:
        body (:obj:`str`): The update's JSON text, as a store records it.

    Returns:
        :obj:`str` | :obj:`None`: 16 hexadecimal characters, or :obj:`None` for a body without
        a known update kind (it then counts as the same update as any other).
    """
    known = _KNOWN.pop(body, _MISSING) if isinstance(body, str) else _MISSING
    if known is not _MISSING:
        return known  # type: ignore[return-value]
    try:
        data = json.loads(body)
    except (TypeError, ValueError):
        return None
    return _of_data(data)


def _of_data(data: Any) -> Optional[str]:
    if not isinstance(data, dict):
        return None
    kinds = sorted(k for k, v in data.items() if k in KINDS and isinstance(v, dict))
    if not kinds:
        return None
    text = _message_text(data, kinds[0]) if len(kinds) == 1 else None
    if text is None:
        text = _identity_text(data, kinds)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _identity_text(data: Dict[str, Any], kinds: List[str]) -> str:
    """The text the fingerprint hashes (the general rule)."""
    parts: List[Any] = [[kind, _identity(data[kind])] for kind in kinds]
    return _IDENTITY_ENCODER.encode(["update", data.get("update_id"), parts])


def _message_text(data: Dict[str, Any], kind: str) -> Optional[str]:
    """:func:`_identity_text` of the most common update, a new message (one kind, integer
    ``update_id``, ``message_id`` and ``chat.id``, no ``id``, no ``edit_date``), written
    directly: the same text, in about a sixth of the time. :obj:`None`: any other update."""
    obj = data[kind]
    chat = obj.get("chat")
    if "id" in obj or "edit_date" in obj or not isinstance(chat, dict):
        return None
    update_id, message_id, chat_id = data.get("update_id"), obj.get("message_id"), chat.get("id")
    # exactly int (bool is an int that JSON writes as true/false)
    if type(update_id) is not int or type(message_id) is not int or type(chat_id) is not int:
        return None
    return f'["update",{update_id},[["{kind}",{{"chat.id":{chat_id},"message_id":{message_id}}}]]]'
