"""The outbox's pure parts: parameters as JSON (PTB objects, defaults, uploads refused) and what
a failed send means (retry, fail, hold), with PTB's real exception classes."""

from __future__ import annotations

import datetime as dt
import json

import httpx
import pytest
from telegram import InlineKeyboardButton, InlineKeyboardMarkup, LinkPreviewOptions
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TimedOut,
)

from ptb_fence import OutboxEntry
from ptb_fence.runtime._bot_params import api_method, params_json
from ptb_fence.runtime._send_outcome import backoff_seconds, decide, is_idempotent


def _entry(method: str = "sendMessage", *, tries: int = 1, at_most_once: bool = False,
           chat_key: "int | None" = 5) -> OutboxEntry:
    return OutboxEntry(
        call_id=1, update_id=1, attempt=1, claim_id="c", seq=0, chat_key=chat_key,
        method=method, params_json="{}", at_most_once=at_most_once, state="sending",
        tries=tries, due_at=0, created_at=0, sent_at=None, error=None, result_json=None,
        acknowledged=False,
    )


def _raised_from(error: Exception, cause: Exception) -> Exception:
    try:
        raise error from cause
    except Exception as exc:
        return exc


def test_method_names() -> None:
    assert api_method("sendMessage") == "sendMessage"
    assert api_method("send_message") == "sendMessage"
    assert api_method("edit_message_reply_markup") == "editMessageReplyMarkup"
    with pytest.raises(ValueError):
        api_method("send message")


def test_params_as_json_with_defaults() -> None:
    keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("a", callback_data="1")]])
    text = params_json(
        "sendMessage",
        {"chat_id": 1, "text": "t", "reply_markup": keyboard, "message_thread_id": None,
         "reply_parameters": {"message_id": 3}, "schedule": dt.datetime(2024, 1, 1)},
        {"parse_mode": "HTML", "protect_content": True,
         "link_preview_options": LinkPreviewOptions(is_disabled=True),
         "allow_sending_without_reply": True},
    )
    assert json.loads(text) == {
        "chat_id": 1, "text": "t",
        "reply_markup": {"inline_keyboard": [[{"text": "a", "callback_data": "1"}]]},
        "reply_parameters": {"message_id": 3, "allow_sending_without_reply": True},
        "schedule": 1704067200,
        "parse_mode": "HTML", "protect_content": True,
        "link_preview_options": {"is_disabled": True},
    }
    # given values win; methods that do not take a default do not get it
    assert json.loads(params_json("sendMessage", {"parse_mode": "MarkdownV2"},
                                  {"parse_mode": "HTML"})) == {"parse_mode": "MarkdownV2"}
    assert json.loads(params_json("deleteMessage", {"chat_id": 1, "message_id": 2},
                                  {"parse_mode": "HTML", "protect_content": True})) == {
        "chat_id": 1, "message_id": 2}


@pytest.mark.parametrize("value", [b"bytes", bytearray(b"x"), object()])
def test_what_json_cannot_keep_is_refused(value: object) -> None:
    with pytest.raises(TypeError, match="document"):
        params_json("sendDocument", {"document": value})


def test_decisions_with_ptb_errors() -> None:
    retry = decide(_entry(), RetryAfter(7))
    assert (retry.fail, retry.delay_seconds, retry.hold_all) == (False, 7.0, False)
    assert decide(_entry(), RetryAfter(7), global_hold=True).hold_all
    for permanent in (Forbidden("Forbidden: bot was blocked by the user"),
                      BadRequest("Chat not found"), BadRequest("Message is not modified"),
                      ChatMigrated(-100)):
        assert decide(_entry(), permanent).fail
    # an answer with an error status (PTB raises it without an httpx error behind it)
    server = decide(_entry(tries=3), NetworkError("Internal Server Error (500)"))
    assert (server.fail, server.unknown, server.delay_seconds) == (False, False, 4.0)
    assert not decide(_entry(), InvalidToken("Unauthorized")).fail


def test_unknown_outcome() -> None:
    timed_out = TimedOut("Timed out")
    dropped = _raised_from(NetworkError("httpx.RemoteProtocolError"),
                           httpx.RemoteProtocolError("Server disconnected"))
    for error in (timed_out, dropped):
        assert decide(_entry(), error) == decide(_entry(), error)  # deterministic
        resend = decide(_entry(), error)
        assert not resend.fail and resend.unknown
        report = decide(_entry(at_most_once=True), error)
        assert report.fail and report.error.startswith("unknown outcome: ")
        # edits, deletes and answers are repeated whatever at_most_once says
        for method in ("editMessageText", "deleteMessage", "answerCallbackQuery"):
            assert not decide(_entry(method, at_most_once=True), error).fail
    # never left: a connect error is retried even at most once
    never = _raised_from(NetworkError("httpx.ConnectError"), httpx.ConnectError("refused"))
    assert not decide(_entry(at_most_once=True), never).fail


def test_idempotent_methods_and_backoff() -> None:
    assert is_idempotent("editMessageCaption") and is_idempotent("answerCallbackQuery")
    assert not is_idempotent("sendMessage") and not is_idempotent("forwardMessage")
    assert [backoff_seconds(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert backoff_seconds(50) == 300.0
