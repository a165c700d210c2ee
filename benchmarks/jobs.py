"""Durable jobs under load (issue 37, item 8): one-off jobs due over a window, run by PTB.

A real PTB Application with ``FencedUpdateProcessor(store, durable_jobs=True)`` talks to an
in-process ``testing.FakeBotApi`` (only ``getMe``). Before it starts, the bot schedules
``--jobs`` one-off jobs with ``app.job_queue.run_once``, due uniformly over ``--window``
seconds. Each run's callback writes one fenced row and completes the run. Usage::

    python benchmarks/jobs.py --store sqlite                  # 10,000 jobs over 60 s
    python benchmarks/jobs.py --store pg --jobs 2000 --window 10
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dtm
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (HERE, ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)

FULL = {"jobs": 10_000, "window": 60.0}
QUICK = {"jobs": 1_000, "window": 10.0}
SWEEP_SECONDS = 1.0
"""The processor's ``sweep_every_seconds``. The job pump looks every min(1, sweep) seconds."""
PROBE = 100
"""Jobs scheduled far ahead and cancelled, to time scheduling before the window is placed."""


class _Runs:
    """What the callbacks saw: starts, ends and lateness per job, from the event loop."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.starts: Counter[int] = Counter()
        self.attempts: Counter[int] = Counter()
        self.lateness_ms: List[float] = []
        self.first_start: Optional[float] = None
        self.last_end: Optional[float] = None
        self.cpu_first: Optional[float] = None
        self.cpu_last: Optional[float] = None
        self.ended = 0
        self.done: Optional[asyncio.Event] = None
        self.write: Any = None
        self.counter: Any = None
        self.at_done: Optional[Dict[str, int]] = None


RUNS: Optional[_Runs] = None
"""The measured run of this process. The callback is module-level, so it finds it here."""


async def job_ran(context: Any) -> None:
    """A job's run: its lateness, then one fenced write that completes the run."""
    runs = RUNS
    assert runs is not None and runs.done is not None
    now = time.perf_counter()
    lateness = time.time() * 1000 - float(context.job.data["due"])
    tag = int(context.job.data["tag"])
    if runs.first_start is None:
        runs.first_start, runs.cpu_first = now, time.process_time()
    runs.starts[tag] += 1
    runs.attempts[context.attempt.attempt] += 1
    runs.lateness_ms.append(lateness)
    await context.attempt.run_in_transaction(runs.write(tag, context.attempt), complete=True)
    runs.ended += 1
    if runs.ended >= runs.expected:
        runs.last_end, runs.cpu_last = time.perf_counter(), time.process_time()
        runs.at_done = runs.counter.snapshot()
        runs.done.set()


# -- the store and its domain table -----------------------------------------------------------
def _make_store(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """The store, its domain table and the write each run makes (harness connections only)."""
    from _common import pg_connect, sqlite_connect

    from ptb_fence import MemoryUpdateStore, PostgresUpdateStore, SQLiteUpdateStore

    kind = cfg["store"]
    suffix = uuid.uuid4().hex[:10]
    if kind == "memory":
        return {"store": MemoryUpdateStore(), "domain": None, "write": lambda tag, attempt: _none}
    if kind == "sqlite":
        path = os.path.join(cfg["workdir"], f"jobs-{suffix}.sqlite3")
        store: Any = SQLiteUpdateStore(path)
        conn = sqlite_connect(path)
        try:
            conn.execute("CREATE TABLE bench_ran (tag INTEGER NOT NULL, run_id INTEGER NOT NULL, "
                         "attempt INTEGER NOT NULL, claim_id TEXT NOT NULL)")
        finally:
            conn.close()
        insert = "INSERT INTO bench_ran VALUES (?, ?, ?, ?)"

        def write_sqlite(tag: int, attempt: Any) -> Any:
            def write(conn: Any) -> None:
                conn.execute(insert, (tag, attempt.update_id, attempt.attempt, attempt.claim_id))

            return write

        return {"store": store, "domain": ("sqlite", path, "bench_ran"), "write": write_sqlite}
    table = f"bench_jobs_{suffix}"
    domain = f"{table}_ran"
    conn = pg_connect(cfg["dsn"])
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE TABLE "{domain}" (tag INT NOT NULL, run_id BIGINT NOT NULL, '
                        "attempt INT NOT NULL, claim_id TEXT NOT NULL)")
    finally:
        conn.close()
    store = PostgresUpdateStore(cfg["dsn"], table)
    insert = f'INSERT INTO "{domain}" VALUES (%s, %s, %s, %s)'

    def write_pg(tag: int, attempt: Any) -> Any:
        def write(conn: Any) -> None:
            with conn.cursor() as cur:
                cur.execute(insert, (tag, attempt.update_id, attempt.attempt, attempt.claim_id))

        return write

    return {"store": store, "domain": ("pg", cfg["dsn"], domain), "write": write_pg,
            "table": table}


def _none(conn: Any) -> None:
    """The memory store's run writes nothing of its own."""


def _domain_counts(domain: Any) -> Optional[Dict[str, int]]:
    """Rows and distinct tags in the domain table, read by a harness connection."""
    if domain is None:
        return None
    from _common import pg_connect, sqlite_connect

    kind, where, table = domain
    sql = f'SELECT count(*), count(DISTINCT tag) FROM "{table}"'
    if kind == "sqlite":
        conn = sqlite_connect(where)
        try:
            rows, tags = conn.execute(sql).fetchone()
        finally:
            conn.close()
    else:
        conn = pg_connect(where)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                rows, tags = cur.fetchone()
        finally:
            conn.close()
    return {"rows": int(rows), "tags": int(tags)}


def _drop(made: Dict[str, Any]) -> None:
    made["store"].close()
    if made.get("table"):
        from _common import drop_tables, pg_connect

        dsn, table = made["domain"][1], made["table"]
        conn = pg_connect(dsn)
        try:
            with conn.cursor() as cur:  # the store's table and every table named after it
                cur.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE %s",
                            (table + "%",))
                tables = [row[0] for row in cur.fetchall()]
        finally:
            conn.close()
        drop_tables(dsn, *tables)


