"""'Already done' is success, and a migrated group gets the call once more: the pure parts.

``decide`` reads an answer after a try whose outcome was unknown (its stored error's mark).
``send_call`` follows a ``ChatMigrated`` once and turns an "already done" answer into the
result ``true``. The errors are PTB's real classes, as both front ends raise them (the
blocking front end's through ``answer_error``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Optional, Tuple

import httpx
import pytest
from telegram.error import BadRequest, ChatMigrated, Forbidden, NetworkError, TimedOut

from ptb_fence import OutboxEntry
from ptb_fence.runtime._bot_answers import FAIL, MIGRATE, RETRY, SENT, answer_error, outcome_of
from ptb_fence.runtime._send_call import send_call
from ptb_fence.runtime._send_outcome import (
    DONE_RESULT,
    UNKNOWN,
    UNKNOWN_BEFORE,
    after_unknown,
    decide,
)

NOT_MODIFIED = ("Bad Request: message is not modified: specified new message content and reply "
                "markup are exactly the same as a current content and reply markup of the message")
DELETE_NOT_FOUND = "Bad Request: message to delete not found"
CANT_DELETE = "Bad Request: message can't be deleted"


def _entry(method: str = "editMessageText", *, error: Optional[str] = None, tries: int = 1,
           at_most_once: bool = False) -> OutboxEntry:
    return OutboxEntry(
        call_id=7, update_id=3, attempt=1, claim_id="c", seq=0, chat_key=-4242, method=method,
        params_json="{}", at_most_once=at_most_once, state="sending", tries=tries, due_at=0,
        created_at=0, sent_at=None, error=error, result_json=None, acknowledged=False,
    )


def _dropped() -> Exception:
    """A connection lost after the request left, as both front ends raise it."""
    try:
        raise NetworkError("httpx.RemoteProtocolError") from httpx.RemoteProtocolError("gone")
    except NetworkError as exc:
        return exc


def _bad_request(description: str, blocking: bool, method: str) -> BaseException:
    """The error for a 400 answer: PTB's own, or the blocking front end's ``answer_error``."""
    if blocking:
        return answer_error(method, 400, {"ok": False, "error_code": 400,
                                          "description": description}, token_known_good=True)
    return BadRequest(description)


def _retried(entry: OutboxEntry, error: BaseException) -> OutboxEntry:
    """``entry`` as its next claim reads it, after the decision for ``error`` was stored."""
    decision = decide(entry, error)
    assert not decision.fail and not decision.done, decision
    return dataclasses.replace(entry, tries=entry.tries + 1, error=decision.error)


@pytest.mark.parametrize("unknown", [TimedOut("Timed out"), _dropped()],
                         ids=["timeout", "dropped"])
def test_an_unknown_outcome_marks_the_stored_error(unknown: BaseException) -> None:
    entry = _retried(_entry(), unknown)
    assert entry.error is not None and entry.error.startswith(UNKNOWN)
    assert after_unknown(entry)
    assert not after_unknown(_entry()) and not after_unknown(_entry(error="TimedOut: x"))


@pytest.mark.parametrize("blocking", [False, True], ids=["ptb", "blocking"])
@pytest.mark.parametrize("method", ["editMessageText", "editMessageReplyMarkup",
                                    "editMessageCaption"])
def test_not_modified_after_an_unknown_outcome_is_done(method: str, blocking: bool) -> None:
    answer = _bad_request(NOT_MODIFIED, blocking, method)
    first = decide(_entry(method), answer)
    assert first.fail and not first.done  # a first try's edit that changes nothing
    after = decide(_retried(_entry(method), TimedOut("Timed out")), answer)
    assert after.done and not after.fail, after
    assert "not modified" in after.error.lower()


@pytest.mark.parametrize("blocking", [False, True], ids=["ptb", "blocking"])
@pytest.mark.parametrize("method", ["deleteMessage", "deleteMessages"])
def test_delete_not_found_after_an_unknown_outcome_is_done(method: str, blocking: bool) -> None:
    answer = _bad_request(DELETE_NOT_FOUND, blocking, method)
    assert decide(_entry(method), answer).fail
    assert decide(_retried(_entry(method), _dropped()), answer).done
    # the message is still there: no sign of an earlier delete
    cant = _bad_request(CANT_DELETE, blocking, method)
    after = decide(_retried(_entry(method), _dropped()), cant)
    assert after.fail and not after.done


def test_the_answers_are_done_only_for_their_methods() -> None:
    unknown = TimedOut("Timed out")
    for method, description in (
        ("sendMessage", NOT_MODIFIED), ("editMessageText", DELETE_NOT_FOUND),
        ("deleteMessage", NOT_MODIFIED), ("setMessageReaction", NOT_MODIFIED),
    ):
        decision = decide(_retried(_entry(method), unknown), BadRequest(description))
        assert decision.fail and not decision.done, (method, description)
    assert outcome_of(BadRequest(NOT_MODIFIED), "editMessageText", True) == SENT
    assert outcome_of(BadRequest(NOT_MODIFIED), "editMessageText") == FAIL
    assert outcome_of(ChatMigrated(-1001), "sendMessage") == MIGRATE
    assert outcome_of(NetworkError("Bad Gateway"), "editMessageText", True) == RETRY


def test_the_mark_outlives_a_try_in_between() -> None:
    entry = _retried(_entry(), TimedOut("Timed out"))
    entry = _retried(entry, NetworkError("Bad Gateway (502)"))  # an answer: known, not done
    assert entry.error is not None and entry.error.startswith(UNKNOWN_BEFORE + "NetworkError")
    assert decide(entry, BadRequest(NOT_MODIFIED)).done
    # an at-most-once call's unknown outcome still fails as before
    report = decide(_entry("sendMessage", at_most_once=True), TimedOut("Timed out"))
    assert report.fail and report.error == UNKNOWN + "TimedOut: Timed out"


def test_a_chat_migrated_that_reaches_decide_fails() -> None:
    decision = decide(_entry("sendMessage"), ChatMigrated(-1004242))
    assert decision.fail and not decision.done


class _Bot:
    """A ``send``: answers ``answers`` in turn (an exception is raised), records the calls."""

    def __init__(self, *answers: Any) -> None:
        self.answers: List[Any] = list(answers)
        self.calls: List[Tuple[str, Dict[str, Any]]] = []

    def __call__(self, method: str, params: Dict[str, Any]) -> Any:
        self.calls.append((method, dict(params)))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def test_send_call_sends_once_more_to_the_supergroup(caplog: Any) -> None:
    bot = _Bot(ChatMigrated(-1004242), {"message_id": 1, "chat": {"id": -1004242}})
    params = {"chat_id": -4242, "text": "hi"}
    with caplog.at_level(logging.INFO, logger="ptb_fence.outbox"):
        result = send_call(bot, _entry("sendMessage"), params)
    assert result == {"message_id": 1, "chat": {"id": -1004242}}
    assert bot.calls == [("sendMessage", {"chat_id": -4242, "text": "hi"}),
                         ("sendMessage", {"chat_id": -1004242, "text": "hi"})]
    assert params == {"chat_id": -4242, "text": "hi"}  # the stored call is not changed
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "-4242" in warning.getMessage() and "-1004242" in warning.getMessage()


@pytest.mark.parametrize("second", [Forbidden("Forbidden: bot was kicked from the supergroup "
                                              "chat"), ChatMigrated(-1009999)],
                         ids=["refused", "migrated-again"])
def test_send_call_raises_what_the_second_send_raised(second: BaseException) -> None:
    bot = _Bot(ChatMigrated(-1004242), second)
    with pytest.raises(type(second)) as raised:
        send_call(bot, _entry("sendMessage"), {"chat_id": "-4242", "text": "hi"})
    assert raised.value is second and len(bot.calls) == 2  # never a second hop
    assert bot.calls[1][1]["chat_id"] == -1004242
    decision = decide(_entry("sendMessage"), raised.value)
    assert decision.fail and decision.error.startswith(type(second).__name__)


@pytest.mark.parametrize("params", [
    {"chat_id": 42, "text": "a user, no group"},
    {"chat_id": -1001234567890, "text": "a supergroup migrates no more"},
    {"chat_id": "@channel", "text": "a username"},
    {"text": "no chat_id"},
    {"chat_id": -4242, "from_chat_id": -5353, "message_id": 1},  # which one moved?
], ids=["user", "supergroup", "username", "none", "two-groups"])
def test_send_call_follows_no_unclear_migration(params: Dict[str, Any]) -> None:
    bot = _Bot(ChatMigrated(-1004242), True)
    with pytest.raises(ChatMigrated):
        send_call(bot, _entry("forwardMessage"), params)
    assert len(bot.calls) == 1


def test_send_call_ends_an_already_done_call_with_true() -> None:
    done = _retried(_entry("deleteMessage"), TimedOut("Timed out"))
    bot = _Bot(BadRequest(DELETE_NOT_FOUND))
    assert send_call(bot, done, {"chat_id": 42, "message_id": 9}) is DONE_RESULT is True
    # without the earlier unknown outcome the refusal is raised for the dispatcher
    with pytest.raises(BadRequest):
        send_call(_Bot(BadRequest(DELETE_NOT_FOUND)), _entry("deleteMessage"),
                  {"chat_id": 42, "message_id": 9})
    # other errors pass through untouched, the unknown ones included
    timed_out = TimedOut("Timed out")
    with pytest.raises(TimedOut) as raised:
        send_call(_Bot(timed_out), done, {"chat_id": 42, "message_id": 9})
    assert raised.value is timed_out
