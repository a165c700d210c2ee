"""Validation of incoming update bodies."""

from __future__ import annotations

import json
from typing import Any, Dict, Tuple, Union

from ptb_fence._update_ids import MAX_UPDATE_ID, update_id_problem

__all__ = ["InvalidUpdate", "MAX_UPDATE_ID", "check_update_id", "parse_update_body"]


class InvalidUpdate(ValueError):
    """The body is not a Telegram update (not JSON, not an object, bad ``update_id``)."""


def check_update_id(update_id: object) -> int:
    """Return ``update_id`` if it is a valid Telegram ``update_id``, else raise.

    Valid: an :obj:`int` (not a :obj:`bool`, not a float such as ``1.0``) from 0 to
    :data:`MAX_UPDATE_ID`. Stores do not check this themselves (SQLite would turn ``None`` into
    a fresh rowid, ``1.0`` into ``1``), so every way in must check before ``store.add``.

    Raises:
        InvalidUpdate: With a short reason.
    """
    problem = update_id_problem(update_id)
    if problem is not None:
        raise InvalidUpdate(problem)
    assert isinstance(update_id, int)
    return int(update_id)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_update_body(body: Union[bytes, bytearray, str]) -> Tuple[int, str, Dict[str, Any]]:
    """Validate an update body and return ``(update_id, text, update_dict)``.

    A valid body is UTF-8 JSON text (RFC 8259: no ``NaN``/``Infinity``, no NUL character) of
    an object whose ``update_id`` is an integer (not a boolean, not a float) from 0 to 2**63-1.
    A ``str`` body must be encodable as UTF-8 (no lone surrogates), as stores need.

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
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidUpdate("body is not valid Unicode (lone surrogate)") from None
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidUpdate("body is not valid Unicode text (lone surrogates)") from None
    else:
        raise InvalidUpdate(f"body must be bytes or str, not {type(body).__name__}")
    try:
        update = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise InvalidUpdate("body is not JSON") from None
    if not isinstance(update, dict):
        raise InvalidUpdate("body is not a JSON object")
    update_id = check_update_id(update.get("update_id"))
    if "\x00" in text:
        raise InvalidUpdate("body contains a NUL character")
    return update_id, text, update
