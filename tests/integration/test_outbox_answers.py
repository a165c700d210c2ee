"""The one table of Bot API answers, tried on both front ends against a FakeBotApi.

Each answer is sent for real through the PTB front end's sender (an initialized PTB ``Bot``,
``do_api_request``) and the blocking front end's sender (its httpx client); the dispatcher's
decision for what each raised must be the table's, the same for both. Then a method Telegram
does not have (a typo) is queued on a real ``UpdateIntake`` and a real PTB ``Application``:
it fails at once and the chat's next reply goes out.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from telegram import Bot, Update
from telegram.ext import MessageHandler, filters

from ptb_fence import OutboxEntry, UpdateIntake
from ptb_fence.blocking._sender import HttpxSender
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.ptb._sender import BotSender
from ptb_fence.runtime._bot_answers import ANSWERS, FAIL, HOLD, RETRY, SENT
from ptb_fence.runtime._send_outcome import decide
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
]


def _entry(method: str) -> OutboxEntry:
    return OutboxEntry(1, 1, 1, "c", 0, 42, method, "{}", False, "sending", 1, 0, 0, None,
                       None, None, False)


def _outcome(method: str, send: Any, raised: Optional[List[str]] = None) -> str:
    """What the dispatcher makes of one real send: sent, or its decision's kind (the error's
    class appended to ``raised``)."""
    try:
        send(method, {"chat_id": 42, "text": "hi"})
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
def ptb_sender(fake: FakeBotApi) -> Iterator[BotSender]:
    """A PTB front end's sender: an initialized Bot on an event loop of its own thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    bot = Bot(fake.token, base_url=fake.base_url)
    asyncio.run_coroutine_threadsafe(bot.initialize(), loop).result(10)
    try:
        yield BotSender(bot, loop, 10.0)
    finally:
        asyncio.run_coroutine_threadsafe(bot.shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


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
    assert {rule.outcome for rule in ANSWERS} == {RETRY, HOLD, FAIL}
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
