"""Handler failures in a real PTB Application: retries, exhaustion, error handlers, block=False.

PTB's ``Application.process_update`` swallows handler exceptions (it routes them to error
handlers), so these tests check that the processor still sees every failure of a blocking
handler, whatever error handlers and ``Defaults`` the user has, and that non-blocking handlers
are visibly outside the attempt.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Dict, List

import pytest
from telegram import Update
from telegram.ext import (
    Application,
    ApplicationHandlerStop,
    Defaults,
    MessageHandler,
    filters,
)

from ptb_fence import Exhaustion, SQLiteUpdateStore, current_attempt
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import FAST, build, polling, rows, run, wait_for


def _retry(error: BaseException, attempt: int) -> float:
    return 0.05


@pytest.mark.parametrize("kind", ["sync", "async", "async-flaky"])
def test_failing_handler_is_retried_then_exhausted_and_acknowledged(tmp_path: Any, kind: str) -> None:
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    runs: List[Any] = []
    delivered: List[Exhaustion] = []
    handler_calls: List[int] = []

    def exhausted_sync(exhaustion: Exhaustion) -> None:
        delivered.append(exhaustion)

    async def exhausted_async(exhaustion: Exhaustion) -> None:
        handler_calls.append(exhaustion.update_id)
        await asyncio.sleep(0)
        if kind == "async-flaky" and len(handler_calls) == 1:
            raise ConnectionError("exhaustion sink down")
        delivered.append(exhaustion)

    async def on_message(update: Update, context: Any) -> None:
        attempt = context.attempt
        runs.append((update.update_id, attempt.attempt, attempt.claim_id))
        if update.message.text == "boom":
            raise RuntimeError("boom")
        await update.message.reply_text("ok")

    async def scenario(fake: FakeBotApi) -> Dict[str, int]:
        processor = FencedUpdateProcessor(
            store,
            handle_exhaustion=exhausted_sync if kind == "sync" else exhausted_async,
            max_attempts=3,
            retry=_retry,
            **FAST,
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        ids = {
            "boom": fake.inject_message(chat_id=1, text="boom"),
            "ok": fake.inject_message(chat_id=1, text="fine"),
        }
        async with polling(app):
            await wait_for("the exhaustion", lambda: delivered, timeout=10)
            await wait_for(
                "the acknowledgement",
                lambda: not store.due_exhaustions(limit=10),
                timeout=5,
            )
            await wait_for("the ok update", lambda: fake.sent_messages)
            await asyncio.sleep(0.4)  # sweeps run every 0.1 s: nothing is delivered again
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake))
    boom = [r for r in runs if r[0] == ids["boom"]]
    assert [r[1] for r in boom] == [1, 2, 3]
    assert len({r[2] for r in boom}) == 3  # a fresh claim id per attempt
    assert len(delivered) == 1
    exhaustion = delivered[0]
    assert (exhaustion.update_id, exhaustion.attempt, exhaustion.claim_id) == boom[-1]
    assert exhaustion.error == "RuntimeError: boom"
    assert '"boom"' in exhaustion.body
    if kind == "async-flaky":
        assert handler_calls == [ids["boom"], ids["boom"]]  # failed once, delivered again
    table = rows(path)
    state, attempts, error, settled_at = table[ids["boom"]]
    assert (state, attempts, error) == ("abandoned", 3, "RuntimeError: boom")
    assert settled_at is not None  # acknowledged: ordinary prunable history
    assert table[ids["ok"]][:2] == ("completed", 1)
    assert store.due_exhaustions(limit=10) == []
    store.close()


def test_failures_are_detected_with_user_error_handlers_and_non_blocking_defaults(tmp_path: Any) -> None:
    """Error handlers registered first (one blocking, one a task under Defaults(block=False))
    and a handler with an explicit block=True that raises: the attempt is still failed."""
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    runs: List[int] = []
    errors: List[Any] = []
    delivered: List[Exhaustion] = []

    async def blocking_error_handler(update: object, context: Any) -> None:
        # runs inline, inside the failing attempt
        errors.append(("blocking", type(context.error).__name__, context.attempt))

    async def task_error_handler(update: object, context: Any) -> None:
        # runs as a task (Defaults(block=False)): outside the attempt
        errors.append(("task", type(context.error).__name__, context.attempt, current_attempt()))

    async def on_message(update: Update, context: Any) -> None:
        assert context.attempt is not None
        runs.append(context.attempt.attempt)
        raise ValueError("handler failed")

    async def scenario(fake: FakeBotApi) -> int:
        processor = FencedUpdateProcessor(
            store, handle_exhaustion=delivered.append, max_attempts=2, retry=_retry, **FAST
        )
        app = build(processor, fake, Application.builder().defaults(Defaults(block=False)))
        app.add_error_handler(blocking_error_handler, block=True)
        app.add_error_handler(task_error_handler)
        app.add_handler(MessageHandler(filters.TEXT, on_message, block=True))
        update_id = fake.inject_message(chat_id=3, text="x")
        async with polling(app):
            await wait_for("the exhaustion", lambda: delivered, timeout=10)
            await wait_for("both error handlers twice", lambda: len(errors) >= 4)
        return update_id

    with FakeBotApi() as fake:
        update_id = run(scenario(fake))
    assert runs == [1, 2]
    assert sorted(e[0] for e in errors) == ["blocking", "blocking", "task", "task"]
    assert all(e[1] == "ValueError" for e in errors)
    assert all(e[2] is None and e[3] is None for e in errors if e[0] == "task")
    assert sorted(e[2].attempt for e in errors if e[0] == "blocking") == [1, 2]
    assert delivered[0].update_id == update_id and delivered[0].error == "ValueError: handler failed"
    assert rows(path)[update_id][:3] == ("abandoned", 2, "ValueError: handler failed")


def test_application_handler_stop_is_not_a_failure(tmp_path: Any) -> None:
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    seen: List[str] = []
    errors: List[Any] = []

    async def stopper(update: Update, context: Any) -> None:
        seen.append(f"stop {context.attempt.attempt}")
        raise ApplicationHandlerStop

    async def later_group(update: Update, context: Any) -> None:
        seen.append("later group")

    async def on_error(update: object, context: Any) -> None:
        errors.append(context.error)

    async def scenario(fake: FakeBotApi) -> int:
        processor = FencedUpdateProcessor(store, max_attempts=3, retry=_retry, **FAST)
        app = build(processor, fake)
        app.add_error_handler(on_error)
        app.add_handler(MessageHandler(filters.TEXT, stopper), group=0)
        app.add_handler(MessageHandler(filters.TEXT, later_group), group=1)
        update_id = fake.inject_message(chat_id=4, text="x")
        async with polling(app):
            await wait_for("the stop", lambda: seen)
            await wait_for("settled", lambda: rows(path).get(update_id, ("",))[0] == "completed")
            await asyncio.sleep(0.3)  # a failed attempt would be retried within this time
        return update_id

    with FakeBotApi() as fake:
        update_id = run(scenario(fake))
    assert seen == ["stop 1"]
    assert errors == []
    assert rows(path)[update_id][:3] == ("completed", 1, None)


@pytest.mark.parametrize("how", ["handler", "defaults"])
def test_non_blocking_handler_runs_outside_the_attempt_and_is_logged(
    tmp_path: Any, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    seen: List[Any] = []
    blocking_seen: List[Any] = []

    async def non_blocking(update: Update, context: Any) -> None:
        await asyncio.sleep(0.05)
        seen.append((context.attempt, current_attempt()))
        raise RuntimeError("not retried: outside the attempt")

    async def blocking(update: Update, context: Any) -> None:
        blocking_seen.append(context.attempt)

    async def scenario(fake: FakeBotApi) -> int:
        processor = FencedUpdateProcessor(store, max_attempts=3, retry=_retry, **FAST)
        if how == "handler":
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.TEXT, non_blocking, block=False))
        else:
            app = build(processor, fake, Application.builder().defaults(Defaults(block=False)))
            app.add_handler(MessageHandler(filters.TEXT, non_blocking))
        app.add_handler(MessageHandler(filters.TEXT, blocking, block=True), group=1)
        update_id = fake.inject_message(chat_id=5, text="x")
        with caplog.at_level(logging.WARNING, logger="ptb_fence"):
            async with polling(app):
                await wait_for("the non-blocking handler", lambda: seen)
                await wait_for("settled", lambda: rows(path)[update_id][0] == "completed")
                await asyncio.sleep(0.3)
        return update_id

    with FakeBotApi() as fake:
        update_id = run(scenario(fake))
    assert seen == [(None, None)]
    assert len(blocking_seen) == 1 and blocking_seen[0] is not None
    assert blocking_seen[0].update_id == update_id
    assert rows(path)[update_id][:2] == ("completed", 1)
    warnings = [r.getMessage() for r in caplog.records if "block=False" in r.getMessage()]
    assert len(warnings) == 1 and "OUTSIDE the attempt" in warnings[0], warnings
    assert "non_blocking" in warnings[0] or "MessageHandler" in warnings[0]


def test_handler_exhaust_and_slow_exhaustion_handler_deliver_once(tmp_path: Any) -> None:
    """``context.attempt.exhaust(reason)`` ends the update at once; a slow exhaustion handler is
    not called a second time by the sweeps that run (every 0.1 s) while it is still running."""
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    calls: List[Exhaustion] = []
    runs: List[int] = []

    async def slow_sink(exhaustion: Exhaustion) -> None:
        calls.append(exhaustion)
        await asyncio.sleep(0.4)

    async def on_message(update: Update, context: Any) -> None:
        runs.append(update.update_id)
        if update.message.text == "permanent":
            await asyncio.to_thread(context.attempt.exhaust, "cannot be done")
            return
        raise RuntimeError("boom")

    async def scenario(fake: FakeBotApi) -> List[int]:
        processor = FencedUpdateProcessor(
            store, handle_exhaustion=slow_sink, max_attempts=1, retry=_retry, **FAST
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        ids = [fake.inject_message(chat_id=1, text="boom"),
               fake.inject_message(chat_id=2, text="permanent")]
        async with polling(app):
            await wait_for("acknowledged", lambda: len(calls) >= 2
                           and not store.due_exhaustions(limit=10), timeout=8)
            await asyncio.sleep(0.4)
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake))
    assert sorted(runs) == ids  # no retries
    assert sorted((e.update_id, e.attempt, e.error) for e in calls) == [
        (ids[0], 1, "RuntimeError: boom"),
        (ids[1], 1, "cannot be done"),
    ]
    table = rows(path)
    assert all(table[u][0] == "abandoned" and table[u][3] is not None for u in ids)


@pytest.mark.parametrize("max_concurrent", [1, 4])
def test_handler_raising_cancelled_error_is_a_failure(tmp_path: Any, max_concurrent: int) -> None:
    """A handler that raises CancelledError (its task was not cancelled) neither kills PTB's
    update fetcher (sequential mode) nor strands its update under a forever-renewed lease."""
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    seen: List[Any] = []

    async def on_message(update: Update, context: Any) -> None:
        seen.append((update.update_id, context.attempt.attempt))
        if update.message.text == "cancel" and context.attempt.attempt == 1:
            raise asyncio.CancelledError("from handler code")

    async def scenario(fake: FakeBotApi) -> List[int]:
        processor = FencedUpdateProcessor(
            store, max_concurrent=max_concurrent, retry=_retry, **FAST
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        ids = [fake.inject_message(chat_id=1, text="cancel")]
        async with polling(app):
            await wait_for("the first attempt", lambda: seen)
            ids.append(fake.inject_message(chat_id=2, text="after"))
            await wait_for("all completed", lambda: all(
                rows(path).get(u, ("",))[0] == "completed" for u in ids), timeout=8)
            # the store shows "completed" a moment before the attempt leaves the keeper
            await wait_for("nothing renewed", lambda: not processor.runtime.keeper.active(), 2)
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake))
    assert sorted(seen) == [(ids[0], 1), (ids[0], 2), (ids[1], 1)]
    assert rows(path)[ids[0]][:2] == ("completed", 2)


@pytest.mark.parametrize("processor_class", ["fenced", "durable"])
def test_a_retry_that_matches_no_handler_is_a_warning(
    tmp_path: Any, caplog: Any, processor_class: str
) -> None:
    """A handler's filter reads state the failed first attempt changed (as a conversation's
    state can be): the retry, attempt 2, matches no handler and is settled completed; that is
    logged once at WARNING with the hint about per-process state. A first attempt that matches
    no handler (another chat's message) is ordinary and stays quiet. Both processors."""
    from ptb_fence.ptb import DurableUpdateProcessor

    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    waiting = {1}  # the chats whose next message the handler takes (per-process state)
    runs: List[int] = []

    class Waiting(filters.MessageFilter):
        def filter(self, message: Any) -> bool:
            return message.chat.id in waiting

    async def on_step(update: Update, context: Any) -> None:
        runs.append(update.update_id)
        waiting.discard(update.effective_chat.id)  # the state moves on, then the step fails
        raise RuntimeError("the step failed after changing the state")

    async def scenario(fake: FakeBotApi) -> List[int]:
        make = FencedUpdateProcessor if processor_class == "fenced" else DurableUpdateProcessor
        processor = make(store, retry=_retry, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT & Waiting(), on_step))
        ids = [fake.inject_message(chat_id=1, text="10:00"),
               fake.inject_message(chat_id=2, text="hello")]
        async with polling(app):
            await wait_for("both completed",
                           lambda: all(rows(path).get(u, ("",))[0] == "completed" for u in ids))
        return ids

    with caplog.at_level(logging.WARNING, logger="ptb_fence"):
        with FakeBotApi() as fake:
            step, stray = run(scenario(fake))
    store.close()
    assert runs == [step]  # the retry ran no handler
    assert rows(path)[step][:2] == ("completed", 2)
    said = [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "matched no handler" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith(f"update {step} attempt 2 matched no handler"), said
    assert "stale" in said[0] and "conversation" in said[0], said
    assert not any(f"update {stray} " in m for m in said)
