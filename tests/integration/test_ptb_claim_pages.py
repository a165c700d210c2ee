"""Bounded claims without claim commits of their own, under polling, on real SQLite and
PostgreSQL: the updates of polled ``getUpdates`` batches that were recorded pending (past the
claim budget) are claimed in pages, each in the commit that completes the attempts whose slots
they take (one ``commit`` that settles and claims), and the store never holds more than
``max_concurrent + ingest_claim_buffer`` claims of the process at any commit.

A real PTB Application polls :class:`ptb_fence.testing.FakeBotApi`. The store is real, behind a
wrapper that tallies the claims it holds in commit order (the calls that grant or end claims
run one at a time, so the tally is the store's own count after each commit). Nothing inside
ptb_fence is patched. Before: one commit per group of claims plus one per group of
completions (about 150 commits for these 1,000 updates instead of 45), and up to 48 claims held
at once: claims at ingest took attempts whose completion was still in the store for running
handlers and added ``ingest_claim_buffer`` more.
"""

from __future__ import annotations

from typing import Any, List

import pytest
from telegram import Update
from telegram.ext import MessageHandler, filters

from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from counting_store import ClaimTallyStore
from ptb_support import build, polling, run, wait_for

MAX_CONCURRENT = 32
BOUND = MAX_CONCURRENT + 8  # the default ingest_claim_buffer
UPDATES = 1000  # ten getUpdates answers of 100 (FakeBotApi's page)
COMMITS = (  # each one commit in the shipped SQL stores
    "commit_records", "commit_claimed", "commit_claimed_settle", "claim_owned",
    "commit_claims", "settle_owned", "commit_settle", "commit_settle_claim",
)


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_pending_updates_are_claimed_in_pages_with_the_completions_within_the_bound(
    store: Any,
) -> None:
    tally = ClaimTallyStore(store)
    handled: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        handled.append(update.update_id)

    async def scenario(fake: FakeBotApi) -> List[int]:
        processor = FencedUpdateProcessor(
            tally, max_concurrent=MAX_CONCURRENT, sweep_every_seconds=60
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        ids = [fake.inject_message(chat_id=1 + i % 200, text=f"m{i}") for i in range(UPDATES)]
        async with polling(app):
            await wait_for("every update handled", lambda: len(handled) >= UPDATES, timeout=90)
            await wait_for("every claim settled", lambda: tally.held == 0, timeout=30)
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake), timeout=150)
    assert sorted(handled) == sorted(ids)  # each once
    calls = dict(tally.calls)
    # the bound holds at every commit (the crash of this process strands at most that many)
    assert 0 < tally.peak <= BOUND, (tally.peak, calls)
    # the updates recorded pending were claimed with the completions, several per commit
    pages = [n for name, n in tally.claimed_per_call if name == "commit_settle_claim" and n]
    assert pages, calls
    claimed = sum(n for _, n in tally.claimed_per_call)
    assert claimed == UPDATES, (claimed, calls)
    assert max(pages) > 1, pages
    assert calls.get("claim_owned", 0) + calls.get("commit_claims", 0) <= len(pages), calls
    # the claims cost no commits of their own: 10 recording batches, 2-3 claims at ingest,
    # 31 pages with the completions and 1 last completion measured (44-45); before, about 70
    # commits of claims and as many of completions
    commits = sum(calls.get(name, 0) for name in COMMITS)
    assert commits <= UPDATES * 8 // 100, calls
