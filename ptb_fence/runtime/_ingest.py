"""Validation of incoming update bodies."""

from __future__ import annotations

import json
from typing import Any, Dict, Tuple, Union

__all__ = ["InvalidUpdate", "MAX_UPDATE_ID", "parse_update_body"]

MAX_UPDATE_ID = 2**63 - 1
"""The largest ``update_id`` a store can hold (a BIGINT)."""


class InvalidUpdate(ValueError):
    """The body is not a Telegram update (not JSON, not an object, bad ``update_id``)."""


def parse_update_body(body: Union[bytes, bytearray, str]) -> Tuple[int, str, Dict[str, Any]]:
    """Validate an update body and return ``(update_id, text, update_dict)``.

    A valid body is UTF-8 JSON text of an object whose ``update_id`` is an integer (not a
    boolean, not a float) from 0 to 2**63-1.

    Raises:
        InvalidUpdate: With a short reason.
    """
    if isinstance(body, (bytes, bytearray)):
        try:
            text = bytes(body).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidUpdate("body is not UTF-8") from None
    elif isinstance(body, str):
        text = body
    else:
        raise InvalidUpdate(f"body must be bytes or str, not {type(body).__name__}")
    try:
        update = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidUpdate("body is not JSON") from None
    if not isinstance(update, dict):
        raise InvalidUpdate("body is not a JSON object")
    update_id = update.get("update_id")
    if isinstance(update_id, bool) or not isinstance(update_id, int):
        raise InvalidUpdate("update_id is missing or not an integer")
    if update_id < 0 or update_id > MAX_UPDATE_ID:
        raise InvalidUpdate("update_id is out of range")
    if "\x00" in text:
        raise InvalidUpdate("body contains a NUL character")
    return update_id, text, update
