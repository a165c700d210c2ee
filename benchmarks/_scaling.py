"""Scaling figures: lease renewal with many active attempts, and a large backlog after a restart."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

from telegram import Update
from telegram.ext import Application, TypeHandler

from ptb_fence import PostgresUpdateStore, RuntimeOptions, SQLiteUpdateStore
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.runtime._runtime import Runtime
from ptb_fence.testing import FakeBotApi

from _common import (
    CompletionTracker,
    CountingStore,
    DriverCounter,
    create_domain_table,
    current_rss_kb,
    domain_write,
    drop_tables,
    median,
    update_dicts,
)

_RENEWAL_METHODS = ("renew", "renew_many", "renew_owned", "renew_owned_many")


def _new_store(cfg: Dict[str, Any], tag: str) -> Tuple[Any, Optional[str], Optional[str]]:
    """A fresh raw store: (store, sqlite path or None, pg table or None)."""
    suffix = uuid.uuid4().hex[:12]
    if cfg["store"] == "sqlite":
        path = os.path.join(cfg["workdir"], f"{tag}-{suffix}.sqlite3")
        return SQLiteUpdateStore(path), path, None
    table = f"bench_{tag}_{suffix}"
    store = PostgresUpdateStore(cfg["dsn"], table)
    store.due(now=0, pending_before=0, limit=1)  # create the table now
    return store, None, table


def _drop(cfg: Dict[str, Any], path: Optional[str], table: Optional[str]) -> None:
    if path:
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.unlink(path + suffix)
            except FileNotFoundError:
                pass
    if table:
        drop_tables(cfg["dsn"], table)


def _record(store: Any, count: int, first_id: int = 1) -> None:
    """Record ``count`` updates with ``add_many`` (1,000 per call), generated chunk by chunk."""
    now = int(time.time() * 1000)
    for start in range(0, count, 1000):
        batch = update_dicts(min(1000, count - start), first_id + start)
        store.add_many([(d["update_id"], json.dumps(d), now) for d in batch])


def measure_lease(cfg: Dict[str, Any], counter: DriverCounter) -> Dict[str, Any]:
    """``keeper.tick()`` with 1, 100 and 5,000 active attempts registered by ``Runtime.claim``."""
    results: List[Dict[str, Any]] = []
    for active in cfg["lease_sizes"]:
        raw, path, table = _new_store(cfg, "lease")
        try:
            _record(raw, active)
            store = CountingStore(raw)
            runtime = Runtime(
                store, RuntimeOptions(), attempt_aware=True, handle_exhaustion=False,
                component="benchmark",
            )
            # Runtime.claim registers each attempt with the lease keeper, as the processors do;
            # claims run on a few threads so that 5,000 of them take seconds, not minutes
            with ThreadPoolExecutor(max_workers=8) as pool:
                claimed = list(pool.map(runtime.claim, range(1, active + 1)))
            attempts = [a for a in claimed if a is not None]
            missed = [i + 1 for i, a in enumerate(claimed) if a is None]
            for _ in range(3):  # a transient store error (reported on stderr): claim again
                if not missed:
                    break
                time.sleep(0.5)
                again = [(uid, runtime.claim(uid)) for uid in missed]
                attempts += [a for _, a in again if a is not None]
                missed = [uid for uid, a in again if a is None]
            if len(attempts) != active:
                raise RuntimeError(f"claimed only {len(attempts)} of {active} updates")
            if len(runtime.keeper.active()) != active:
                raise RuntimeError("the lease keeper does not hold every claimed attempt")
            keeper = runtime.keeper
            ticks = int(cfg.get("lease_ticks", 5))
            durations: List[float] = []
            calls_per_tick: List[int] = []
            renewal_calls: List[int] = []
            statements: List[int] = []
            commits: List[int] = []
            for _ in range(ticks):
                store.reset_calls()
                counter.reset()
                t0 = time.perf_counter()
                keeper.tick()
                durations.append((time.perf_counter() - t0) * 1000.0)
                calls = store.calls()
                calls_per_tick.append(sum(calls.values()))
                renewal_calls.append(sum(calls.get(m, 0) for m in _RENEWAL_METHODS))
                snap = counter.snapshot()
                statements.append(snap["statements"])
                commits.append(snap["commits"])
            lost = sum(1 for a in attempts if a.owner_lost.is_set())
            for attempt in attempts:
                runtime.end(attempt)
            results.append(
                {
                    "active": active,
                    "ticks": ticks,
                    "store_calls_per_tick": max(calls_per_tick),
                    "renewal_calls_per_tick": max(renewal_calls),
                    "statements_per_tick": max(statements) if counter.installed else None,
                    "commits_per_tick": max(commits) if counter.installed else None,
                    "tick_ms_median": median(durations),
                    "tick_ms_max": max(durations),
                    "owner_lost": lost,
                    "methods": sorted(store.calls()),
                }
            )
        finally:
            raw.close()
            _drop(cfg, path, table)
    return {"lease": results}


class _RssSampler(threading.Thread):
    def __init__(self, tracker: CompletionTracker, interval: float = 0.1) -> None:
        super().__init__(daemon=True, name="bench-rss")
        self.tracker = tracker
        self.interval = interval
        self.samples: List[Tuple[float, int, int]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        start = time.perf_counter()
        while not self.stop_event.is_set():
            self.samples.append((time.perf_counter() - start, current_rss_kb(), self.tracker.count))
            self.stop_event.wait(self.interval)


async def _backlog_async(
    cfg: Dict[str, Any], raw: Any, count: int, counter: DriverCounter, domain: Optional[str] = None
) -> Dict[str, Any]:
    tracker = CompletionTracker(keep_times=False)
    store = CountingStore(raw, tracker)
    handled = [0]

    async def noop(update: Update, context: Any) -> None:
        handled[0] += 1

    if domain is not None:  # backlog-write: the fenced write, completed in its own commit
        write = domain_write(cfg["store"], domain)

        async def fenced_write(update: Update, context: Any) -> None:
            await context.attempt.run_in_transaction(write(context.attempt), complete=True)
            tracker.mark(update.update_id)
            handled[0] += 1

    with FakeBotApi() as fake:
        processor = FencedUpdateProcessor(store)  # library defaults: max_concurrent=32
        builder = Application.builder().token(fake.token).base_url(fake.base_url)
        app = processor.install(builder).build()
        app.add_handler(TypeHandler(Update, noop if domain is None else fenced_write))
        gc.collect()
        rss_start = current_rss_kb()
        sampler = _RssSampler(tracker)
        counter.reset()
        sampler.start()
        t0 = time.perf_counter()
        try:
            await app.initialize()
            await app.start()  # the first sweep hands the recorded rows over, page by page
            ok = await tracker.wait(count, float(cfg.get("timeout", 600)))
            t1 = time.perf_counter()
        finally:
            sampler.stop_event.set()
            sampler.join()
            if app.running:
                await app.stop()
            await app.shutdown()
    if not ok:
        raise RuntimeError(
            f"backlog: only {tracker.count}/{count} completed ({handled[0]} handled) in time"
        )
    samples = sampler.samples
    peak = max(s[1] for s in samples)
    early = next((s[1] for s in samples if s[2] >= count * 0.05), samples[-1][1])
    by_progress = {}
    for fraction in (0.05, 0.25, 0.5, 0.75, 1.0):
        want = count * fraction
        rss = next((s[1] for s in samples if s[2] >= want), samples[-1][1])
        by_progress[str(fraction)] = rss
    calls = store.calls()
    snap = counter.snapshot()
    return {
        "updates": count,
        "seconds": t1 - t0,
        "rate": count / (t1 - t0),
        "handled": handled[0],
        "rss_start_kb": rss_start,
        "rss_peak_kb": peak,
        "rss_delta_kb": peak - rss_start,
        "rss_at_5pct_kb": early,
        "rss_growth_after_5pct_kb": peak - early,
        "rss_by_progress_kb": by_progress,
        "store_calls_per_update": {k: v / count for k, v in sorted(calls.items())},
        "statements_per_update": snap["statements"] / count if counter.installed else None,
        "commits_per_update": snap["commits"] / count if counter.installed else None,
    }


def measure_backlog(cfg: Dict[str, Any], counter: DriverCounter) -> Dict[str, Any]:
    """Record ``backlog`` updates with ``add_many``, then start a FencedUpdateProcessor app
    over the store (no polling) and time until every row is completed; sample RSS."""
    count = int(cfg["backlog"])
    raw, path, table = _new_store(cfg, "backlog")
    domain = None
    if cfg["kind"] == "backlog-write":
        domain = f"bench_domain_{uuid.uuid4().hex[:12]}"
        create_domain_table(cfg["store"], domain, path=path or "", dsn=cfg.get("dsn") or "")
    try:
        t0 = time.perf_counter()
        _record(raw, count)
        record_seconds = time.perf_counter() - t0
        result = asyncio.run(_backlog_async(cfg, raw, count, counter, domain))
        result["record_seconds"] = record_seconds
        return {"backlog": result}
    finally:
        raw.close()
        _drop(cfg, path, table)
        if domain is not None and table is not None:
            drop_tables(cfg["dsn"], domain)
