"""The durable queue records only real Telegram updates; attempt helpers for asyncio code."""

from __future__ import annotations

import asyncio
from typing import Any, List

from telegram import Update
from telegram.ext import Application, MessageHandler, filters

from ptb_fence import MemoryUpdateStore
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi, make_message_update


def test_updates_with_impossible_ids_are_dropped_not_recorded(caplog: Any) -> None:
    store = MemoryUpdateStore()
    handled: List[int] = []

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(store, lease_seconds=5)
        app = processor.install(
            Application.builder().token(fake.token).base_url(fake.base_url)
        ).build()

        async def on_message(update: Update, context: Any) -> None:
            handled.append(update.update_id)

        app.add_handler(MessageHandler(filters.ALL, on_message))
        async with app:
            await app.start()
            for bad in (-5, 2**63):
                await app.update_queue.put(Update(update_id=bad))
            good = Update.de_json(make_message_update(7, 42, "hi"), app.bot)
            await app.update_queue.put(good)
            for _ in range(200):
                if handled:
                    break
                await asyncio.sleep(0.02)
            await app.stop()

    with FakeBotApi() as fake:
        asyncio.run(asyncio.wait_for(scenario(fake), 30))
    assert handled == [7]
    rows = store.due(now=2**62, pending_before=2**62, limit=10)
    assert [r.update_id for r in rows] == []  # 7 completed; nothing else recorded
    assert store.add(7, "{}", 0) is False
    assert "not a Telegram update" in caplog.text


def test_async_owns_and_exhaust_run_off_the_loop() -> None:
    store = MemoryUpdateStore()
    seen: List[Any] = []
    exhausted: List[Any] = []

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(
            store, handle_exhaustion=exhausted.append, lease_seconds=5
        )
        app = processor.install(
            Application.builder().token(fake.token).base_url(fake.base_url)
        ).build()

        async def on_message(update: Update, context: Any) -> None:
            seen.append(await context.attempt.owns_async())
            await context.attempt.exhaust_async("refused by the handler")

        app.add_handler(MessageHandler(filters.ALL, on_message))
        async with app:
            await app.start()
            await app.update_queue.put(Update.de_json(make_message_update(9, 1, "x"), app.bot))
            for _ in range(250):
                if exhausted:
                    break
                await asyncio.sleep(0.02)
            await app.stop()

    with FakeBotApi() as fake:
        asyncio.run(asyncio.wait_for(scenario(fake), 30))
    assert seen == [True]
    assert [(e.update_id, e.error) for e in exhausted] == [(9, "refused by the handler")]
    assert store.due_exhaustions(limit=10) == []  # delivered and acknowledged
