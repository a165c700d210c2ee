"""Sending the outbox: committed calls reach Telegram (a FakeBotApi), each chat's in order,
refusals fail once, RetryAfter, 5xx and timeouts are retried, a stop loses nothing.

Real PTB ``Application``s polling a ``FakeBotApi`` in this process (the processor's dispatcher
sends through the Application's ``Bot.do_api_request``) and a real ``UpdateIntake`` (its
httpx sender), on real SQLite files, PostgreSQL tables and the memory store. What Telegram
received is what the FakeBotApi recorded.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, Dict, List

import pytest
from telegram import Update
from telegram.ext import Application, Defaults, MessageHandler, filters

from ptb_fence import HeldCall, OutboxEntry, SQLiteUpdateStore, UpdateIntake
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import FAST, build, polling, run, wait_for
from runtime_support import body, wait_until


def _texts(fake: FakeBotApi, chat: Any = None) -> List[str]:
    return [m["text"] for m in fake.sent_messages if chat is None or m["chat_id"] == chat]


def _processor(store: Any, **options: Any) -> FencedUpdateProcessor:
    settings = dict(FAST, lease_seconds=10.0, retry=lambda error, attempt: 0.05)
    settings.update(options)
    return FencedUpdateProcessor(store, **settings)


def test_held_reply_is_sent_after_the_completion(store: Any) -> None:
    handles: Dict[int, Any] = {}
    latencies: List[float] = []

    async def on_message(update: Update, context: Any) -> None:
        handles[update.update_id] = context.attempt.outbox.reply_text(
            "echo " + update.message.text
        )
        # held until the completion commits: not sent while the handler runs
        assert not any(m["text"] == "echo " + update.message.text for m in fake.sent_messages)
        latencies.append(time.perf_counter())

    async def main() -> None:
        processor = _processor(store)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            update_id = fake.inject_message(77, "one")
            await wait_for("the reply", lambda: _texts(fake) == ["echo one"])
            sent_after = time.perf_counter() - latencies[0]
            handle = handles[update_id]
            assert isinstance(handle, HeldCall) and handle.committed
            # this process's dispatcher claimed it, so it knows the id now
            await wait_for("the id", lambda: handle.call_id is not None)
            entry = await processor.outbox_call_async(handle)
            assert entry is not None
            await wait_for("recorded", lambda: processor.outbox_call(handle).state == "sent")
            entry = processor.outbox_call(int(handle))
            assert entry is not None and entry.tries == 1
            assert json.loads(entry.result_json or "{}")["message_id"] == \
                fake.sent_messages[0]["message_id"]
            stats = processor.stats()
            assert stats.calls_sent == 1 and stats.calls_failed == 0
            print(f"\nhandler end to FakeBotApi answer seen: {sent_after * 1000:.1f} ms")

    with FakeBotApi() as fake:
        run(main())


def test_call_in_transaction_is_sent_with_defaults_applied(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "u.db"))

    async def on_message(update: Update, context: Any) -> None:
        attempt = context.attempt

        def write(conn: Any) -> Any:
            return attempt.outbox.send_message(update.effective_chat.id, "<b>booked</b>")

        call_id = await attempt.run_in_transaction(write, complete=True)
        assert isinstance(call_id, int)

    async def main() -> None:
        processor = _processor(store)
        app = build(processor, fake, Application.builder().defaults(
            Defaults(parse_mode="HTML", disable_notification=True)))
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            fake.inject_message(5, "book")
            await wait_for("the reply", lambda: fake.sent_messages)
        (sent,) = fake.sent_messages
        assert sent["parse_mode"] == "HTML" and sent["disable_notification"] is True

    with FakeBotApi() as fake:
        run(main())
    store.close()


def test_a_failing_handlers_reply_is_never_sent_the_retrys_is(store: Any) -> None:
    async def on_message(update: Update, context: Any) -> None:
        attempt = context.attempt
        attempt.outbox.reply_text(f"attempt {attempt.attempt}")
        if attempt.attempt == 1:
            raise RuntimeError("fails after queueing its reply")

    async def main() -> None:
        app = build(_processor(store), fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            fake.inject_message(9, "x")
            await wait_for("the retry's reply", lambda: _texts(fake))
            await asyncio.sleep(0.3)  # nothing else arrives
        assert _texts(fake) == ["attempt 2"]

    with FakeBotApi() as fake:
        run(main())


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_retry_after_holds_the_chat_then_sends_in_order(store: Any) -> None:
    async def on_message(update: Update, context: Any) -> None:
        for i in range(3):
            context.attempt.outbox.reply_text(f"{update.message.text} {i}")

    async def main() -> None:
        processor = _processor(store)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            fake.fail_next("sendMessage", retry_after=1)
            started = time.monotonic()
            fake.inject_message(3, "a")
            await wait_for("three replies", lambda: len(_texts(fake)) == 3, 20)
            waited = time.monotonic() - started
        assert _texts(fake) == ["a 0", "a 1", "a 2"]  # the held chat kept its order
        assert waited >= 1.0  # retry_after honoured (a lower bound, not a speed claim)
        assert len(fake.calls_to("sendMessage")) == 4
        assert processor.stats().calls_retried == 1

    with FakeBotApi() as fake:
        run(main())


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres", "memory"])
@pytest.mark.parametrize(
    "code, description",
    [(403, "Forbidden: bot was blocked by the user"), (400, "Bad Request: chat not found")],
)
def test_permanent_refusal_fails_once_and_is_reported(
    store: Any, code: int, description: str, caplog: Any
) -> None:
    failures: List[OutboxEntry] = []

    async def report(entry: OutboxEntry) -> None:  # an async callback, awaited on the loop
        failures.append(entry)

    async def on_message(update: Update, context: Any) -> None:
        context.attempt.outbox.reply_text("refused")
        context.attempt.outbox.reply_text("next one")

    async def main() -> None:
        processor = _processor(store, handle_send_failure=report)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            fake.fail_next("sendMessage", error_code=code, description=description)
            fake.inject_message(4, "x")
            await wait_for("the failure", lambda: failures, 10)
            await wait_for("the next call", lambda: _texts(fake) == ["next one"], 10)
            await wait_for("acknowledged", lambda: store.due_send_failures(limit=10) == [])
            await asyncio.sleep(0.3)
            assert processor.stats().calls_failed == 1
        assert len(failures) == 1
        (failure,) = failures
        # PTB keeps the description without its "Bad Request: " prefix
        assert failure.state == "failed"
        assert description.split(": ")[1].lower() in (failure.error or "").lower()
        assert len(fake.calls_to("sendMessage")) == 2  # never retried
        warnings = [r for r in caplog.records
                    if r.name == "ptb_fence.outbox" and "failed, not retried" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelname == "WARNING"

    with FakeBotApi() as fake:
        run(main())


@pytest.mark.parametrize("store_kind", ["sqlite"])
def test_failure_callback_that_raises_is_called_again(store: Any) -> None:
    calls: List[int] = []

    def report(entry: OutboxEntry) -> None:
        calls.append(entry.call_id)
        if len(calls) == 1:
            raise RuntimeError("the report failed")

    async def on_message(update: Update, context: Any) -> None:
        context.attempt.outbox.reply_text("refused")

    async def main() -> None:
        app = build(_processor(store, handle_send_failure=report), fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            fake.fail_next("sendMessage", error_code=403)
            fake.inject_message(4, "x")
            await wait_for("the second delivery", lambda: len(calls) >= 2, 10)
            await wait_for("acknowledged", lambda: store.due_send_failures(limit=10) == [])
        assert calls[0] == calls[1]

    with FakeBotApi() as fake:
        run(main())


@pytest.mark.parametrize("store_kind", ["sqlite"])
def test_server_errors_are_retried(store: Any) -> None:
    async def on_message(update: Update, context: Any) -> None:
        context.attempt.outbox.reply_text("after two 500s")

    async def main() -> None:
        processor = _processor(store)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            fake.fail_next("sendMessage", 2, error_code=500)
            fake.inject_message(4, "x")
            await wait_for("the reply", lambda: _texts(fake), 15)
            await wait_for("recorded", lambda: store.list_calls(state="sent"))
        (entry,) = store.list_calls()
        assert entry.state == "sent" and entry.tries == 3
        assert len(fake.calls_to("sendMessage")) == 3
        assert processor.stats().calls_retried == 2

    with FakeBotApi() as fake:
        run(main())


@pytest.mark.parametrize("store_kind", ["sqlite"])
@pytest.mark.parametrize("at_most_once", [False, True])
def test_unknown_outcome_is_resent_or_reported(store: Any, at_most_once: bool) -> None:
    failures: List[OutboxEntry] = []

    async def on_message(update: Update, context: Any) -> None:
        context.attempt.outbox.reply_text("slow", at_most_once=at_most_once)

    async def main() -> None:
        processor = _processor(store, handle_send_failure=failures.append)
        app = build(processor, fake, Application.builder().read_timeout(0.5))
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            fake.delay("sendMessage", 2.0)  # answered after PTB gave up waiting: TimedOut
            fake.inject_message(4, "x")
            await wait_for("the first request", lambda: fake.calls_to("sendMessage"), 10)
            fake.delay("sendMessage", 0)
            if at_most_once:
                await wait_for("the report", lambda: failures, 15)
            else:
                await wait_for("the resend", lambda: len(fake.calls_to("sendMessage")) == 2, 15)
                await wait_for("recorded", lambda: store.list_calls(state="sent"), 10)
                # the first request is handled once its delay ends: Telegram got it too
                await wait_for("the late one", lambda: len(_texts(fake)) == 2, 10)
        if at_most_once:
            (failure,) = failures
            assert (failure.error or "").startswith("unknown outcome: TimedOut")
            assert len(fake.calls_to("sendMessage")) == 1
        else:
            # at least once: a duplicate, since Telegram did get the first request
            assert _texts(fake) == ["slow", "slow"]
            (entry,) = store.list_calls()
            assert entry.state == "sent" and entry.tries == 2

    with FakeBotApi() as fake:
        run(main())


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_each_chat_in_order_chats_concurrently(store: Any) -> None:
    async def on_message(update: Update, context: Any) -> None:
        for i in range(4):
            context.attempt.outbox.reply_text(f"{update.message.text}-{i}")

    async def main() -> None:
        app = build(_processor(store, outbox_concurrency=4), fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            fake.fail_next("sendMessage", error_code=502)  # one chat's first call retried
            for chat in (1, 2, 3):
                for n in range(3):
                    fake.inject_message(chat, f"c{chat}m{n}")
            await wait_for("every reply", lambda: len(_texts(fake)) == 36, 30)
        for chat in (1, 2, 3):
            assert _texts(fake, chat) == [f"c{chat}m{n}-{i}" for n in range(3) for i in range(4)]

    with FakeBotApi() as fake:
        run(main())


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_graceful_stop_loses_nothing_and_sends_nothing_twice(shared_stores: Any) -> None:
    async def on_message(update: Update, context: Any) -> None:
        context.attempt.outbox.reply_text(update.message.text)

    async def first() -> None:
        app = build(_processor(shared_stores(), outbox_concurrency=1, stop_timeout_seconds=10), fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            fake.delay("sendMessage", 1.0)
            for chat in range(1, 6):
                fake.inject_message(chat, f"m{chat}")
            await wait_for("a request in flight", lambda: fake.calls_to("sendMessage"), 10)
            await wait_for("all handled", lambda: len(shared_stores().list_calls()) == 5, 10)
        # the stop waited for the request in flight and recorded it; the rest is pending
        states = [c.state for c in shared_stores().list_calls()]
        assert "sending" not in states and states.count("sent") >= 1
        assert "pending" in states

    async def second() -> None:
        fake.delay("sendMessage", 0)
        app = build(_processor(shared_stores()), fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            await wait_for("the rest", lambda: len(_texts(fake)) == 5, 15)
            await asyncio.sleep(0.3)

    with FakeBotApi() as fake:
        run(first())
        run(second())
        assert sorted(_texts(fake)) == [f"m{chat}" for chat in range(1, 6)]  # each once
    assert all(c.state == "sent" for c in shared_stores().list_calls())


def test_blocking_intake_end_to_end(store: Any) -> None:
    failures: List[OutboxEntry] = []
    done = threading.Event()

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        attempt.outbox.reply_text("hi from the intake")
        attempt.outbox.send_message(666, "to a chat that blocked the bot")
        done.set()

    with FakeBotApi() as fake:
        # one sender: calls go out by id (chat 42's first), so the faults land in this order
        fake.fail_next("sendMessage", retry_after=1)
        fake.fail_next("sendMessage", error_code=403, description="Forbidden: bot was blocked")
        intake = UpdateIntake(
            store, handle_attempt=handle, bot_token=fake.token, bot_base_url=fake.base_url,
            handle_send_failure=failures.append, outbox_concurrency=1,
        )
        intake.start()
        try:
            intake.accept(body(1, chat=42))
            assert wait_until(lambda: len(failures) == 1 and len(fake.sent_messages) == 1, 20)
            entries = {e.chat_key: e for e in store.list_calls()}
            assert wait_until(lambda: intake.outbox_call(entries[42].call_id).state == "sent", 10)
            sent = intake.outbox_call(entries[42].call_id)
            assert sent is not None and sent.tries == 2  # RetryAfter, then sent
            assert json.loads(sent.result_json or "{}")["chat"]["id"] == 42
            assert failures[0].chat_key == 666
            assert intake.stats().calls_sent == 1 and intake.stats().calls_failed == 1
            # the sweep read the store's outbox counts with its figures (at start: none yet;
            # again at most every 10 s)
            counts = intake.stats().outbox
            assert counts is not None and set(counts) == {
                "pending", "sending", "sent", "failed", "failed_acknowledged"}
            # and Prometheus sees the same
            from prometheus_client import CollectorRegistry

            from ptb_fence.metrics import register

            registry = CollectorRegistry()
            register(intake, registry)
            for result, count in (("sent", 1), ("failed", 1), ("retried", 1)):
                assert registry.get_sample_value(
                    "ptb_fence_outbox_sends_total", {"result": result}) == count
            # a store-wide gauge: labelled scope="store" (max() over the processes)
            assert registry.get_sample_value(
                "ptb_fence_outbox_calls", {"scope": "store", "state": "pending"}) == 0
        finally:
            intake.close()
        assert _texts(fake) == ["hi from the intake"]


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_stale_attempts_reply_is_never_sent(store: Any) -> None:
    stolen = threading.Event()
    returned: List[Any] = []

    async def on_message(update: Update, context: Any) -> None:
        attempt = context.attempt
        returned.append(attempt.outbox.reply_text("from the stale attempt"))
        # another process takes the update over (as after a pause past the lease)
        later = int(time.time() * 1000) + 60_000
        thief = await asyncio.to_thread(
            store.claim_owned, update.update_id, now=later, lease_until=later + 600_000,
            max_attempts=5,
        )
        assert thief is not None
        stolen.set()

    async def main() -> None:
        processor = _processor(store)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            fake.inject_message(6, "x")
            await wait_for("the takeover", stolen.is_set)
            await wait_for("the discarded reply", lambda: returned[0].discarded, 10)
            await asyncio.sleep(0.5)
            assert processor.stats().attempts_ended["lost"] == 1
        assert fake.sent_messages == [] and store.list_calls() == []

    with FakeBotApi() as fake:
        run(main())


@pytest.mark.parametrize("store_kind", ["sqlite"])
def test_a_flood_limit_across_chats_holds_every_chat(store: Any) -> None:
    async def on_message(update: Update, context: Any) -> None:
        context.attempt.outbox.reply_text(update.message.text)

    async def main() -> None:
        # a long sweep interval: chat 4's call is claimed when the hold ends, not at a sweep
        processor = _processor(store, outbox_concurrency=8, sweep_every_seconds=60)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            fake.fail_next("sendMessage", 3, retry_after=3)  # room for a slow observer below
            for chat in (1, 2, 3):
                fake.inject_message(chat, f"chat {chat}")
            await wait_for("three refusals", lambda: processor.stats().calls_retried == 3, 10)
            held_at = time.monotonic()
            fake.inject_message(4, "chat 4")  # a fourth chat, not refused itself: held too
            await wait_for("chat 4's reply", lambda: "chat 4" in _texts(fake), 15)
            assert time.monotonic() - held_at >= 1.0
            await wait_for("every reply", lambda: len(_texts(fake)) == 4, 15)

    with FakeBotApi() as fake:
        run(main())


@pytest.mark.parametrize("store_kind", ["postgres", "sqlite"])
def test_two_senders_keep_each_chats_commit_order(shared_stores: Any) -> None:
    def handle(update: Dict[str, Any], attempt: Any) -> None:
        for i in range(2):
            attempt.outbox.reply_text(f"u{update['update_id']}-{i}")

    with FakeBotApi() as fake:
        fake.delay("sendMessage", 0.02)  # requests overlap: the senders really compete
        intakes = [
            UpdateIntake(shared_stores(), handle_attempt=handle, bot_token=fake.token,
                         bot_base_url=fake.base_url, outbox_concurrency=4)
            for _ in range(2)
        ]
        for intake in intakes:
            intake.start()
        try:
            update_id = 0
            for _ in range(6):
                for chat in (1, 2, 3):
                    update_id += 1
                    intakes[update_id % 2].accept(body(update_id, chat=chat))
            assert wait_until(lambda: len(fake.sent_messages) == 36, 60)
            store = shared_stores()
            assert wait_until(lambda: len(store.list_calls(state="sent")) == 36, 10)
            committed = store.list_calls(limit=100)
            for chat in (1, 2, 3):
                in_commit_order = [json.loads(c.params_json)["text"] for c in committed
                                   if c.chat_key == chat]
                assert _texts(fake, chat) == in_commit_order
            assert all(c.tries == 1 for c in committed)  # none sent twice, none retried
        finally:
            for intake in intakes:
                intake.close()


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_calls_of_a_sender_that_died_are_sent_after_its_lease(store: Any) -> None:
    from ptb_fence import AttemptEffects, Batch, Completed, OutboxCall

    now = int(time.time() * 1000)
    assert store.add(1, body(1, chat=70), now)
    identity = store.claim_owned(1, now=now, lease_until=now + 60_000, max_attempts=5)
    calls = tuple(
        OutboxCall("sendMessage", json.dumps({"chat_id": 70, "text": f"left {i}"}), 70, i)
        for i in range(2)
    )
    # a process completed the update with two calls, claimed the first to send, and died
    assert store.commit(Batch(
        settlements=((identity, Completed(now)),), effects={identity: AttemptEffects(calls=calls)}
    )).landed == (True,)
    (claimed,) = store.claim_calls(now=now, lease_until=now + 1_500, limit=1, sender="dead")
    with FakeBotApi() as fake:
        intake = UpdateIntake(
            store, handle_attempt=lambda update, attempt: None, bot_token=fake.token,
            bot_base_url=fake.base_url, sweep_every_seconds=0.2,
        )
        intake.start()
        try:
            assert wait_until(lambda: len(fake.sent_messages) == 2, 20)
            elapsed = time.time() * 1000 - now
        finally:
            intake.close()
        # the chat's first call held the second until its dead sender's lease lapsed
        assert _texts(fake) == ["left 0", "left 1"] and elapsed >= 1_500
    entry = store.get_call(claimed.call_id)
    assert entry is not None and entry.state == "sent" and entry.tries == 2


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_stop_releases_claimed_unsent_calls_at_once(shared_stores: Any) -> None:
    """One sender, each request answered after 1 s: the first completion's call is being
    sent, the second's was claimed by its completion's commit and waits for the sender.
    The stop waits for the request in flight and gives the waiting claimed call back at once
    (pending, tries 0), so the next process sends it without waiting for the 60 s lease."""
    def handle(update: Dict[str, Any], attempt: Any) -> None:
        attempt.outbox.reply_text(f"r{update['update_id']}")

    store = shared_stores()
    with FakeBotApi() as fake:
        fake.delay("sendMessage", 1.0)
        first = UpdateIntake(
            shared_stores(), handle_attempt=handle, bot_token=fake.token,
            bot_base_url=fake.base_url, outbox_concurrency=1, lease_seconds=60.0,
            stop_timeout_seconds=10.0,
        )
        first.start()
        try:
            first.accept(body(1, chat=1))
            assert wait_until(lambda: fake.calls_to("sendMessage"), 10)
            first.accept(body(2, chat=2))
            # claimed for this sender by the completion's commit, not sent
            assert wait_until(lambda: len(store.list_calls(state="sending")) == 2, 10)
            assert len(fake.calls_to("sendMessage")) == 1
        finally:
            stopped_at = time.monotonic()
            first.close()
        calls = {c.chat_key: c for c in store.list_calls()}
        assert calls[1].state == "sent"  # the stop waited for the request in flight
        assert calls[2].state == "pending" and calls[2].tries == 0  # given back at once
        fake.delay("sendMessage", 0)
        second = UpdateIntake(
            shared_stores(), handle_attempt=handle, bot_token=fake.token,
            bot_base_url=fake.base_url, lease_seconds=60.0,
        )
        second.start()
        try:
            assert wait_until(lambda: len(fake.sent_messages) == 2, 20)
            assert time.monotonic() - stopped_at < 30  # not after the first's lease
            assert wait_until(lambda: all(c.state == "sent" for c in store.list_calls()), 10)
        finally:
            second.close()
    assert sorted(_texts(fake)) == ["r1", "r2"]  # each once
    assert store.get_call(calls[2].call_id).tries == 1
