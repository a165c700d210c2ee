"""Polling takes no more updates than the processor has room for: a backlog waits at Telegram
(unconfirmed), not as thousands of tasks in the bot's memory. A chat that floods the bot does
not hold back the other chats: updates waiting for their chat's turn do not count.

A real PTB Application polls :class:`ptb_fence.testing.FakeBotApi` with a real
SQLiteUpdateStore; what the bot fetched is what it recorded (rows in the store file), what it
left is what FakeBotApi still holds. Nothing inside ptb_fence is patched.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

from telegram import Update
from telegram.ext import MessageHandler, filters

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.ptb._ingest import POLL_AHEAD
from ptb_fence.testing import FakeBotApi
from ptb_support import build, polling, rows, run, wait_for

PAGE = 100  # FakeBotApi's (and PTB's default) getUpdates limit


def test_polling_waits_for_room_and_the_backlog_stays_at_telegram(tmp_path: Any) -> None:
    path = str(tmp_path / "updates.db")
    release = asyncio.Event()
    handled: Dict[int, int] = {}

    async def on_message(update: Update, context: Any) -> None:
        await release.wait()
        handled[update.update_id] = handled.get(update.update_id, 0) + 1

    async def scenario(fake: FakeBotApi) -> List[int]:
        processor = FencedUpdateProcessor(
            SQLiteUpdateStore(path), max_concurrent=4, sweep_every_seconds=60
        )
        assert processor._ingest.poll_ahead == POLL_AHEAD  # max(POLL_AHEAD, 2 * 4)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        ids = [fake.inject_message(chat_id=1 + i, text=f"m{i}") for i in range(3 * POLL_AHEAD)]
        async with polling(app):
            await wait_for("a first page recorded", lambda: len(rows(path)) >= PAGE)
            # the handlers hang: the poller fetches until the bound, then waits (several of
            # its long-poll rounds would have fetched everything)
            await asyncio.sleep(1.5)
            fetched = len(rows(path))
            calls = len(fake.calls_to("getUpdates"))
            await asyncio.sleep(1.0)
            assert len(rows(path)) == fetched, "the poller went on fetching"
            assert len(fake.calls_to("getUpdates")) == calls, "getUpdates was sent while full"
            # it stopped at the bound: the last page it took began below it
            assert POLL_AHEAD <= fetched < POLL_AHEAD + PAGE, fetched
            assert len(fake.pending_update_ids) >= len(ids) - fetched
            release.set()
            await wait_for("every update handled", lambda: len(handled) == len(ids), timeout=60)
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake), timeout=120)
    assert sorted(handled) == sorted(ids)
    assert set(handled.values()) == {1}
    assert all(state == "completed" for state, *_ in rows(path).values())


def test_a_flooding_chat_does_not_hold_back_the_other_chats(tmp_path: Any) -> None:
    path = str(tmp_path / "updates.db")
    flood_chat = 1
    order: List[int] = []
    flood_left: Dict[str, int] = {"n": 0}
    others_done_with_flood_left: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        assert update.effective_chat is not None
        if update.effective_chat.id == flood_chat:
            await asyncio.sleep(0.005)  # its chat's updates run one at a time
            flood_left["n"] -= 1
        else:
            others_done_with_flood_left.append(flood_left["n"])
        order.append(update.update_id)

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(
            SQLiteUpdateStore(path), max_concurrent=4, sweep_every_seconds=60
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        flood = 2 * POLL_AHEAD
        flood_left["n"] = flood
        for i in range(flood):
            fake.inject_message(chat_id=flood_chat, text=f"flood {i}")
        for i in range(20):
            fake.inject_message(chat_id=100 + i, text=f"other {i}")
        async with polling(app):
            await wait_for("the other chats handled", lambda: len(others_done_with_flood_left) == 20,
                           timeout=60)
            await wait_for("the flood handled", lambda: len(order) == flood + 20, timeout=60)

    with FakeBotApi() as fake:
        run(scenario(fake), timeout=120)
    # the others were fetched past the flood's waiting updates and handled while most of the
    # flood still waited for its chat's turn (counted, the flood would have held them back
    # until fewer than POLL_AHEAD of it were left)
    assert max(others_done_with_flood_left) > POLL_AHEAD, others_done_with_flood_left


def test_a_stop_while_the_poller_waits_for_room_loses_nothing(tmp_path: Any) -> None:
    path = str(tmp_path / "updates.db")
    hang = asyncio.Event()  # never set: the first run's handlers hang until the stop ends them
    first: List[int] = []
    second: Dict[int, int] = {}

    async def hanging(update: Update, context: Any) -> None:
        first.append(update.update_id)
        await hang.wait()

    async def handling(update: Update, context: Any) -> None:
        second[update.update_id] = second.get(update.update_id, 0) + 1

    async def scenario(fake: FakeBotApi) -> List[int]:
        ids = [fake.inject_message(chat_id=1 + i, text=f"m{i}") for i in range(3 * POLL_AHEAD)]
        processor = FencedUpdateProcessor(
            SQLiteUpdateStore(path), max_concurrent=2, sweep_every_seconds=60,
            stop_timeout_seconds=0.5,
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, hanging))
        async with app:
            await app.start()
            assert app.updater is not None
            await app.updater.start_polling(poll_interval=0.0, timeout=1)
            await wait_for("the poller full", lambda: len(rows(path)) >= POLL_AHEAD)
            await asyncio.sleep(0.5)  # it waits for room now
            calls = len(fake.calls_to("getUpdates"))
            started = asyncio.get_running_loop().time()
            await app.updater.stop()  # the wait ends with the polling (cancelled)
            await app.stop()
            took = asyncio.get_running_loop().time() - started
        assert took < 5.0, took  # the stop_timeout (0.5 s) and the handlers' 1 s grace
        assert len(fake.calls_to("getUpdates")) <= calls + 1  # at most the confirming call
        fetched = len(rows(path))
        assert fetched < len(ids)  # the rest stayed at Telegram

        # a new process (here: a new Application on the same store) handles everything:
        # what was fetched from the store, the rest from Telegram
        processor = FencedUpdateProcessor(
            SQLiteUpdateStore(path), max_concurrent=8, lease_seconds=1.0,
            sweep_every_seconds=0.2, pending_grace_seconds=0.2,
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, handling))
        async with polling(app):
            await wait_for("every update handled", lambda: set(second) == set(ids),
                           timeout=60)
            await wait_for(
                "every update completed",
                lambda: all(state == "completed" for state, *_ in rows(path).values())
                and len(rows(path)) == len(ids),
                timeout=30,
            )
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake), timeout=120)
    assert sorted(second) == sorted(ids)
    assert set(second.values()) == {1}  # each once after the restart
    assert len(first) >= 2  # the first run did start handlers before its stop
