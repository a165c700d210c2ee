"""Durable jobs in a real PTB Application: FencedUpdateProcessor(store, durable_jobs=True)
against FakeBotApi, on the memory, SQLite and PostgreSQL stores.

A job's callback runs as a fenced attempt (``context.attempt``, its reply through the outbox),
once; a job scheduled by a handler commits with the handler's attempt; a repeating job is
declared once per name; misuse is refused at the call with the fix.
"""

from __future__ import annotations

import asyncio
import datetime as dtm
import threading
import time
from typing import Any, Dict, List

import pytest
from telegram.ext import ContextTypes, MessageHandler, filters

from ptb_fence import MemoryUpdateStore, UsageError
from ptb_fence.ptb import FencedCallbackContext, FencedJobQueue, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import run, wait_for
from runtime_support import ALL_METHODS, StoreWrapper

RAN: List[Dict[str, Any]] = []
_LOCK = threading.Lock()


async def remind(context: Any) -> None:
    """A module-level job callback: replies through the outbox of its attempt."""
    attempt = context.attempt
    with _LOCK:
        RAN.append({"name": context.job.name, "data": context.job.data,
                    "attempt": attempt.attempt, "run": context.job.run_number,
                    "chat_id": context.job.chat_id})
    if context.job.data.get("fail"):
        raise RuntimeError("the reminder fails")
    attempt.outbox.send_message(chat_id=context.job.chat_id, text=f"reminder {context.job.data}")


async def tick(context: Any) -> None:
    """A repeating job's callback."""
    with _LOCK:
        RAN.append({"name": context.job.name, "run": context.job.run_number})


def build(store: Any, fake: FakeBotApi, **options: Any) -> Any:
    from telegram.ext import Application

    options.setdefault("retry", lambda error, attempt: 0.05)
    processor = FencedUpdateProcessor(store, durable_jobs=True, sweep_every_seconds=0.5,
                                      **options)
    builder = (Application.builder().token(fake.token).base_url(fake.base_url)
               .context_types(ContextTypes(context=FencedCallbackContext)))
    return processor, processor.install(builder).build()


@pytest.fixture(autouse=True)
def clean() -> None:
    RAN.clear()


async def started(app: Any) -> None:
    await app.initialize()
    await app.start()
    assert app.updater is not None
    await app.updater.start_polling(poll_interval=0.0, timeout=1)


async def stopped(app: Any) -> None:
    if app.updater.running:
        await app.updater.stop()
    await app.stop()
    await app.shutdown()


def test_a_job_runs_once_as_a_fenced_attempt_and_replies(store: Any) -> None:
    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor, app = build(store, fake)
            assert isinstance(app.job_queue, FencedJobQueue)
            await started(app)
            try:
                job = app.job_queue.run_once(remind, 0.2, data={"n": 1}, chat_id=42,
                                             name="nudge")
                assert job.job_id is not None and job.name == "nudge"
                await wait_for("the reminder sent", lambda: [
                    m for m in fake.sent_messages if m.get("text") == "reminder {'n': 1}"], 20)
                await asyncio.sleep(1.5)  # two more looks: it does not run again
            finally:
                await stopped(app)
            assert [(r["name"], r["attempt"], r["run"], r["chat_id"]) for r in RAN] == [
                ("nudge", 1, 1, 42)]
            assert [m["chat_id"] for m in fake.sent_messages
                    if str(m.get("text")).startswith("reminder")] in ([42], ["42"])
            assert app.job_queue.jobs() == ()  # it ended

    run(scenario(), 60)


def test_a_job_scheduled_by_a_failing_attempt_is_never_scheduled(store: Any) -> None:
    async def on_message(update: Any, context: Any) -> None:
        context.job_queue.run_once(remind, 0.1, data={"from": context.attempt.attempt},
                                   chat_id=update.effective_chat.id)
        if context.attempt.attempt == 1:
            raise RuntimeError("fails after scheduling")

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor, app = build(store, fake)
            app.add_handler(MessageHandler(filters.ALL, on_message))
            await started(app)
            try:
                fake.inject_message(chat_id=7, text="remind me")
                await wait_for("the retry's reminder", lambda: RAN, 20)
                await asyncio.sleep(1.5)
            finally:
                await stopped(app)
            assert [r["data"] for r in RAN] == [{"from": 2}]  # the failed attempt's never ran

    run(scenario(), 60)