# -- one measured run ---------------------------------------------------------------------------
def _schedule(app: Any, jobs: int, first_due_ms: float, window: float) -> float:
    """Schedule the jobs one ``run_once`` each, due uniformly over the window. Returns seconds."""
    queue = app.job_queue
    step = window * 1000 / jobs
    started = time.perf_counter()
    for tag in range(jobs):
        due = int(first_due_ms + tag * step)
        queue.run_once(job_ran, dtm.datetime.fromtimestamp(due / 1000, tz=dtm.timezone.utc),
                       data={"tag": tag, "due": due}, chat_id=1 + tag % 1000)
    return time.perf_counter() - started


def _probe(app: Any) -> float:
    """Seconds per ``run_once``: a few jobs a day ahead, cancelled again."""
    queue = app.job_queue
    far = dtm.datetime.now(dtm.timezone.utc) + dtm.timedelta(days=1)
    started = time.perf_counter()
    probes = [queue.run_once(job_ran, far, data={"tag": -1, "due": 0}) for _ in range(PROBE)]
    seconds = (time.perf_counter() - started) / PROBE
    for job in probes:
        job.schedule_removal()
    return seconds


async def _run(app: Any, runs: _Runs, timeout: float) -> None:
    runs.done = asyncio.Event()
    async with app:
        await app.start()
        try:
            await asyncio.wait_for(runs.done.wait(), timeout)
        except asyncio.TimeoutError:  # reported as runs missing, not as a crash
            runs.last_end, runs.cpu_last = time.perf_counter(), time.process_time()
            runs.at_done = runs.counter.snapshot()
        finally:
            await app.stop()


