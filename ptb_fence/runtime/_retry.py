"""The default retry policy."""

from __future__ import annotations

import datetime as dtm
import random
from typing import Optional

__all__ = ["default_retry", "is_permanent_telegram_error"]

BASE_DELAY_SECONDS = 5.0
MAX_DELAY_SECONDS = 15 * 60.0
JITTER = 0.1
"""The backoff is spread by up to this fraction either way (±10 %): updates that failed
together (a database or Telegram outage) are not retried together."""

# its own generator: a handler that seeds ``random`` must not make the retries of many
# processes fall in step again
_RANDOM = random.SystemRandom()

# Lower-cased fragments of Bot API refusals that repeating cannot fix.
_PERMANENT_FRAGMENTS = (
    "bot was blocked by the user",
    "user is deactivated",
    "chat not found",
    "bot can't initiate conversation",
    "bot can't send messages to bots",
    "bot was kicked",
    "not enough rights to send",
    "have no rights to send",
    "can't parse entities",
    "can't parse message text",
    "message is too long",
    "message text is empty",
    "peer_id_invalid",
)


def _class_names(error: BaseException) -> "set[str]":
    return {cls.__name__ for cls in type(error).__mro__}


def is_permanent_telegram_error(error: BaseException) -> bool:
    """Return :obj:`True` for Telegram refusals that repeating cannot fix.

    Any ``telegram.error.Forbidden`` (bot blocked, user deactivated, bot never started by the
    user, kicked) and the ``BadRequest`` texts for a chat that does not exist and for a message
    text that cannot be parsed or is too long.
    """
    names = _class_names(error)
    if "Forbidden" in names:
        return True
    text = str(error).lower()
    if "BadRequest" in names or "TelegramError" in names:
        return any(fragment in text for fragment in _PERMANENT_FRAGMENTS)
    return False


def _retry_after_seconds(error: BaseException) -> Optional[float]:
    raw = getattr(error, "_retry_after", None)
    if raw is None:
        try:
            raw = getattr(error, "retry_after", None)
        except Exception:  # pragma: no cover - defensive: a property that raises
            raw = None
    if isinstance(raw, dtm.timedelta):
        return raw.total_seconds()
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    return None


def default_retry(error: BaseException, attempt: int) -> Optional[float]:
    """The default retry policy: seconds to wait before the next attempt, or :obj:`None`.

    Backoff is ``5 s × 4^(attempt−1)`` capped at 15 minutes, spread by up to ±10 %
    (:data:`JITTER`: updates that failed together are not retried together). Telegram's
    ``retry_after`` wins when it is longer (exactly: never a retry before it). Refusals that
    repeating cannot fix (see :func:`is_permanent_telegram_error`) give up at once. Any other
    error is retried.

    Args:
        error: The exception the attempt failed with.
        attempt: The number of the attempt that failed (from 1).
    """
    if is_permanent_telegram_error(error):
        return None
    exponent = min(max(0, attempt - 1), 10)  # 5 s x 4^6 already exceeds the cap
    delay = min(BASE_DELAY_SECONDS * (4.0**exponent), MAX_DELAY_SECONDS)
    delay *= _RANDOM.uniform(1.0 - JITTER, 1.0 + JITTER)
    retry_after = _retry_after_seconds(error)
    if retry_after is not None and retry_after > delay:
        delay = retry_after
    return delay