def test_a_repeating_job_is_declared_once_by_name_and_keeps_running(store: Any) -> None:
    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor, app = build(store, fake)
            await started(app)
            try:
                first = app.job_queue.run_repeating(tick, 0.4, first=0.1, name="tick")
                again = app.job_queue.run_repeating(tick, 0.4, first=0.1, name="tick")
                assert first.job_id == again.job_id
                assert [j.job_id for j in app.job_queue.get_jobs_by_name("tick")] == [
                    first.job_id]
                await wait_for("three runs", lambda: len(RAN) >= 3, 20)
                first.schedule_removal()
                count = len(RAN)
                await asyncio.sleep(1.2)
            finally:
                await stopped(app)
            runs = [r["run"] for r in RAN]
            assert runs == list(range(1, len(runs) + 1))  # each run once, in order
            assert len(RAN) <= count + 1  # at most one run was already fired at the removal
            assert app.job_queue.get_jobs_by_name("tick") == ()

    run(scenario(), 60)


def test_a_failing_job_is_retried_then_exhausted(store: Any) -> None:
    exhausted: List[Any] = []

    async def on_exhaustion(exhaustion: Any) -> None:
        exhausted.append(exhaustion)

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor, app = build(store, fake, max_attempts=3, handle_exhaustion=on_exhaustion)
            await started(app)
            try:
                app.job_queue.run_once(remind, 0, data={"fail": True}, chat_id=5)
                await wait_for("the exhaustion", lambda: exhausted, 20)
            finally:
                await stopped(app)
            assert [r["attempt"] for r in RAN] == [1, 2, 3]
            assert "the reminder fails" in (exhausted[0].error or "")
            assert fake.sent_messages == []

    run(scenario(), 60)


def test_misuse_is_refused_at_the_call_with_the_fix() -> None:
    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor, app = build(MemoryUpdateStore(), fake)
            await started(app)
            try:
                queue = app.job_queue
                with pytest.raises(UsageError, match="lambda"):
                    queue.run_once(lambda context: None, 1)
                with pytest.raises(UsageError, match="picklable"):
                    queue.run_once(remind, 1, data=threading.Lock())
                with pytest.raises(UsageError, match="job_kwargs 'jitter'"):
                    queue.run_repeating(tick, 5, job_kwargs={"jitter": 1})
                with pytest.raises(UsageError, match="by name"):
                    queue.run_custom(tick, {"trigger": object()})
                daily = queue.run_daily(tick, dtm.time(9, 30, tzinfo=dtm.timezone.utc),
                                        days=(1, 2), name="digest")
                assert daily.next_t is not None and daily.next_t.hour == 9
                assert queue.jobs("dig") == (daily,)
            finally:
                await stopped(app)

    run(scenario(), 60)
    with pytest.raises(TypeError, match="StoreFeatures\\(jobs=True\\)"):
        FencedUpdateProcessor(StoreWrapper(methods=ALL_METHODS), durable_jobs=True)


