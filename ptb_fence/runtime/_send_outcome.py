"""What a failed Bot API send means for its outbox call: retry (when), fail, or hold everything.

Errors are python-telegram-bot's (``telegram.error``): the PTB front end's ``Bot`` raises them,
and the blocking front end's sender raises the same classes for the same answers.
"""

from __future__ import annotations

import datetime as dtm
from typing import NamedTuple, Optional

from ptb_fence._values import OutboxEntry
from ptb_fence.runtime._bot_answers import FAIL, HOLD, MIGRATE, SENT, outcome_of
from ptb_fence.runtime._outcome import error_text

__all__ = [
    "DONE_RESULT",
    "IDEMPOTENT_METHODS",
    "UNKNOWN",
    "UNKNOWN_BEFORE",
    "SendDecision",
    "after_unknown",
    "backoff_seconds",
    "decide",
    "is_idempotent",
    "retry_after_seconds",
]

BASE_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 300.0

UNKNOWN = "unknown outcome: "
"""The stored error of a try whose outcome was unknown begins so.

The retried call keeps it until its next try.
That try's :func:`decide` reads it: an answer may then say the earlier try did the call."""

UNKNOWN_BEFORE = "unknown outcome earlier: "
"""The stored error of a later retry begins so, after a try whose outcome was unknown.

So the mark outlives a try in between (a 5xx answer, a flood limit)."""

DONE_RESULT = True
"""The result recorded for a call an earlier try did: JSON ``true``.

Telegram answers ``true`` to a delete, and to an edit of an inline message.
The edited message itself is not known here."""

IDEMPOTENT_METHODS = frozenset({
    "answerCallbackQuery", "answerInlineQuery", "answerPreCheckoutQuery",
    "answerShippingQuery", "answerWebAppQuery", "deleteMessage", "deleteMessages",
    "pinChatMessage", "unpinChatMessage", "unpinAllChatMessages", "setMessageReaction",
    "sendChatAction", "banChatMember", "unbanChatMember", "restrictChatMember",
    "promoteChatMember", "approveChatJoinRequest", "declineChatJoinRequest",
})
"""Methods safe to repeat when their outcome is unknown.

Every ``edit*``, ``set*`` and ``get*`` method is safe too. A repeat leaves Telegram as one
call would. A second delete or edit is refused or changes nothing."""


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
        done: An earlier try did the call, as the answer says. The call ends sent with
            :data:`DONE_RESULT`. The sender does that (see
            :func:`~ptb_fence.runtime._send_call.send_call`).
    """

    fail: bool
    delay_seconds: float
    error: str
    hold_all: bool = False
    unknown: bool = False
    done: bool = False


def backoff_seconds(tries: int) -> float:
    """``1 s × 2^(tries−1)``, at most 5 minutes."""
    return min(BASE_BACKOFF_SECONDS * 2.0 ** min(max(tries - 1, 0), 20), MAX_BACKOFF_SECONDS)


def _names(error: BaseException) -> "set[str]":
    return {cls.__name__ for cls in type(error).__mro__}


def after_unknown(entry: OutboxEntry) -> bool:
    """Whether an earlier try of ``entry`` had an unknown outcome (its stored error says so)."""
    return (entry.error or "").startswith((UNKNOWN, UNKNOWN_BEFORE))


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
    """Whether the request may have left without an answer coming back.

    That is a timeout, or a transport error of the HTTP client after connecting.
    Telegram answering with an error status is not such a case. PTB raises those without an
    HTTP client error behind them."""
    if "TimedOut" in _names(error):
        return True
    cause = error.__cause__
    return cause is not None and (type(cause).__module__ or "").startswith("httpx")


def decide(entry: OutboxEntry, error: BaseException, *, global_hold: bool = False) -> SendDecision:
    """The decision for ``entry`` whose send raised ``error``.

    It follows the one table of Bot API answers
    (:data:`~ptb_fence.runtime._bot_answers.ANSWERS`), alike for both front ends.

    - ``RetryAfter``: retry after ``retry_after``. The store holds the chat meanwhile, since
      its earlier call is pending. With ``global_hold`` every chat is held too. That is a
      flood limit seen across chats (see the dispatcher).
    - ``Forbidden`` (blocked, kicked, deactivated), ``BadRequest`` (chat not found, message to
      edit not found, message is not modified, text unparseable, ...), ``EndPointNotFound``
      (a method Telegram does not have): repeating the refusal cannot change it. The call
      fails, and the chat's next call goes on.
    - ``ChatMigrated``: the sender sent the call once more to the supergroup. One that comes
      here was not sent again (no group ``chat_id``), or came for that second send. The call
      fails.
    - No answer (``TimedOut``, a connection dropped after the request left): an idempotent
      method is retried. Another is resent, unless the call is ``at_most_once``. Then it fails
      as ``unknown outcome``. A request that provably never left is retried. The retry's
      stored error begins with :data:`UNKNOWN`.
    - After such a try, ``message is not modified`` to an ``edit*`` method and ``message to
      delete not found`` to a delete are ``done``: the earlier try did the call.
    - Anything else (5xx answers, ``InvalidToken``, a revoked token, ``Conflict``, unexpected
      errors) is retried with backoff.

    A retry after an unknown outcome keeps the mark (:data:`UNKNOWN_BEFORE`).
    """
    names = _names(error)
    text = error_text(error)
    earlier = after_unknown(entry)
    outcome = outcome_of(error, entry.method, earlier)
    if outcome == SENT:
        return SendDecision(False, 0.0, text, done=True)
    kept = f"{UNKNOWN_BEFORE}{text}" if earlier else text
    retry_after = retry_after_seconds(error)
    if outcome == HOLD and retry_after is not None:
        return SendDecision(False, max(retry_after, 0.0), kept, hold_all=global_hold)
    if outcome in (FAIL, MIGRATE):
        return SendDecision(True, 0.0, text)
    backoff = backoff_seconds(entry.tries)
    if ("NetworkError" in names or "TimedOut" in names) and not _not_sent(error) \
            and _without_answer(error):
        if is_idempotent(entry.method) or not entry.at_most_once:
            return SendDecision(False, backoff, f"{UNKNOWN}{text}", unknown=True)
        return SendDecision(True, 0.0, f"{UNKNOWN}{text}", unknown=True)
    return SendDecision(False, backoff, kept)
