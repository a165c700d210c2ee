"""The one table of Bot API answers, tried on both front ends against a FakeBotApi.

Each answer is sent for real through the PTB front end's sender (an initialized PTB ``Bot``,
``do_api_request``) and the blocking front end's sender (its httpx client); the dispatcher's
decision for what each raised must be the table's, the same for both. Then a method Telegram
does not have (a typo) is queued on a real ``UpdateIntake`` and a real PTB ``Application``:
it fails at once and the chat's next reply goes out.

"Already done" is success, on both front ends: after a try whose outcome was unknown, an edit
answered ``message is not modified`` and a delete answered ``message to delete not found`` end
the call sent. A ``ChatMigrated`` sends the call once more, to the supergroup.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest
from telegram import Bot, Update
from telegram.ext import MessageHandler, filters

from ptb_fence import OutboxEntry, UpdateIntake
from ptb_fence.blocking._sender import HttpxSender
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.ptb._sender import BotSender
from ptb_fence.runtime._bot_answers import ANSWERS, FAIL, HOLD, MIGRATE, RETRY, SENT
from ptb_fence.runtime._send_call import send_call
from ptb_fence.runtime._send_outcome import UNKNOWN, decide
from ptb_fence.testing import FakeBotApi
from ptb_support import FAST, build, polling, run, wait_for
from runtime_support import body, wait_until

Row = Tuple[str, Optional[int], Optional[str], Optional[int], str]
"""(method, HTTP status, description, retry_after or migrate_to_chat_id, the table's
outcome)."""

ROWS: List[Row] = [
    ("sendMessage", None, None, None, SENT),
    ("sendMessage", 400, "Bad Request: chat not found", None, FAIL),
    ("sendMessage", 403, "Forbidden: bot was blocked by the user", None, FAIL),
    ("sendMesage", 404, "Not Found", None, FAIL),  # a method Telegram does not have
    ("sendMessage", 401, "Unauthorized", None, RETRY),  # the token revoked since
    ("sendMessage", 409, "Conflict: terminated by other getUpdates request", None, RETRY),
    ("sendMessage", 429, None, 3, HOLD),
    ("sendMessage", 400, "Bad Request: group chat was upgraded to a supergroup chat", -1001,
     FAIL),  # parameters.migrate_to_chat_id
    ("sendMessage", 429, "Too Many Requests", None, RETRY),  # no retry_after: backoff
    ("sendMessage", 500, "Internal Server Error", None, RETRY),
    ("sendMessage", 502, "Bad Gateway", None, RETRY),
    # on a first try these are the caller's mistake (after an unknown outcome: sent, below)
    ("editMessageText", 400, "Bad Request: message is not modified: specified new message "
     "content and reply markup are exactly the same as a current content and reply markup "
     "of the message", None, FAIL),
    ("deleteMessage", 400, "Bad Request: message to delete not found", None, FAIL),
]


def _entry(method: str) -> OutboxEntry:
    return OutboxEntry(1, 1, 1, "c", 0, 42, method, "{}", False, "sending", 1, 0, 0, None,
                       None, None, False)


def _outcome(method: str, send: Any, raised: Optional[List[str]] = None) -> str:
    """What the dispatcher makes of one real send: sent, or its decision's kind (the error's
    class appended to ``raised``)."""
    try:
        send_call(send, _entry(method), {"chat_id": 42, "text": "hi"})
    except Exception as exc:
        if raised is not None:
            raised.append(type(exc).__name__)
        decision = decide(_entry(method), exc)
        if decision.fail:
            return FAIL
        if "RetryAfter" in {c.__name__ for c in type(exc).__mro__}:
            assert decision.delay_seconds == 3.0
            return HOLD
        return RETRY
    return SENT


@pytest.fixture
def ptb_bot(fake: FakeBotApi) -> Iterator[Tuple[Bot, asyncio.AbstractEventLoop]]:
    """An initialized PTB Bot on an event loop of its own thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    bot = Bot(fake.token, base_url=fake.base_url)
    asyncio.run_coroutine_threadsafe(bot.initialize(), loop).result(10)
    try:
        yield bot, loop
    finally:
        asyncio.run_coroutine_threadsafe(bot.shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


@pytest.fixture
def ptb_sender(ptb_bot: Tuple[Bot, asyncio.AbstractEventLoop]) -> BotSender:
    """A PTB front end's sender on that Bot."""
    return BotSender(ptb_bot[0], ptb_bot[1], 10.0)


@pytest.fixture
def fake() -> Iterator[FakeBotApi]:
    with FakeBotApi() as api:
        yield api


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r[0]}-{r[1]}-{r[3]}")
def test_each_answer_has_the_tables_outcome_on_both_front_ends(
    row: Row, fake: FakeBotApi, ptb_sender: BotSender,
) -> None:
    method, code, description, parameter, expected = row
    retry_after = parameter if parameter is not None and parameter > 0 else None
    migrate = parameter if parameter is not None and parameter < 0 else None
    blocking = HttpxSender(fake.token, fake.base_url, timeout=10.0)
    got: Dict[str, str] = {}
    raised: Dict[str, List[str]] = {"ptb": [], "blocking": []}
    try:
        for name, send in (("ptb", ptb_sender), ("blocking", blocking)):
            if code is not None:
                fake.fail_next(method, error_code=code, description=description,
                               retry_after=retry_after, migrate_to_chat_id=migrate)
            got[name] = _outcome(method, send, raised[name])
    finally:
        blocking.close()
    assert got == {"ptb": expected, "blocking": expected}, row
    assert raised["ptb"] == raised["blocking"], raised  # the same error, not just the outcome
    if migrate is not None:
        assert raised["ptb"] == ["ChatMigrated"], raised