def test_a_conversation_timeout_is_durable_and_fires_once(store: Any) -> None:
    """A persistent conversation under FencedPersistence times out through a durable job:
    its TIMEOUT handler replies once and the conversation ends. A conversation that went on
    in time is not timed out at the old time."""
    from telegram import Update
    from telegram.ext import CommandHandler, ConversationHandler, TypeHandler

    from ptb_fence.ptb import FencedPersistence

    async def book(update: Any, context: Any) -> int:
        return 0

    async def answer(update: Any, context: Any) -> int:
        context.attempt.outbox.reply_text("noted")
        return 0

    async def timed_out(update: Any, context: Any) -> None:
        context.attempt.outbox.send_message(chat_id=update.effective_chat.id,
                                            text=f"timed out {update.effective_chat.id}")

    async def scenario() -> None:
        with FakeBotApi() as fake:
            from telegram.ext import Application

            processor = FencedUpdateProcessor(store, durable_jobs=True, sweep_every_seconds=0.5,
                                              retry=lambda error, attempt: 0.05)
            builder = (Application.builder().token(fake.token).base_url(fake.base_url)
                       .context_types(ContextTypes(context=FencedCallbackContext))
                       .persistence(FencedPersistence(store)))
            app = processor.install(builder).build()
            app.add_handler(ConversationHandler(
                entry_points=[CommandHandler("book", book)],
                states={0: [MessageHandler(filters.TEXT & ~filters.COMMAND, answer)],
                        ConversationHandler.TIMEOUT: [TypeHandler(Update, timed_out)]},
                fallbacks=[], name="booking", persistent=True, conversation_timeout=2.0,
            ))
            await started(app)
            try:
                fake.inject_message(chat_id=11, text="/book")
                fake.inject_message(chat_id=12, text="/book")
                await wait_for("both booked", lambda: len(
                    [m for m in fake.sent_messages]) == 0 and len(app.job_queue.jobs()) == 2, 20)
                await asyncio.sleep(1.0)
                went_on = time.monotonic()
                fake.inject_message(chat_id=12, text="still here")  # pushes its timeout on

                def sent() -> List[str]:
                    return [m["text"] for m in fake.sent_messages
                            if str(m.get("text", "")).startswith("timed out")]

                await wait_for("chat 11 timed out", lambda: "timed out 11" in sent(), 20)
                await wait_for("chat 12 timed out", lambda: "timed out 12" in sent(), 20)
                # chat 12 went on: it timed out a whole timeout after, not at the old time
                assert time.monotonic() - went_on >= 2.0 - 0.3
                await asyncio.sleep(1.5)
                conversations = await app.persistence.get_conversations("booking")
            finally:
                await stopped(app)
            assert sorted(sent()) == ["timed out 11", "timed out 12"]  # each once
            assert conversations == {}  # both ended, the end committed with the timeout

    run(scenario(), 60)


def test_next_conversation_state_commits_the_timeout_with_the_state(store: Any) -> None:
    """A conversation callback that completes inside its handler (``transaction(complete=True)``)
    and declares its next state first: the durable timeout is stored by that commit, not after
    the callback returns. It then times the conversation out once."""
    from telegram import Update
    from telegram.ext import CommandHandler, ConversationHandler, TypeHandler

    from ptb_fence.ptb import FencedPersistence

    stored_at_commit: List[List[str]] = []

    async def book(update: Any, context: Any) -> int:
        context.next_conversation_state(0)
        await context.attempt.run_in_transaction(lambda conn: None, complete=True)
        stored_at_commit.append([job.name for job in store.list_jobs()])
        return 0

    async def timed_out(update: Any, context: Any) -> None:
        context.attempt.outbox.send_message(chat_id=update.effective_chat.id,
                                            text=f"timed out {update.effective_chat.id}")

    async def scenario() -> None:
        with FakeBotApi() as fake:
            from telegram.ext import Application

            processor = FencedUpdateProcessor(store, durable_jobs=True, sweep_every_seconds=0.5,
                                              retry=lambda error, attempt: 0.05)
            builder = (Application.builder().token(fake.token).base_url(fake.base_url)
                       .context_types(ContextTypes(context=FencedCallbackContext))
                       .persistence(FencedPersistence(store)))
            app = processor.install(builder).build()
            app.add_handler(ConversationHandler(
                entry_points=[CommandHandler("book", book)],
                states={0: [], ConversationHandler.TIMEOUT: [TypeHandler(Update, timed_out)]},
                fallbacks=[], name="booking", persistent=True, conversation_timeout=1.0,
            ))
            await started(app)
            try:
                fake.inject_message(chat_id=21, text="/book")

                def sent() -> List[str]:
                    return [m["text"] for m in fake.sent_messages
                            if str(m.get("text", "")).startswith("timed out")]

                await wait_for("chat 21 timed out", lambda: "timed out 21" in sent(), 20)
                await asyncio.sleep(1.5)
                conversations = await app.persistence.get_conversations("booking")
            finally:
                await stopped(app)
            assert stored_at_commit == [['conversation-timeout:booking:[21, 21]']]
            assert sent() == ["timed out 21"]
            assert conversations == {}

    run(scenario(), 60)


