"""Instructions per update, counted by valgrind: a deterministic figure for A/B comparisons.

On a shared or throttled machine the throughput and CPU figures of ``run.py`` move by tens of
percent between minutes, more than most single changes to the code. The number of machine
instructions the bot process executes per update does not: it is counted (``valgrind
--tool=cachegrind --cache-sim=no``), not timed, and two runs of the same code agree to about
0.3 %. It does not see what is not an instruction of the process (kernel time: thread wake-ups,
file and socket I/O; cache misses; waiting for the GIL), so it bounds what a change can win,
and tells whether it won anything, but it is not a throughput.

Each row is one real ``Application`` polling the fast fake Bot API (``_fast_server.py``, its
own process, not counted) with ``max_concurrent`` 32, run twice under valgrind (N1 and N2
updates over 200 chats); the figure is (I(N2) - I(N1)) / (N2 - N1), so start-up and shutdown
cancel out::

    python benchmarks/instructions.py                 # all rows, ~3 min
    python benchmarks/instructions.py --only fenced-sqlite,plain
    python benchmarks/instructions.py --pythonpath /path/to/other/checkout   # A/B

Rows: ``plain`` (PTB, no-op), ``fenced-sqlite`` (``FencedUpdateProcessor``, SQLite, no-op),
``fenced-pg`` (PostgreSQL; only the bot process's instructions: the server is another
process), ``conv-none``, ``conv-pickle`` and ``conv-fenced`` (a ``ConversationHandler`` that
changes ``user_data`` per update, under ``FencedUpdateProcessor`` on SQLite, without
persistence, with ``PicklePersistence`` and with ``FencedPersistence``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))

ROWS = ("plain", "fenced-sqlite", "fenced-pg", "conv-none", "conv-pickle", "conv-fenced")

_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def _child(row: str, count: int, dsn: Optional[str]) -> None:
    """One polling run of ``row`` until ``count`` updates were handled (and completed)."""
    from telegram import Update
    from telegram.ext import (
        Application,
        ConversationHandler,
        MessageHandler,
        PicklePersistence,
        TypeHandler,
        filters,
    )

    if row == "conv-fenced":
        # Under valgrind the bot runs some 50 times slower, so FencedPersistence's state read
        # ahead of an update (used only within PREFETCH_MAX_AGE, 1 s) ages out before the
        # update starts, and each attempt reads its state again: a path the timed rows never
        # take (they count about one read per 19 updates) that added some 190 k instructions
        # per update. The limit is lengthened here, in the counting child only, so that the
        # count is of the code that runs at full speed.
        from ptb_fence.ptb import _persistence

        _persistence.PREFETCH_MAX_AGE = 600.0
    server = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "_fast_server.py"),
         json.dumps({"count": count, "chats": 200})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert server.stdout is not None
    info = json.loads(server.stdout.readline())
    workdir = tempfile.mkdtemp(prefix="ptb-fence-instr-")
    conversation = row.startswith("conv-")
    handled = 0

    async def main() -> None:
        nonlocal handled
        done = asyncio.Event()
        builder = Application.builder().token(info["token"]).base_url(info["base_url"])
        store: Any = None
        if row == "plain":
            builder.concurrent_updates(32)
        else:
            from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore
            from ptb_fence.ptb import FencedPersistence, FencedUpdateProcessor

            if row == "fenced-pg":
                store = PostgresUpdateStore(dsn, f"bench_instr_{os.getpid()}")
            else:
                store = SQLiteUpdateStore(os.path.join(workdir, "bench.sqlite3"))
            processor = FencedUpdateProcessor(store, max_concurrent=32)
            builder = processor.install(builder)
            if row == "conv-fenced":
                builder.persistence(FencedPersistence(store))
        if row == "conv-pickle":
            builder.persistence(PicklePersistence(os.path.join(workdir, "bench.pickle")))
        app = builder.build()

        async def handler(update: Any, context: Any) -> Optional[int]:
            nonlocal handled
            if conversation:
                context.user_data["n"] = context.user_data.get("n", 0) + 1
            handled += 1
            if handled >= count:
                done.set()
            return 1 if conversation else None

        if conversation:
            app.add_handler(ConversationHandler(
                entry_points=[MessageHandler(filters.TEXT, handler)],
                states={1: [MessageHandler(filters.TEXT, handler)]},
                fallbacks=[], name="talk", persistent=row != "conv-none",
            ))
        else:
            app.add_handler(TypeHandler(Update, handler))
        async with app:
            await app.start()
            assert app.updater is not None
            await app.updater.start_polling(poll_interval=0.0, timeout=1)
            await done.wait()
            if store is not None:  # until the last completion is in the store
                for _ in range(1000):
                    if _completed(row, workdir, dsn) >= count:
                        break
                    await asyncio.sleep(0.01)
            await app.updater.stop()
            await app.stop()

    try:
        asyncio.run(main())
    finally:
        if row == "fenced-pg":
            _drop_pg(dsn)
        assert server.stdin is not None
        server.stdin.close()
        server.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _completed(row: str, workdir: str, dsn: Optional[str]) -> int:
    """Rows completed in the row's table (a connection of its own)."""
    if row == "fenced-pg":
        import psycopg2

        conn = psycopg2.connect(dsn)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM bench_instr_{os.getpid()} "
                            "WHERE state = 'completed'")
                return int(cur.fetchone()[0])
        finally:
            conn.close()
    import sqlite3

    conn3 = sqlite3.connect(os.path.join(workdir, "bench.sqlite3"))
    try:
        return int(conn3.execute(
            "SELECT count(*) FROM telegram_updates WHERE state = 'completed'").fetchone()[0])
    finally:
        conn3.close()


