"""Recovery measurements (issue 12): how long until every update is handled after a signal.

Usage (from the repository root)::

    python benchmarks/recovery.py            # every scenario, SQLite and PostgreSQL
    python benchmarks/recovery.py --quick    # fewer updates, SQLite and PostgreSQL (smoke)
    python benchmarks/recovery.py --only sigkill-restart --stores sqlite

Each scenario runs real PTB bot processes (``tests/ptb_bot_worker.py``: a
``FencedUpdateProcessor`` with the library defaults, lease 120 s and sweep 30 s; handler: 50 ms
+ one fenced INSERT with ``run_in_transaction(..., complete=True)``) against a
:class:`ptb_fence.testing.FakeBotApi`, ``--updates`` updates over 30 chats; the signal comes
after about a third of them were handled, and a new process is started right away.

Columns: seconds from the signal until every update is handled; updates that waited for a
lapsed lease (handled more than 90 % of a lease after the signal); lost (not handled within
``--cap`` seconds); duplicates (more than one fenced domain row for an update).
PostgreSQL comes from ``PTB_FENCE_POSTGRES_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/test``).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
WORKER = os.path.join(ROOT, "tests", "ptb_bot_worker.py")
LEASE = 120.0
DEFAULTS = ["--lease", "120", "--sweep", "30", "--grace", "60", "--max-life", "600",
            "--max-concurrent", "32", "--slow", "w", "--slow-seconds", "0.05"]
SCENARIOS = ["sigterm-burst", "sigint-stream", "sigterm-backlog", "sigkill-restart",
             "sigkill-second", "hung-handler"]

from ptb_fence.testing import FakeBotApi  # noqa: E402


class Store:
    """One store under test: its URL for the worker, its table, domain table and readers."""

    def __init__(self, kind: str, workdir: str) -> None:
        self.kind = kind
        if kind == "sqlite":
            self.path = os.path.join(workdir, "bot.db")
            self.url = "sqlite:///" + self.path
            self.table, self.domain = "telegram_updates", "domain"
            from ptb_fence import SQLiteUpdateStore

            store = SQLiteUpdateStore(self.path)
            with store.transaction() as conn:
                conn.execute("CREATE TABLE domain (update_id INTEGER, attempt INTEGER, "
                             "claim_id TEXT, pid INTEGER)")
            store.close()
        else:
            import psycopg2

            from ptb_fence import PostgresUpdateStore

            self.url = os.environ.get("PTB_FENCE_POSTGRES_DSN",
                                      "postgresql://postgres@127.0.0.1:5432/test")
            suffix = uuid.uuid4().hex[:10]
            self.table, self.domain = f"bench_rec_{suffix}", f"bench_dom_{suffix}"
            PostgresUpdateStore(self.url, self.table).close()
            self.conn = psycopg2.connect(self.url)
            self.conn.autocommit = True
            self._q(f"CREATE TABLE {self.domain} (update_id BIGINT, attempt INT, claim_id TEXT, pid INT)")

    def _q(self, sql: str) -> List[Any]:
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.path, timeout=10)
            try:
                return list(conn.execute(sql))
            finally:
                conn.close()
        with self.conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall()) if cur.description else []

    def completed(self) -> Dict[int, int]:
        """``{update_id: settled_at_ms}`` of completed rows."""
        return {r[0]: r[1] for r in self._q(
            f"SELECT update_id, settled_at FROM {self.table} WHERE state = 'completed'")}

    def domain_counts(self) -> Dict[int, int]:
        return {r[0]: r[1] for r in self._q(
            f"SELECT update_id, COUNT(*) FROM {self.domain} GROUP BY update_id")}

    def drop(self) -> None:
        if self.kind != "sqlite":
            self._q(f"DROP TABLE IF EXISTS {self.table}")
            self._q(f"DROP TABLE IF EXISTS {self.domain}")
            self.conn.close()


class Run:
    """The processes of one scenario."""

    def __init__(self, fake: FakeBotApi, store: Store, workdir: str) -> None:
        self.fake, self.store, self.dir = fake, store, workdir
        self.procs: List[Any] = []

    def spawn(self, *extra: str) -> Any:
        out = open(os.path.join(self.dir, f"out.{len(self.procs)}"), "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, WORKER, self.fake.base_url, self.fake.token, self.store.url,
             self.store.table, "--dir", self.dir, "--domain", self.store.domain, *DEFAULTS,
             *extra], stdout=out, stderr=subprocess.STDOUT)
        out.close()
        self.procs.append(proc)
        return proc

    def ready(self, proc: Any, timeout: float = 60) -> None:
        _wait(lambda: os.path.exists(os.path.join(self.dir, f"ready.{proc.pid}")), timeout)

    def end(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _wait(predicate: Callable[[], Any], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def scenario(name: str, kind: str, updates: int, cap: float) -> Tuple[float, int, int, int]:
    workdir = tempfile.mkdtemp(prefix="ptb_fence_recovery_")
    store = Store(kind, workdir)
    try:
        with FakeBotApi() as fake:
            run = Run(fake, store, workdir)
            try:
                return _scenario(name, run, updates, cap)
            finally:
                run.end()
    finally:
        store.drop()
        shutil.rmtree(workdir, ignore_errors=True)


def _scenario(name: str, run: Run, updates: int, cap: float) -> Tuple[float, int, int, int]:
    fake, store = run.fake, run.store
    backlog = updates * 7 if name == "sigterm-backlog" else updates
    stream = name == "sigint-stream"
    first_n = updates // 3 if stream else backlog
    ids = [fake.inject_message(chat_id=1 + i % 30, text="w") for i in range(first_n)]
    hang_id: Optional[int] = None
    extra: List[str] = []
    if name == "hung-handler":
        hang_id = fake.inject_message(chat_id=31, text="hang")
        ids.append(hang_id)
        extra = ["--hang", "hang"]
    second: Optional[Any] = None
    if name == "sigkill-second":
        second = run.spawn()
        run.ready(second)
        first = run.spawn("--poll", *extra)
    elif name.startswith("sigkill"):
        first = run.spawn("--poll", *extra)
    else:
        first = run.spawn("--run-polling", *extra)
    run.ready(first)
    feeding = threading.Event()
    fed: List[int] = []
    if stream:
        def feed() -> None:
            for i in range(updates - first_n):
                if feeding.is_set():
                    return
                fed.append(fake.inject_message(chat_id=1 + i % 30, text="w"))
                time.sleep(0.005)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
    _wait(lambda: len(store.completed()) >= min(100, updates // 3), cap)
    sig = {"sigterm": signal.SIGTERM, "sigint": signal.SIGINT, "sigkill": signal.SIGKILL,
           "hung": signal.SIGTERM}[name.split("-")[0]]
    signalled = time.time()
    first.send_signal(sig)
    first.wait(cap)
    if stream:
        feeder.join(cap)
        ids += fed
    run.spawn("--run-polling")  # the next process, at once
    _wait(lambda: set(store.completed()) >= set(ids), cap)
    done = store.completed()
    took = (max(done[u] for u in ids if u in done) / 1000.0 - signalled) if done else float("nan")
    lost = sum(1 for u in ids if u not in done)
    waited = sum(1 for u in ids if u in done and done[u] / 1000.0 - signalled > 0.9 * LEASE)
    dups = sum(1 for c in store.domain_counts().values() if c > 1)
    return took, waited, lost, dups


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60 updates, cap 60 s")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--cap", type=float, default=200.0, help="seconds to wait for each")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--only", default=",".join(SCENARIOS))
    args = parser.parse_args(argv)
    if args.quick:
        args.updates, args.cap = 60, 60.0
    print(f"{'scenario':<18} {'store':<9} {'signal->all handled':>20} {'waited for lease':>17} "
          f"{'lost':>5} {'dups':>5}")
    failed = False
    for name in args.only.split(","):
        for kind in args.stores.split(","):
            took, waited, lost, dups = scenario(name, kind, args.updates, args.cap)
            failed |= bool(lost or dups)
            print(f"{name:<18} {kind:<9} {took:>18.1f} s {waited:>17} {lost:>5} {dups:>5}",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
