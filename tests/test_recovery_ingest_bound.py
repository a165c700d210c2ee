"""Issue 12 item 3: claim-at-ingest is bounded by ``max_concurrent + ingest_claim_buffer``.

A 2,000-update backlog waits at a FakeBotApi; real PTB bot processes (tests/ptb_bot_worker.py)
with ``max_concurrent=4`` and the default buffer (8) work it off. Sampled all along, the rows
in ``processing`` (the claims held) never exceed 4 + 8 per process; the rest waits
``pending``, so a second process sharing the PostgreSQL table handles part of it.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List

import pytest

from ptb_fence.testing import FakeBotApi
from test_ptb_processes import Bots
from recovery_support import Bed, _exactly_once, bed, bots  # noqa: F401

BACKLOG = 2000
BOUND = 4 + 8
"""``max_concurrent`` + the default ``ingest_claim_buffer``."""


def _work_off(bots: Bots, bed: Bed, ids: List[int], procs: List[Any], deadline: float) -> int:
    """Sample until every update completed; returns the most rows ever in ``processing``."""
    peak = 0
    while True:
        states: Dict[int, str] = bed.states()
        peak = max(peak, sum(1 for s in states.values() if s == "processing"))
        if len(states) >= len(ids) and all(states.get(u) == "completed" for u in ids):
            return peak
        for proc in procs:
            assert proc.poll() is None, bots.output()
        assert time.monotonic() < deadline, (
            f"{sum(s == 'completed' for s in states.values())} of {len(ids)} completed\n"
            f"{bots.output()}"
        )
        time.sleep(0.02)


def test_one_process_never_holds_more_than_the_bound(bots: Bots, bed: Bed) -> None:
    if "sqlite" not in bed.url:
        pytest.skip("the PostgreSQL case is the two-process test below")
    with FakeBotApi() as fake:
        ids = [fake.inject_message(chat_id=1 + i % 50, text=f"m{i}") for i in range(BACKLOG)]
        proc = bots.spawn(fake, bed.url, bed.table, bed.domain, "--poll", "--max-concurrent", "4",
                          "--lease", "120", "--max-life", "300")
        bots.wait_ready(proc)
        peak = _work_off(bots, bed, ids, [proc], time.monotonic() + 240)
        bots.stop_all()
    assert peak <= BOUND, peak
    _exactly_once(bed, ids)


def test_two_processes_share_a_backlog(bots: Bots, bed: Bed) -> None:
    if "sqlite" in bed.url:
        pytest.skip("two processes sharing PostgreSQL")
    short = ("--max-concurrent", "4", "--lease", "120", "--grace", "0.2", "--sweep", "0.2",
             "--max-life", "300")
    with FakeBotApi() as fake:
        ids = [fake.inject_message(chat_id=1 + i % 50, text=f"m{i}") for i in range(BACKLOG)]
        poller = bots.spawn(fake, bed.url, bed.table, bed.domain, "--poll", *short)
        worker = bots.spawn(fake, bed.url, bed.table, bed.domain, *short)
        bots.wait_ready(poller, worker)
        peak = _work_off(bots, bed, ids, [poller, worker], time.monotonic() + 240)
        bots.stop_all()
    assert peak <= 2 * BOUND, peak
    written = _exactly_once(bed, ids)
    by_pid: Dict[int, int] = {}
    for rows in written.values():
        by_pid[rows[0][3]] = by_pid.get(rows[0][3], 0) + 1
    assert set(by_pid) == {poller.pid, worker.pid}, by_pid
    assert min(by_pid.values()) >= BACKLOG // 20, by_pid  # both took a real share