def test_the_table_names_every_outcome_and_known_error() -> None:
    assert {rule.outcome for rule in ANSWERS} == {RETRY, HOLD, FAIL, SENT, MIGRATE}
    assert {"RetryAfter", "ChatMigrated", "Forbidden", "BadRequest", "EndPointNotFound",
            "InvalidToken", "Conflict", "NetworkError"} == {rule.error for rule in ANSWERS}


def test_a_401_or_404_with_a_token_never_known_good_is_retried(fake: FakeBotApi) -> None:
    """The blocking sender's token check fails too (a wrong token): the calls wait, as for
    PTB's bot that could not start."""
    wrong = HttpxSender("123456:WRONG-TOKEN", fake.base_url, timeout=10.0)
    try:
        assert _outcome("sendMesage", wrong) == RETRY
    finally:
        wrong.close()


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_blocking_front_end_fails_an_unknown_method_at_once_and_the_chat_goes_on(
    store: Any,
) -> None:
    failures: List[OutboxEntry] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        attempt.outbox.call("sendMesage", chat_id=42, text="a typo of a method")
        attempt.outbox.reply_text("Booked")

    with FakeBotApi() as fake:
        fake.fail_next("sendMesage", 50, error_code=404, description="Not Found")
        intake = UpdateIntake(
            store, handle_attempt=handle, bot_token=fake.token, bot_base_url=fake.base_url,
            handle_send_failure=failures.append,
        )
        intake.start()
        try:
            started = time.monotonic()
            intake.accept(body(1, chat=42))
            booked = wait_until(lambda: [m for m in fake.sent_messages
                                         if m["text"] == "Booked"], 10)
            took = time.monotonic() - started
            assert booked, (fake.calls_to("sendMesage"), store.list_calls())
            assert wait_until(lambda: len(failures) == 1, 10)
        finally:
            intake.close()
        (typo,) = [e for e in store.list_calls() if e.method == "sendMesage"]
        assert typo.state == "failed" and typo.tries == 1, typo
        assert "EndPointNotFound" in (typo.error or "") or "not found" in (typo.error or "")
        assert len(fake.calls_to("sendMesage")) == 1  # never retried
    print(f"\nblocking front end: the chat's reply after the refused call in {took:.2f} s")


