"""Polling through a real PTB Application: record before confirm, ingest failures, duplicates.

The Application polls :class:`ptb_fence.testing.FakeBotApi` over HTTP. ``fake.on_confirm`` runs
in the server thread at the moment a ``getUpdates`` offset is about to confirm ids, and reads the
SQLite file with its own connection: every confirmed id must already have its row.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any, List

from telegram import Update
from telegram.ext import MessageHandler, filters

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import DurableUpdateProcessor, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi, make_message_update
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
    # recorded once; the re-fetch is a duplicate unless the whole batch was refused at once
    assert dups[ids[0]] <= 1, store.adds
    assert all(adds[uid] == 1 for uid in ids), store.adds
    assert Counter(handled)[ids[0]] == 1
    assert all(Counter(handled)[uid] == 1 for uid in ids)
    table = rows(path)
    assert all(table[uid][:2] == ("completed", 1) for uid in ids)


_CLAIMS = {"claim", "claim_owned", "commit_claims", "commit_settle_claim"}
_SETTLES = {"settle", "settle_owned", "commit_settle", "commit_settle_claim"}


def test_store_failures_after_ingest_are_reported_and_left_to_the_sweep(tmp_path: Any) -> None:
    """Claims fail for a while (rows left from an earlier run), then settles fail (a fresh
    update): each failure is reported (on_store_error) and the sweep finishes the work;
    nothing is lost, and only the update whose settle failed runs twice."""
    path = str(tmp_path / "updates.db")
    store = FlakyStore(SQLiteUpdateStore(path))
    store.fail_ids = set()  # recording keeps working
    old = [1, 2, 3]
    for uid in old:
        store.inner.add(uid, json.dumps(make_message_update(uid, chat_id=uid, text="old")), 0)
    steps: List[str] = []
    handled: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        handled.append(update.update_id)

    def completed(ids: List[int]) -> bool:
        table = rows(path)
        return all(table.get(u, ("",))[0] == "completed" for u in ids)

    async def scenario(fake: FakeBotApi) -> int:
        processor = FencedUpdateProcessor(
            store, on_store_error=lambda error, step: steps.append(step), **FAST
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        store.broken = set(_CLAIMS)
        store.failing = True
        async with polling(app):
            await wait_for("claims refused", lambda: steps.count("claim") >= 3)
            assert handled == []
            store.failing = False
            await wait_for("the old rows handled after recovery", lambda: completed(old), timeout=8)
            # settle fails: the attempt ran, its lease lapses, the sweep runs it again
            store.broken = set(_SETTLES)
            store.failing = True
            fresh = fake.inject_message(chat_id=9, text="x")
            await wait_for("settle refused", lambda: "settle" in steps)
            store.failing = False
            await wait_for("completed on the second attempt", lambda: completed([fresh]), timeout=8)
        return fresh

    with FakeBotApi() as fake:
        fresh = run(scenario(fake))
    assert Counter(handled) == Counter(old + [fresh, fresh])  # at least once
    assert rows(path)[fresh][:2] == ("completed", 2)


def test_unconfirmed_batch_fetched_again_after_restart_is_not_handled_again(tmp_path: Any) -> None:
    """The bot handles a batch but dies before the getUpdates that confirms it (here: every
    confirmation fails). The next bot on the same store fetches the batch again: the updates
    are duplicates, recorded once and not handled again."""
    path = str(tmp_path / "updates.db")
    store = FlakyStore(SQLiteUpdateStore(path))
    handled: List[Any] = []

    def refuse(ids: List[int]) -> None:
        raise ConnectionError("confirmation lost")

    async def scenario(fake: FakeBotApi) -> List[int]:
        ids: List[int] = []
        for run_number in (1, 2):
            async def on_message(update: Update, context: Any, run_number: int = run_number) -> None:
                handled.append((run_number, update.update_id))

            processor = FencedUpdateProcessor(store, **FAST)
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.TEXT, on_message))
            async with polling(app):
                if run_number == 1:
                    fake.on_confirm = refuse
                    ids = [fake.inject_message(chat_id=1 + i, text="x") for i in range(3)]
                    await wait_for("handled", lambda: len(handled) == 3)
                    await wait_for("settled",
                                   lambda: {r[0] for r in rows(path).values()} == {"completed"})
                    await wait_for("a refused confirmation", lambda: fake.hook_errors)
                    assert set(fake.pending_update_ids) == set(ids)
                else:
                    await wait_for("confirmed by the second bot",
                                   lambda: fake.confirmed_update_ids >= set(ids), timeout=8)
                    await asyncio.sleep(0.3)
            fake.on_confirm = None
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake))
    assert sorted(handled) == [(1, uid) for uid in ids]
    assert Counter(uid for uid, added in store.adds if added) == Counter(ids)
    assert Counter(uid for uid, added in store.adds if not added) == Counter(ids)
    assert {uid: rows(path)[uid][:2] for uid in ids} == {uid: ("completed", 1) for uid in ids}


def test_a_store_that_outlives_its_fake_bot_api_handles_the_next_ones_messages(
    tmp_path: Any,
) -> None:
    """A bot whose SQLite file outlives a FakeBotApi (a script run twice, each run with a new
    fake server) handles the second run's message. Each run's fake numbers messages from 1 in
    chat 1, so with update ids that restarted too the second run's ``/book 12:00`` would have
    the first run's update id and fingerprint and be dropped as a redelivery."""
    path = str(tmp_path / "kept.db")
    handled: List[str] = []

    async def one_run(slot: str) -> None:
        store = SQLiteUpdateStore(path)
        try:
            with FakeBotApi() as fake:
                processor = FencedUpdateProcessor(store, **FAST)
                app = build(processor, fake)

                async def on_message(update: Update, context: Any) -> None:
                    handled.append(update.message.text)

                app.add_handler(MessageHandler(filters.TEXT, on_message))
                async with polling(app):
                    update_id = fake.inject_message(chat_id=1, text=f"/book {slot}")
                    await wait_for(f"/book {slot} handled or dropped",
                                   lambda: f"/book {slot}" in handled
                                   or update_id in fake.confirmed_update_ids, 10)
                    await asyncio.sleep(0.3)  # a dropped one is confirmed and never handled
        finally:
            store.close()

    run(one_run("10:00"))
    run(one_run("12:00"))
    assert handled == ["/book 10:00", "/book 12:00"], rows(path)
