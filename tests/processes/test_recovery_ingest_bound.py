"""Claim-at-ingest is bounded by ``max_concurrent + ingest_claim_buffer``.

A 2,000-update backlog waits at a FakeBotApi; real PTB bot processes
(tests/processes/ptb_bot_worker.py) with ``max_concurrent=4`` and the default buffer (8) work it
off. Sampled all along, the rows in ``processing`` (the claims held) never exceed 4 + 8 per process;
the rest waits ``pending``, so a second process sharing the PostgreSQL table handles part of it.

The same bound per process when the backlog is already in the store (an outage: 2,000 rows
``pending``) and two processes take it by sweeps: each claim records its instance, so the
claims of each process are counted apart. Written against behaviour (rows in ``processing``
per instance), whatever pages the claims are taken in. Every test runs with both front ends
(PTB and ``UpdateIntake``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional

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
    if bots.worker.endswith("intake_worker.py"):
        pytest.skip("UpdateIntake claims nothing at ingest and records one update per accept(): "
                    "its 4 workers keep up with its poller, so no backlog forms to share "
                    "(sharing a recorded backlog is the test below)")
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


def _instances(bots: Bots, procs: List[Any]) -> Dict[str, int]:
    """``{instance: pid}`` from the ``instance.<pid>`` files the workers write."""
    owners = {}
    for proc in procs:
        with open(os.path.join(bots.dir, f"instance.{proc.pid}"), encoding="utf-8") as file:
            owners[file.read().strip()] = proc.pid
    return owners


def test_two_processes_share_a_recorded_backlog_each_within_the_bound(bots: Bots, bed: Bed) -> None:
    ids = bed.record_pending(BACKLOG, chats=50)
    short = ("--max-concurrent", "4", "--lease", "120", "--grace", "0.2", "--sweep", "0.2",
             "--max-life", "300")
    with FakeBotApi() as fake:
        first = bots.spawn(fake, bed.url, bed.table, bed.domain, *short)
        second = bots.spawn(fake, bed.url, bed.table, bed.domain, *short)
        peaks: Dict[Optional[str], int] = {}
        deadline = time.monotonic() + 240
        while True:
            for instance, held in bed.claims().items():
                peaks[instance] = max(peaks.get(instance, 0), held)
            states = bed.states()
            if all(states.get(u) == "completed" for u in ids):
                break
            for proc in (first, second):
                assert proc.poll() is None, bots.output()
            assert time.monotonic() < deadline, (
                f"{sum(s == 'completed' for s in states.values())} of {len(ids)} completed\n"
                f"{bots.output()}"
            )
            time.sleep(0.02)
        owners = _instances(bots, [first, second])
        bots.stop_all()
    assert set(peaks) <= set(owners), peaks  # every claim names a live instance
    assert all(peak <= BOUND for peak in peaks.values()), {owners[i]: p for i, p in peaks.items()}
    written = _exactly_once(bed, ids)
    by_pid: Dict[int, int] = {}
    for rows in written.values():
        by_pid[rows[0][3]] = by_pid.get(rows[0][3], 0) + 1
    assert set(by_pid) == {first.pid, second.pid}, by_pid
    assert min(by_pid.values()) >= BACKLOG // 20, by_pid  # both took a real share
