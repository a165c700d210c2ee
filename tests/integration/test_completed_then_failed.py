"""What is reported when an attempt completed (``complete=True`` committed) and its handler then
failed or ran out of time.

- A handler completes with ``run_in_transaction(fn, complete=True)`` (or
  ``attempt.transaction(complete=True)``) and then raises: its reply failed (``NetworkError:
  Bad Gateway`` from the fake Bot API) or it completed a second time (``AttemptFinished``). The
  update is completed and not retried; one WARNING names the update, the attempt and the
  exception (the user may have missed a reply), the traceback goes to DEBUG, and the user's
  error handlers still get the exception.
- ``attempt_timeout_seconds`` passes while the completing transaction is still in ``fn``: the
  update completes once and that is what is reported (no ``on_failure``, no "failed" log, the
  stats count one completed attempt) — also when ``fn`` outlasts the lease, so the failure
  settle is refused while the transaction is still open (on PostgreSQL the refused settle does
  not even wait for the row lock: the lapsed lease already fails its condition).

Real PTB Applications against FakeBotApi and real ``UpdateIntake`` s, on a SQLite file and on
the real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any, Dict, List, Tuple

import pytest
from telegram import Update
from telegram.error import NetworkError
from telegram.ext import MessageHandler, filters

from ptb_fence import AttemptFinished, UpdateIntake
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import FAST, build, polling, run, wait_for, wait_sync

KINDS = ["sqlite", "postgres"]
SLOW_LEASE = {**FAST, "lease_seconds": 5.0}
"""A lease longer than the transactions kept open past the attempt timeout (which is the only
limit these tests reach)."""
SHORT_LEASE = {**FAST, "lease_seconds": 1.0}
"""A lease shorter than the completing transaction: the runtime's wait for it (bounded by the
lease) ends while it is still open, and the failure settle that follows is refused."""
LEASES = {"fn-within-lease": (SLOW_LEASE, 1.5), "fn-outlasts-lease": (SHORT_LEASE, 3.0)}


def _states(store: Any) -> Dict[int, Tuple[str, int]]:
    with store.transaction() as conn:
        cur = conn.cursor()
        cur.execute(f"SELECT update_id, state, attempts FROM {store.table}")  # noqa: S608
        return {int(r[0]): (str(r[1]), int(r[2])) for r in cur.fetchall()}


def _body(update_id: int, chat: int, text: str) -> str:
    return json.dumps({"update_id": update_id, "message": {
        "message_id": update_id, "date": 0, "chat": {"id": chat, "type": "private"}, "text": text}})


def _nothing(conn: Any) -> None:
    conn.cursor().execute("SELECT 1")


def _completed_then(records: List[logging.LogRecord], update_id: int) -> List[logging.LogRecord]:
    return [r for r in records if r.name.startswith("ptb_fence") and r.levelno == logging.WARNING
            and f"update {update_id} attempt 1 completed" in r.getMessage()]


def _failures_logged(records: List[logging.LogRecord]) -> List[str]:
    return [r.getMessage() for r in records
            if r.name.startswith("ptb_fence") and r.levelno >= logging.WARNING
            and " failed (" in r.getMessage()]


def _ended(stats: Any) -> Dict[str, int]:
    return {name: count for name, count in stats.attempts_ended.items() if count}


@pytest.mark.parametrize("store_kind", KINDS)
@pytest.mark.parametrize("error_handler", [False, True], ids=["no-error-handler", "error-handler"])
def test_ptb_handler_raising_after_its_completion_is_reported_once(
    store: Any, error_handler: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="ptb_fence")
    runs: List[int] = []
    failures: List[Any] = []
    seen_by_error_handler: List[BaseException] = []

    async def handler(update: Update, context: Any) -> None:
        runs.append(update.update_id)
        await context.attempt.run_in_transaction(_nothing, complete=True)
        if update.message.text == "twice":
            await context.attempt.run_in_transaction(_nothing, complete=True)  # AttemptFinished
        await update.message.reply_text("done")  # NetworkError: Bad Gateway (fake.fail_next)

    async def on_error(update: object, context: Any) -> None:
        seen_by_error_handler.append(context.error)

    processor = FencedUpdateProcessor(
        store, **FAST, retry=lambda error, n: 0.05,
        on_failure=lambda error, attempt, retrying: failures.append(error),
    )

    async def main() -> Tuple[int, int]:
        with FakeBotApi() as fake:
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.TEXT, handler))
            if error_handler:
                app.add_error_handler(on_error)
            fake.fail_next("sendMessage", error_code=502)
            async with polling(app):
                reply = fake.inject_message(chat_id=1, text="reply")
                twice = fake.inject_message(chat_id=2, text="twice")
                await wait_for("both completed", lambda: all(
                    _states(store).get(u, ("",))[0] == "completed" for u in (reply, twice)), 15)
                await asyncio.sleep(0.3)  # a retry (there must be none) would start by now
            return reply, twice

    reply, twice = run(main(), 40)
    states = _states(store)
    assert states[reply] == ("completed", 1) and states[twice] == ("completed", 1)
    assert sorted(runs) == sorted([reply, twice])  # not retried
    assert failures == []
    assert _failures_logged(caplog.records) == []
    (network,) = _completed_then(caplog.records, reply)
    (finished,) = _completed_then(caplog.records, twice)
    for record, name in ((network, "NetworkError"), (finished, "AttemptFinished")):
        message = record.getMessage()
        assert "then the handler raised" in message and name in message, message
        assert "not retried" in message and "missed a reply" in message, message
        assert record.exc_info is None  # the traceback goes to DEBUG
    assert "Bad Gateway" in network.getMessage()
    tracebacks = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info
                  and r.name.startswith("ptb_fence")]
    assert sorted(type(r.exc_info[1]).__name__ for r in tracebacks) == ["AttemptFinished", "NetworkError"]
    if error_handler:
        assert sorted(type(e).__name__ for e in seen_by_error_handler) == ["AttemptFinished", "NetworkError"]
    assert _ended(processor.stats()) == {"completed": 2}


@pytest.mark.parametrize("store_kind", KINDS)
def test_ptb_a_later_handler_group_raising_after_the_completion_is_reported_once(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler of group 0 completes the update; a handler of group 1 (e.g. analytics)
    then raises: the same single WARNING, no retry, no on_failure, counted completed."""
    caplog.set_level(logging.DEBUG, logger="ptb_fence")
    runs: List[int] = []
    failures: List[Any] = []

    async def completes(update: Update, context: Any) -> None:
        runs.append(update.update_id)
        await context.attempt.run_in_transaction(_nothing, complete=True)

    async def later(update: Update, context: Any) -> None:
        raise NetworkError("Bad Gateway")

    processor = FencedUpdateProcessor(
        store, **FAST, retry=lambda error, n: 0.05,
        on_failure=lambda error, attempt, retrying: failures.append(error),
    )

    async def main() -> int:
        with FakeBotApi() as fake:
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.TEXT, completes), group=0)
            app.add_handler(MessageHandler(filters.TEXT, later), group=1)
            async with polling(app):
                update_id = fake.inject_message(chat_id=1, text="hello")
                await wait_for("completed", lambda: _states(store).get(update_id, ("",))[0]
                               == "completed", 15)
                await wait_for("the attempt counted", lambda: _ended(processor.stats()), 10)
                await asyncio.sleep(0.3)  # a retry (there must be none) would start by now
            return update_id

    update_id = run(main(), 40)
    assert _states(store)[update_id] == ("completed", 1)
    assert runs == [update_id] and failures == []
    assert _failures_logged(caplog.records) == []
    (record,) = _completed_then(caplog.records, update_id)
    assert "then the handler raised NetworkError: Bad Gateway" in record.getMessage()
    assert _ended(processor.stats()) == {"completed": 1}