def _drop_pg(dsn: Optional[str]) -> None:
    import psycopg2

    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS bench_instr_{os.getpid()} CASCADE")
            cur.execute(f"DROP TABLE IF EXISTS bench_instr_{os.getpid()}_outbox CASCADE")
            cur.execute(f"DROP TABLE IF EXISTS bench_instr_{os.getpid()}_persistence CASCADE")
    finally:
        conn.close()


def _count(row: str, count: int, env: Dict[str, str], dsn: Optional[str]) -> int:
    """Instructions of one child run under cachegrind."""
    python = os.path.realpath(sys.executable)  # not a shim script: valgrind must run Python
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
           python, os.path.abspath(__file__), "--child", row, str(count)]
    if dsn:
        cmd += ["--dsn", dsn]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    found = _REFS.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{row} ({count} updates) failed:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(r for r in ROWS if r != "fenced-pg"),
                        help=f"comma-separated rows of {', '.join(ROWS)} (default: all but "
                             "fenced-pg)")
    parser.add_argument("--updates", default="600,1800", help="N1,N2 (default 600,1800)")
    parser.add_argument("--pythonpath", default=None,
                        help="import ptb_fence from this checkout (A/B against another tree)")
    parser.add_argument("--dsn", default=os.environ.get(
        "PTB_FENCE_POSTGRES_DSN", "host=127.0.0.1 user=postgres dbname=test"))
    parser.add_argument("--child", nargs=2, metavar=("ROW", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]), args.dsn)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    rows = [r.strip() for r in args.only.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        print(f"unknown rows {unknown}; the rows are {', '.join(ROWS)}", file=sys.stderr)
        return 2
    n1, n2 = (int(x) for x in args.updates.split(","))
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = os.path.abspath(args.pythonpath) + os.pathsep + env.get("PYTHONPATH", "")
    source = args.pythonpath or os.path.dirname(HERE)
    print(f"instructions per update (valgrind cachegrind; ({n2} - {n1}) updates), ptb_fence "
          f"from {source}")
    results: Dict[str, float] = {}
    for row in rows:
        low, high = _count(row, n1, env, args.dsn), _count(row, n2, env, args.dsn)
        results[row] = (high - low) / (n2 - n1)
        print(f"  {row:<14} {results[row] / 1e6:7.3f} M", flush=True)
    plain = results.get("plain")
    lines: List[str] = []
    for row, value in results.items():
        if plain and row != "plain" and not row.startswith("conv-"):
            lines.append(f"  {row}: plain / row = {plain / value:.2f}; ptb_fence adds "
                         f"{(value - plain) / 1e3:,.0f} k per update")
    if "conv-fenced" in results and "conv-none" in results:
        lines.append(f"  conv-fenced: conv-none / conv-fenced = "
                     f"{results['conv-none'] / results['conv-fenced']:.2f}; FencedPersistence adds "
                     f"{(results['conv-fenced'] - results['conv-none']) / 1e3:,.0f} k per update")
    if "conv-pickle" in results and "conv-none" in results:
        lines.append(f"  conv-pickle: PTB's persistence bookkeeping adds "
                     f"{(results['conv-pickle'] - results['conv-none']) / 1e3:,.0f} k per update")
    if lines:
        print("ratios (instructions, not throughput: see the module docstring)")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
