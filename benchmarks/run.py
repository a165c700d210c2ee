"""Benchmark harness of ptb_fence: every configuration side by side, in one command and one run.

Usage (from the repository root)::

    pip install -e '.[bench]'                   # pgqueuer + asyncpg for the reference rows
    python benchmarks/run.py                    # full run (6.6 min measured on a 2-core machine)
    python benchmarks/run.py --quick            # short run (1.5 min measured on the same)
    python benchmarks/run.py --list             # the rows and what they run
    python benchmarks/run.py --only 'jobs-*'    # durable jobs (3.6 min measured, --quick 47 s)
    python benchmarks/run.py --only 'fenced-*-32,plain-32' --updates 300 --runs 1
    python benchmarks/run.py --only 'poll-*' --poll-updates 1000   # the polling rows only
    python benchmarks/run.py --scale-out        # PostgreSQL's cost per update; 1 vs 2 bot processes
    python benchmarks/run.py --profile fenced-pg-32           # cProfile (all threads) of a row
    python benchmarks/run.py --profile fenced-pg-32 --profiler py-spy [--gil]

PostgreSQL comes from ``PTB_FENCE_POSTGRES_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/test``). The harness creates a private database
``ptb_fence_bench_<random>`` on that server for the run (so ``pg_stat_database`` counts only its
own transactions; if it may not, it uses the DSN's database and says so), a fresh table per run
inside it, and drops both afterwards. Rows that need an unreachable PostgreSQL, or pgqueuer when
it is not installed, are printed as ``skipped: <reason>``.

Each row runs in a fresh child process (``run.py --child``), one after another, so peak RSS and
interference are per row. A row is a warm-up run, ``--runs`` measured runs (median, min-max)
and a low-load latency phase. Every run builds a fresh store, processor and Application and
feeds it ``--updates`` updates the way PTB's polling does: ``await app.update_queue.put(update)``
for each ``telegram.Update`` (``Update.de_json``) of batches of 100; it ends when every update is
handled (and, for ptb_fence, completed in the store). The ``poll-*`` rows instead let
``app.updater.start_polling(poll_interval=0)`` fetch ``--poll-updates`` updates (3,000 over
``--poll-chats`` 200 chats) over HTTP from a fake Bot API that runs in a process of its own and
already holds them (the path on which ptb_fence records a whole ``getUpdates`` batch in one
commit). That server is ``_fast_server.py``: every ``getUpdates`` page is a complete HTTP
response built before the clock starts, answered with one write on a keep-alive connection, so
that PTB's polling (its HTTP client, ``json.loads`` and ``Update.de_json``), not the server, is
what limits plain PTB's row; the bot process's CPU time per update is printed next to plain
PTB's. Each polling row's measured runs alternate with plain PTB polling runs in the same
process, and its ``x plain`` is the median of those paired ratios (steadier than a ratio of rows
measured minutes apart on a loaded machine). ``poll-plain-fakebotapi-32`` polls :class:`ptb_fence.testing.FakeBotApi` instead, the
server these rows used before (a reference: it shows how much that server held plain PTB back).

Rows (``--list`` prints them):

- ``plain-N``: plain PTB (``ApplicationBuilder().concurrent_updates(N)``), no-op handler.
- ``durable-{sqlite,pg}-N``: ``DurableUpdateProcessor(store, max_concurrent=N)``, no-op handler.
- ``fenced-{sqlite,pg}-N``: ``FencedUpdateProcessor(store, max_concurrent=N)``, no-op handler.
- ``fenced-write-{sqlite,pg}-N``: as ``fenced``, with one fenced domain INSERT per update through
  ``await context.attempt.run_in_transaction(fn, complete=True)``.
- ``burst-fenced-{sqlite,pg}-32``: as ``fenced-*-32``, with 32 producer tasks putting at once
  (each awaits its own ``put``, as PTB's webhook handler does per request): a webhook burst,
  recorded through group commit.
- ``naive-pg-N``: plain PTB whose handler does one psycopg2 INSERT + commit per update through
  ``asyncio.to_thread`` (the naive durable approach; a reference).
- ``pgqueuer-N``: pgqueuer on the same PostgreSQL: enqueue the same number of jobs (batches of
  100), then dequeue + complete them (``QueueManager.run`` in drain mode).
- ``poll-plain-32``: plain PTB polling the fast server, no-op handler (the polling baseline).
- ``poll-plain-fakebotapi-32``: the same, polling ``testing.FakeBotApi`` (reference).
- ``poll-naive-{sqlite,pg}-32``: plain PTB polling; the handler does one INSERT + commit through
  ``asyncio.to_thread`` (a connection per worker thread; SQLite: WAL, ``synchronous=NORMAL``).
- ``poll-fenced-{sqlite,pg}-32``: ``FencedUpdateProcessor`` polling, no-op handler.
- ``poll-fenced-write-{sqlite,pg}-32``: ``FencedUpdateProcessor`` polling; the handler does
  ``await context.attempt.run_in_transaction(insert, complete=True)``.
- ``poll-reply-{sqlite,pg}-32``: ``FencedUpdateProcessor`` polling; the handler does the fenced
  write ``run_in_transaction(insert, complete=True)`` and then replies directly, ``await
  context.bot.send_message(chat, text)``.
- ``poll-outbox-{sqlite,pg}-32``: the same write; the reply goes through the outbox:
  ``attempt.outbox.send_message(chat, text)`` before the write (held by the attempt, written in
  the write's commit) and sent by the process's dispatcher after it. In both reply rows an
  update counts as done when the fake Bot API answered its reply (a ``telegram.request``
  subclass given to the builder timestamps the answer), and their ``reply lat`` figures are a
  low-load phase (one ``update_queue.put`` at a time) from the put to the reply's answer.
- ``scaleout-{fenced,fenced-write}-pg-32``: one bot process, then ``--scale-processes`` (2) bot
  processes at once, on one PostgreSQL table; each process polls a fast server of its own holding
  its own ``--poll-updates`` updates (``_scaleout.py``). With ``poll-fenced-pg-32``,
  ``poll-fenced-write-pg-32`` and ``poll-naive-pg-32`` they make the SCALE-OUT section
  (``--scale-out`` runs just these):
  statements, commits and the PostgreSQL backends' CPU per update, and the bot processes one
  PostgreSQL core can feed at that cost.
- ``jobs-{sqlite,pg}`` (and ``jobs-memory``, a reference): ``jobs.py``. Before the Application
  starts, the bot schedules ``--jobs`` one-off jobs (10,000, ``--quick`` 1,000) with
  ``app.job_queue.run_once``, due uniformly over ``--jobs-window`` seconds (60, ``--quick`` 10).
  ``FencedUpdateProcessor(store, durable_jobs=True, sweep_every_seconds=--jobs-sweep)`` (1 s)
  runs them. Each run's callback does one fenced INSERT with ``run_in_transaction(insert,
  complete=True)``. The JOBS section prints runs/s, lateness p50/p99 (callback start minus the
  due time in the job's data), commits per job at the driver and the scheduling rate.
- ``broadcasts-{sqlite,pg}``: ``broadcasts.py``. ``UpdateIntake(outbox_pacing=OutboxPacing(
  per_second=300))`` broadcasts to 10,000 chats (``--quick`` 2,000) through ``FakeBotApi``
  enforcing 300 a second. The BROADCASTS section prints the sustained rate, the 429 answers and
  the commits per sent recipient.
- ``lease-{sqlite,pg}``: ``LeaseKeeper.tick()`` with 1, 100 and 5,000 active attempts.
- ``backlog-{sqlite,pg}``: 100,000 recorded updates handled after a restart; RSS sampled.
- ``backlog-write-{sqlite,pg}``: the same backlog, each update handled with the fenced write
  ``run_in_transaction(insert, complete=True)``.

What the columns count:

- ``upd/s``: handled updates per second, median of the measured runs (min-max).
- ``x plain`` / ``x pgq``: the median over plain PTB's median at the same concurrency (the
  ``poll-*`` rows: over ``poll-plain-32``), and over pgqueuer's enqueue+dequeue+complete at the
  same concurrency.
- ``lat p50/p99``: low load (``--latency-rate`` updates/s for ``--latency-seconds``, one
  ``put`` at a time): from just before ``update_queue.put`` to the handler's end (plain, naive:
  after its commit; fenced-write: after the transaction that also settled the attempt
  committed) or, for durable/fenced no-op rows, to the return of the store's settle call that
  completed the update (observed by the store proxy). ``+p50/+p99``: minus plain PTB's.
- ``calls/u``: calls to store methods per handled update (a proxy around the store counts them;
  the breakdown by method is printed below the table).
- ``stmts/u`` and ``commits/u``: SQL statements (without BEGIN/COMMIT/PRAGMA) and commits per
  handled update, counted at the driver in the child process: every SQLite connection gets a
  trace callback, every psycopg2 connection counts ``cursor.execute`` and ``commit()``. This
  includes the fenced-write and naive rows' own writes.
- ``srv c/u``: PostgreSQL only: the delta of ``pg_stat_database.xact_commit`` of the private
  database around a whole run (table creation, start, the run, stop) per handled update; it
  counts every transaction, read-only ones too (a cross-check of ``commits/u``).
- ``CPU us/u``: CPU time of the row's process (the bot: PTB, ptb_fence, the drivers, and the
  harness's own counting; all threads) over the timed part, per handled update
  (``time.process_time``). Polling rows also show plain PTB polling's (``plain``), the bot's CPU
  time over wall time (``bot CPU``; the GIL holds Python code to about one core), and the fake
  server process's CPU time per update (``srv us/u``, from ``/proc/<pid>/stat``).
- ``RSS MB``: peak RSS of the row's child process (``ru_maxrss``).

The TARGETS section checks the goals of issue 24 (``[24]``: fenced no-op polling at least 0.6x
plain and at most 0.05 commits per update, the claims a process held at most
``max_concurrent + ingest_claim_buffer``, the fenced write polling at least 0.25x plain and 2x
naive, ptb_fence's CPU per no-op polled update over the paired plain runs' at most 120 us, and
an INFO line of the backlog and burst rates to compare with the README by hand), of issue 36
(``[36]``: the same throughput goals with ptb_fence's CPU per update at most 80 us), of issue 39
(``[39]``: ``steps-pg-32``, one ``attempt.step`` before each fenced write costs at most one
extra commit, and under 0.5 when 32 attempts record theirs at once), of issue 37
(``[37]``: every durable job ran exactly once, lateness p99 at most ``sweep_every_seconds`` + 1 s,
and on PostgreSQL under one commit per job), of issue 14
(``[14]``: the polling rows' ratios to ``poll-plain-32`` and ``poll-naive-pg-32``, the fenced
write's CPU per update, commits per update, the backlog's rate and RSS growth), the outbox rows'
goals (``poll-outbox-*`` against ``poll-reply-*``: at least 0.8x the throughput, at most 0.1 extra
commits per update, and the reply latency at low load printed) and the earlier goals on the
``update_queue.put`` rows.

The claims bound is checked on ``poll-fenced-{sqlite,pg}-32`` by one more run of the row after
its timed runs, not timed and not in its figures, with the claims tallied exactly (as
``--claims-exact`` does: the store calls that grant or end claims run one at a time, which slows
the row). With ``--claims-exact`` the timed runs' own tally is used instead.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (HERE, ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)

RESULT_PREFIX = "BENCH-RESULT "

FULL = {
    "updates": 1500,
    "runs": 3,
    "warmup": 200,
    "latency_seconds": 2.5,
    "backlog": 100_000,
    "poll_updates": 3000,
    "poll_chats": 200,
    "jobs": 10_000,
    "jobs_window": 60.0,
    "broadcast_recipients": 10_000,
    "broadcast_limit": 300,
}
QUICK = {
    "updates": 300,
    "runs": 3,
    "warmup": 0,  # the median of 3 absorbs a slow first run
    "latency_seconds": 1.0,
    "backlog": 3_000,
    "poll_updates": 600,
    "poll_chats": 200,
    "jobs": 1_000,
    "jobs_window": 10.0,
    "broadcast_recipients": 2_000,
    "broadcast_limit": 300,
}

LEGEND = [
    "  upd/s: handled updates per second, from the first update_queue.put until every update is handled",
    "    and, for ptb_fence rows, completed in the store (Update.de_json of the test updates happens",
    "    before the clock starts; the POLLING section below includes PTB's own fetching and parsing).",
    "  x plain: over plain PTB at the same concurrency; x pgq: over pgqueuer enqueue+dequeue+complete at",
    "    the same concurrency.",
    "  lat p50/p99: low load, one put at a time; from just before update_queue.put to completion: the",
    "    handler's end for plain/naive (naive: after its commit) and fenced-write (after the transaction",
    "    that also settled the attempt committed); for durable/fenced no-op rows, the return of the store",
    "    settle call that completed the update (seen by the store proxy). +p50/+p99: minus plain PTB's.",
    "  calls/u: store method calls per handled update (a proxy around the store counts them).",
    "  stmts/u, commits/u: SQL statements (BEGIN/COMMIT/PRAGMA excluded) and commits per handled update,",
    "    counted at the driver in the row's process (sqlite3 trace callback; psycopg2 connection subclass",
    "    counting cursor.execute and commit()); includes the fenced-write and naive rows' own writes.",
    "  srv c/u: PostgreSQL pg_stat_database.xact_commit delta of the harness's private database over a",
    "    whole run (table creation, start, run, stop; read-only transactions count too), per update.",
    "  CPU us/u: CPU time of the row's (the bot's) process over the timed part (time.process_time, all",
    "    threads: PTB, ptb_fence, drivers, and the harness's counting), per handled update.",
    "  RSS MB: peak RSS (ru_maxrss) of the row's own child process.",
]

POLLING_LEGEND = [
    "  upd/s: handled updates per second, from start_polling until every update is handled and, for",
    "    ptb_fence rows, completed in the store; PTB's HTTP client and Update.de_json are inside the clock.",
    "  x plain, plain upd/s: each row's measured runs alternate with runs of plain PTB polling the fast",
    "    server in the same process (same update count); x plain is the median of the per-pair ratios,",
    "    plain upd/s the median of those plain runs (poll-plain-32 is the plain row itself).",
    "    poll-plain-fakebotapi-32 is plain PTB polling ptb_fence.testing.FakeBotApi, the server these rows",
    "    used before: its x plain is the old server's throughput over the fast server's.",
    "  CPU us/u: the bot process's CPU time per update (all threads); plain: the paired plain runs'.",
    "  bot CPU: the bot process's CPU time over wall time (100% = one core; the GIL caps Python at ~1 core).",
    "  srv us/u: the fake server process's CPU time per update (it is not the bot's and shares the 2 cores).",
    "  calls/u, stmts/u, commits/u, srv c/u, RSS MB: as above (naive rows: their own INSERT and commit).",
]


SCALE_OUT_ROWS = ["scaleout-*", "poll-fenced-pg-32", "poll-fenced-write-pg-32", "poll-naive-pg-32"]
"""The rows ``--scale-out`` selects."""

SCALE_OUT_LEGEND = [
    "  procs: bot processes (each a PTB Application with FencedUpdateProcessor, max_concurrent=32) on one",
    "    PostgreSQL table; poll-* rows: the row's own runs (one process; poll-naive-pg-32, one INSERT + commit",
    "    per update through asyncio.to_thread, is the yardstick); scaleout-* rows: each measured run is",
    "    a pair, one process alone and N processes at once (order alternating), each polling a fast fake",
    "    Bot API of its own holding its own updates (disjoint ids), all told to start at the same moment.",
    "  upd/s: all processes' updates over (last end - first start), median of the runs; x1: the median of",
    "    the pairs' ratios N processes / 1 process. per proc: each process's own rate (median).",
    "  stmts/u, commits/u: SQL statements and commits per update counted at the bots' drivers (all processes);",
    "    srv c/u: pg_stat_database.xact_commit of the run's private database per update (whole run).",
    "  PG us/u: CPU time of the PostgreSQL client backends of the run's private database (the bots'",
    "    connections; /proc/<pid>/schedstat) over the timed part, per update. Not included: the server's",
    "    shared processes (WAL writer, checkpointer, autovacuum; they serve every database) and I/O waits.",
    "    A backend opened during the timed part counts from its start (about 3 ms of start-up plus the",
    "    catalog reads of its first statements: a one-off cost, spread over the run's updates).",
    "  bot us/u: CPU time of the bot process(es) per update (all threads).",
    "  bots/PG core: bot us/u / PG us/u, the bot processes, each running at one full core (the GIL), whose",
    "    statements one PostgreSQL core executes; at rate: 1e6 / (PG us/u x per-process upd/s), the",
    "    processes at the rate measured here. Projections from CPU alone: locks, WAL and fsync not modelled.",
]


JOBS_LEGEND = [
    "  Before the Application starts, the bot schedules the jobs with app.job_queue.run_once (one store",
    "    commit each: scheduling is timed apart). They are due uniformly over the window, which opens",
    "    once scheduling is done. Each run's callback writes one fenced row and completes the run with",
    "    run_in_transaction(insert, complete=True). The job pump fires up to 200 due runs per look.",
    "  runs/s: jobs over the busy part (first callback start to last run completed). It follows the",
    "    due rate when the bot keeps up. CPU us/run: the bot process's CPU over that part.",
    "  lateness: callback start minus the due time carried in the job's data (ms).",
    "  commits/job: commits at the driver from the Application's start to the last run's completion,",
    "    per job (looks, claims, runs, completions, sweeps and lease renewals).",
    "  ran once: each job's callback started once, the fenced table has one row per job, and the",
    "    store keeps no job afterwards.",
]


@dataclass(frozen=True)
class Row:
    """One configuration of the table."""

    name: str
    kind: str
    store: Optional[str]
    concurrency: int
    title: str
    server: Optional[str] = None
    """Polling rows: ``fast`` (``_fast_server.py``) or ``fakebotapi`` (``testing.FakeBotApi``)."""
    producers: int = 1
    """Throughput rows: tasks putting updates at the same time (``burst-*``: 32, a webhook burst)."""

    @property
    def needs_pg(self) -> bool:
        return self.store == "pg" or self.kind == "pgqueuer"

    @property
    def section(self) -> str:
        if self.kind in ("lease", "backlog", "backlog-write"):
            return "backlog" if self.kind == "backlog-write" else self.kind
        if self.kind.startswith("poll-"):
            return "polling"
        if self.kind.startswith("scaleout-"):
            return "scaleout"
        if self.kind == "steps":
            return "steps"
        if self.kind == "jobs":
            return "jobs"
        if self.kind == "broadcasts":
            return "broadcasts"
        return "throughput"


def all_rows(concurrencies: Sequence[int]) -> List[Row]:
    """Every row, in the order they run."""
    rows: List[Row] = []
    for c in concurrencies:
        rows.append(Row(f"plain-{c}", "plain", None, c, f"plain PTB concurrent_updates({c}), no-op"))
    for kind, what in (
        ("durable", "DurableUpdateProcessor, no-op"),
        ("fenced", "FencedUpdateProcessor, no-op"),
        ("fenced-write", "Fenced + transaction(complete=True) write"),
    ):
        for store in ("sqlite", "pg"):
            for c in concurrencies:
                rows.append(Row(f"{kind}-{store}-{c}", kind, store, c, f"{what}, {store}, {c}"))
    for store in ("sqlite", "pg"):
        rows.append(
            Row(f"burst-fenced-{store}-32", "fenced", store, 32,
                f"FencedUpdateProcessor, no-op, {store}, 32; 32 producers put at once (webhook burst)",
                producers=32)
        )
    for c in concurrencies:
        rows.append(Row(f"naive-pg-{c}", "naive", "pg", c, f"naive: INSERT+commit per update, {c}"))
    for c in concurrencies:
        rows.append(Row(f"pgqueuer-{c}", "pgqueuer", "pg", c, f"pgqueuer enqueue+dequeue+complete, {c}"))
    fast = "polling the fast fake Bot API"
    rows.append(Row("poll-plain-32", "poll-plain", None, 32, f"plain PTB {fast}, no-op, 32", "fast"))
    rows.append(
        Row("poll-plain-fakebotapi-32", "poll-plain", None, 32,
            "plain PTB polling testing.FakeBotApi (the old server; reference), no-op, 32", "fakebotapi")
    )
    for kind, what in (
        ("naive", "naive: to_thread INSERT+commit per update"),
        ("fenced", "FencedUpdateProcessor, no-op"),
        ("fenced-write", "Fenced + run_in_transaction(insert, complete=True)"),
    ):
        for store in ("sqlite", "pg"):
            rows.append(
                Row(f"poll-{kind}-{store}-32", f"poll-{kind}", store, 32, f"{what}, {store}, {fast}, 32", "fast")
            )
    for store in ("sqlite", "pg"):
        rows.append(
            Row(f"poll-reply-{store}-32", "poll-fenced-write-reply", store, 32,
                f"Fenced + run_in_transaction(insert, complete=True), then await "
                f"bot.send_message (a direct reply), {store}, {fast}, 32", "fast")
        )
        rows.append(
            Row(f"poll-outbox-{store}-32", "poll-fenced-write-outbox", store, 32,
                f"Fenced + attempt.outbox.send_message held, written in the commit of "
                f"run_in_transaction(insert, complete=True), sent by the dispatcher, {store}, "
                f"{fast}, 32", "fast")
        )
    for store in ("sqlite", "pg"):
        for persistence, what in (("none", "no persistence"), ("pickle", "PicklePersistence"),
                                  ("fenced", "FencedPersistence")):
            rows.append(
                Row(f"poll-conv-{persistence}-{store}-32", f"poll-conv-{persistence}", store, 32,
                    f"FencedUpdateProcessor, a ConversationHandler changing user_data per "
                    f"update, {what}, {store}, {fast}, 32", "fast")
            )
    for store in ("sqlite", "pg"):
        rows.append(
            Row(f"poll-fenced-metrics-{store}-32", "poll-fenced-metrics", store, 32,
                f"FencedUpdateProcessor, no-op, {store}, {fast}, 32; ptb_fence.metrics "
                "registered and scraped every second", "fast")
        )
    for kind, what in (("fenced", "no-op"), ("fenced-write", "run_in_transaction(insert, complete=True)")):
        rows.append(
            Row(f"scaleout-{kind}-pg-32", f"scaleout-{kind}", "pg", 32,
                f"1 vs --scale-processes (2) FencedUpdateProcessor bot processes on one PostgreSQL "
                f"table, {what}, each {fast} of its own, 32", "fast")
        )
    for store in ("sqlite", "pg"):
        rows.append(Row(f"steps-{store}-32", "steps", store, 32,
                        f"fenced writes of claimed attempts, 0 or 1 attempt.step each, {store}, 32"))
    for store in ("memory", "sqlite", "pg"):
        rows.append(Row(f"jobs-{store}", "jobs", store, 0,
                        f"one-off durable jobs due over a window, run_once each, a fenced write "
                        f"per run, {store}" + (" (reference)" if store == "memory" else "")))
    for store in ("sqlite", "pg"):
        rows.append(Row(f"broadcasts-{store}", "broadcasts", store, 0,
                        f"one broadcast through FakeBotApi enforcing a global limit, "
                        f"UpdateIntake(outbox_pacing=OutboxPacing(per_second=limit)), {store}"))
    for store in ("sqlite", "pg"):
        rows.append(Row(f"lease-{store}", "lease", store, 0, f"lease renewal tick, {store}"))
    for store in ("sqlite", "pg"):
        rows.append(Row(f"backlog-{store}", "backlog", store, 32, f"backlog after restart, {store}"))
    for store in ("sqlite", "pg"):
        rows.append(
            Row(f"backlog-write-{store}", "backlog-write", store, 32,
                f"backlog after restart, handler run_in_transaction(insert, complete=True), {store}")
        )
    return rows


# ================================================================================================
# child side
# ================================================================================================
def measure_steps(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """The cost of ``attempt.step``: fenced writes of claimed attempts by 32 tasks, grouped,
    with 0 and with 1 step before each (a no-op ``fn``), alternated over the runs."""
    from fenced_write import writes

    kind = f"fenced-{cfg['store']}"
    count = max(200, min(int(cfg["updates"]), 2000))
    runs: Dict[str, List[Dict[str, Any]]] = {"0": [], "1": []}
    for _ in range(max(1, int(cfg["runs"]))):
        for steps in (0, 1):
            runs[str(steps)].append(writes(kind, count, int(cfg["concurrency"]), True, steps))

    def median_of(steps: str, key: str) -> Optional[float]:
        values = sorted(run[key] for run in runs[steps] if run.get(key) is not None)
        return values[len(values) // 2] if values else None

    return {
        "steps": {
            steps: {key: median_of(steps, key)
                    for key in ("writes_s", "cpu_us_per_write", "commits_per_write")}
            for steps in runs
        },
        "count": count,
    }


def child_main(cfg: Dict[str, Any]) -> int:
    """Measure one row in this (fresh) process and print its result as one JSON line."""
    import asyncio
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from _common import DriverCounter, peak_rss_kb

    counter = DriverCounter()
    if cfg.get("driver_count", True):
        counter.install()
    kind = cfg["kind"]

    def measure() -> Dict[str, Any]:
        if kind == "pgqueuer":
            from _pgq_rows import measure_pgqueuer

            return measure_pgqueuer(cfg)
        if kind == "lease":
            from _scaling import measure_lease

            return measure_lease(cfg, counter)
        if kind in ("backlog", "backlog-write"):
            from _scaling import measure_backlog

            return measure_backlog(cfg, counter)
        if kind.startswith("scaleout-"):
            from _scaleout import measure_scaleout

            return measure_scaleout(cfg)
        if kind == "steps":
            return measure_steps(cfg)
        if kind == "jobs":
            from jobs import measure_jobs

            return measure_jobs(cfg, counter)
        if kind == "broadcasts":
            from broadcasts import measure_broadcasts

            return measure_broadcasts(cfg, counter if cfg.get("driver_count", True) else None)
        from _ptb_rows import measure_ptb_row

        return asyncio.run(measure_ptb_row(cfg, counter))

    result = measure()
    result["rss_peak_kb"] = peak_rss_kb()
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


def fake_server_main(spec: str) -> int:
    """Serve a FakeBotApi holding ``{"count": N, "chats": C}`` pending updates until stdin closes.

    The reference row ``poll-plain-fakebotapi-32`` runs :class:`ptb_fence.testing.FakeBotApi`
    in this separate process (the other ``poll-*`` rows run ``_fast_server.py``); it prints
    ``{"token": ..., "base_url": ..., "pid": ...}`` once ready.
    """
    from _common import update_dicts

    from ptb_fence.testing import FakeBotApi

    cfg = json.loads(spec)
    with FakeBotApi() as fake:
        for update in update_dicts(int(cfg["count"]), chats=int(cfg.get("chats", 200))):
            fake.inject(update)
        sys.stdout.write(
            json.dumps({"token": fake.token, "base_url": fake.base_url, "pid": os.getpid()}) + "\n"
        )
        sys.stdout.flush()
        sys.stdin.read()  # until the parent closes the pipe
    return 0


# ================================================================================================
# parent side
# ================================================================================================
def _versions(pg_dsn: str, pg_ok: bool) -> List[str]:
    import sqlite3

    import apscheduler
    import psycopg2
    import telegram

    import ptb_fence

    lines = []
    cores = os.cpu_count()
    usable: Optional[int] = cores
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        pass
    lines.append(f"machine: {platform.machine()}, {cores} cores ({usable} usable), {platform.platform()}")
    lines.append(f"load average at start: {_load()} (other processes compete for the same cores)")
    lines.append(
        f"python {platform.python_version()}, python-telegram-bot {telegram.__version__}, "
        f"APScheduler {apscheduler.__version__}, psycopg2 {str(getattr(psycopg2, '__version__', '?')).split()[0]}, "
        f"SQLite {sqlite3.sqlite_version}"
    )
    commit = "unknown"
    try:
        commit = subprocess.run(
            ["git", "-C", ROOT, "describe", "--always", "--dirty"],
            capture_output=True, text=True, timeout=5, check=False,
        ).stdout.strip() or "unknown"
    except Exception:
        pass
    lines.append(f"ptb_fence {ptb_fence.__version__} (git {commit})")
    server = "unreachable"
    if pg_ok:
        from _common import pg_connect

        try:
            conn = pg_connect(pg_dsn)
            try:
                with conn.cursor() as cur:
                    cur.execute("SHOW server_version")
                    server = str(cur.fetchone()[0])
                    cur.execute("SHOW synchronous_commit")
                    server += f" (synchronous_commit={cur.fetchone()[0]})"
            finally:
                conn.close()
        except Exception as exc:
            server = f"error: {exc}"
    lines.append(f"PostgreSQL {server}")
    try:
        from importlib.metadata import version

        lines.append(f"pgqueuer {version('pgqueuer')}, asyncpg {version('asyncpg')}")
    except Exception:
        lines.append("pgqueuer: not installed")
    return lines


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        return "unknown"


def _run_child(cfg: Dict[str, Any], timeout: float, env_extra: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    env = dict(os.environ)
    env.update(env_extra or {})
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: Dict[str, Any] = json.loads(line[len(RESULT_PREFIX):])
            warnings = [l for l in proc.stderr.splitlines() if l.startswith(("WARNING", "ERROR"))]
            if warnings:
                result["stderr_warnings"] = warnings[:5]
            return result
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    first_error = next((l for l in lines if l.startswith("ERROR")), None)
    tail = [l.strip() for l in lines[-3:]]
    text = f"child exited {proc.returncode}: " + " | ".join(tail)
    if first_error:
        text += f" (first error logged: {first_error[:200]})"
    return {"error": text}


def _fmt_rate(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}"


def _fmt_num(value: Optional[float], digits: int = 2) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.{digits}f}"


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b


class Report:
    """Collects results and prints the table, the scaling sections and the targets."""

    def __init__(
        self, rows: Sequence[Row], results: Dict[str, Dict[str, Any]], claim_buffer: int = 8
    ) -> None:
        self.rows = rows
        self.results = results
        self.claim_buffer = claim_buffer  # the rows' ingest_claim_buffer (the library default)

    def ok(self, name: str) -> Optional[Dict[str, Any]]:
        result = self.results.get(name)
        if result is None or "error" in result or "skipped" in result:
            return None
        return result

    def median(self, name: str) -> Optional[float]:
        result = self.ok(name)
        return None if result is None else result.get("median")

    def claims_bound(self, concurrency: int) -> int:
        """The most claims a process may hold: max_concurrent + ingest_claim_buffer."""
        return concurrency + int(self.claim_buffer)

    def plain_for(self, row: Row) -> Optional[Dict[str, Any]]:
        if row.kind.startswith("poll-"):
            return self.ok("poll-plain-32") or self.ok(f"plain-{row.concurrency}")
        return self.ok(f"plain-{row.concurrency}")

    def throughput_table(self) -> List[str]:
        header = (
            f"{'row':<24} {'upd/s median (min-max)':<26} {'x plain':>7} {'x pgq':>6} "
            f"{'lat p50/p99 ms':>15} {'+p50/+p99 ms':>14} {'calls/u':>7} {'stmts/u':>7} "
            f"{'commits/u':>9} {'srv c/u':>7} {'CPU us/u':>8} {'RSS MB':>6}"
        )
        lines = [header, "-" * len(header)]
        for row in self.rows:
            if row.section != "throughput":
                continue
            result = self.results.get(row.name)
            if result is None:
                continue
            if "skipped" in result:
                lines.append(f"{row.name:<24} skipped: {result['skipped']}")
                continue
            if "error" in result:
                lines.append(f"{row.name:<24} FAILED: {result['error']}")
                continue
            rates = result["rates"]
            rate = f"{_fmt_rate(result['median'])} ({_fmt_rate(min(rates))}-{_fmt_rate(max(rates))})"
            plain = self.plain_for(row)
            x_plain = _ratio(result["median"], plain["median"]) if plain and row.kind != "plain" else None
            pgq = self.ok(f"pgqueuer-{row.concurrency}")
            x_pgq = (
                _ratio(result["median"], pgq["median"])
                if pgq and row.kind not in ("pgqueuer", "plain", "poll-plain") else None
            )
            lat = result.get("latency")
            lat_text = added_text = "-"
            if lat:
                lat_text = f"{lat['p50_ms']:.2f}/{lat['p99_ms']:.2f}"
                plat = plain.get("latency") if plain else None
                if plat and row.kind != "plain":
                    added_text = f"{lat['p50_ms'] - plat['p50_ms']:+.2f}/{lat['p99_ms'] - plat['p99_ms']:+.2f}"
            lines.append(
                f"{row.name:<24} {rate:<26} {_fmt_num(x_plain):>7} {_fmt_num(x_pgq):>6} "
                f"{lat_text:>15} {added_text:>14} {_fmt_num(result.get('store_calls_per_update')):>7} "
                f"{_fmt_num(result.get('statements_per_update')):>7} "
                f"{_fmt_num(result.get('commits_per_update')):>9} "
                f"{_fmt_num(result.get('server_commits_per_update')):>7} "
                f"{_fmt_num(result.get('cpu_us_per_update'), 0):>8} "
                f"{result.get('rss_peak_kb', 0) / 1024:>6.0f}"
            )
        return lines

    def polling_plain(self, name: str) -> Tuple[Optional[float], Optional[float], Optional[float]]:
        """(x plain, plain upd/s, plain CPU us/update) for a polling row.

        From the plain PTB polling runs alternated with the row's own runs in its process
        (``paired_plain``: the median of the per-pair ratios), else from ``poll-plain-32``.
        """
        result = self.ok(name)
        if result is None:
            return None, None, None
        paired = result.get("paired_plain")
        if paired:
            return paired["ratio_median"], paired["median"], paired["cpu_us_per_update"]
        plain = self.ok("poll-plain-32")
        if plain is None:
            return None, None, None
        x_plain = None if name == "poll-plain-32" else _ratio(result["median"], plain["median"])
        return x_plain, plain["median"], plain.get("cpu_us_per_update")

    def polling_table(self) -> List[str]:
        rows = [r for r in self.rows if r.section == "polling" and r.name in self.results]
        if not rows:
            return []
        header = (
            f"{'row':<27} {'upd/s median (min-max)':<22} {'x plain':>7} {'plain upd/s':>11} "
            f"{'CPU us/u':>8} {'plain':>6} {'bot CPU':>7} {'srv us/u':>8} {'calls/u':>7} "
            f"{'stmts/u':>7} {'commits/u':>9} {'srv c/u':>7} {'RSS MB':>6}"
        )
        lines = [header, "-" * len(header)]
        for row in rows:
            result = self.results[row.name]
            if "skipped" in result:
                lines.append(f"{row.name:<26} skipped: {result['skipped']}")
                continue
            if "error" in result:
                lines.append(f"{row.name:<26} FAILED: {result['error']}")
                continue
            rates = result["rates"]
            rate = f"{_fmt_rate(result['median'])} ({_fmt_rate(min(rates))}-{_fmt_rate(max(rates))})"
            x_plain, plain_rate, plain_cpu = self.polling_plain(row.name)
            busy = result.get("cpu_busy")
            lines.append(
                f"{row.name:<27} {rate:<22} {_fmt_num(x_plain):>7} {_fmt_rate(plain_rate):>11} "
                f"{_fmt_num(result.get('cpu_us_per_update'), 0):>8} {_fmt_num(plain_cpu, 0):>6} "
                f"{'-' if busy is None else f'{busy * 100:.0f}%':>7} "
                f"{_fmt_num(result.get('server_cpu_us_per_update'), 0):>8} "
                f"{_fmt_num(result.get('store_calls_per_update')):>7} "
                f"{_fmt_num(result.get('statements_per_update')):>7} "
                f"{_fmt_num(result.get('commits_per_update')):>9} "
                f"{_fmt_num(result.get('server_commits_per_update')):>7} "
                f"{result.get('rss_peak_kb', 0) / 1024:>6.0f}"
            )
        return lines

    def breakdown(self) -> List[str]:
        lines = []
        for row in self.rows:
            result = self.ok(row.name)
            if result is None or row.section not in ("throughput", "polling"):
                continue
            parts = []
            calls = result.get("calls_per_update") or {}
            if calls:
                parts.append(", ".join(f"{k} {v:.3f}" for k, v in calls.items()))
            peak = result.get("claims_peak")
            if peak and row.kind.split("-")[-1] == "fenced":
                parts.append(
                    f"claims held at most {peak} (bound max_concurrent + ingest_claim_buffer = "
                    f"{self.claims_bound(row.concurrency)}; tallied in commit order at the store proxy, --claims-exact)"
                )
            check = result.get("claims_check_peak")
            if check is not None:
                parts.append(
                    f"claims held at most {check} in an untimed check run of "
                    f"{result['claims_check_updates']:,} updates tallied in commit order "
                    f"({_fmt_rate(result.get('claims_check_rate'))} upd/s with the calls serialised; "
                    f"bound {self.claims_bound(row.concurrency)})"
                )
            if row.kind == "pgqueuer":
                drains = result["drain_rates"]
                parts.append(
                    f"dequeue+complete only: {_fmt_rate(result['drain_median'])} jobs/s "
                    f"({_fmt_rate(min(drains))}-{_fmt_rate(max(drains))})"
                )
            for note in result.get("notes", []):
                parts.append(note)
            # one line per distinct warning (every run of a row logs the same ones)
            warnings_seen: Dict[str, int] = {}
            for warning in result.get("stderr_warnings", []):
                warnings_seen[warning[:160]] = warnings_seen.get(warning[:160], 0) + 1
            for warning, count in warnings_seen.items():
                parts.append(f"child log ({count}x): {warning}" if count > 1 else "child log: " + warning)
            if parts:
                lines.append(f"  {row.name}: " + "; ".join(parts))
        return lines

    def scaleout_table(self) -> List[str]:
        """PostgreSQL's cost per update of the fenced polling rows, and 1 vs N processes."""
        rows = [
            r for r in self.rows
            if r.name in self.results
            and (
                r.section == "scaleout"
                or (r.kind in ("poll-fenced", "poll-fenced-write", "poll-naive") and r.store == "pg")
            )
        ]
        if not rows:
            return []
        header = (
            f"{'row':<27} {'procs':>5} {'upd/s':>7} {'x1':>5} {'per proc':>8} {'stmts/u':>7} "
            f"{'commits/u':>9} {'srv c/u':>7} {'PG us/u':>7} {'bot us/u':>8} {'bots/PG core':>12} "
            f"{'at rate':>7}"
        )
        lines = [header, "-" * len(header)]

        def line(name: str, procs: int, rate: Optional[float], x1: Optional[float],
                 per_proc: Optional[float], figures: Dict[str, Any]) -> str:
            pg_us = figures.get("pg_cpu_us_per_update")
            bot_us = figures.get("cpu_us_per_update")
            feeds = _ratio(bot_us, pg_us)
            at_rate = None if not pg_us or not per_proc else 1e6 / (pg_us * per_proc)
            return (
                f"{name:<27} {procs:>5} {_fmt_rate(rate):>7} {_fmt_num(x1):>5} {_fmt_rate(per_proc):>8} "
                f"{_fmt_num(figures.get('statements_per_update')):>7} "
                f"{_fmt_num(figures.get('commits_per_update'), 3):>9} "
                f"{_fmt_num(figures.get('server_commits_per_update'), 3):>7} "
                f"{_fmt_num(pg_us, 0):>7} {_fmt_num(bot_us, 0):>8} {_fmt_num(feeds, 1):>12} "
                f"{_fmt_num(at_rate, 1):>7}"
            )

        notes: List[str] = []
        for row in rows:
            result = self.results[row.name]
            if "skipped" in result or "error" in result:
                lines.append(f"{row.name:<27} " + (
                    f"skipped: {result['skipped']}" if "skipped" in result else f"FAILED: {result['error']}"
                ))
                continue
            if row.section != "scaleout":
                lines.append(line(row.name, 1, result["median"], None, result["median"], result))
                opened = [b["new"] for b in result.get("pg_backends") or []]
                if opened:
                    notes.append(
                        f"  {row.name}: PostgreSQL backends opened during a timed part: "
                        f"{min(opened)}-{max(opened)}"
                    )
                for note in result.get("notes", []):
                    if "backend CPU" in note:
                        notes.append(f"  {row.name}: {note}")
                continue
            one, many = result["scaleout"]["one"], result["scaleout"]["many"]
            procs = int(result["processes"])
            from _common import median

            lines.append(line(row.name, 1, one["median"], None, one["median"], one))
            per_proc = median([median(m["process_rates"]) for m in many["runs"]])
            lines.append(line("", procs, many["median"], result["speedup_median"], per_proc, many))
            spread = max(m["start_spread_ms"] for m in many["runs"])
            loads = [m["load"][0] for m in one["runs"] + many["runs"] if m.get("load")]
            notes.append(
                f"  {row.name}: {result['updates_per_process']:,} updates per process, "
                f"{len(many['runs'])} pair(s); {procs}-process runs started within {spread:.1f} ms of each "
                f"other; {result['cores']} cores ({result['usable_cores']} usable), 1-min load "
                f"{min(loads):.1f}-{max(loads):.1f} during the runs; every bot process has its own fake "
                f"server process too ({_fmt_num(many.get('fast_server_cpu_us_per_update'), 0)} us/u)"
            )
            opened = [m["pg_backends"]["new"] for m in one["runs"] + many["runs"] if m.get("pg_backends")]
            if opened:
                notes.append(
                    f"  {row.name}: PostgreSQL backends opened during a timed part: {min(opened)}-{max(opened)}"
                )
            problem = next((m.get("pg_cpu_problem") for m in one["runs"] if m.get("pg_cpu_problem")), None)
            if problem:
                notes.append(f"  {row.name}: PostgreSQL backend CPU not measured: {problem}")
        return lines + notes

    def lease_table(self) -> List[str]:
        lines = []
        for row in self.rows:
            if row.kind != "lease" or row.name not in self.results:
                continue
            result = self.results[row.name]
            if "skipped" in result or "error" in result:
                lines.append(f"  {row.name}: " + (f"skipped: {result['skipped']}" if "skipped" in result else f"FAILED: {result['error']}"))
                continue
            for item in result["lease"]:
                lines.append(
                    f"  {row.store:<7} {item['active']:>6,} active: {item['renewal_calls_per_tick']} renewal call(s) "
                    f"({item['store_calls_per_tick']} store calls) per tick, "
                    f"{item['statements_per_tick']} SQL statement(s) + {item['commits_per_tick']} commit(s) per tick, "
                    f"tick {item['tick_ms_median']:.2f} ms median / {item['tick_ms_max']:.2f} ms max "
                    f"({item['ticks']} ticks; owner lost: {item['owner_lost']})"
                )
        return lines

    def steps_table(self) -> List[str]:
        lines = []
        for row in self.rows:
            if row.section != "steps" or row.name not in self.results:
                continue
            result = self.results[row.name]
            if "skipped" in result or "error" in result:
                lines.append(f"  {row.name}: " + (f"skipped: {result['skipped']}" if "skipped" in result else f"FAILED: {result['error']}"))
                continue
            for steps, figures in sorted(result["steps"].items()):
                commits = figures.get("commits_per_write")
                lines.append(
                    f"  {row.store:<7} {steps} step(s) per write: {_fmt_rate(figures['writes_s'])} "
                    f"writes/s, {_fmt_num(figures['cpu_us_per_write'], 0)} CPU us/write"
                    + ("" if commits is None else f", {commits:.3f} commits/write")
                    + f" ({result['count']:,} writes per run, medians)"
                )
        return lines

    def jobs_table(self) -> List[str]:
        lines = []
        for row in self.rows:
            if row.section != "jobs" or row.name not in self.results:
                continue
            result = self.results[row.name]
            if "skipped" in result or "error" in result:
                lines.append(f"  {row.name}: " + (f"skipped: {result['skipped']}" if "skipped" in result else f"FAILED: {result['error']}"))
                continue
            from jobs import summary

            lines.append(f"  {row.store:<7} {summary(result)}")
        return lines

    def broadcasts_table(self) -> List[str]:
        lines = []
        for row in self.rows:
            if row.section != "broadcasts" or row.name not in self.results:
                continue
            r = self.results[row.name]
            if "skipped" in r or "error" in r:
                lines.append(f"  {row.name}: " + (f"skipped: {r['skipped']}" if "skipped" in r
                                                   else f"FAILED: {r['error']}"))
                continue
            share = r.get("rate_share")
            commits = r.get("commits_per_sent")
            lines.append(
                f"  {row.store:<7} {r['recipients']:,} recipients at a limit of {r['limit']}/s: "
                f"{_fmt_num(r.get('rate_per_second'), 0)}/s sustained "
                f"({'-' if share is None else f'{share:.0%}'} of the limit), "
                f"{r['answered_429']} answered 429 ({r['per_10k_429']:.1f} per 10,000), "
                f"{r['inside_hold']} inside a hold, {r['duplicates']} duplicate(s), "
                + ("" if commits is None else f"{commits:.3f} commits per sent, ")
                + f"{_fmt_num(r.get('cpu_us_per_sent'), 0)} CPU us per sent (fake included)")
        return lines

    def backlog_table(self) -> List[str]:
        lines = []
        for row in self.rows:
            if row.section != "backlog" or row.name not in self.results:
                continue
            result = self.results[row.name]
            if "skipped" in result or "error" in result:
                lines.append(f"  {row.name}: " + (f"skipped: {result['skipped']}" if "skipped" in result else f"FAILED: {result['error']}"))
                continue
            b = result["backlog"]
            progress = ", ".join(
                f"{float(k) * 100:.0f}%: {v / 1024:.0f}" for k, v in b["rss_by_progress_kb"].items()
            )
            calls = ", ".join(f"{k} {v:.3f}" for k, v in b["store_calls_per_update"].items())
            lines.append(
                f"  {row.name:<20} {b['updates']:,} updates (recorded in {b['record_seconds']:.1f} s) handled in "
                f"{b['seconds']:.1f} s = {b['rate']:,.0f} upd/s; RSS start {b['rss_start_kb'] / 1024:.0f} MB, "
                f"peak {b['rss_peak_kb'] / 1024:.0f} MB, delta {b['rss_delta_kb'] / 1024:+.1f} MB, "
                f"of which after 5% done {b['rss_growth_after_5pct_kb'] / 1024:+.1f} MB "
                f"(RSS MB by progress: {progress}); {_fmt_num(b['statements_per_update'])} stmts/u, "
                f"{_fmt_num(b['commits_per_update'])} commits/u; calls/u: {calls}"
            )
        return lines

    def targets(self) -> List[str]:
        lines: List[str] = []

        def verdict(name: str, value: Optional[float], ok: Optional[bool], detail: str) -> None:
            if ok is None:
                lines.append(f"  SKIP  {name}: {detail}")
            else:
                lines.append(f"  {'PASS' if ok else 'FAIL'}  {name}: {detail}")

        def ratio_goal(name: str, num: str, den: str, goal: float, what: str = "") -> None:
            a, b = self.median(num), self.median(den)
            r = _ratio(a, b)
            verdict(
                name, r, None if r is None else r >= goal,
                f"{num} or {den} not measured" if r is None or a is None or b is None
                else f"{num} {a:,.0f} / {den} {b:,.0f} upd/s = {r:.2f}x (goal {goal:g}x){what}",
            )

        def paired_rows_goal(name: str, num: str, den: str, goal: float) -> None:
            # the median of the ratios of ``num``'s runs to the ``den``-kind runs alternated
            # with them in its process (paired_rows), else the ratio of the two rows' medians;
            # the other figure is shown beside it
            result = self.ok(num)
            paired = None if result is None else result.get("paired_rows")
            if not paired:
                ratio_goal(name, num, den, goal)
                return
            a, b = self.median(num), self.median(den)
            rows = _ratio(a, b)
            rows_text = (None if rows is None or a is None or b is None
                         else f"{num} {a:,.0f} / {den} {b:,.0f} upd/s = {rows:.2f}x")
            r = paired["ratio_median"]
            detail = (
                f"{num} / {den[:-3]} runs alternated in one process: median of "
                f"{len(paired['ratios'])} paired ratios {r:.2f}x (each "
                + ", ".join(f"{x:.2f}" for x in paired["ratios"])
                + f"; {a:,.0f} / {paired['median']:,.0f} upd/s)"
            )
            if rows_text is not None:
                detail += f"; the two rows' medians: {rows_text}"
            verdict(name, r, r >= goal, detail + f" (goal {goal:g}x)")

        def plain_goal(name: str, num: str, goal: float) -> None:
            # against plain PTB polling runs alternated with the row's runs (paired), else
            # against the poll-plain-32 row
            r, plain_rate, _cpu = self.polling_plain(num)
            a = self.median(num)
            result = self.ok(num)
            paired = None if result is None else result.get("paired_plain")
            if r is None or a is None or plain_rate is None:
                verdict(name, None, None, f"{num} or poll-plain-32 not measured")
                return
            if paired:
                row_plain = self.median("poll-plain-32")
                detail = (
                    f"{num} {a:,.0f} upd/s = {r:.2f}x plain PTB polling in the same process "
                    f"(median of {len(paired['ratios'])} paired runs; plain {plain_rate:,.0f} upd/s)"
                )
                if row_plain:
                    detail += f"; vs the poll-plain-32 row ({row_plain:,.0f}): {a / row_plain:.2f}x"
            else:
                detail = f"{num} {a:,.0f} / poll-plain-32 {plain_rate:,.0f} upd/s = {r:.2f}x"
            verdict(name, r, r >= goal, detail + f" (goal {goal:g}x)")

        def extra_commits_goal(name: str, row: str, base: str, why: str) -> None:
            # at most 0.1 commits per update more than the base row, at the driver
            a, b = self.ok(row), self.ok(base)
            ca = None if a is None else a.get("commits_per_update")
            cb = None if b is None else b.get("commits_per_update")
            extra = None if ca is None or cb is None else ca - cb
            verdict(
                f"{name}: <= 0.1 extra commits per update", extra,
                None if extra is None else extra <= 0.1,
                f"{row} or {base} not measured" if extra is None
                else f"{ca:.3f} - {cb:.3f} = {extra:+.3f} commits/update at the driver ({why})",
            )

        def commits_goal(title: str, name: str, limit: float, *, polled: bool = False) -> None:
            # commits per handled update at the driver (and the server's xact_commit) of one row
            result = self.ok(name)
            value = None if result is None else result.get("commits_per_update")
            srv = None if result is None else result.get("server_commits_per_update")
            if value is None:
                detail = f"{name} not measured"
            elif polled:  # a polled batch recorded, claimed and settled in pages
                detail = (f"{value:.3f} commits/update at the driver (1 per "
                          f"{1 / value if value else float('inf'):,.1f} updates; server "
                          f"xact_commit: {_fmt_num(srv, 3)}/update)")
            else:
                detail = (f"{value:.2f} commits/update at the driver (server xact_commit: "
                          f"{_fmt_num(srv)}/update)")
            verdict(title, value, None if value is None else value <= limit, detail)

        def polled_commits_goal(issue: str, store: str) -> None:
            name = f"poll-fenced-{store}-32"
            commits_goal(f"{issue} fenced no-op {store} polling: <= 1 commit per 20 updates ({name})",
                         name, 0.05, polled=True)

        # issue 24: polling again, with the claims bound and ptb_fence's own CPU per update
        for store in ("pg", "sqlite"):
            plain_goal(f"[24] fenced no-op {store} polling >= 0.6x plain PTB polling no-op",
                       f"poll-fenced-{store}-32", 0.6)
        for store in ("pg", "sqlite"):
            polled_commits_goal("[24]", store)
        for store in ("pg", "sqlite"):
            name = f"poll-fenced-{store}-32"
            result = self.ok(name)
            bound = self.claims_bound(32)
            label = f"[24] fenced no-op {store} polling: claims held <= max_concurrent + ingest_claim_buffer"
            if result is None:
                verdict(label, None, None, f"{name} not measured")
                continue
            peak, source = result.get("claims_check_peak"), (
                f"an untimed run of {result.get('claims_check_updates') or 0:,} updates of {name} "
                "after its timed runs, claims tallied exactly in commit order")
            if peak is None:
                peak, source = result.get("claims_peak"), (
                    f"the timed runs of {name}, --claims-exact: their rates are slowed by the tally")
            if peak is None:
                verdict(label, None, None, f"{name}: no exact claims tally (profiled?)")
            else:
                verdict(label, peak, peak <= bound,
                        f"at most {peak} held, bound 32 + {self.claim_buffer} = {bound} ({source})")
        plain_goal("[24] fenced write PG polling >= 0.25x plain PTB polling no-op",
                   "poll-fenced-write-pg-32", 0.25)
        x_write = self.polling_plain("poll-fenced-write-pg-32")[0]
        x_naive = self.polling_plain("poll-naive-pg-32")[0]
        paired = _ratio(x_write, x_naive)
        ratio_goal("[24] fenced write PG polling >= 2x naive PG polling",
                   "poll-fenced-write-pg-32", "poll-naive-pg-32", 2,
                   "" if paired is None else
                   f"; from their paired x plain: {x_write:.2f} / {x_naive:.2f} = {paired:.2f}x")
        def added_cpu_goal(issue: str, store: str, limit: float) -> None:
            # the bot process's CPU per update over the paired plain PTB polling runs'
            name = f"poll-fenced-{store}-32"
            result = self.ok(name)
            cpu = None if result is None else result.get("cpu_us_per_update")
            plain_cpu = self.polling_plain(name)[2]
            added = None if cpu is None or plain_cpu is None else cpu - plain_cpu
            verdict(
                f"{issue} fenced no-op {store} polling: ptb_fence adds <= {limit:g} us CPU/update",
                added, None if added is None else added <= limit,
                f"{name} or its paired plain runs not measured" if added is None
                else f"bot {cpu:,.0f} - plain PTB polling {plain_cpu:,.0f} = {added:+,.0f} us/update "
                f"(the bot process, all threads; medians of the runs)",
            )

        for store in ("pg", "sqlite"):
            added_cpu_goal("[24]", store, 120)

        # issue 36: the same goals with ptb_fence's own CPU per update cut to 80 us
        for store in ("pg", "sqlite"):
            plain_goal(f"[36] fenced no-op {store} polling >= 0.6x plain PTB polling no-op",
                       f"poll-fenced-{store}-32", 0.6)
        for store in ("pg", "sqlite"):
            added_cpu_goal("[36]", store, 80)
        plain_goal("[36] fenced write PG polling >= 0.25x plain PTB polling no-op",
                   "poll-fenced-write-pg-32", 0.25)
        ratio_goal("[36] fenced write PG polling >= 2x naive PG polling",
                   "poll-fenced-write-pg-32", "poll-naive-pg-32", 2,
                   "" if paired is None else
                   f"; from their paired x plain: {x_write:.2f} / {x_naive:.2f} = {paired:.2f}x")

        # issue 39: a step's record costs at most one commit, and concurrent records share one
        step_result = self.ok("steps-pg-32")
        extra = None
        if step_result is not None:
            with_step = step_result["steps"]["1"].get("commits_per_write")
            without = step_result["steps"]["0"].get("commits_per_write")
            if with_step is not None and without is not None:
                extra = with_step - without
        for name, limit in (("[39] a step costs at most one extra commit (PG)", 1.0),
                            ("[39] the records of 32 concurrent steps share commits: "
                             "< 0.5 extra commits per step (PG)", 0.5)):
            verdict(name, extra, None if extra is None else extra <= limit if limit == 1.0
                    else extra < limit,
                    "steps-pg-32 not measured" if extra is None
                    else f"steps-pg-32: {extra:+.3f} commits per write with one step")

        # issue 38: broadcasts keep to Telegram's limit and are never answered 429
        for store in ("sqlite", "pg"):
            name = f"broadcasts-{store}"
            result = self.ok(name)
            share = None if result is None else result.get("rate_share")
            verdict(f"[38] sustained broadcast rate >= 90% of the limit ({name})", share,
                    None if share is None else share >= 0.9,
                    f"{name} not measured" if result is None else
                    f"{result['rate_per_second']:.0f}/s of {result['limit']}/s ({share:.1%}; "
                    f"OutboxPacing keeps 5% below the limit)")
            per_10k = None if result is None else result.get("per_10k_429")
            verdict(f"[38] 429 answers per 10,000 sends = 0 ({name})", per_10k,
                    None if per_10k is None else per_10k == 0,
                    f"{name} not measured" if result is None else
                    f"{result['answered_429']} of {result['sent']:,} sends answered 429")
            commits = None if result is None else result.get("commits_per_sent")
            if commits is not None:
                lines.append(f"  INFO  [38] commits per sent recipient ({name}): {commits:.3f} "
                             "(claims, pace slots and outcomes, at the driver)")

        # issue 37: durable one-off jobs run once, on time, their runs grouped in commits
        for store in ("sqlite", "pg"):
            name = f"jobs-{store}"
            result = self.ok(name)
            if result is None:
                verdict(f"[37] every job ran exactly once ({name})", None, None, f"{name} not measured")
                verdict(f"[37] lateness p99 <= sweep_every_seconds + 1 s ({name})", None, None,
                        f"{name} not measured")
                continue
            verdict(
                f"[37] every job ran exactly once ({name})", None, bool(result["ran_once"]),
                f"{result['jobs_started']:,} of {result['jobs']:,} jobs started, "
                f"{result['runs_started']:,} callback starts, attempts {result['attempts']}, "
                f"fenced rows {result['domain']}, jobs left in the store {result['jobs_left']}",
            )
            p99, limit = result["lateness_ms"]["p99"] / 1000, result["sweep"] + 1.0
            verdict(
                f"[37] lateness p99 <= sweep_every_seconds + 1 s ({name})", p99, p99 <= limit,
                f"p99 {p99:.2f} s, p50 {result['lateness_ms']['p50'] / 1000:.2f} s (sweep "
                f"{result['sweep']:g} s, limit {limit:g} s, {result['jobs']:,} jobs over "
                f"{result['window']:g} s)",
            )
        for store in ("pg", "sqlite"):
            name = f"jobs-{store}"
            result = self.ok(name)
            commits = None if result is None else result.get("commits_per_job")
            title = f"[37] commits per job < 1, runs due together grouped ({name})"
            detail = (f"{name} not measured" if result is None else "not counted (--no-driver-count)"
                      if commits is None else
                      f"{commits:.3f} commits per job at the driver from the Application's start to the "
                      f"last run's completion (1 per {1 / commits if commits else float('inf'):,.1f} "
                      f"jobs; scheduling, one run_once each, not included)")
            if store == "pg":
                verdict(title, commits, None if commits is None else commits < 1, detail)
            else:
                lines.append(f"  INFO  {title}: {detail}")

        elsewhere = []
        for name in ("backlog-sqlite", "backlog-pg", "backlog-write-sqlite", "backlog-write-pg"):
            result = self.ok(name)
            if result is not None:
                elsewhere.append(f"{name} {result['backlog']['rate']:,.0f}")
        for name in ("burst-fenced-sqlite-32", "burst-fenced-pg-32"):
            if self.median(name) is not None:
                elsewhere.append(f"{name} {self.median(name):,.0f}")
        if elsewhere:
            lines.append(
                "  INFO  [24] no regression elsewhere (judge against the README's figures): "
                + ", ".join(elsewhere) + " upd/s"
            )

        # FencedPersistence: a conversation bot against the same bot without persistence
        for store in ("pg", "sqlite"):
            fenced, none = f"poll-conv-fenced-{store}-32", f"poll-conv-none-{store}-32"
            paired_rows_goal(f"[22] FencedPersistence {store} polling >= 0.7x no persistence",
                             fenced, none, 0.7)
            extra_commits_goal(f"[22] FencedPersistence {store}", fenced, none,
                               "the state rides in the completion commit; reads are single "
                               "statements")

        # fenced replies: the outbox against a direct reply after the same fenced write
        for store in ("pg", "sqlite"):
            outbox, direct = f"poll-outbox-{store}-32", f"poll-reply-{store}-32"
            ratio_goal(f"[21] outbox reply {store} polling >= 0.8x a direct reply_text",
                       outbox, direct, 0.8)
            extra_commits_goal(f"[21] outbox reply {store}", outbox, direct,
                               "the calls ride in the completion commit; claims and results "
                               "are grouped")
            a, b = self.ok(outbox), self.ok(direct)
            la = None if a is None else a.get("latency")
            lb = None if b is None else b.get("latency")
            if la and lb:
                lines.append(
                    f"  INFO  [21] reply latency at low load, {store}: outbox p50/p99 "
                    f"{la['p50_ms']:.2f}/{la['p99_ms']:.2f} ms, direct "
                    f"{lb['p50_ms']:.2f}/{lb['p99_ms']:.2f} ms, added "
                    f"{la['p50_ms'] - lb['p50_ms']:+.2f}/{la['p99_ms'] - lb['p99_ms']:+.2f} ms "
                    f"({la['n']} samples; from update_queue.put to the reply's answer)"
                )
            else:
                verdict(f"[21] reply latency at low load, {store}", None, None,
                        f"{outbox} or {direct} not measured")

        # issue 14: polling (the path PTB uses) against the fast fake Bot API, ratios in this run
        plain_goal("[14] fenced write PG polling >= 0.35x plain PTB polling no-op",
                   "poll-fenced-write-pg-32", 0.35)
        ratio_goal("[14] fenced write PG polling >= 2.5x naive PG polling",
                   "poll-fenced-write-pg-32", "poll-naive-pg-32", 2.5)
        fw = self.ok("poll-fenced-write-pg-32")
        cpu = None if fw is None else fw.get("cpu_us_per_update")
        plain_cpu = self.polling_plain("poll-fenced-write-pg-32")[2]
        verdict(
            "[14] fenced write PG polling: bot CPU <= 500 us/update", cpu,
            None if cpu is None else cpu <= 500,
            "poll-fenced-write-pg-32 not measured" if cpu is None
            else f"{cpu:,.0f} us/update in the bot process (plain PTB polling: {_fmt_num(plain_cpu, 0)})",
        )
        plain_goal("[14] fenced write SQLite polling >= 0.45x plain PTB polling no-op",
                   "poll-fenced-write-sqlite-32", 0.45)
        for store in ("pg", "sqlite"):
            plain_goal(f"[14] fenced no-op {store} polling >= 0.8x plain PTB polling no-op",
                       f"poll-fenced-{store}-32", 0.8)
        for store in ("pg", "sqlite"):
            # each row's runs are paired with plain PTB runs in its own process: the ratio of
            # the two rows' x-plain figures cancels the load that changed between the rows
            on, off = f"poll-fenced-metrics-{store}-32", f"poll-fenced-{store}-32"
            r_on, r_off = self.polling_plain(on)[0], self.polling_plain(off)[0]
            r = _ratio(r_on, r_off)
            verdict(
                f"metrics on >= 0.95x metrics off, fenced no-op {store} polling", r,
                None if r is None else r >= 0.95,
                f"{on} or {off} not measured" if r is None
                else f"{on} {r_on:.2f}x plain / {off} {r_off:.2f}x plain = {r:.2f}x (goal 0.95x; "
                f"scraped every second)",
            )
        for store in ("pg", "sqlite"):
            polled_commits_goal("[14]", store)
        for store in ("pg", "sqlite"):
            name = f"backlog-{store}"
            result = self.ok(name)
            b = None if result is None else result.get("backlog")
            verdict(
                f"[14] backlog after a restart, no-op, {store}: >= 3,000 upd/s", None if b is None else b["rate"],
                None if b is None else b["rate"] >= 3000,
                f"{name} not measured" if b is None else f"{b['updates']:,} updates at {b['rate']:,.0f} upd/s",
            )
            verdict(
                f"[14] backlog after a restart, {store}: RSS growth <= 30 MB",
                None if b is None else b["rss_delta_kb"],
                None if b is None else b["rss_delta_kb"] <= 30 * 1024,
                f"{name} not measured" if b is None
                else f"{b['rss_delta_kb'] / 1024:+.1f} MB over {b['updates']:,} updates",
            )

        for store in ("pg", "sqlite"):
            name = f"backlog-write-{store}"
            result = self.ok(name)
            b = None if result is None else result.get("backlog")
            verdict(
                f"[14] backlog after a restart, fenced write, {store}: >= 1,000 upd/s",
                None if b is None else b["rate"],
                None if b is None else b["rate"] >= 1000,
                f"{name} not measured" if b is None else f"{b['updates']:,} updates at {b['rate']:,.0f} upd/s",
            )
        burst = self.ok("burst-fenced-pg-32")
        verdict(
            "[14] webhook burst, 32 producers, fenced PG: >= 3,000 upd/s (burst-fenced-pg-32)",
            None if burst is None else burst["median"],
            None if burst is None else burst["median"] >= 3000,
            "burst-fenced-pg-32 not measured" if burst is None
            else f"{burst['median']:,.0f} upd/s, {_fmt_num(burst.get('commits_per_update'))} commits/update",
        )

        # earlier targets, on the update_queue.put rows
        for fenced_name, how in (("fenced-pg-32", "update_queue.put"),):
            fpg = self.median(fenced_name)
            verdict(
                f"fenced PG conc-32 no-op >= 5,000 upd/s ({fenced_name}, {how})", fpg,
                None if fpg is None else fpg >= 5000,
                f"{fenced_name} not measured" if fpg is None
                else f"{fpg:,.0f} upd/s (ratio {fpg / 5000:.2f} of the target)",
            )
            naive = self.median("naive-pg-32")
            r = _ratio(fpg, naive)
            verdict(
                f"fenced PG conc-32 >= 5x naive ({fenced_name})", r, None if r is None else r >= 5,
                f"{fenced_name} or naive-pg-32 not measured" if r is None or fpg is None or naive is None
                else f"{fpg:,.0f} / {naive:,.0f} = {r:.2f}x",
            )
            pgq = self.ok("pgqueuer-32")
            drain = pgq["drain_median"] if pgq else None
            r = _ratio(fpg, drain)
            if r is None or pgq is None or fpg is None or drain is None:
                detail = "pgqueuer-32: " + self.results.get("pgqueuer-32", {}).get("skipped", "not measured")
                if fpg is None:
                    detail = f"{fenced_name} not measured"
            else:
                detail = (
                    f"{fpg:,.0f} / {drain:,.0f} = {r:.2f}x (vs pgqueuer enqueue+dequeue+complete "
                    f"{pgq['median']:,.0f}: {fpg / pgq['median']:.2f}x)"
                )
            verdict(
                f"fenced PG conc-32 >= 1.5x pgqueuer dequeue+complete ({fenced_name})", r,
                None if r is None else r >= 1.5, detail,
            )
        for fenced_name, plain_name in (("fenced-sqlite-32", "plain-32"),):
            fsq = self.median(fenced_name)
            plain = self.median(plain_name)
            r = _ratio(fsq, plain)
            verdict(
                f"fenced SQLite (synchronous=NORMAL) conc-32 >= 50% of plain PTB ({fenced_name} vs {plain_name})",
                r, None if r is None else r >= 0.5,
                f"{fenced_name} or {plain_name} not measured" if r is None or fsq is None or plain is None
                else f"{fsq:,.0f} / {plain:,.0f} = {r * 100:.0f}%",
            )
        for name in ("fenced-pg-32", "fenced-pg-1"):
            commits_goal(f"<= 1.5 commits per handled update on PostgreSQL ({name})", name, 1.5)
        for row in self.rows:
            if row.kind != "lease":
                continue
            result = self.ok(row.name)
            if result is None:
                verdict(f"lease renewal: 1 statement per tick ({row.store})", None, None,
                        f"{row.name} not measured")
                continue
            items = result["lease"]
            worst = max(i["statements_per_tick"] or 0 for i in items)
            calls = max(i["renewal_calls_per_tick"] for i in items)
            verdict(
                f"lease renewal: 1 statement per tick whatever the number of attempts ({row.store})",
                worst, worst == 1 and calls == 1,
                ", ".join(
                    f"{i['active']:,}: {i['statements_per_tick']} stmt/{i['renewal_calls_per_tick']} call"
                    for i in items
                ),
            )
        for store, limit in (("pg", 5.0), ("sqlite", 2.0)):
            for c in (1, 32):
                name = f"fenced-{store}-{c}"
                result = self.ok(name)
                plain_row = self.ok(f"plain-{c}")
                if result is None or plain_row is None or not result.get("latency") or not plain_row.get("latency"):
                    verdict(f"added latency p99 at low load <= {limit:g} ms ({name})", None, None,
                            f"{name} or plain-{c} not measured")
                    continue
                added = result["latency"]["p99_ms"] - plain_row["latency"]["p99_ms"]
                verdict(
                    f"added latency p99 at low load <= {limit:g} ms ({name})", added, added <= limit,
                    f"p99 {result['latency']['p99_ms']:.2f} ms - plain {plain_row['latency']['p99_ms']:.2f} ms "
                    f"= {added:+.2f} ms (p50 added {result['latency']['p50_ms'] - plain_row['latency']['p50_ms']:+.2f} ms, "
                    f"{result['latency']['n']} samples)",
                )
        return lines