@pytest.mark.parametrize("store_kind", KINDS)
def test_intake_handler_raising_after_its_completion_is_reported_once(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="ptb_fence")
    runs: List[int] = []
    failures: List[Any] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        runs.append(update["update_id"])
        with attempt.transaction(complete=True) as conn:
            _nothing(conn)
        if update["message"]["text"] == "twice":
            with attempt.transaction(complete=True) as conn:  # AttemptFinished
                _nothing(conn)
        raise NetworkError("Bad Gateway")  # the reply failed

    intake = UpdateIntake(
        store, handle_attempt=handle, **FAST, retry=lambda error, n: 0.05,
        on_failure=lambda error, attempt, retrying: failures.append(error),
    )
    with intake:
        intake.accept(_body(1, 1, "reply"))
        intake.accept(_body(2, 2, "twice"))
        wait_sync("both completed", lambda: all(
            _states(store).get(u, ("",))[0] == "completed" for u in (1, 2)), 15)
        time.sleep(0.3)  # a retry (there must be none) would start by now
        assert intake.idle(10)
    assert _states(store) == {1: ("completed", 1), 2: ("completed", 1)}
    assert sorted(runs) == [1, 2]
    assert failures == []
    assert _failures_logged(caplog.records) == []
    (network,) = _completed_then(caplog.records, 1)
    (finished,) = _completed_then(caplog.records, 2)
    assert "then the handler raised NetworkError: Bad Gateway" in network.getMessage()
    assert "then the handler raised AttemptFinished" in finished.getMessage()
    tracebacks = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info
                  and r.name.startswith("ptb_fence")]
    assert sorted(type(r.exc_info[1]).__name__ for r in tracebacks) == ["AttemptFinished", "NetworkError"]
    assert isinstance([r for r in tracebacks if "update 2" in r.getMessage()][0].exc_info[1], AttemptFinished)
    assert _ended(intake.stats()) == {"completed": 2}


