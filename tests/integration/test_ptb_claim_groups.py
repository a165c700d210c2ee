"""Grouped claims under polling, with claim-at-ingest bounded: the updates of a polled
``getUpdates`` batch that were recorded pending (past the claim budget) are claimed several per
commit as they start (a ``commit`` of claims), not one commit each, and the bound holds: a process
never holds more than ``max_concurrent + ingest_claim_buffer`` claims.

A real PTB Application polls :class:`ptb_fence.testing.FakeBotApi`; the store is a real
SQLiteUpdateStore behind a wrapper that counts the calls of its methods (each write method is
one transaction, one commit, in the shipped SQL stores). Nothing inside ptb_fence is patched.
Before the change: one ``claim_owned`` commit per update recorded pending (about 90 here).
"""

from __future__ import annotations

import sqlite3
from typing import Any, List

from telegram import Update
from telegram.ext import MessageHandler, filters

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from counting_store import CountingStore
from ptb_support import build, polling, rows, run, wait_for

CLAIMS = ("claim", "claim_owned", "commit_claims", "commit_settle_claim")
MAX_CONCURRENT = 8
BOUND = MAX_CONCURRENT + 8  # the default ingest_claim_buffer


def _processing(path: str) -> int:
    conn = sqlite3.connect(path, timeout=10)
    try:
        return int(
            conn.execute("SELECT count(*) FROM telegram_updates WHERE state = 'processing'")
            .fetchone()[0]
        )
    finally:
        conn.close()


def test_updates_recorded_pending_are_claimed_several_per_commit_within_the_bound(
    tmp_path: Any,
) -> None:
    path = str(tmp_path / "updates.db")
    store = CountingStore(SQLiteUpdateStore(path))
    handled: List[int] = []
    peak: List[int] = [0]

    async def on_message(update: Update, context: Any) -> None:
        handled.append(update.update_id)
        peak[0] = max(peak[0], _processing(path))  # the claims held right now

    async def scenario(fake: FakeBotApi) -> List[int]:
        processor = FencedUpdateProcessor(
            store, max_concurrent=MAX_CONCURRENT, sweep_every_seconds=60
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        # one getUpdates answer of 100 (FakeBotApi's page), from 50 chats
        ids = [fake.inject_message(chat_id=1 + i % 50, text=f"m{i}") for i in range(100)]
        async with polling(app):
            await wait_for("the batch handled", lambda: len(set(handled)) >= 100, timeout=60)
            await wait_for(
                "the batch completed",
                lambda: all(rows(path).get(u, ("",))[0] == "completed" for u in ids),
                timeout=30,
            )
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake), timeout=90)
    assert sorted(handled) == sorted(ids)  # each once
    claimed_at_ingest = store.calls["commit_claimed"]
    claims = sum(store.calls[name] for name in CLAIMS)
    assert claimed_at_ingest >= 1, dict(store.calls)
    # at most 8 claimed at ingest; the ~92 others in groups (12 commits measured; 92 before)
    assert claims <= 25, dict(store.calls)
    assert store.calls["commit_claims"] + store.calls["commit_settle_claim"] >= 1, dict(
        store.calls
    )
    assert peak[0] <= BOUND, peak[0]
    assert all(state == "completed" for state, *_ in rows(path).values())