def _processor_options(pairs: List[str]) -> Dict[str, Any]:
    """``--processor-option NAME=VALUE`` pairs as keyword arguments (VALUE parsed as JSON when
    it is JSON, else kept as a string)."""
    options: Dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.isidentifier():
            raise SystemExit(f"--processor-option wants NAME=VALUE, got {pair!r}")
        try:
            options[name] = json.loads(value)
        except ValueError:
            options[name] = value
    return options


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="ptb_fence benchmark harness (see the module docstring for what is measured).",
    )
    parser.add_argument("--quick", action="store_true", help="short run (fewer updates, smaller backlog)")
    parser.add_argument("--only", help="comma-separated row names or globs (e.g. 'fenced-*-32,plain-32')")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.add_argument("--updates", type=int, help="updates per measured run (concurrency > 1)")
    parser.add_argument(
        "--updates-seq", type=int,
        help="updates per measured run of the sequential (concurrency 1) rows; default 30%% of --updates",
    )
    parser.add_argument("--runs", type=int, help="measured runs per row (median reported)")
    parser.add_argument("--warmup", type=int, help="updates of the warm-up run (0: none)")
    parser.add_argument("--latency-seconds", type=float, help="length of the low-load latency phase (0: skip)")
    parser.add_argument("--latency-rate", type=float, default=10.0, help="updates/s of the latency phase")
    parser.add_argument("--backlog", type=int, help="recorded updates of the backlog rows")
    parser.add_argument("--poll-updates", type=int, help="updates per measured run of the poll-* rows")
    parser.add_argument("--poll-chats", type=int, help="distinct chats of the poll-* rows' updates")
    parser.add_argument("--jobs", type=int, help="one-off jobs of the jobs-* rows")
    parser.add_argument("--jobs-window", type=float, help="seconds the jobs-* rows' jobs are due over")
    parser.add_argument(
        "--jobs-sweep", type=float, default=1.0,
        help="sweep_every_seconds of the jobs-* rows (the pump looks every min(1, sweep) s)",
    )
    parser.add_argument("--lease-sizes", default="1,100,5000", help="active attempts of the lease rows")
    parser.add_argument("--concurrency", default="1,32", help="concurrencies of the throughput rows")
    parser.add_argument(
        "--pgq-batch", type=int, default=16,
        help="pgqueuer dequeue batch_size at concurrency > 1 (default 16: the largest it allows "
        "with max_concurrent_tasks=32)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a row's child is killed")
    parser.add_argument(
        "--processor-option", action="append", default=[], metavar="NAME=VALUE",
        help="an option for the rows' FencedUpdateProcessor (VALUE as JSON, else a string), "
        "e.g. ingest_claim_buffer=100000; repeatable",
    )
    parser.add_argument("--profile", metavar="ROW", help="profile one row in its child and print the top costs")
    parser.add_argument("--profiler", choices=("cprofile", "py-spy"), default="cprofile")
    parser.add_argument("--profile-top", type=int, default=30)
    parser.add_argument("--gil", action="store_true", help="py-spy: sample only the thread holding the GIL")
    parser.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    parser.add_argument(
        "--no-driver-count", action="store_true",
        help="do not count statements/commits at the driver (to check the counting's overhead)",
    )
    parser.add_argument(
        "--scale-out", action="store_true",
        help="the scale-out rows only (1 vs --scale-processes bot processes on one PostgreSQL "
        "table) with the per-update PostgreSQL cost rows poll-fenced-pg-32, "
        "poll-fenced-write-pg-32 and poll-naive-pg-32; combines with --only",
    )
    parser.add_argument(
        "--scale-processes", type=int, default=2,
        help="bot processes of the scale-out rows' many-process runs (default 2)",
    )
    parser.add_argument(
        "--claims-exact", action="store_true",
        help="report the most claims a fenced no-op row's process held in the store: the store "
        "proxy runs the calls that grant or end claims one at a time to tally them in commit order "
        "(changes how those calls overlap: measure throughput without it)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--fake-server", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        return child_main(json.loads(args.child))
    if args.fake_server is not None:
        return fake_server_main(args.fake_server)

    settings = dict(QUICK if args.quick else FULL)
    for key in ("updates", "runs", "warmup", "latency_seconds", "backlog", "poll_updates", "poll_chats",
                "jobs", "jobs_window"):
        value = getattr(args, key)
        if value is not None:
            settings[key] = value
    settings["updates_seq"] = (
        args.updates_seq if args.updates_seq is not None else max(1, settings["updates"] * 3 // 10)
    )
    if args.updates is not None and args.poll_updates is None:
        settings["poll_updates"] = args.updates  # --updates alone sizes every row
    if args.scale_processes < 2:
        parser.error("--scale-processes must be at least 2")
    if min(settings["runs"], settings["updates"], settings["updates_seq"], settings["poll_updates"],
           settings["poll_chats"]) < 1:
        parser.error("--runs, --updates, --updates-seq, --poll-updates and --poll-chats must be positive")
    concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    rows = all_rows(concurrencies)

    if args.list:
        for row in rows:
            print(f"{row.name:<28} {row.title}")
        return 0

    selected = rows
    patterns = None
    if args.profile:
        patterns = [args.profile]
    elif args.only or args.scale_out:
        patterns = [p.strip() for p in (args.only or "").split(",") if p.strip()]
        if args.scale_out:
            patterns += SCALE_OUT_ROWS
    if patterns:
        selected = [r for r in rows if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]
        unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(r.name, p) for r in rows)]
        if unknown or not selected:
            parser.error(f"no row matches {', '.join(unknown or patterns)} (see --list)")
        if args.profile and any(r.section == "scaleout" for r in selected):
            # the row's child only coordinates the bot processes: its profile shows none of them
            parser.error("the scaleout-* rows cannot be profiled: profile poll-fenced-pg-32 or "
                         "poll-fenced-write-pg-32 (the same bot, one process)")

    from _common import create_bench_database, drop_bench_database, pg_dsn, pg_problem

    admin_dsn = pg_dsn()
    needs_pg = any(r.needs_pg for r in selected)
    problem = pg_problem(admin_dsn) if needs_pg else None
    started = time.monotonic()
    print("ptb_fence benchmarks" + (" (--quick)" if args.quick else ""))
    for line in _versions(admin_dsn, needs_pg and problem is None):
        print("  " + line)
    print(
        f"  settings: {settings['updates']:,} updates per run ({settings['updates_seq']:,} for the "
        f"sequential rows), {settings['runs']} measured runs + a "
        f"{settings['warmup']}-update warm-up per row, batches of 100 via update_queue.put; latency "
        f"{args.latency_rate:g} updates/s for {settings['latency_seconds']:g} s; SQLite synchronous=NORMAL "
        f"(the default), WAL; PostgresUpdateStore library defaults (pool_size=8); other options defaults"
    )
    print(
        f"  polling rows: {settings['poll_updates']:,} updates per run over {settings['poll_chats']} chats, "
        f"start_polling(poll_interval=0, timeout=1) against a fake Bot API in its own process that "
        f"holds them all before the clock starts (fast server: pre-serialised getUpdates pages of 100, "
        f"HTTP/1.1 keep-alive); no latency phase"
    )
    sys.stdout.flush()

    # a SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C: the private database is dropped and
    # the running child is killed by subprocess.run
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    bench_dsn, bench_db, db_note = admin_dsn, None, None
    if needs_pg and problem is None:
        bench_dsn, bench_db, db_note = create_bench_database(admin_dsn)
        if db_note:
            print("  note: " + db_note)
    workdir = tempfile.mkdtemp(prefix="ptb_fence_bench_")
    results: Dict[str, Dict[str, Any]] = {}
    try:
        for row in selected:
            if row.needs_pg and problem:
                results[row.name] = {"skipped": problem}
                continue
            cfg: Dict[str, Any] = {
                "row": row.name,
                "kind": row.kind,
                "store": row.store,
                "concurrency": row.concurrency,
                "producers": row.producers,
                "updates": (
                    settings["poll_updates"] if row.section in ("polling", "scaleout")
                    else settings["updates"] if row.concurrency != 1 else settings["updates_seq"]
                ),
                "chats": settings["poll_chats"],
                "server": row.server,
                "runs": settings["runs"],
                "warmup": settings["warmup"],
                "latency_seconds": settings["latency_seconds"],
                "latency_rate": args.latency_rate,
                "backlog": settings["backlog"],
                "lease_sizes": [int(s) for s in args.lease_sizes.split(",") if s.strip()],
                "pgq_batch": args.pgq_batch,
                "dsn": bench_dsn,
                "admin_dsn": admin_dsn,
                "bench_db": bench_db,
                "workdir": workdir,
                "run_py": os.path.abspath(__file__),
                "driver_count": not args.no_driver_count,
                "timeout": args.timeout,
                "processor_options": _processor_options(args.processor_option),
                "processes": args.scale_processes,
                "claims_exact": args.claims_exact,
                "jobs": settings["jobs"],
                "window": settings["jobs_window"],
                "broadcast_recipients": settings["broadcast_recipients"],
                "broadcast_limit": settings["broadcast_limit"],
                "sweep": args.jobs_sweep,
                # the fenced no-op polling rows' claims bound, from one untimed exact-tally run
                "claims_check": row.kind == "poll-fenced" and not args.profile,
            }
            env_extra = {}
            if row.kind == "pgqueuer":
                env_extra["PGQUEUER_PREFIX"] = "bench" + uuid.uuid4().hex[:8] + "_"
            if args.profile:
                cfg["profile"] = args.profiler
                cfg["profile_top"] = args.profile_top
                cfg["profile_gil"] = args.gil
            t0 = time.monotonic()
            sys.stderr.write(f"[{time.monotonic() - started:6.1f}s] {row.name} ...")
            sys.stderr.flush()
            result = _run_child(cfg, args.timeout, env_extra)
            results[row.name] = result
            status = "skipped" if "skipped" in result else ("FAILED" if "error" in result else "done")
            sys.stderr.write(f" {status} in {time.monotonic() - t0:.1f}s\n")
            sys.stderr.flush()
    finally:
        if bench_db and db_note is None:
            try:
                drop_bench_database(admin_dsn, bench_db)
            except Exception as exc:
                print(f"  note: could not drop database {bench_db}: {exc}")
        shutil.rmtree(workdir, ignore_errors=True)

    report = Report(
        selected, results,
        int(_processor_options(args.processor_option).get("ingest_claim_buffer", 8)),
    )
    print()
    print("THROUGHPUT (median of runs; ratios use medians; '-' = not applicable or not measured)")
    for line in report.throughput_table():
        print(line)
    for line in LEGEND:
        print(line)
    polling = report.polling_table()
    if polling:
        print()
        print(
            "POLLING (start_polling against a fake Bot API in its own process; median of runs; "
            "ratios and CPU in the same run)"
        )
        for line in polling:
            print(line)
        for line in POLLING_LEGEND:
            print(line)
    extra = report.breakdown()
    if extra:
        print()
        print("store calls per handled update, by method (proxy), and notes:")
        for line in extra:
            print(line)
    scaleout = report.scaleout_table()
    if scaleout:
        print()
        print(
            "SCALE-OUT: PostgreSQL's cost per fenced update, and how many bot processes one PostgreSQL "
            "core can feed at that cost"
        )
        for line in scaleout:
            print(line)
        for line in SCALE_OUT_LEGEND:
            print(line)
    lease = report.lease_table()
    if lease:
        print()
        print("LEASE RENEWAL: keeper.tick() with N active attempts (Runtime.claim'ed; statements at the driver)")
        for line in lease:
            print(line)
    steps = report.steps_table()
    if steps:
        print()
        print("STEPS: the cost of attempt.step (its read and its fenced record) before a fenced write")
        for line in steps:
            print(line)
    broadcasts = report.broadcasts_table()
    if broadcasts:
        print()
        print("BROADCASTS: one broadcast through FakeBotApi enforcing a global limit, paced in "
              "the store")
        for line in broadcasts:
            print(line)
    jobs = report.jobs_table()
    if jobs:
        print()
        print("JOBS: one-off durable jobs (FencedJobQueue.run_once) due over a window, each run a "
              "fenced write that completes it")
        for line in jobs:
            print(line)
        for line in JOBS_LEGEND:
            print(line)
    backlog = report.backlog_table()
    if backlog:
        print()
        print("BACKLOG: recorded with add_many, then a FencedUpdateProcessor app started over it (no polling)")
        for line in backlog:
            print(line)
    print()
    print("TARGETS")
    for line in report.targets():
        print(line)
    for row in selected:
        result = results.get(row.name, {})
        if result.get("profile"):
            print()
            print(f"PROFILE of {row.name}")
            print(result["profile"])
    print()
    print(f"total time {time.monotonic() - started:.0f} s; load average at the end: {_load()}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"settings": settings, "results": results}, handle, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