@pytest.mark.parametrize("store_kind", ["sqlite"])
def test_ptb_front_end_fails_an_unknown_method_at_once_and_the_chat_goes_on(
    store: Any,
) -> None:
    failures: List[OutboxEntry] = []

    async def on_message(update: Update, context: Any) -> None:
        context.attempt.outbox.call("sendMesage", chat_id=42, text="a typo of a method")
        context.attempt.outbox.reply_text("Booked")

    async def main() -> None:
        processor = FencedUpdateProcessor(
            store, **dict(FAST, lease_seconds=10.0), handle_send_failure=failures.append
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            fake.inject_message(42, "book")
            await wait_for("the reply", lambda: [m for m in fake.sent_messages
                                                 if m["text"] == "Booked"], 10)
            await wait_for("the failure", lambda: failures, 10)

    with FakeBotApi() as fake:
        fake.fail_next("sendMesage", 50, error_code=404, description="Not Found")
        run(main())
    (typo,) = [e for e in store.list_calls() if e.method == "sendMesage"]
    assert typo.state == "failed" and typo.tries == 1, typo
    assert len(fake.calls_to("sendMesage")) == 1


# -- "already done" is success, and a migrated group gets the call once more ------------------

NOT_MODIFIED = ("Bad Request: message is not modified: specified new message content and reply "
                "markup are exactly the same as a current content and reply markup of the message")

Call = Tuple[str, Dict[str, Any]]
"""A call a handler queues: the method and its parameters."""


def _queue_and_wait(
    front_end: str, store: Any, fake: FakeBotApi, calls: Sequence[Call]
) -> Tuple[List[OutboxEntry], List[OutboxEntry]]:
    """Queue ``calls`` from one update's handler on ``front_end`` (its real dispatcher and
    sender) and wait until each ended. The stored calls by id, and the failures delivered."""
    failures: List[OutboxEntry] = []

    def ended() -> bool:
        entries = store.list_calls()
        return len(entries) == len(calls) and all(
            e.state in ("sent", "failed") for e in entries
        ) and len(failures) == sum(e.state == "failed" for e in entries)

    if front_end == "blocking":
        def handle(update: Dict[str, Any], attempt: Any) -> None:
            for method, params in calls:
                attempt.outbox.call(method, **params)

        # a short sweep: a failure that ends a round is delivered at the next sweep
        intake = UpdateIntake(
            store, handle_attempt=handle, bot_token=fake.token, bot_base_url=fake.base_url,
            handle_send_failure=failures.append, **dict(FAST, lease_seconds=10.0),
        )
        intake.start()
        try:
            intake.accept(body(1, chat=42))
            assert wait_until(ended, 20), store.list_calls()
        finally:
            intake.close()
    else:
        async def on_message(update: Update, context: Any) -> None:
            for method, params in calls:
                context.attempt.outbox.call(method, **params)

        async def main() -> None:
            processor = FencedUpdateProcessor(
                store, **dict(FAST, lease_seconds=10.0), handle_send_failure=failures.append
            )
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.TEXT, on_message))
            async with polling(app):
                fake.inject_message(42, "go")
                await wait_for("the calls to end", ended, 20)

        run(main())
    return sorted(store.list_calls(), key=lambda e: e.call_id), failures


def _effective(fake: FakeBotApi, method: str) -> List[Dict[str, Any]]:
    return [call.params for call in fake.effective_calls if call.method == method]


FRONT_ENDS = pytest.mark.parametrize("front_end", ["ptb", "blocking"])


@FRONT_ENDS
@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_an_edit_not_modified_after_a_lost_answer_is_sent(store: Any, front_end: str) -> None:
    """The edit took effect and its answer was lost. Its resend hears it changes nothing."""
    edit = {"chat_id": 42, "message_id": 7, "text": "booked for 9:00"}
    with FakeBotApi() as fake:
        fake.cut_next("editMessageText", after_effect=True)
        (entry,), failures = _queue_and_wait(front_end, store, fake, [("editMessageText", edit)])
        assert len(fake.calls_to("editMessageText")) == 2  # the lost one, the resend
        assert len(_effective(fake, "editMessageText")) == 1  # the user saw one edit
    assert (entry.state, entry.tries, entry.result_json) == ("sent", 2, "true"), entry
    assert (entry.error or "").startswith(UNKNOWN + "NetworkError"), entry.error
    assert failures == []


@FRONT_ENDS
@pytest.mark.parametrize("store_kind", ["sqlite"])
def test_an_edit_not_modified_on_its_first_try_fails(store: Any, front_end: str) -> None:
    """The handler edits to the same text twice: the second edit is its own mistake."""
    edit = {"chat_id": 42, "message_id": 7, "text": "booked for 9:00"}
    with FakeBotApi() as fake:
        (first, second), failures = _queue_and_wait(
            front_end, store, fake, [("editMessageText", edit), ("editMessageText", edit)]
        )
        assert len(fake.calls_to("editMessageText")) == 2
    assert first.state == "sent" and json.loads(first.result_json or "{}")["message_id"] == 7
    assert (second.state, second.tries, second.result_json) == ("failed", 1, None), second
    assert "not modified" in (second.error or "").lower(), second.error
    assert [f.call_id for f in failures] == [second.call_id]


