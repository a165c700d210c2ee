"""Broadcasts in a real PTB Application: FencedUpdateProcessor(store).broadcast(...) against
FakeBotApi with Telegram's rate limits enforced, on the memory, SQLite and PostgreSQL stores.

Each recipient gets the message once, at the store-wide pace (no 429), a user who blocked the
bot is recorded blocked and reported to ``handle_blocked``, pause holds the rest back, resume
sends it, cancel leaves it out, and a restart sends only what was left.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Callable, List, Tuple

import pytest
from telegram.ext import Application

from ptb_fence import OutboxPacing, UsageError
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi, RateLimits
from ptb_support import run, wait_for


def build(store: Any, fake: FakeBotApi, **options: Any) -> Tuple[Any, Any]:
    processor = FencedUpdateProcessor(store, sweep_every_seconds=0.5, **options)
    builder = Application.builder().token(fake.token).base_url(fake.base_url)
    return processor, processor.install(builder).build()


async def started(app: Any) -> None:
    await app.initialize()
    await app.start()


async def stopped(app: Any) -> None:
    await app.stop()
    await app.shutdown()


def news_to(fake: FakeBotApi, text: str) -> Counter[int]:
    """How often each chat got ``text``."""
    return Counter(int(m["chat_id"]) for m in fake.sent_messages if m.get("text") == text)


def test_each_recipient_gets_it_once_at_the_pace_and_blocked_users_are_reported(
    store: Any,
) -> None:
    chats = list(range(1000, 1040))
    blocked: List[Tuple[str, int]] = []

    async def handle_blocked(name: str, chat_id: int) -> None:
        blocked.append((name, chat_id))

    async def scenario() -> None:
        with FakeBotApi(rate_limits=RateLimits()) as fake:
            fake.block(1003, 1017, 1031)
            processor, app = build(store, fake, handle_blocked=handle_blocked)
            await started(app)
            try:
                first = await processor.broadcast("launch", chats, text="we launched",
                                                  disable_notification=True)
                assert (first.name, first.total, first.method) == ("launch", 40, "sendMessage")
                await wait_for("every recipient settled", lambda: len(news_to(
                    fake, "we launched")) == 37 and len(blocked) == 3, 30)
                done = await processor.get_broadcast("launch")
                for _ in range(50):
                    if done.done:
                        break
                    await asyncio.sleep(0.1)
                    done = await processor.get_broadcast("launch")
            finally:
                await stopped(app)
            got = news_to(fake, "we launched")
            assert sorted(got) == sorted(set(chats) - {1003, 1017, 1031})
            assert set(got.values()) == {1}  # once each
            assert all(m.get("disable_notification") is True for m in fake.sent_messages)
            assert (done.sent, done.blocked, done.failed, done.pending) == (37, 3, 0, 0)
            counted = processor.stats().broadcast_sends
            assert (counted["sent"], counted["blocked"], counted["failed"]) == (37, 3, 0)
            assert sorted(blocked) == [("launch", 1003), ("launch", 1017), ("launch", 1031)]
            assert fake.rate_limited == 0  # the pace kept under Telegram's limits

    run(scenario(), 60)


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_pause_holds_the_rest_resume_sends_it_cancel_leaves_it_out(store: Any) -> None:
    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor, app = build(store, fake, outbox_pacing=OutboxPacing(per_second=20))
            await started(app)
            try:
                await processor.broadcast("digest", range(1, 201), text="digest")
                await wait_for("some sent", lambda: len(news_to(fake, "digest")) >= 5, 20)
                paused = await processor.pause_broadcast("digest")
                assert paused.state == "paused"
                await asyncio.sleep(1.0)  # the sends in flight end
                at_pause = len(news_to(fake, "digest"))
                await asyncio.sleep(1.5)
                assert len(news_to(fake, "digest")) == at_pause  # nothing while paused
                await processor.resume_broadcast("digest")
                await wait_for("more sent after resume",
                               lambda: len(news_to(fake, "digest")) >= at_pause + 5, 20)
                cancelled = await processor.cancel_broadcast("digest")
                await asyncio.sleep(1.0)
                at_cancel = len(news_to(fake, "digest"))
                await asyncio.sleep(1.0)
                final = await processor.get_broadcast("digest")
                with pytest.raises(UsageError, match="stays cancelled"):
                    await processor.resume_broadcast("digest")
                with pytest.raises(UsageError, match="no broadcast named 'other'"):
                    await processor.pause_broadcast("other")
            finally:
                await stopped(app)
            assert len(news_to(fake, "digest")) == at_cancel  # nothing after the cancel
            assert cancelled.cancelled > 0 and final.state == "cancelled"
            assert final.sent == at_cancel and final.cancelled == 200 - at_cancel
            assert set(news_to(fake, "digest").values()) == {1}

    run(scenario(), 60)


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_restart_sends_only_the_rest_and_starting_it_again_adds_nothing(
    shared_stores: Callable[[], Any],
) -> None:
    """The first Application stops mid-broadcast. A second one on the same database, which
    starts the same broadcast again (as a bot's start-up code would), sends only the rest."""

    async def scenario() -> None:
        with FakeBotApi() as fake:
            pacing = OutboxPacing(per_second=20)
            processor, app = build(shared_stores(), fake, outbox_pacing=pacing)
            await started(app)
            try:
                await processor.broadcast("promo", range(1, 61), text="promo")
                await wait_for("some sent", lambda: len(news_to(fake, "promo")) >= 10, 20)
            finally:
                await stopped(app)
            processor, app = build(shared_stores(), fake, outbox_pacing=pacing)
            await started(app)
            try:
                again = await processor.broadcast("promo", range(1, 61), text="promo")
                assert again.total == 60
                await wait_for("all sent", lambda: len(news_to(fake, "promo")) == 60, 30)
                with pytest.raises(UsageError, match="exists with another call"):
                    await processor.broadcast("promo", [1], text="other text")
                with pytest.raises(UsageError, match="chat_ids, not chat_id"):
                    await processor.broadcast("x", [1], chat_id=5, text="t")
            finally:
                await stopped(app)
            assert set(news_to(fake, "promo").values()) == {1}

    run(scenario(), 60)


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_the_blocking_intake_broadcasts_too(store: Any) -> None:
    from ptb_fence import UpdateIntake

    blocked: List[int] = []
    with FakeBotApi(rate_limits=RateLimits()) as fake:
        fake.block(7)
        intake = UpdateIntake(store, handle_attempt=lambda update, attempt: None,
                              bot_token=fake.token, bot_base_url=fake.base_url,
                              handle_blocked=lambda name, chat: blocked.append(chat))
        intake.start()
        try:
            started_ = intake.broadcast("hello", [5, 6, 7, 8], text="hello")
            assert started_.total == 4
            assert fake.wait_until(lambda: len(news_to(fake, "hello")) == 3 and blocked, 20)
        finally:
            intake.close(10)
        assert sorted(news_to(fake, "hello")) == [5, 6, 8] and blocked == [7]
    with pytest.raises(UsageError, match="no bot_token"):
        UpdateIntake(store, handle_attempt=lambda update, attempt: None).broadcast(
            "x", [1], text="t")


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_flood_answer_to_one_sender_holds_both_and_nothing_is_sent_inside_it(
    shared_stores: Callable[[], Any],
) -> None:
    """Two intakes on one database send one broadcast. Telegram answers one request with a
    bot-wide 429 retry_after=2: neither intake sends inside the hold (past a grace of 0.3 s for
    requests already on their way), and every recipient still gets the message once."""
    from ptb_fence import UpdateIntake

    with FakeBotApi(rate_limits=RateLimits(hold_grace_seconds=0.3)) as fake:
        intakes = [UpdateIntake(shared_stores(), handle_attempt=lambda update, attempt: None,
                                bot_token=fake.token, bot_base_url=fake.base_url,
                                outbox_pacing=OutboxPacing(per_second=40))
                   for _ in range(2)]
        for intake in intakes:
            intake.start()
        try:
            intakes[0].broadcast("flood", range(1, 161), text="flood")
            assert fake.wait_until(lambda: len(news_to(fake, "flood")) >= 20, 20)
            fake.flood(retry_after=2)
            assert fake.wait_until(lambda: fake.rate_limited >= 1, 10)
            assert fake.wait_until(lambda: len(news_to(fake, "flood")) == 160, 40)
        finally:
            for intake in intakes:
                intake.close(10)
        assert fake.requests_in_hold == 0
        assert set(news_to(fake, "flood").values()) == {1}
