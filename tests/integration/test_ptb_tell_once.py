"""Telling the user once that their update failed: an error handler runs once per attempt and
reads ``context.attempt.retry_follows``; ``handle_exhaustion`` queues the message on
``exhaustion.outbox``, which commits with the exhaustion's acknowledgement (a delivery that
raises drops its calls: the next one queues its own). Real PTB Applications against
FakeBotApi, on every store."""

from __future__ import annotations

import json
import threading
from typing import Any, List

import pytest
from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes

from ptb_fence import DeliveredExhaustion, UpdateIntake, UsageError
from ptb_fence.ptb import DurableUpdateProcessor, FencedCallbackContext, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import FAST, build, polling, run, wait_for


async def _fail(update: Update, context: Any) -> None:
    raise RuntimeError("the booking service is down")


def test_the_user_is_told_once_from_handle_exhaustion(store: Any) -> None:
    """Three attempts: the error handler sees retry_follows True, True, False. The first
    delivery queues the apology and raises (nothing sent, still due); the second queues it
    and returns: it is sent once, with the acknowledgement."""
    seen: List[Any] = []
    deliveries: List[int] = []
    lock = threading.Lock()

    async def on_error(update: object, context: FencedCallbackContext) -> None:
        attempt = context.attempt
        assert attempt is not None and attempt.failure is context.error
        seen.append(attempt.retry_follows)

    async def on_exhaustion(exhaustion: DeliveredExhaustion) -> None:
        exhaustion.outbox.reply_text("Sorry, that failed. Please try again later.")
        with lock:
            deliveries.append(exhaustion.update_id)
            first = len(deliveries) == 1
        if first:
            raise ConnectionError("the log service is down too")

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(store, handle_exhaustion=on_exhaustion, max_attempts=3,
                                          retry=lambda error, attempt: 0.05, **FAST)
        builder = Application.builder().context_types(ContextTypes(context=FencedCallbackContext))
        app = build(processor, fake, builder)
        app.add_handler(CommandHandler("book", _fail))
        app.add_error_handler(on_error)
        async with polling(app):
            fake.inject_message(chat_id=7, text="/book")
            await wait_for("the apology", lambda: fake.sent_messages, 20)
            await wait_for("acknowledged", lambda: store.due_exhaustions(limit=5) == [], 10)
            await wait_for("quiet", lambda: len(fake.sent_messages) == 1, 1)

    with FakeBotApi() as fake:
        run(scenario(fake), timeout=60)
        sent = [c.params["text"] for c in fake.effective_calls if c.method == "sendMessage"]
    assert seen == [True, True, False]
    assert len(deliveries) == 2, deliveries
    assert sent == ["Sorry, that failed. Please try again later."]


@pytest.mark.parametrize("store_kind", ["sqlite"])
def test_a_unary_front_end_says_to_use_the_fenced_one(store: Any) -> None:
    """DurableUpdateProcessor delivers exhaustions but has no outbox: exhaustion.outbox names
    FencedUpdateProcessor; nothing is sent and the exhaustion is acknowledged."""
    errors: List[BaseException] = []

    async def on_exhaustion(exhaustion: DeliveredExhaustion) -> None:
        try:
            exhaustion.outbox.send_message(7, "Sorry")
        except UsageError as exc:
            errors.append(exc)

    async def scenario(fake: FakeBotApi) -> None:
        processor = DurableUpdateProcessor(store, handle_exhaustion=on_exhaustion,
                                           max_attempts=1, **FAST)
        app = build(processor, fake)
        app.add_handler(CommandHandler("book", _fail))
        async with polling(app):
            fake.inject_message(chat_id=7, text="/book")
            await wait_for("delivered", lambda: errors, 20)

    with FakeBotApi() as fake:
        run(scenario(fake), timeout=60)
        assert fake.sent_messages == []
    assert "FencedUpdateProcessor" in str(errors[0])


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_the_blocking_front_end_sends_the_exhaustions_calls_with_its_acknowledgement(
    store: Any,
) -> None:
    """UpdateIntake(handle_attempt=...): the same outbox on the exhaustion it delivers."""
    delivered: List[int] = []

    def handle(update: Any, attempt: Any) -> None:
        raise RuntimeError("down")

    def on_exhaustion(exhaustion: DeliveredExhaustion) -> None:
        exhaustion.outbox.send_message(9, f"update {exhaustion.update_id} failed")
        delivered.append(exhaustion.update_id)

    with FakeBotApi() as fake:
        intake = UpdateIntake(store, handle_attempt=handle, handle_exhaustion=on_exhaustion,
                              max_attempts=1, bot_token=fake.token, bot_base_url=fake.base_url,
                              **FAST)
        intake.start()
        try:
            body = fake.new_message_update(9, "x")
            assert intake.accept(json.dumps(body)) == "accepted"
            assert fake.wait_until(lambda: len(fake.sent_messages) == 1, 20), delivered
            assert fake.wait_until(lambda: store.due_exhaustions(limit=5) == [], 10)
        finally:
            intake.close(timeout=10)
        assert [m["text"] for m in fake.sent_messages] == [f"update {body['update_id']} failed"]
