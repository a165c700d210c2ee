"""Sequential and concurrent processing in a real PTB Application; per-chat order; slots."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Any, Dict, List

from telegram import Update
from telegram.ext import MessageHandler, filters

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import FAST, build, polling, rows, run, wait_for


class Gauge:
    """Counts handlers running at once."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def __enter__(self) -> "Gauge":
        self.now += 1
        self.peak = max(self.peak, self.now)
        return self

    def __exit__(self, *exc: object) -> None:
        self.now -= 1


def test_sequential_mode_handles_one_update_at_a_time_in_order(tmp_path: Any) -> None:
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    gauge = Gauge()
    order: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        with gauge:
            await asyncio.sleep(random.uniform(0, 0.01))
            order.append(update.update_id)

    async def scenario(fake: FakeBotApi) -> List[int]:
        processor = FencedUpdateProcessor(store, max_concurrent=1, **FAST)
        app = build(processor, fake)
        assert app.concurrent_updates == 1 and processor.max_concurrent_updates == 1
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        ids = [fake.inject_message(chat_id=1 + i % 4, text=str(i)) for i in range(12)]
        async with polling(app):
            ids += [fake.inject_message(chat_id=1 + i % 4, text=str(i)) for i in range(12)]
            await wait_for("all handled", lambda: len(order) >= len(ids))
            await asyncio.sleep(0.2)
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake))
    assert gauge.peak == 1
    assert order == sorted(ids)
    assert {r[:2] for r in rows(path).values()} == {("completed", 1)}


def test_concurrent_mode_keeps_per_chat_order(tmp_path: Any) -> None:
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    gauge = Gauge()
    per_chat: Dict[int, List[int]] = defaultdict(list)
    rng = random.Random(7)

    async def on_message(update: Update, context: Any) -> None:
        with gauge:
            assert context.attempt.update_id == update.update_id
            await asyncio.sleep(rng.uniform(0, 0.02))
            per_chat[update.effective_chat.id].append(update.update_id)

    async def scenario(fake: FakeBotApi) -> List[int]:
        processor = FencedUpdateProcessor(store, max_concurrent=32, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        # private chats and groups (negative ids); several users in one group
        chats = [c for c in range(1, 11)] + [-100, -200]
        ids = [fake.inject_message(chat_id=chats[i % 12], text=str(i)) for i in range(72)]
        async with polling(app):
            for i in range(48):
                ids.append(fake.inject_message(chat_id=chats[(i * 5) % 12], text=str(i),
                                               user_id=500 + i % 3 if chats[(i * 5) % 12] < 0 else None))
                if i % 8 == 0:
                    await asyncio.sleep(0.01)
            await wait_for("all handled", lambda: sum(map(len, per_chat.values())) >= len(ids))
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake))
    assert sorted(u for seq in per_chat.values() for u in seq) == sorted(ids)
    for chat, sequence in per_chat.items():
        assert sequence == sorted(sequence), f"chat {chat} out of order: {sequence}"
    assert 1 < gauge.peak <= 12  # concurrent, never two of one chat
    assert {r[:2] for r in rows(path).values()} == {("completed", 1)}


def test_waiting_chats_do_not_hold_a_slot_and_max_concurrent_is_kept(tmp_path: Any) -> None:
    """max_concurrent=2. Chat A's first update blocks; A's later updates wait for their turn
    without a slot, so chat B still runs. With A and B both blocked, chat C waits for a slot."""
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    started: List[str] = []
    release: Dict[str, asyncio.Event] = {}
    gauge = Gauge()

    async def on_message(update: Update, context: Any) -> None:
        text = update.message.text
        with gauge:
            started.append(text)
            if text in release:
                await release[text].wait()

    async def scenario(fake: FakeBotApi) -> None:
        release["a1"] = asyncio.Event()
        release["b1"] = asyncio.Event()
        processor = FencedUpdateProcessor(store, max_concurrent=2, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        for text in ("a1", "a2", "a3", "a4"):
            fake.inject_message(chat_id=1, text=text)
        fake.inject_message(chat_id=2, text="b1")
        async with polling(app):
            try:
                await blocked_part(processor, fake)
            finally:
                for event in release.values():
                    event.set()  # never leave a handler blocked (app.stop() waits for it)
            await wait_for("chat A continues", lambda: len(started) == 6)
            await wait_for("all settled",
                           lambda: {r[0] for r in rows(path).values()} == {"completed"})

    async def blocked_part(processor: Any, fake: FakeBotApi) -> None:
        await wait_for("b1 runs while a2..a4 wait", lambda: "b1" in started)
        assert started[0] == "a1" and "a2" not in started
        assert processor.current_concurrent_updates == 2
        fake.inject_message(chat_id=3, text="c1")
        await wait_for("c1 fetched and recorded", lambda: len(rows(path)) == 6)
        await asyncio.sleep(0.3)
        assert "c1" not in started, "a third chat ran although both slots were taken"
        release["b1"].set()
        await wait_for("c1 gets the free slot", lambda: "c1" in started)
        assert "a2" not in started
        release["a1"].set()

    with FakeBotApi() as fake:
        run(scenario(fake))
    a_runs = [t for t in started if t.startswith("a")]
    assert a_runs == ["a1", "a2", "a3", "a4"]
    assert gauge.peak == 2
