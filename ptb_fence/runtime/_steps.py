"""Effect keys and recorded steps: an effect outside Telegram and the database, done once.

An effect key names one piece of work of one update. It is the same in every attempt at that
update, so an API that honours idempotency keys applies the work once. A step records the
result of such work, fenced, as soon as it returns. A later attempt reads the result instead
of calling again.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

from ptb_fence._errors import UsageError
from ptb_fence._fingerprint import update_fingerprint

__all__ = ["EFFECT_KEY_LENGTH", "EFFECT_KEY_PREFIX", "decode_result", "effect_key",
           "encode_result", "step_name"]

EFFECT_KEY_PREFIX = "ptbf-"
"""Every effect key starts with this."""

EFFECT_KEY_LENGTH = len(EFFECT_KEY_PREFIX) + 40
"""The length of every effect key: the prefix and 40 lowercase hexadecimal digits."""

_NAME_MOST = 200
"""The longest step name, in characters."""


def step_name(name: object) -> str:
    """``name`` checked: a non-empty text of at most 200 characters.

    Raises:
        UsageError: It is not (the message says what is accepted).
    """
    if not isinstance(name, str) or not name or len(name) > _NAME_MOST:
        raise UsageError(
            f"an effect or step name must be a non-empty str of at most {_NAME_MOST} "
            f"characters, not {name!r}: name the work, e.g. 'charge' or 'book-slot'"
        )
    return name


def _update_identity(body: Optional[str], update: Any) -> str:
    """Which update this is, the same in every attempt (and another for a reused id)."""
    if body is None and update is not None:
        to_json = getattr(update, "to_json", None)
        body = to_json() if callable(to_json) else json.dumps(update, sort_keys=True)
    if body is None:
        return ""
    # the fingerprint is the same for two serializations of one update (raw and PTB's)
    found = update_fingerprint(body)
    if found is not None:
        return found
    return hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def effect_key(bot_id: Optional[int], update_id: int, body: Optional[str], update: Any,
               name: str) -> str:
    """The effect key of ``name`` in the update ``update_id`` of the bot ``bot_id``.

    It hashes the bot, the update id, which update the body is, and the name. So two updates
    never share a key, nor do two bots, nor an update id that Telegram used again.
    """
    text = "\x1f".join((str(bot_id or 0), str(int(update_id)), _update_identity(body, update),
                        step_name(name)))
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return EFFECT_KEY_PREFIX + digest[:40]


def encode_result(name: str, result: Any) -> str:
    """A step's result as the JSON text it is recorded as.

    Raises:
        UsageError: The result is not JSON (the message names the fix).
    """
    try:
        return json.dumps(result, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"step {name!r} returned {type(result).__name__}, which is not JSON ({exc}): "
            "return what the retry needs as JSON (a dict, list, str, int, float, bool or "
            "None), e.g. the charge's id. The work was done: the retry calls the step again "
            "with the same effect key"
        ) from None


def decode_result(text: str) -> Any:
    """A recorded step result, as the step returns it."""
    return json.loads(text)
