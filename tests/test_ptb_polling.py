"""Polling through a real PTB Application: record before confirm, ingest failures, duplicates.

The Application polls :class:`ptb_fence.testing.FakeBotApi` over HTTP. ``fake.on_confirm`` runs
in the server thread at the moment a ``getUpdates`` offset is about to confirm ids, and reads the
SQLite file with its own connection: every confirmed id must already have its row.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Any, List

from telegram import Update
from telegram.ext import MessageHandler, filters

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import DurableUpdateProcessor, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import FAST, FlakyStore, build, polling, recorded_ids, rows, run, wait_for


def _confirm_checker(path: str, violations: List[Any], confirmed: List[int]) -> Any:
    def on_confirm(ids: List[int]) -> None:
        confirmed.extend(ids)
        missing = set(ids) - recorded_ids(path, ids)
        if missing:
            violations.append(sorted(missing))

    return on_confirm


def test_every_update_is_handled_and_confirmed_only_after_it_is_recorded(tmp_path: Any) -> None:
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    handled: List[int] = []
    violations: List[Any] = []
    confirmed: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        assert context.attempt is not None and context.attempt.update_id == update.update_id
        handled.append(update.update_id)
        await asyncio.sleep(0.002)
        await update.message.reply_text(f"ok {update.message.text}")

    async def scenario(fake: FakeBotApi) -> List[int]:
        processor = FencedUpdateProcessor(store, max_concurrent=8, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        ids = [fake.inject_message(chat_id=1 + i % 5, text=f"a{i}") for i in range(15)]
        async with polling(app):
            await wait_for("the first batch", lambda: len(handled) >= 5)
            # more updates while polling (several getUpdates batches)
            for i in range(15):
                ids.append(fake.inject_message(chat_id=1 + i % 5, text=f"b{i}"))
                if i % 4 == 0:
                    await asyncio.sleep(0.02)
            await wait_for("all handled", lambda: set(handled) >= set(ids))
            await wait_for("all confirmed", lambda: fake.confirmed_update_ids >= set(ids))
        return ids

    with FakeBotApi() as fake:
        fake.on_confirm = _confirm_checker(path, violations, confirmed)
        ids = run(scenario(fake))
        assert fake.hook_errors == []
        assert len(fake.sent_messages) == len(ids)
    assert violations == [], f"confirmed before recorded: {violations}"
    assert set(confirmed) >= set(ids)
    assert Counter(handled) == Counter(ids)  # each exactly once
    table = rows(path)
    assert set(table) == set(ids)
    assert {r[0] for r in table.values()} == {"completed"}
    assert {r[1] for r in table.values()} == {1}
    store.close()


def test_store_failure_at_ingest_does_not_advance_the_offset(tmp_path: Any) -> None:
    path = str(tmp_path / "updates.db")
    store = FlakyStore(SQLiteUpdateStore(path))
    store.failing = True
    handled: List[int] = []
    violations: List[Any] = []
    confirmed: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        handled.append(update.update_id)

    async def scenario(fake: FakeBotApi) -> List[int]:
        processor = DurableUpdateProcessor(store, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.ALL, on_message))
        async with polling(app):
            ids = [fake.inject_message(chat_id=7, text=f"m{i}") for i in range(3)]
            # PTB retries the same offset (1 s, then 1.5 s later): wait for two refusals
            await wait_for("two failed ingests", lambda: len(set(store.failed_adds)) >= 1
                           and len(store.failed_adds) >= 2, timeout=8)
            assert not (fake.confirmed_update_ids & set(ids)), "confirmed while the store was down"
            assert set(fake.pending_update_ids) >= set(ids)
            assert handled == []
            assert recorded_ids(path, ids) == set()
            store.failing = False
            await wait_for("handled after recovery", lambda: set(handled) >= set(ids), timeout=8)
            await wait_for("confirmed after recovery",
                           lambda: fake.confirmed_update_ids >= set(ids), timeout=5)
        return ids

    with FakeBotApi() as fake:
        fake.on_confirm = _confirm_checker(path, violations, confirmed)
        ids = run(scenario(fake))
        assert fake.hook_errors == []
    assert violations == []
    assert Counter(handled) == Counter(ids)
    assert {r[0] for r in rows(path).values()} == {"completed"}


def test_refetched_batch_is_recorded_and_handled_once(tmp_path: Any) -> None:
    """The store refuses the 2nd update of a batch: the 1st is recorded, the offset stays, the
    batch is fetched again and the 1st is a duplicate (recorded and handled once)."""
    path = str(tmp_path / "updates.db")
    store = FlakyStore(SQLiteUpdateStore(path))
    handled: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        handled.append(update.update_id)

    async def scenario(fake: FakeBotApi) -> List[int]:
        processor = FencedUpdateProcessor(store, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.ALL, on_message))
        ids = [fake.inject_message(chat_id=10 + i, text=f"m{i}") for i in range(3)]
        store.fail_ids = {ids[1]}
        store.failing = True
        async with polling(app):
            await wait_for("the refused ingest", lambda: store.failed_adds, timeout=5)
            store.failing = False
            await wait_for("all handled", lambda: set(handled) >= set(ids), timeout=8)
            await wait_for("all confirmed", lambda: fake.confirmed_update_ids >= set(ids))
            await asyncio.sleep(0.3)  # a wrongly queued duplicate would be handled by now
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake))
    adds = Counter(uid for uid, added in store.adds if added)
    dups = Counter(uid for uid, added in store.adds if not added)
    assert adds[ids[0]] == 1 and dups[ids[0]] == 1, store.adds  # the re-fetch
    assert all(adds[uid] == 1 for uid in ids)
    assert Counter(handled)[ids[0]] == 1
    assert all(Counter(handled)[uid] == 1 for uid in ids)
    table = rows(path)
    assert all(table[uid][:2] == ("completed", 1) for uid in ids)


def test_store_failures_after_ingest_are_reported_and_left_to_the_sweep(tmp_path: Any) -> None:
    """claim and settle fail for a while: each failure is reported (on_store_error) and the
    updates are handled later by the sweep; none is lost or handled twice."""
    path = str(tmp_path / "updates.db")
    store = FlakyStore(SQLiteUpdateStore(path))
    store.broken = {"claim_owned", "settle_owned"}
    store.fail_ids = set()  # add keeps working
    steps: List[str] = []
    handled: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        handled.append(update.update_id)

    async def scenario(fake: FakeBotApi) -> List[int]:
        processor = FencedUpdateProcessor(
            store, on_store_error=lambda error, step: steps.append(step), **FAST
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with polling(app):
            store.failing = True
            ids = [fake.inject_message(chat_id=1 + i, text="x") for i in range(3)]
            await wait_for("claims refused", lambda: steps.count("claim") >= 3)
            assert handled == []
            store.failing = False
            await wait_for("handled after recovery",
                           lambda: {r[0] for r in rows(path).values()} == {"completed"}
                           and len(rows(path)) == 3, timeout=8)
            # settle fails: the attempt ran, its lease lapses, the sweep runs it again
            store.broken = {"settle_owned"}
            store.failing = True
            ids.append(fake.inject_message(chat_id=9, text="x"))
            await wait_for("settle refused", lambda: "settle" in steps)
            store.failing = False
            await wait_for("completed on the second attempt",
                           lambda: rows(path).get(ids[-1], ("",))[0] == "completed", timeout=8)
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake))
        assert fake.confirmed_update_ids >= set(ids)
    assert Counter(handled) == Counter(ids[:3] + ids[3:] * 2)  # at least once
    assert rows(path)[ids[3]][:2] == ("completed", 2)
