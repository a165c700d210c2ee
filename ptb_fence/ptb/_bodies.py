"""What is stored for an update and how it reads back. The error that refuses an ingest."""

from __future__ import annotations

import json
import logging
from typing import Any, Optional, Sequence, Union

from telegram import Update
from telegram.error import TelegramError
from telegram.ext import InvalidCallbackData

from ptb_fence._events import event
from ptb_fence._fingerprint import fingerprint_known
from ptb_fence._update_ids import is_update_id

__all__ = [
    "IngestError",
    "ingest_error",
    "parse_update",
    "raw_body",
    "update_body",
    "valid_update_id",
]

_INGEST_LOGGER = logging.getLogger("ptb_fence.ingest")
_LOGGER = logging.getLogger("ptb_fence.ptb")


class IngestError(TelegramError):
    """An update could not be recorded. It was not acknowledged to Telegram.

    A :class:`telegram.error.TelegramError`, so PTB's polling loop retries the same offset and
    the webhook answers 5xx: Telegram delivers the update again.
    """

    __slots__ = ()


def _updates_text(update_ids: Union[Optional[int], Sequence[int]]) -> "tuple[str, Optional[int]]":
    if isinstance(update_ids, int) or update_ids is None:
        return f"update {update_ids}", update_ids
    return ("updates " + ", ".join(str(u) for u in update_ids),
            update_ids[0] if update_ids else None)


def ingest_error(update_ids: Union[Optional[int], Sequence[int]], error: BaseException) -> IngestError:
    """Log that ``update_ids`` could not be recorded and return the :class:`IngestError` to
    raise (PTB then does not acknowledge them to Telegram)."""
    what, first = _updates_text(update_ids)
    _INGEST_LOGGER.error(
        "could not record %s (%s: %s); not acknowledged to Telegram",
        what,
        type(error).__name__,
        error,
        extra={"update_id": first},
    )
    return IngestError(f"ptb_fence could not record {what}: {type(error).__name__}")


def log_recording_again(update_ids: Sequence[int], error: BaseException, level: int,
                        wait: float, note: str = "") -> None:
    """Log (at ``level``) that a batch could not be recorded and is tried again in ``wait``
    seconds (``note``: what the line adds, e.g. that the next ones go to DEBUG)."""
    if not _INGEST_LOGGER.isEnabledFor(level):
        return
    what, first = _updates_text(update_ids)
    _INGEST_LOGGER.log(
        level,
        "could not record %s (%s: %s); not acknowledged to Telegram, recording again in "
        "%.1f s%s",
        what,
        type(error).__name__,
        error,
        wait,
        note,
        extra=event("recording_again", update_id=first),
    )


def _null(_: object) -> None:
    return None


def update_body(update: Update) -> str:
    """The JSON text stored for ``update``.

    Updates arrive in PTB already parsed, so the stored body is ``update.to_json()``. With
    ``arbitrary_callback_data`` PTB has replaced ``callback_query.data`` by the cached Python
    object before the queue. Objects that are not JSON are stored as ``null`` (and the body
    gets ``"_ptb_fence": {"callback_data": "not stored"}``), so a replay of such an update
    (retry, takeover, restart) sees ``callback_query.data`` as :obj:`None`. Data PTB could
    not resolve (``InvalidCallbackData``, the keyboard not in this process's cache) keep the
    button's id, so a replay resolves it as on delivery (FencedPersistence: from the store).
    """
    try:
        return update.to_json()
    except (TypeError, ValueError):
        data = update.to_dict()
        query = data.get("callback_query")
        if isinstance(query, dict):
            raw = getattr(update.callback_query, "data", None)
            kept = raw.callback_data if isinstance(raw, InvalidCallbackData) else None
            query["data"] = kept if isinstance(kept, str) else None
            if query["data"] is None:
                data["_ptb_fence"] = {"callback_data": "not stored"}
        return json.dumps(data, default=_null)


# what json.dumps(raw, ensure_ascii=False) writes, without building an encoder per update
_UTF8_ENCODER = json.JSONEncoder(ensure_ascii=False)


def raw_body(raw: Any) -> str:
    """The stored JSON text of a raw update: UTF-8 text, or ASCII escapes when the update
    holds a lone UTF-16 surrogate (valid JSON that no store can encode as UTF-8)."""
    body = _UTF8_ENCODER.encode(raw)
    try:
        body.encode("utf-8")
    except UnicodeEncodeError:
        body = json.dumps(raw)  # lossless: the escapes decode to the same strings
    fingerprint_known(body, raw)  # the store's fingerprint of it needs no second parse
    return body


def parse_update(data: Any, bot: Any) -> Optional[Update]:
    """The :class:`telegram.Update` of a stored or raw body (parsed JSON), bound to ``bot``.

    A body recorded from ``getUpdates`` keeps the callback data id: it is resolved from the
    bot's cache as PTB does on delivery (``InvalidCallbackData`` if gone).
    """
    update = Update.de_json(data, bot)
    if update is not None and getattr(bot, "callback_data_cache", None) is not None:
        bot.insert_callback_data(update)
    return update


def valid_update_id(update: Update) -> bool:
    """Whether ``update`` has a Telegram ``update_id``. Logs a WARNING (nothing is recorded)
    when it has not."""
    update_id = update.update_id
    if is_update_id(update_id):
        return True
    _LOGGER.warning(
        "dropped an update whose update_id %r is not an integer from 0 to 2**63-1: it is "
        "not a Telegram update (nothing recorded)",
        update_id,
    )
    return False
