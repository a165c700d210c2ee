"""``attempt_timeout_seconds`` ends a hung attempt; it fails with
:exc:`ptb_fence.AttemptTimeout`, is retried by policy, and its fenced writes are refused.

A real PTB Application against FakeBotApi (asyncio: the handler is cancelled) and a real
UpdateIntake (threads: the handler is abandoned, its thread runs on), both on SQLite files.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, List

from telegram import Update
from telegram.ext import MessageHandler, filters

from ptb_fence import AttemptFinished, AttemptTimeout, OwnershipLost, SQLiteUpdateStore, UpdateIntake
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import DOMAIN_DDL, FAST, build, domain_rows, polling, rows, run, wait_for, wait_sync


def _store(tmp_path: Any) -> "tuple[str, SQLiteUpdateStore]":
    path = str(tmp_path / "bot.db")
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute(DOMAIN_DDL)
    return path, store


def test_asyncio_handler_past_the_attempt_timeout_is_cancelled_and_retried(tmp_path: Any) -> None:
    path, store = _store(tmp_path)
    failures: List[Any] = []
    cancelled: List[int] = []

    async def handler(update: Update, context: Any) -> None:
        attempt = context.attempt
        if attempt.attempt == 1 and update.message.text == "hang":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(update.update_id)
                raise

        def write(conn: Any) -> None:
            conn.execute("INSERT INTO domain VALUES (?, ?, ?, NULL)",
                         (update.update_id, attempt.attempt, attempt.claim_id))

        await attempt.run_in_transaction(write, complete=True)

    processor = FencedUpdateProcessor(
        store, **FAST, attempt_timeout_seconds=0.5, retry=lambda error, n: 0.05,
        on_failure=lambda error, attempt, retrying: failures.append((error, attempt.attempt, retrying)),
    )

    async def main() -> None:
        with FakeBotApi() as fake:
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.TEXT, handler))
            async with polling(app):
                hung = fake.inject_message(chat_id=1, text="hang")
                other = fake.inject_message(chat_id=1, text="after it, same chat")
                await wait_for("both completed",
                               lambda: {rows(path).get(u, ("",))[0] for u in (hung, other)} == {"completed"},
                               15)
        assert cancelled == [hung]
        ((error, number, retrying),) = failures
        assert isinstance(error, AttemptTimeout) and number == 1 and retrying
        assert error.update_id == hung and error.seconds == 0.5
        assert "attempt_timeout_seconds" in str(error)
        assert [(u, a) for u, a, _ in domain_rows(path)] == sorted([(hung, 2), (other, 1)])

    run(main(), 40)
    store.close()


def test_blocking_handler_past_the_attempt_timeout_is_abandoned_and_its_writes_refused(
    tmp_path: Any,
) -> None:
    path, store = _store(tmp_path)
    failures: List[Any] = []
    late: List[BaseException] = []
    resume = threading.Event()

    def handle(update: Any, attempt: Any) -> None:
        if attempt.attempt == 1 and update["message"]["text"] == "hang":
            resume.wait(20)  # past the timeout: abandoned meanwhile
            try:
                with attempt.transaction() as conn:
                    conn.execute("INSERT INTO domain VALUES (?, ?, ?, NULL)",
                                 (update["update_id"], attempt.attempt, attempt.claim_id))
            except (OwnershipLost, AttemptFinished) as exc:
                late.append(exc)
                raise
            return
        with attempt.transaction(complete=True) as conn:
            conn.execute("INSERT INTO domain VALUES (?, ?, ?, NULL)",
                         (update["update_id"], attempt.attempt, attempt.claim_id))

    intake = UpdateIntake(
        store, handle_attempt=handle, **FAST, attempt_timeout_seconds=0.5,
        retry=lambda error, n: 0.05,
        on_failure=lambda error, attempt, retrying: failures.append((error, attempt.attempt)),
    )

    def body(update_id: int, chat: int, text: str) -> str:
        return json.dumps({"update_id": update_id, "message": {
            "message_id": update_id, "date": 0, "chat": {"id": chat, "type": "private"}, "text": text}})

    with intake:
        assert intake.accept(body(1, 7, "hang")) == "accepted"
        assert intake.accept(body(2, 7, "same chat, after it")) == "accepted"
        began = time.monotonic()
        # the hung attempt is settled failed, the chat goes on, the retry completes
        wait_sync("both completed", lambda: {rows(path).get(u, ("",))[0] for u in (1, 2)} == {"completed"}, 15)
        assert time.monotonic() - began < 10
        assert isinstance(failures[0][0], AttemptTimeout) and failures[0][1] == 1
        resume.set()
        wait_sync("the abandoned handler's write refused", lambda: late, 10)
        assert intake.idle(10)
    assert [(u, a) for u, a, _ in domain_rows(path)] == [(1, 2), (2, 1)]
    assert rows(path)[1][:2] == ("completed", 2)
    store.close()


def test_a_handler_ignoring_its_cancellation_is_counted_as_left_running(tmp_path: Any) -> None:
    """Past ``attempt_timeout_seconds`` and the cancel grace, a handler task that swallows its
    cancellation is let go: ``stats().handlers_left_running`` counts it (not
    ``attempts_running``) until it ends."""
    path, store = _store(tmp_path)
    let_go = asyncio.Event()
    ended: List[int] = []

    async def handler(update: Update, context: Any) -> None:
        attempt = context.attempt
        if attempt.attempt == 1:
            while not let_go.is_set():  # a cleanup that swallows every cancellation
                try:
                    await let_go.wait()
                except asyncio.CancelledError:
                    pass
            ended.append(update.update_id)
            return
        await attempt.run_in_transaction(lambda conn: None, complete=True)

    processor = FencedUpdateProcessor(
        store, **FAST, attempt_timeout_seconds=0.3, retry=lambda error, n: 0.05,
    )

    async def main() -> None:
        with FakeBotApi() as fake:
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.TEXT, handler))
            async with polling(app):
                try:
                    assert processor.stats().handlers_left_running == 0
                    stubborn = fake.inject_message(chat_id=1, text="stubborn")
                    # the retry completes while the first attempt's task still runs
                    await wait_for("the retry completed",
                                   lambda: rows(path).get(stubborn, ("",))[0] == "completed", 15)
                    # the retry's handler returns just after its completing commit: the gauge
                    # drops then, not at the commit
                    await wait_for("the retry's attempt ended",
                                   lambda: processor.stats().attempts_running == 0, 10)
                    stats = processor.stats()
                    assert stats.handlers_left_running == 1, stats
                    assert stats.attempts_running == 0, stats
                finally:
                    let_go.set()  # a failed check must not leave the task running to the timeout
                await wait_for("the stubborn task ended", lambda: ended == [stubborn], 10)
                assert processor.stats().handlers_left_running == 0

    run(main(), 40)
    store.close()
