"""Backlog drain (issue 14 item 2): how fast a fenced front end works off updates recorded
while no process ran, and how much memory that takes.

Usage (from the repository root)::

    python benchmarks/backlog.py                         # 20,000 updates, SQLite and PostgreSQL
    python benchmarks/backlog.py --updates 100000
    python benchmarks/backlog.py --updates 200 --stores sqlite --fronts intake   # smoke

Each case runs in a fresh subprocess: ``--updates`` updates over 200 chats are recorded
``pending`` (received an hour ago) with ``add_many``, then the front end starts with the
library defaults (``max_concurrent`` 32, lease 120 s, sweep 30 s) and a no-op fenced handler:

* ``ptb``: a :class:`~ptb_fence.ptb.FencedUpdateProcessor` inside a real PTB Application
  polling an empty :class:`ptb_fence.testing.FakeBotApi`; the sweep hands the backlog over;
* ``intake``: an :class:`~ptb_fence.UpdateIntake` with ``handle_attempt``.

Columns: updates per second from the start until every row is ``completed``; the resident
memory growth of the process over that time (peak VmRSS minus VmRSS right before the start).
PostgreSQL comes from ``PTB_FENCE_POSTGRES_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/test``); each case uses a table of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

# PTB_FENCE_ROOT: measure another checkout (e.g. main, for a before/after comparison)
ROOT = os.environ.get("PTB_FENCE_ROOT") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
CHATS = 200
CHUNK = 1000


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Peak:
    """Samples VmRSS every 20 ms in a thread; :attr:`peak` is the highest seen."""

    def __init__(self) -> None:
        self.base = _rss_kib()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_kib())

    def stop(self) -> float:
        """Stop sampling; the growth in MB."""
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_kib())
        return (self.peak - self.base) / 1024


def _open(kind: str, workdir: str) -> "tuple[Any, Callable[[], int], Callable[[], None]]":
    """The store, a counter of completed rows, and a clean-up."""
    if kind == "sqlite":
        import sqlite3

        from ptb_fence import SQLiteUpdateStore

        path = os.path.join(workdir, "backlog.db")
        store = SQLiteUpdateStore(path)
        reader = sqlite3.connect(path, timeout=30, check_same_thread=False)

        def completed() -> int:
            return int(reader.execute(
                "SELECT count(*) FROM telegram_updates WHERE state = 'completed'"
            ).fetchone()[0])

        return store, completed, reader.close
    import psycopg2

    from ptb_fence import PostgresUpdateStore

    dsn = os.environ.get("PTB_FENCE_POSTGRES_DSN", DEFAULT_DSN)
    table = f"bench_backlog_{uuid.uuid4().hex[:10]}"
    store = PostgresUpdateStore(dsn, table)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True

    def count() -> int:
        with conn.cursor() as cur:
            cur.execute(f'SELECT count(*) FROM "{table}" WHERE state = \'completed\'')
            return int(cur.fetchone()[0])

    def drop() -> None:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{table}"')
        conn.close()

    return store, count, drop


def _record(store: Any, updates: int) -> None:
    from ptb_fence.testing import make_message_update

    long_ago = int(time.time() * 1000) - 3_600_000
    for start in range(1, updates + 1, CHUNK):
        rows = [
            (u, json.dumps(make_message_update(u, chat_id=1 + u % CHATS, text="b")), long_ago)
            for u in range(start, min(start + CHUNK, updates + 1))
        ]
        assert all(store.add_many(rows))


def _wait(completed: Callable[[], int], updates: int, cap: float) -> bool:
    deadline = time.monotonic() + cap
    while time.monotonic() < deadline:
        if completed() >= updates:
            return True
        time.sleep(0.05)
    return False


def _drain_intake(store: Any, completed: Callable[[], int], updates: int, cap: float) -> bool:
    from ptb_fence import UpdateIntake

    intake = UpdateIntake(store, handle_attempt=lambda update, attempt: None)
    try:
        intake.start()
        return _wait(completed, updates, cap)
    finally:
        intake.close()


def _drain_ptb(store: Any, completed: Callable[[], int], updates: int, cap: float) -> bool:
    from telegram.ext import Application, TypeHandler

    from ptb_fence.ptb import FencedUpdateProcessor
    from ptb_fence.testing import FakeBotApi

    async def noop(update: Any, context: Any) -> None:
        return None

    async def main(fake: Any) -> bool:
        processor = FencedUpdateProcessor(store)
        builder = Application.builder().token(fake.token).base_url(fake.base_url)
        app = processor.install(builder).build()
        app.add_handler(TypeHandler(object, noop))
        async with app:
            await app.start()
            assert app.updater is not None
            await app.updater.start_polling(poll_interval=0.0, timeout=1)
            try:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(None, _wait, completed, updates, cap)
            finally:
                await app.updater.stop()
                await app.stop()

    with FakeBotApi() as fake:
        return asyncio.run(main(fake))


def run_case(kind: str, front: str, updates: int, cap: float) -> Dict[str, Any]:
    """One case in this process: record, drain, measure."""
    with tempfile.TemporaryDirectory(prefix="ptb_fence_backlog_") as workdir:
        store, completed, clean = _open(kind, workdir)
        try:
            _record(store, updates)
            peak = Peak()
            started = time.perf_counter()
            drain = _drain_ptb if front == "ptb" else _drain_intake
            done = drain(store, completed, updates, cap)
            seconds = time.perf_counter() - started
            growth = peak.stop()
            handled = completed()
        finally:
            store.close()
            clean()
    return {
        "store": kind, "front": front, "updates": updates, "completed": handled,
        "done": done, "seconds": round(seconds, 2),
        "per_second": round(handled / seconds) if seconds > 0 else 0,
        "rss_growth_mb": round(growth, 1),
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--fronts", default="ptb,intake")
    parser.add_argument("--cap", type=float, default=900.0, help="seconds per case at most")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # store:front, in a subprocess
    args = parser.parse_args(argv)
    if args.case:
        kind, front = args.case.split(":")
        print(json.dumps(run_case(kind, front, args.updates, args.cap)))
        return 0
    print(f"{'store':<9} {'front':<7} {'updates':>8} {'seconds':>8} {'upd/s':>7} "
          f"{'RSS +MB':>8}  done")
    failed = False
    for kind in args.stores.split(","):
        for front in args.fronts.split(","):
            proc = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--case", f"{kind}:{front}",
                 "--updates", str(args.updates), "--cap", str(args.cap)],
                cwd=ROOT, capture_output=True, text=True, timeout=args.cap + 300,
            )
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not lines:
                print(f"{kind:<9} {front:<7} failed: {proc.stderr.strip()[-400:]}")
                failed = True
                continue
            row = json.loads(lines[-1])
            failed = failed or not row["done"]
            print(f"{kind:<9} {front:<7} {row['updates']:>8} {row['seconds']:>8.2f} "
                  f"{row['per_second']:>7} {row['rss_growth_mb']:>8.1f}  "
                  f"{'yes' if row['done'] else 'NO (' + str(row['completed']) + ')'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
