"""Bot API parameters as the JSON an outbox row keeps: PTB objects serialised, the bot's
defaults applied the way PTB's ``ExtBot`` applies them, uploads refused."""

from __future__ import annotations

import datetime as dtm
import enum
import json
import os
from typing import Any, Dict, Mapping, Optional

from ptb_fence._errors import UsageError

__all__ = ["api_method", "params_json", "to_json_value"]

_TEXT_METHODS = frozenset({
    "sendMessage", "editMessageText", "editMessageCaption", "sendPhoto", "sendDocument",
    "sendVideo", "sendAudio", "sendAnimation", "sendVoice", "copyMessage", "sendPaidMedia",
})
"""Methods whose text or caption a default ``parse_mode`` applies to."""

_LINK_PREVIEW_METHODS = frozenset({"sendMessage", "editMessageText"})

_UPLOAD_HINT = (
    "the outbox keeps JSON, so it sends files by file_id or URL only; upload a local file "
    "directly (await context.bot.send_document(...)), then queue later calls with its file_id"
)


def api_method(method: str) -> str:
    """The Bot API name of ``method``: ``"sendMessage"`` as given, ``"send_message"`` (PTB's
    spelling) turned into it.

    Raises:
        ValueError: An empty name, or one that is not an identifier.
    """
    if not isinstance(method, str) or not method or not method.replace("_", "a").isalnum():
        raise ValueError(f"a Bot API method name like 'sendMessage' is needed, got {method!r}")
    if "_" not in method:
        return method
    head, *rest = method.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def to_json_value(value: Any, name: str = "value") -> Any:
    """``value`` as plain JSON data: PTB objects through ``to_dict()``, datetimes as Unix
    timestamps (naive ones taken as UTC, as PTB does without ``Defaults.tzinfo``), enums as
    their value, sequences as lists.

    Raises:
        TypeError: A file to upload (``InputFile``, bytes, a path, an open file) or another
            object JSON cannot hold. The message names the parameter.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, float) and value != value:
            raise UsageError(f"{name}: NaN is not JSON")
        return value
    if isinstance(value, enum.Enum):
        return to_json_value(value.value, name)
    if isinstance(value, dtm.datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=dtm.timezone.utc)
        return int(moment.timestamp())
    if isinstance(value, dtm.timedelta):
        return int(value.total_seconds())
    kind = type(value)
    module = kind.__module__ or ""
    uploads = (bytes, bytearray, memoryview, os.PathLike)
    if kind.__name__ == "InputFile" or isinstance(value, uploads) or hasattr(value, "read"):
        raise UsageError(f"{name} is a file to upload ({kind.__name__}): {_UPLOAD_HINT}")
    if module.startswith("telegram") and callable(getattr(value, "to_dict", None)):
        return to_json_value(value.to_dict(), name)
    if isinstance(value, Mapping):
        return {
            str(k): to_json_value(v, f"{name}[{k!r}]") for k, v in value.items() if v is not None
        }
    if isinstance(value, (list, tuple)):
        return [to_json_value(v, f"{name}[{i}]") for i, v in enumerate(value)]
    raise UsageError(
        f"{name} is a {kind.__name__}, which the outbox cannot keep as JSON (pass plain "
        "values, dicts, lists or python-telegram-bot objects)"
    )


def _with_defaults(method: str, params: Dict[str, Any], defaults: Mapping[str, Any]) -> None:
    """Apply the bot's defaults (PTB ``Defaults.api_defaults``) in place where the caller
    passed nothing, as ``ExtBot`` does for the methods that take them."""
    if not defaults:
        return
    sends = method.startswith("send") or method in {
        "copyMessage", "copyMessages", "forwardMessage", "forwardMessages",
    }
    if method in _TEXT_METHODS and "parse_mode" in defaults:
        params.setdefault("parse_mode", defaults["parse_mode"])
    if sends:
        for key in ("disable_notification", "protect_content"):
            if key in defaults:
                params.setdefault(key, defaults[key])
    if method in _LINK_PREVIEW_METHODS and "link_preview_options" in defaults:
        params.setdefault("link_preview_options", to_json_value(defaults["link_preview_options"]))
    reply = params.get("reply_parameters")
    if isinstance(reply, dict) and "allow_sending_without_reply" in defaults:
        reply.setdefault("allow_sending_without_reply", defaults["allow_sending_without_reply"])


def params_json(
    method: str, params: Mapping[str, Any], defaults: Optional[Mapping[str, Any]] = None
) -> str:
    """The text of the JSON object an outbox row keeps for ``method(**params)``: parameters
    given as :obj:`None` left out (as PTB leaves them out), the bot's ``defaults`` applied.

    Raises:
        TypeError: A parameter JSON cannot hold (see :func:`to_json_value`).
    """
    data: Dict[str, Any] = {}
    for key, value in params.items():
        if value is not None:
            data[key] = to_json_value(value, key)
    _with_defaults(method, data, defaults or {})
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
