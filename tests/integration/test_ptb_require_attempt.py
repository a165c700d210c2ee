"""``context.require_attempt()`` returns the Attempt or
raises :class:`ptb_fence.ptb.AttemptUnavailable` naming the cause (a unary
DurableUpdateProcessor, a job, or code outside the update's attempt: ``block=False`` handlers
and ``create_task`` tasks). Real Applications against FakeBotApi and a SQLite file."""

from __future__ import annotations

from typing import Any, Dict

from telegram import Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import DurableUpdateProcessor, FencedCallbackContext, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import FAST, build, polling, run, wait_for


def test_require_attempt_returns_the_attempt_or_names_the_cause(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    seen: Dict[str, Any] = {}

    async def blocking(update: Update, context: FencedCallbackContext) -> None:
        seen["blocking"] = context.require_attempt()
        seen["attempt"] = context.attempt

        async def in_task() -> None:
            try:
                context.require_attempt()
            except RuntimeError as exc:
                seen["task"] = exc

        await context.application.create_task(in_task())

        async def job(ctx: FencedCallbackContext) -> None:
            try:
                ctx.require_attempt()
            except RuntimeError as exc:
                seen["job"] = exc

        assert context.job_queue is not None
        context.job_queue.run_once(job, 0)

    async def non_blocking(update: Update, context: FencedCallbackContext) -> None:
        try:
            context.require_attempt()
        except RuntimeError as exc:
            seen["non_blocking"] = exc

    async def scenario() -> None:
        with FakeBotApi() as fake:
            app = build(FencedUpdateProcessor(store, **FAST), fake)
            app.add_handler(MessageHandler(filters.ALL, blocking))
            app.add_handler(MessageHandler(filters.ALL, non_blocking, block=False), group=1)
            fake.inject_message(chat_id=1, text="hi")
            async with polling(app):
                await wait_for("all cases seen", lambda: {"task", "job", "non_blocking"} <= set(seen), 10)
        assert seen["blocking"] is seen["attempt"] and seen["attempt"] is not None
        for key in ("task", "job", "non_blocking"):
            assert type(seen[key]).__name__ == "AttemptUnavailable", seen[key]
        assert "job" in str(seen["job"])
        assert "block=False" in str(seen["non_blocking"]) and "create_task" in str(seen["task"])

    try:
        run(scenario())
    finally:
        store.close()


def test_require_attempt_under_durable_update_processor_names_it(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    seen: Dict[str, Any] = {}

    async def handler(update: Update, context: FencedCallbackContext) -> None:
        try:
            context.require_attempt()
        except RuntimeError as exc:
            seen["error"] = exc

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor = DurableUpdateProcessor(store, **FAST)
            builder = Application.builder().context_types(ContextTypes(context=FencedCallbackContext))
            app = build(processor, fake, builder)
            app.add_handler(MessageHandler(filters.ALL, handler))
            fake.inject_message(chat_id=1, text="hi")
            async with polling(app):
                await wait_for("the handler ran", lambda: "error" in seen, 10)
        message = str(seen["error"])
        assert "DurableUpdateProcessor" in message and "FencedUpdateProcessor" in message

    try:
        run(scenario())
    finally:
        store.close()
