"""What a failed Bot API send means for its outbox call: retry (when), fail, or hold everything.

Errors are python-telegram-bot's (``telegram.error``): the PTB front end's ``Bot`` raises them,
and the blocking front end's sender raises the same classes for the same answers.
"""

from __future__ import annotations

import datetime as dtm
from typing import NamedTuple, Optional

from ptb_fence._values import OutboxEntry
from ptb_fence.runtime._bot_answers import FAIL, HOLD, outcome_of
from ptb_fence.runtime._outcome import error_text

__all__ = [
    "IDEMPOTENT_METHODS",
    "SendDecision",
    "backoff_seconds",
    "decide",
    "is_idempotent",
    "retry_after_seconds",
]

BASE_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 300.0

IDEMPOTENT_METHODS = frozenset({
    "answerCallbackQuery", "answerInlineQuery", "answerPreCheckoutQuery",
    "answerShippingQuery", "answerWebAppQuery", "deleteMessage", "deleteMessages",
    "pinChatMessage", "unpinChatMessage", "unpinAllChatMessages", "setMessageReaction",
    "sendChatAction", "banChatMember", "unbanChatMember", "restrictChatMember",
    "promoteChatMember", "approveChatJoinRequest", "declineChatJoinRequest",
})
"""Methods safe to repeat when their outcome is unknown, besides every ``edit*``, ``set*``
and ``get*`` method: a repeat leaves Telegram as one call would (a second delete or edit is
refused or changes nothing)."""


def is_idempotent(method: str) -> bool:
    """Whether ``method`` may be repeated when its outcome is unknown."""
    return method in IDEMPOTENT_METHODS or method.startswith(("edit", "set", "get", "delete"))


class SendDecision(NamedTuple):
    """What to do with a call whose send raised.

    Attributes:
        fail: End the call ``failed`` (never retried).
        delay_seconds: Otherwise: retry after this long.
        error: The text stored with the call (and logged).
        hold_all: A flood limit of the whole bot: hold every chat for ``delay_seconds``.
        unknown: The request may have reached Telegram (no answer came back).
    """

    fail: bool
    delay_seconds: float
    error: str
    hold_all: bool = False
    unknown: bool = False


def backoff_seconds(tries: int) -> float:
    """``1 s × 2^(tries−1)``, at most 5 minutes."""
    return min(BASE_BACKOFF_SECONDS * 2.0 ** min(max(tries - 1, 0), 20), MAX_BACKOFF_SECONDS)


def _names(error: BaseException) -> "set[str]":
    return {cls.__name__ for cls in type(error).__mro__}


def retry_after_seconds(error: BaseException) -> Optional[float]:
    """Telegram's ``retry_after`` of a ``RetryAfter`` error, in seconds (:obj:`None`: none)."""
    raw = getattr(error, "_retry_after", None)
    if raw is None:
        try:
            raw = getattr(error, "retry_after", None)
        except Exception:  # pragma: no cover - a property that raises
            raw = None
    if isinstance(raw, dtm.timedelta):
        return raw.total_seconds()
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    return None


def _not_sent(error: BaseException) -> bool:
    """The request provably never left: the connection was not made (an httpx connect or
    pool error behind PTB's ``NetworkError``/``TimedOut``)."""
    cause = error.__cause__ or error.__context__
    names = _names(cause) if cause is not None else set()
    return bool(names & {"ConnectError", "ConnectTimeout", "PoolTimeout", "UnsupportedProtocol"})


def _without_answer(error: BaseException) -> bool:
    """The request may have left and no answer came back (a timeout, or a transport error of
    the HTTP client after connecting), as opposed to Telegram answering with an error status
    (PTB raises those without an HTTP client error behind them)."""
    if "TimedOut" in _names(error):
        return True
    cause = error.__cause__
    return cause is not None and (type(cause).__module__ or "").startswith("httpx")


def decide(entry: OutboxEntry, error: BaseException, *, global_hold: bool = False) -> SendDecision:
    """The decision for ``entry`` whose send raised ``error``, by the one table of Bot API
    answers (:data:`~ptb_fence.runtime._bot_answers.ANSWERS`), alike for both front ends.

    - ``RetryAfter``: retry after ``retry_after`` (the store holds the chat meanwhile: its
      earlier call is pending); ``global_hold``: hold every chat too (a flood limit seen across
      chats, see the dispatcher);
    - ``Forbidden`` (blocked, kicked, deactivated), ``BadRequest`` (chat not found, message to
      edit not found, message is not modified, text unparseable, ...), ``ChatMigrated``,
      ``EndPointNotFound`` (a method Telegram does not have): a refusal repeating cannot
      change: failed, and the chat's next call goes on;
    - no answer (``TimedOut``, a connection dropped after the request left): an idempotent
      method is retried; another is resent, unless the call is ``at_most_once`` (then failed
      as ``unknown outcome``); a request that provably never left is retried;
    - anything else (5xx answers, ``InvalidToken``, a revoked token, ``Conflict``, unexpected
      errors): retried with backoff.
    """
    names = _names(error)
    text = error_text(error)
    outcome = outcome_of(error)
    retry_after = retry_after_seconds(error)
    if outcome == HOLD and retry_after is not None:
        return SendDecision(False, max(retry_after, 0.0), text, hold_all=global_hold)
    if outcome == FAIL:
        return SendDecision(True, 0.0, text)
    backoff = backoff_seconds(entry.tries)
    if ("NetworkError" in names or "TimedOut" in names) and not _not_sent(error) \
            and _without_answer(error):
        if is_idempotent(entry.method) or not entry.at_most_once:
            return SendDecision(False, backoff, text, unknown=True)
        return SendDecision(True, 0.0, f"unknown outcome: {text}", unknown=True)
    return SendDecision(False, backoff, text)
