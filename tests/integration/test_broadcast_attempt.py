"""attempt.broadcast: a broadcast a handler starts lands with the commit that completes its
update, or not at all.

Real stores (memory, SQLite file, PostgreSQL table) behind a real ``UpdateIntake`` that sends
to a ``FakeBotApi``, and a real PTB Application for ``context.attempt``. What landed is read
back with the store's own ``list_broadcasts``, what was sent from the fake.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Dict, List

import pytest
from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes

from ptb_fence import BroadcastWrite, UpdateIntake, UsageError
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import run, wait_for
from runtime_support import body, wait_until


def sent(fake: FakeBotApi, text: str) -> Counter[int]:
    """How often each chat got ``text``."""
    return Counter(int(m["chat_id"]) for m in fake.sent_messages if m.get("text") == text)


def intake_on(store: Any, fake: FakeBotApi, intakes: List[UpdateIntake], handle: Any,
              **options: Any) -> UpdateIntake:
    options.setdefault("retry", lambda error, attempt: 0.01)
    intake = UpdateIntake(store, handle_attempt=handle, bot_token=fake.token,
                          bot_base_url=fake.base_url, **options)
    intakes.append(intake)
    intake.start()
    return intake


def test_a_handlers_broadcast_lands_with_its_completion(
    store: Any, intakes: List[UpdateIntake]
) -> None:
    seen: Dict[str, Any] = {}

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        seen["write"] = attempt.broadcast("news", [11, 12, 13, 12], text="news")
        seen["while_running"] = store.list_broadcasts()  # held, not written

    with FakeBotApi() as fake:
        intake = intake_on(store, fake, intakes, handle)
        intake.accept(body(1, chat=5))
        assert fake.wait_until(lambda: len(sent(fake, "news")) == 3, 20)
        assert wait_until(lambda: intake.get_broadcast("news").done, 10)
        done = intake.get_broadcast("news")
    assert seen["while_running"] == []
    assert seen["write"] == BroadcastWrite("news", "sendMessage", '{"text":"news"}',
                                           (11, 12, 13))
    assert (done.total, done.sent) == (3, 3)
    assert set(sent(fake, "news").values()) == {1}


def test_a_failed_attempt_starts_nothing_and_its_retry_starts_it_once(
    store: Any, intakes: List[UpdateIntake]
) -> None:
    """The first attempt holds the broadcast and then fails: nothing of it is written. The
    second attempt sees no broadcast yet, starts it again and completes: each chat gets the
    message once."""
    seen: List[Any] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        seen.append((attempt.attempt, store.list_broadcasts()))
        attempt.broadcast("retry", range(21, 26), text="once")
        if attempt.attempt == 1:
            raise ConnectionError("the payment API timed out")

    with FakeBotApi() as fake:
        intake = intake_on(store, fake, intakes, handle)
        intake.accept(body(1, chat=5))
        assert fake.wait_until(lambda: len(sent(fake, "once")) == 5, 20)
        assert wait_until(lambda: intake.get_broadcast("retry").done, 10)
    assert [(n, found) for n, found in seen] == [(1, []), (2, [])]
    assert set(sent(fake, "once").values()) == {1}


def test_a_broadcast_held_in_a_complete_transaction_lands_with_that_commit(
    store: Any, intakes: List[UpdateIntake]
) -> None:
    def handle(update: Dict[str, Any], attempt: Any) -> None:
        with attempt.transaction(complete=True):
            attempt.broadcast("in-block", [31, 32], text="block")

    with FakeBotApi() as fake:
        intake = intake_on(store, fake, intakes, handle)
        intake.accept(body(1, chat=5))
        assert fake.wait_until(lambda: len(sent(fake, "block")) == 2, 20)
    assert set(sent(fake, "block").values()) == {1}


def test_a_name_with_another_call_gets_none_of_them_and_an_error_is_logged(
    store: Any, intakes: List[UpdateIntake], caplog: pytest.LogCaptureFixture
) -> None:
    def handle(update: Dict[str, Any], attempt: Any) -> None:
        attempt.broadcast("taken", [41, 42], text="other text")

    caplog.set_level(logging.ERROR, logger="ptb_fence.broadcasts")
    with FakeBotApi() as fake:
        intake = intake_on(store, fake, intakes, handle)
        intake.broadcast("taken", [40], text="first text")
        intake.accept(body(1, chat=5))
        assert wait_until(lambda: any("exists with another call" in r.getMessage()
                                      for r in caplog.records), 20)
        assert intake.get_broadcast("taken").total == 1
    assert 41 not in sent(fake, "other text") and 42 not in sent(fake, "other text")
    (record,) = [r for r in caplog.records if "exists with another call" in r.getMessage()]
    assert "pick a new name" in record.getMessage() and "2 chat(s)" in record.getMessage()


@pytest.mark.parametrize("store_kind", ["memory"])
def test_wrong_arguments_and_a_missing_sender_are_refused_with_the_fix(
    store: Any, intakes: List[UpdateIntake]
) -> None:
    errors: List[str] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        for call in (lambda: attempt.broadcast("x", [1], chat_id=5, text="t"),
                     lambda: attempt.broadcast("x", ["1"], text="t"),
                     lambda: attempt.broadcast("", [1], text="t"),
                     lambda: attempt.broadcast("x", [1], text=object())):
            try:
                call()
            except UsageError as exc:
                errors.append(str(exc))

    with FakeBotApi() as fake:
        intake_on(store, fake, intakes, handle).accept(body(1, chat=5))
        assert wait_until(lambda: len(errors) == 4, 10)
    assert "chat_ids, not chat_id=" in errors[0]
    assert "int chat id" in errors[1]
    assert "1 to 200 characters" in errors[2]
    assert "JSON values" in errors[3]

    refused: List[str] = []

    def no_sender(update: Dict[str, Any], attempt: Any) -> None:
        try:
            attempt.broadcast("x", [1], text="t")
        except UsageError as exc:
            refused.append(str(exc))

    intake = UpdateIntake(store, handle_attempt=no_sender)
    intakes.append(intake)
    intake.start()
    intake.accept(body(2, chat=5))
    assert wait_until(lambda: refused, 10)
    assert "bot_token" in refused[0]


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_context_attempt_broadcast_in_a_ptb_handler(store: Any) -> None:
    """A PTB command handler starts a broadcast through ``context.attempt``. It lands with
    the update's completion, and the Application's bot sends it."""

    async def announce(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        context.attempt.broadcast("announce", [51, 52, 53], text="from a handler")

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor = FencedUpdateProcessor(store, sweep_every_seconds=0.5)
            app = processor.install(
                Application.builder().token(fake.token).base_url(fake.base_url)).build()
            app.add_handler(CommandHandler("announce", announce))
            fake.inject_message(7, "/announce")
            async with app:
                await app.start()
                await app.updater.start_polling(poll_interval=0.0, timeout=1)
                try:
                    await wait_for("the broadcast sent", lambda: len(
                        sent(fake, "from a handler")) == 3, 20)
                finally:
                    await app.updater.stop()
                    await app.stop()
            assert set(sent(fake, "from a handler").values()) == {1}
            done = await processor.get_broadcast("announce")
            assert (done.total, done.sent) == (3, 3)

    run(scenario(), 60)


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_reply_does_not_queue_behind_a_running_broadcast(
    store: Any, intakes: List[UpdateIntake]
) -> None:
    """Replies and broadcasts share the bot's pace in the store. A broadcast takes the slots
    of at most about half a second of sends at a time, so a reply queued while 200 recipients
    still wait (about 7 s of sends at 30 a second) goes out within a second or two, long
    before the broadcast ends, and Telegram answers no request with 429."""
    from ptb_fence import OutboxPacing
    from ptb_fence.testing import RateLimits

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        attempt.outbox.send_message(999, "a reply")

    with FakeBotApi(rate_limits=RateLimits()) as fake:
        intake = intake_on(store, fake, intakes, handle, outbox_pacing=OutboxPacing())
        intake.broadcast("long", range(1, 301), text="long")
        assert fake.wait_until(lambda: len(sent(fake, "long")) >= 60, 20)
        intake.accept(body(1, chat=999))
        assert fake.wait_until(lambda: sent(fake, "a reply")[999] == 1, 20)
        waiting = 300 - len(sent(fake, "long"))
        assert fake.wait_until(lambda: len(sent(fake, "long")) == 300, 30)
    assert waiting >= 150, f"the reply went out after the broadcast ({waiting} left)"
    assert fake.rate_limited == 0


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_the_store_wide_gauge_counts_the_recipients_by_state(
    store: Any, intakes: List[UpdateIntake]
) -> None:
    """The sweep counts the store's recipients by state with its figures (at most every
    10 s). ``stats().broadcast_recipients`` and the Prometheus gauge
    ``ptb_fence_broadcast_recipients{scope="store"}`` show them."""
    from prometheus_client import CollectorRegistry

    from ptb_fence.metrics import register

    with FakeBotApi() as fake:
        fake.block(3)
        intake = intake_on(store, fake, intakes, lambda update, attempt: None,
                           sweep_every_seconds=0.2)
        intake.broadcast("counted", [1, 2, 3], text="counted")
        intake.broadcast("paused", [4, 5], text="later")
        intake.pause_broadcast("paused")
        want = {"pending": 2, "sending": 0, "sent": 2, "failed": 0, "blocked": 1,
                "cancelled": 0}
        assert wait_until(lambda: intake.stats().broadcast_recipients == want, 25), \
            intake.stats().broadcast_recipients
        registry = CollectorRegistry()
        register(intake, registry)
        for state, count in want.items():
            assert registry.get_sample_value(
                "ptb_fence_broadcast_recipients", {"scope": "store", "state": state}) == count