def measure_jobs(cfg: Dict[str, Any], counter: Any) -> Dict[str, Any]:
    """One row: schedule, run every job once, and report the figures."""
    global RUNS
    import logging

    from telegram.ext import Application

    from _common import percentile
    from ptb_fence.ptb import FencedUpdateProcessor
    from ptb_fence.testing import FakeBotApi

    jobs, window = int(cfg["jobs"]), float(cfg["window"])
    sweep = float(cfg.get("sweep", SWEEP_SECONDS))
    logging.getLogger("ptb_fence").setLevel(logging.ERROR)  # no handle_exhaustion warning
    made = _make_store(cfg)
    if not getattr(getattr(made["store"], "features", None), "jobs", False):
        _drop(made)
        return {"skipped": f"{type(made['store']).__name__} keeps no jobs (StoreFeatures.jobs)"}
    runs = RUNS = _Runs(jobs)
    runs.write, runs.counter = made["write"], counter
    try:
        with FakeBotApi() as fake:
            processor = FencedUpdateProcessor(made["store"], durable_jobs=True,
                                              sweep_every_seconds=sweep)
            app = processor.install(
                Application.builder().token(fake.token).base_url(fake.base_url)).build()
            per_job = _probe(app)
            # the window opens once the scheduling is done, with room to spare
            lead = max(2.0, per_job * jobs * 2.0 + 2.0)
            first_due_ms = time.time() * 1000 + lead * 1000
            before = counter.snapshot()
            schedule_seconds = _schedule(app, jobs, first_due_ms, window)
            scheduled = counter.snapshot()
            slack = first_due_ms / 1000 - time.time()
            asyncio.run(_run(app, runs, timeout=lead + window + 120))
            after = runs.at_done or counter.snapshot()
            left = len(app.job_queue.jobs())
    finally:
        RUNS = None
        counts = _domain_counts(made["domain"])
        _drop(made)
    if runs.first_start is None:
        return {"error": f"no job ran within {lead + window + 120:.0f} s"}
    assert runs.last_end is not None
    assert runs.cpu_first is not None and runs.cpu_last is not None
    seconds = runs.last_end - runs.first_start
    once = (len(runs.starts) == jobs and set(runs.starts.values()) == {1}
            and (counts is None or counts == {"rows": jobs, "tags": jobs}) and left == 0)
    driver = counter.installed and made["domain"] is not None

    def per(key: str, a: Dict[str, int], b: Dict[str, int]) -> Optional[float]:
        return (b[key] - a[key]) / jobs if driver else None

    return {
        "store": cfg["store"],
        "jobs": jobs,
        "window": window,
        "sweep": sweep,
        "ran_once": once,
        "runs_started": sum(runs.starts.values()),
        "jobs_started": len(runs.starts),
        "attempts": {str(k): v for k, v in sorted(runs.attempts.items())},
        "domain": counts,
        "jobs_left": left,
        "runs_s": (jobs - 1) / seconds if seconds > 0 else None,
        "due_s": jobs / window if window > 0 else None,
        "busy_seconds": seconds,
        "cpu_us_per_run": (runs.cpu_last - runs.cpu_first) * 1e6 / jobs,
        "lateness_ms": {
            "p50": percentile(runs.lateness_ms, 0.5),
            "p99": percentile(runs.lateness_ms, 0.99),
            "max": max(runs.lateness_ms),
            "min": min(runs.lateness_ms),
        },
        "commits_per_job": per("commits", scheduled, after),
        "statements_per_job": per("statements", scheduled, after),
        "schedule_s": jobs / schedule_seconds,
        "schedule_commits_per_job": per("commits", before, scheduled),
        "window_slack_s": slack,
    }


def summary(result: Dict[str, Any]) -> str:
    """One line of a row's figures."""
    late = result["lateness_ms"]
    commits = result.get("commits_per_job")
    sched_commits = result.get("schedule_commits_per_job")
    return (
        f"{result['jobs']:,} jobs due over {result['window']:g} s "
        f"({result['due_s']:,.0f}/s due), sweep {result['sweep']:g} s: "
        f"{result['runs_s']:,.0f} runs/s over the busy {result['busy_seconds']:.1f} s, "
        f"lateness p50 {late['p50']:,.0f} ms / p99 {late['p99']:,.0f} ms / max "
        f"{late['max']:,.0f} ms, "
        + ("commits/job n/a" if commits is None else f"{commits:.3f} commits/job")
        + f", {result['cpu_us_per_run']:,.0f} CPU us/run, ran once: "
        + ("yes" if result["ran_once"] else "NO")
        + f"; scheduling {result['schedule_s']:,.0f} jobs/s ("
        + ("n/a" if sched_commits is None else f"{sched_commits:.2f} commits/job")
        + ", one run_once each)"
        + ("" if result["window_slack_s"] >= 0 else
           f"; the window opened {-result['window_slack_s']:.1f} s before scheduling ended")
    )


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("memory", "sqlite", "pg"), default="sqlite")
    parser.add_argument("--quick", action="store_true", help="1,000 jobs over 10 s")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--window", type=float)
    parser.add_argument("--sweep", type=float, default=SWEEP_SECONDS)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    from _common import DriverCounter, pg_dsn

    settings = dict(QUICK if args.quick else FULL)
    cfg: Dict[str, Any] = {
        "store": args.store, "sweep": args.sweep, "dsn": pg_dsn(),
        "jobs": args.jobs or settings["jobs"],
        "window": settings["window"] if args.window is None else args.window,
    }
    counter = DriverCounter()
    counter.install()
    with tempfile.TemporaryDirectory(prefix="ptb_fence_jobs_") as workdir:
        cfg["workdir"] = workdir
        result = measure_jobs(cfg, counter)
    print(json.dumps(result) if args.json else f"{args.store}: {summary(result)}")
    return 0 if result["ran_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