@pytest.mark.parametrize("store_kind", KINDS)
@pytest.mark.parametrize("lease", list(LEASES))
def test_ptb_timeout_inside_a_completing_transaction_reports_the_completion(
    store: Any, lease: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ptb_fence")
    options, seconds = LEASES[lease]
    runs: List[int] = []
    replied: List[int] = []
    failures: List[Any] = []

    async def handler(update: Update, context: Any) -> None:
        runs.append(update.update_id)
        # still in fn when attempt_timeout_seconds passes; the transaction commits after
        await context.attempt.run_in_transaction(
            lambda conn: (_nothing(conn), time.sleep(seconds)), complete=True)
        replied.append(update.update_id)

    processor = FencedUpdateProcessor(
        store, **options, attempt_timeout_seconds=0.5, retry=lambda error, n: 0.05,
        on_failure=lambda error, attempt, retrying: failures.append((error, retrying)),
    )

    async def main() -> int:
        with FakeBotApi() as fake:
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.TEXT, handler))
            async with polling(app):
                slow = fake.inject_message(chat_id=1, text="slow")
                await wait_for("completed", lambda: _states(store).get(slow, ("",))[0] == "completed", 15)
                await wait_for("the attempt counted", lambda: _ended(processor.stats()), 10)
                await asyncio.sleep(0.5)  # a retry (there must be none) would start by now
            return slow

    slow = run(main(), 40)
    assert _states(store)[slow] == ("completed", 1)
    assert runs == [slow] and replied == []  # the handler was cancelled after fn
    assert failures == []
    assert _failures_logged(caplog.records) == []
    (record,) = _completed_then(caplog.records, slow)
    assert "attempt_timeout_seconds=0.5" in record.getMessage()
    assert "not retried" in record.getMessage()
    assert _ended(processor.stats()) == {"completed": 1}


@pytest.mark.parametrize("store_kind", KINDS)
@pytest.mark.parametrize("lease", list(LEASES))
def test_ptb_a_reply_held_before_a_completing_transaction_that_times_out_is_sent(
    store: Any, lease: str
) -> None:
    """The handler queues a reply (``attempt.outbox``: held for the completion), then completes
    in a transaction still in ``fn`` when attempt_timeout_seconds passes: the transaction's
    commit completes the update and carries the held reply, which is sent once. The timeout's
    failure settle must not discard it while that transaction is still open."""
    options, seconds = LEASES[lease]
    failures: List[Any] = []

    async def handler(update: Update, context: Any) -> None:
        context.attempt.outbox.reply_text("held reply")
        await context.attempt.run_in_transaction(
            lambda conn: (_nothing(conn), time.sleep(seconds)), complete=True)

    processor = FencedUpdateProcessor(
        store, **options, attempt_timeout_seconds=0.5, retry=lambda error, n: 0.05,
        on_failure=lambda error, attempt, retrying: failures.append((error, retrying)),
    )

    async def main() -> Tuple[int, List[str]]:
        with FakeBotApi() as fake:
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.TEXT, handler))
            async with polling(app):
                slow = fake.inject_message(chat_id=1, text="slow")
                await wait_for("completed", lambda: _states(store).get(slow, ("",))[0] == "completed", 15)
                await wait_for("the held reply", lambda: fake.sent_messages, 10)
                await asyncio.sleep(0.5)  # a second send (there must be none) would come by now
            return slow, [m["text"] for m in fake.sent_messages]

    slow, texts = run(main(), 40)
    assert _states(store)[slow] == ("completed", 1)
    assert texts == ["held reply"]
    assert failures == []


@pytest.mark.parametrize("store_kind", KINDS)
@pytest.mark.parametrize("lease", list(LEASES))
def test_intake_timeout_inside_a_completing_transaction_reports_the_completion(
    store: Any, lease: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ptb_fence")
    options, seconds = LEASES[lease]
    runs: List[int] = []
    failures: List[Any] = []
    after = threading.Event()

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        runs.append(update["update_id"])
        with attempt.transaction(complete=True) as conn:
            _nothing(conn)
            time.sleep(seconds)  # attempt_timeout_seconds passes here
        after.set()

    intake = UpdateIntake(
        store, handle_attempt=handle, **options, attempt_timeout_seconds=0.5,
        retry=lambda error, n: 0.05,
        on_failure=lambda error, attempt, retrying: failures.append((error, retrying)),
    )
    with intake:
        intake.accept(_body(1, 1, "slow"))
        wait_sync("completed", lambda: _states(store).get(1, ("",))[0] == "completed", 15)
        wait_sync("the handler returned", after.is_set, 10)
        wait_sync("the attempt counted", lambda: _ended(intake.stats()), 10)
        time.sleep(0.3)  # a retry (there must be none) would start by now
        assert intake.idle(10)
    assert _states(store) == {1: ("completed", 1)}
    assert runs == [1]
    assert failures == []
    assert _failures_logged(caplog.records) == []
    (record,) = _completed_then(caplog.records, 1)
    assert "attempt_timeout_seconds=0.5" in record.getMessage()
    assert _ended(intake.stats()) == {"completed": 1}
