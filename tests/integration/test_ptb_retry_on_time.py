"""PTB: a retry due before the next sweep runs at its time; a failed attempt is logged once.

A real Application polls :class:`~ptb_fence.testing.FakeBotApi` with the default sweep
interval (30 s) and ``retry=lambda e, a: 0.2``: three attempts of an always-failing update
must finish in about half a second, each through a fresh fenced claim. Without error
handlers, PTB's "No error handlers are registered" traceback is not printed for each failed
attempt: ptb_fence logs each failure once at WARNING (update id, attempt, claim id, the
error's type and message) and the traceback goes to DEBUG.
"""

from __future__ import annotations

import logging
import time
from typing import Any, List, Tuple

import pytest
from telegram import Update
from telegram.ext import MessageHandler, filters

from ptb_fence import Exhaustion, SQLiteUpdateStore
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import build, polling, run, wait_for


def test_short_retry_runs_at_its_time_and_each_failure_is_logged_once(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    store = SQLiteUpdateStore(str(tmp_path / "updates.db"))
    runs: List[Tuple[float, int, str]] = []
    delivered: List[Exhaustion] = []

    async def on_message(update: Update, context: Any) -> None:
        attempt = context.require_attempt()
        runs.append((time.monotonic(), attempt.attempt, attempt.claim_id))
        raise ValueError("always fails")

    async def scenario(fake: FakeBotApi) -> float:
        processor = FencedUpdateProcessor(
            store,
            handle_exhaustion=delivered.append,
            max_attempts=3,
            retry=lambda error, attempt: 0.2,
        )  # default sweep_every_seconds: 30 s
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        fake.inject_message(chat_id=1, text="boom")
        started = time.monotonic()
        async with polling(app):
            await wait_for("the exhaustion", lambda: delivered, timeout=10)
        return time.monotonic() - started

    with FakeBotApi() as fake:
        elapsed = run(scenario(fake))
    store.close()
    assert [a for _, a, _ in runs] == [1, 2, 3]
    assert len({c for _, _, c in runs}) == 3  # a fresh fenced claim per attempt
    gaps = [b[0] - a[0] for a, b in zip(runs, runs[1:])]
    assert all(0.19 <= gap <= 1.5 for gap in gaps), gaps
    assert elapsed < 8, elapsed
    messages = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert not any("No error handlers are registered" in m for _, _, m in messages), messages
    failures = [
        r for r in caplog.records
        if r.name.startswith("ptb_fence") and "failed (" in r.getMessage()
    ]
    assert len(failures) == 3, [r.getMessage() for r in failures]
    for record in failures[:2]:
        assert record.levelno == logging.WARNING
        assert "retry scheduled in 200 ms" in record.getMessage()
        assert "ValueError: always fails" in record.getMessage()
        assert record.claim_id and record.attempt in (1, 2)  # type: ignore[attr-defined]
    assert not any(r.exc_info for r in caplog.records if r.levelno >= logging.INFO), [
        r.getMessage() for r in caplog.records if r.exc_info and r.levelno >= logging.INFO
    ]


def test_user_error_handlers_still_see_the_error(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "updates.db"))
    seen: List[str] = []

    async def on_message(update: Update, context: Any) -> None:
        raise KeyError("user sees me")

    async def on_error(update: object, context: Any) -> None:
        seen.append(repr(context.error))

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(store, max_attempts=1, sweep_every_seconds=0.2)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        app.add_error_handler(on_error)
        fake.inject_message(chat_id=1, text="x")
        async with polling(app):
            await wait_for("the error handler", lambda: seen, timeout=10)

    with FakeBotApi() as fake:
        run(scenario(fake))
    store.close()
    assert seen and "user sees me" in seen[0]