def test_a_job_whose_callback_a_deploy_removed_ends_as_an_exhaustion(store: Any) -> None:
    """A stored job names a callback this process does not have: its run is not dropped, it
    ends at once as an exhaustion whose error names the callback."""
    from ptb_fence import JobWrite
    from ptb_fence._state_codec import encode_state
    from ptb_fence.runtime._job_schedule import JobSchedule

    exhausted: List[Any] = []

    async def on_exhaustion(exhaustion: Any) -> None:
        exhausted.append(exhaustion)

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor, app = build(store, fake, max_attempts=5, handle_exhaustion=on_exhaustion)
            now = int(time.time() * 1000)
            at = dtm.datetime.fromtimestamp(now / 1000, tz=dtm.timezone.utc)
            store.schedule_jobs([JobWrite(
                name="old", callback="bot_of_last_week:send_digest", data=encode_state(None),
                chat_id=None, user_id=None, schedule=JobSchedule.once(at).text(),
                next_run_at=now)], now)
            await started(app)
            try:
                await wait_for("the exhaustion", lambda: exhausted, 20)
            finally:
                await stopped(app)
            assert exhausted[0].attempt == 1  # final at once: a retry cannot find it either
            assert "bot_of_last_week:send_digest" in (exhausted[0].error or "")
            assert "does not exist" in (exhausted[0].error or "")

    run(scenario(), 60)


async def count_in_chat(context: Any) -> None:
    """A job run that changes its chat's and its user's persisted data."""
    context.chat_data["runs"] = context.chat_data.get("runs", 0) + 1
    context.user_data["seen"] = True
    if context.job.data.get("fail") and context.attempt.attempt == 1:
        raise RuntimeError("the first attempt fails after changing the data")


def test_a_jobs_chat_and_user_data_commit_with_its_run(store: Any) -> None:
    """Under FencedPersistence a run works on its job's chat_data and user_data: the change
    of the attempt that completed is committed once, that of a failed attempt never."""
    from ptb_fence import StateKey
    from ptb_fence._state_codec import decode_state
    from ptb_fence.ptb import FencedPersistence

    async def scenario() -> None:
        with FakeBotApi() as fake:
            from telegram.ext import Application

            processor = FencedUpdateProcessor(store, durable_jobs=True, sweep_every_seconds=0.5,
                                              retry=lambda error, attempt: 0.05)
            builder = (Application.builder().token(fake.token).base_url(fake.base_url)
                       .context_types(ContextTypes(context=FencedCallbackContext))
                       .persistence(FencedPersistence(store)))
            app = processor.install(builder).build()
            await started(app)
            try:
                app.job_queue.run_once(count_in_chat, 0, data={"fail": True}, chat_id=31,
                                       user_id=41)
                app.job_queue.run_once(count_in_chat, 0.3, data={}, chat_id=31, user_id=41)

                def stored(kind: str, key: str) -> Any:
                    entry = store.read_state([StateKey(kind, "", key)]).get(StateKey(kind, "",
                                                                                     key))
                    return None if entry is None else decode_state(entry.value)

                deadline = time.monotonic() + 20
                while (stored("chat", "31") or {}).get("runs") != 2 and (
                        time.monotonic() < deadline):
                    await asyncio.sleep(0.1)
                assert stored("chat", "31") == {"runs": 2}  # not the failed attempt's +1
                assert stored("user", "41") == {"seen": True}
            finally:
                await stopped(app)

    run(scenario(), 60)


def test_a_removal_made_by_a_handler_commits_with_its_attempt(store: Any) -> None:
    """``job.schedule_removal()`` in a handler whose attempts fail removes nothing. In a
    handler that completes it removes the job."""
    exhausted: List[Any] = []

    async def on_message(update: Any, context: Any) -> None:
        for job in context.job_queue.get_jobs_by_name("weekly"):
            job.schedule_removal()
        if update.message.text == "stop and fail":
            raise RuntimeError("fails after the removal")

    async def on_exhaustion(exhaustion: Any) -> None:
        exhausted.append(exhaustion)

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor, app = build(store, fake, max_attempts=2, handle_exhaustion=on_exhaustion)
            app.add_handler(MessageHandler(filters.ALL, on_message))
            await started(app)
            try:
                job = app.job_queue.run_repeating(tick, 3600, name="weekly")
                fake.inject_message(chat_id=9, text="stop and fail")
                await wait_for("the failing update exhausted", lambda: exhausted, 20)
                assert [j.job_id for j in app.job_queue.get_jobs_by_name("weekly")] == [
                    job.job_id]  # its removal never committed
                fake.inject_message(chat_id=9, text="stop")
                await wait_for("the removal committed",
                               lambda: not app.job_queue.get_jobs_by_name("weekly"), 20)
            finally:
                await stopped(app)

    run(scenario(), 60)
