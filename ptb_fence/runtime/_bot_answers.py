"""The one table of Bot API answers: what each answer means for an outbox call.

Both front ends read a failed answer through it. The blocking front end's sender turns an
HTTP answer into python-telegram-bot's exception with :func:`answer_error`, as PTB's own
request and ``Bot.do_api_request`` do for the PTB front end. The dispatcher then reads the
outcome of that exception from :data:`ANSWERS` (:func:`outcome_of`). So an answer gets one
outcome whichever front end sent the call.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any, Mapping, NamedTuple, Optional, Pattern, Tuple

__all__ = [
    "ANSWERS",
    "FAIL",
    "HOLD",
    "MIGRATE",
    "RETRY",
    "SENT",
    "AnswerRule",
    "answer_error",
    "outcome_of",
]

SENT = "sent"
"""Telegram did it (``ok: true``), or an answer says an earlier try did it."""

RETRY = "retry"
"""Try again after a backoff (the chat's later calls wait)."""

HOLD = "hold"
"""Try again after Telegram's ``retry_after`` (a flood limit)."""

FAIL = "fail"
"""A refusal repeating cannot change: end the call ``failed`` (the chat goes on)."""

MIGRATE = "migrate"
"""The group became a supergroup: send the call once more, to the new chat.

:func:`~ptb_fence.runtime._send_call.send_call` does it within the same claim.
The answer to that send decides the call.
A second ``ChatMigrated`` fails it (never a second hop)."""


class AnswerRule(NamedTuple):
    """One row of :data:`ANSWERS`.

    Attributes:
        answer: The Bot API answer, for people (HTTP status, ``error_code``, description).
        error: The ``telegram.error`` class both front ends raise for it.
        outcome: :data:`SENT`, :data:`RETRY`, :data:`HOLD` or :data:`FAIL`.
        said: A pattern of the description behind the error (its own text or its cause's).
            :obj:`None` matches any.
        methods: A pattern of the methods the row is for. :obj:`None` matches any.
        after_unknown: The row holds only after an earlier try whose outcome was unknown.
    """

    answer: str
    error: str
    outcome: str
    said: Optional[Pattern[str]] = None
    methods: Optional[Pattern[str]] = None
    after_unknown: bool = False


ANSWERS: Tuple[AnswerRule, ...] = (
    AnswerRule("any status with parameters.retry_after", "RetryAfter", HOLD),
    AnswerRule("any status with parameters.migrate_to_chat_id", "ChatMigrated", MIGRATE),
    # after a try whose outcome was unknown these say that try did it. On a first try they are
    # the caller's own mistake (an edit that changes nothing, a wrong message id): FAIL below
    AnswerRule("400 Bad Request: message is not modified, to an edit*, after an unknown "
               "outcome", "BadRequest", SENT, re.compile(r"message is not modified", re.I),
               re.compile(r"^edit"), after_unknown=True),
    AnswerRule("400 Bad Request: message to delete not found, after an unknown outcome",
               "BadRequest", SENT, re.compile(r"message to delete not found", re.I),
               re.compile(r"^deleteMessages?$"), after_unknown=True),
    AnswerRule("403 Forbidden: blocked, kicked, deactivated", "Forbidden", FAIL),
    AnswerRule("400 Bad Request: chat not found, text unparseable, ...", "BadRequest", FAIL),
    # a known-good token whose answer is 401: the token was revoked since. The calls wait
    # for the operator to fix it.
    AnswerRule("401 Unauthorized, the token known good before", "EndPointNotFound", RETRY,
               re.compile(r"^Unauthorized", re.IGNORECASE)),
    # Telegram answers 404 for a malformed token and for a method it does not have: with a
    # token known good (PTB: an initialized bot) it is the method
    AnswerRule("404 Not Found, the token known good", "EndPointNotFound", FAIL),
    AnswerRule("401/404 with a token not known good", "InvalidToken", RETRY),
    AnswerRule("409 Conflict", "Conflict", RETRY),
    AnswerRule("429 without retry_after, 5xx, other statuses, no answer", "NetworkError", RETRY),
)
"""Every Bot API answer to a call that is not ``ok``.

The first match wins.
An error none matches (an unexpected exception) is retried.
``TimedOut`` and a connection lost after the request left are a :data:`RETRY` of their own
kind: the outcome is unknown (see :func:`~ptb_fence.runtime._send_outcome.decide`).

"Already done" is success.
After such an unknown outcome the earlier try may have done the call.
Then ``message is not modified`` to an ``edit*`` method is :data:`SENT`.
So is ``message to delete not found`` to ``deleteMessage`` or ``deleteMessages``.
The call is recorded sent with the result ``true``.
Without an earlier unknown outcome both stay :data:`FAIL`.
A first try's edit that changes nothing is the caller's mistake, and it is reported.
``message can't be deleted`` stays :data:`FAIL` always.
Telegram says it for a message the bot may not delete (no right, too old).
The message is still there, so it is no sign of an earlier delete.

``ChatMigrated`` is :data:`MIGRATE`: the call is sent once more to the supergroup."""


def _names(error: BaseException) -> "set[str]":
    return {cls.__name__ for cls in type(error).__mro__}


def _said(error: BaseException) -> str:
    """The description behind ``error``: its cause's text when it has one (PTB raises
    ``EndPointNotFound`` from the ``InvalidToken`` that carries Telegram's description)."""
    cause = error.__cause__
    return str(cause if cause is not None else error)


def outcome_of(error: BaseException, method: str = "", after_unknown: bool = False) -> str:
    """The outcome :data:`ANSWERS` gives ``error`` (:data:`RETRY` when no row matches).

    Args:
        error: What the send raised.
        method: The Bot API method sent.
        after_unknown: An earlier try of the call had an unknown outcome.
    """
    names = _names(error)
    for rule in ANSWERS:
        if rule.error not in names or (rule.after_unknown and not after_unknown):
            continue
        if rule.methods is not None and not rule.methods.search(method):
            continue
        if rule.said is None or rule.said.search(_said(error)):
            return rule.outcome
    return RETRY


def answer_error(
    method: str, status: int, data: Any, *, token_known_good: bool
) -> BaseException:
    """The ``telegram.error`` exception for an answer that is not ``ok``, as PTB raises it.

    Args:
        method: The Bot API method called.
        status: The HTTP status.
        data: The answer's JSON (:obj:`None`: not JSON).
        token_known_good: The bot's token worked for another call (PTB: the bot is
            initialized): a 401/404 then names the method, not the token.
    """
    from telegram import error

    try:
        message = f"{HTTPStatus(status).phrase} ({status})"
    except ValueError:
        message = f"Unknown HTTPError ({status})"
    if isinstance(data, Mapping):
        message = data.get("description") or message
        parameters = data.get("parameters") or {}
        if isinstance(parameters, Mapping):
            if parameters.get("migrate_to_chat_id"):
                return error.ChatMigrated(parameters["migrate_to_chat_id"])
            if parameters.get("retry_after"):
                return error.RetryAfter(parameters["retry_after"])
    if status == HTTPStatus.FORBIDDEN:
        return error.Forbidden(message)
    if status in (HTTPStatus.NOT_FOUND, HTTPStatus.UNAUTHORIZED):
        rejected = error.InvalidToken(message)
        if not token_known_good:
            return rejected
        found = error.EndPointNotFound(f"Endpoint '{method}' not found in Bot API")
        found.__cause__ = rejected
        return found
    if status == HTTPStatus.BAD_REQUEST:
        return error.BadRequest(message)
    if status == HTTPStatus.CONFLICT:
        return error.Conflict(message)
    return error.NetworkError(message)