@FRONT_ENDS
@pytest.mark.parametrize("store_kind", ["sqlite"])
def test_a_delete_not_found_after_a_lost_answer_is_sent(store: Any, front_end: str) -> None:
    delete = {"chat_id": 42, "message_id": 9}
    with FakeBotApi() as fake:
        fake.cut_next("deleteMessage", after_effect=True)
        fake.fail_next("deleteMessage", error_code=400,
                       description="Bad Request: message to delete not found")
        (entry,), failures = _queue_and_wait(front_end, store, fake, [("deleteMessage", delete)])
        assert len(fake.calls_to("deleteMessage")) == 2
    assert (entry.state, entry.tries, entry.result_json) == ("sent", 2, "true"), entry
    assert failures == []


@FRONT_ENDS
@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_migrated_group_gets_the_call_once_in_the_supergroup(
    store: Any, front_end: str, caplog: Any,
) -> None:
    with FakeBotApi() as fake, caplog.at_level(logging.INFO, logger="ptb_fence.outbox"):
        fake.fail_next("sendMessage", migrate_to_chat_id=-1004242)
        (entry,), failures = _queue_and_wait(
            front_end, store, fake, [("sendMessage", {"chat_id": -4242, "text": "see you"})]
        )
        assert [c["chat_id"] for c in fake.calls_to("sendMessage")] == [-4242, -1004242]
        assert [(m["chat_id"], m["text"]) for m in fake.sent_messages] == [
            (-1004242, "see you")]
    assert (entry.state, entry.tries, entry.chat_key) == ("sent", 1, -4242), entry
    assert json.loads(entry.result_json or "{}")["chat"]["id"] == -1004242
    assert failures == []
    said = [r.getMessage() for r in caplog.records
            if r.levelno >= logging.INFO and "ChatMigrated" in r.getMessage()]
    assert len(said) == 1 and "-4242" in said[0] and "-1004242" in said[0], said


@FRONT_ENDS
@pytest.mark.parametrize("store_kind", ["sqlite"])
def test_a_migrated_call_refused_in_the_supergroup_fails_with_that_refusal(
    store: Any, front_end: str,
) -> None:
    with FakeBotApi() as fake:
        fake.fail_next("sendMessage", migrate_to_chat_id=-1004242)
        fake.fail_next("sendMessage", error_code=403,
                       description="Forbidden: bot was kicked from the supergroup chat")
        (entry,), failures = _queue_and_wait(
            front_end, store, fake, [("sendMessage", {"chat_id": -4242, "text": "see you"})]
        )
        assert [c["chat_id"] for c in fake.calls_to("sendMessage")] == [-4242, -1004242]
        assert fake.sent_messages == []
    assert (entry.state, entry.tries) == ("failed", 1), entry
    assert (entry.error or "").startswith("Forbidden: bot was kicked"), entry.error
    assert [f.call_id for f in failures] == [entry.call_id]


def test_an_edit_not_modified_after_a_timeout_is_sent_on_both_front_ends(
    fake: FakeBotApi, ptb_bot: Tuple[Bot, asyncio.AbstractEventLoop],
) -> None:
    """A real timeout of each front end's sender. The edit takes effect after the sender gave
    up (held by the fake until then). The retry, as the dispatcher makes it, is sent."""
    senders = {"ptb": BotSender(ptb_bot[0], ptb_bot[1], 0.5),
               "blocking": HttpxSender(fake.token, fake.base_url, timeout=0.5)}
    try:
        for message_id, (name, send) in enumerate(senders.items(), start=1):
            edit = {"chat_id": 42, "message_id": message_id, "text": "booked for 9:00"}
            entry = _entry("editMessageText")
            fake.hold("editMessageText")
            with pytest.raises(Exception) as raised:
                send_call(send, entry, edit)
            decision = decide(entry, raised.value)
            assert type(raised.value).__name__ == "TimedOut", (name, raised.value)
            assert decision.unknown and not decision.fail, (name, decision)
            fake.release("editMessageText")
            assert wait_until(lambda: len(_effective(fake, "editMessageText")) == message_id, 5)
            retried = dataclasses.replace(entry, tries=2, error=decision.error)
            assert send_call(send, retried, edit) is True, name
            # without the mark the same answer is a refusal
            with pytest.raises(Exception) as refused:
                send_call(send, entry, edit)
            assert "not modified" in str(refused.value).lower(), name
            assert decide(entry, refused.value).fail, name
    finally:
        senders["blocking"].close()  # type: ignore[attr-defined]
