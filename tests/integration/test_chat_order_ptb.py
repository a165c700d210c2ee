"""``strict_chat_order`` in one process, through a real PTB Application (FakeBotApi as
Telegram, polling), FencedUpdateProcessor and DurableUpdateProcessor, SQLite and PostgreSQL.

One chat, updates 1, 2, 3; the first fails once (retry 0.2 s): with strict order the handler
runs them 1, 1, 2, 3, and another chat (two updates) finishes while the first chat waits for
its retry (no head-of-line blocking).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, List, Tuple

import pytest
from telegram import Update
from telegram.ext import MessageHandler, filters

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import DurableUpdateProcessor, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi

from ptb_support import FAST, build, polling, run, wait_for

CHAT_A = 100
CHAT_B = 200


def scenario(store: Any, processor_class: Any, strict: bool) -> Tuple[List[Any], List[int]]:
    events: List[Tuple[int, int, str, float]] = []
    failed: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        chat = update.effective_chat.id
        events.append((update.update_id, chat, "start", time.monotonic()))
        await asyncio.sleep(0.05)
        if chat == CHAT_A and not failed:
            failed.append(update.update_id)
            events.append((update.update_id, chat, "fail", time.monotonic()))
            raise RuntimeError("first attempt fails")
        events.append((update.update_id, chat, "ok", time.monotonic()))

    async def main(fake: FakeBotApi) -> List[int]:
        processor = processor_class(
            store,
            strict_chat_order=strict,
            retry=lambda error, attempt: 0.2,
            max_concurrent=4,
            **FAST,
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        ids = [fake.inject_message(chat_id=CHAT_A, text=f"a{n}") for n in range(3)]
        ids += [fake.inject_message(chat_id=CHAT_B, text=f"b{n}") for n in range(2)]
        async with polling(app):
            await wait_for(
                "every update handled", lambda: len([e for e in events if e[2] == "ok"]) >= 5,
                timeout=20,
            )
            await asyncio.sleep(0.3)  # nothing runs again
        return ids

    with FakeBotApi() as fake:
        ids = run(main(fake), timeout=40)
    return events, ids


def starts(events: List[Any], chat: int) -> List[int]:
    return [u for u, c, what, _ in events if c == chat and what == "start"]


def at(events: List[Any], update_id: int, what: str, nth: int = 0) -> float:
    return [t for u, _, w, t in events if u == update_id and w == what][nth]


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("processor_class", [FencedUpdateProcessor, DurableUpdateProcessor])
def test_fail_once_keeps_the_chat_in_order(store: Any, processor_class: Any) -> None:
    events, ids = scenario(store, processor_class, True)
    a1, a2, a3, b1, b2 = ids
    assert starts(events, CHAT_A) == [a1, a1, a2, a3], events
    assert starts(events, CHAT_B) == [b1, b2], events
    assert at(events, a2, "start") >= at(events, a1, "ok")
    # the other chat was not held up by chat A's retry
    assert at(events, b2, "ok") < at(events, a1, "start", 1), events


def test_without_strict_order_the_retry_runs_after_later_updates(tmp_path: Path) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "plain.sqlite3"))
    try:
        events, ids = scenario(store, FencedUpdateProcessor, False)
    finally:
        store.close()
    a1, a2, a3, _, _ = ids
    assert starts(events, CHAT_A) == [a1, a2, a3, a1], events
