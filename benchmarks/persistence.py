"""What FencedPersistence costs: a conversation bot (a persistent ConversationHandler whose
every update changes ``user_data``) under FencedUpdateProcessor, with FencedPersistence, with
PTB's PicklePersistence, and without persistence, on SQLite and PostgreSQL.

Usage (from the repository root)::

    python benchmarks/persistence.py                       # 2000 updates, concurrency 32
    python benchmarks/persistence.py --updates 5000 --users 500 --repeat 3

Each row builds a fresh store (a new SQLite file; a new PostgreSQL table in a private database
made for the run, so that ``pg_stat_database.xact_commit`` counts only the run's transactions),
a fresh ``FencedUpdateProcessor(max_concurrent=32)`` and Application, and feeds the updates the
way PTB's polling does (``await app.update_queue.put(update)``); it is timed from the first put
until the store holds no unsettled row. Reported: updates per second (median of the repeats),
the ratio to the no-persistence row of the same store, and for PostgreSQL the server's
transactions per update (reads included: FencedPersistence reads each update's state in one
transaction of its own; its writes ride the completion's commit). PostgreSQL comes from
``PTB_FENCE_POSTGRES_DSN``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from telegram import Update  # noqa: E402
from telegram.ext import (  # noqa: E402
    Application,
    CommandHandler,
    ConversationHandler,
    MessageHandler,
    PicklePersistence,
    filters,
)

from _common import (  # noqa: E402
    create_bench_database,
    drop_bench_database,
    pg_dsn,
    pg_problem,
    server_commits,
)
from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore  # noqa: E402
from ptb_fence.ptb import FencedPersistence, FencedUpdateProcessor  # noqa: E402
from ptb_fence.testing import make_message_update  # noqa: E402

KINDS = ("none", "pickle", "fenced")
TOKEN = "123456:ABCdefGhIJKlmnoPQRstuvWXyz012345678"


def updates(count: int, users: int) -> List[Dict[str, Any]]:
    """Per user a ``/start`` first, then texts, round robin over ``users`` private chats."""
    out = []
    for i in range(count):
        user = 1 + i % users
        text = "/start" if i < users else f"step {i}"
        out.append(make_message_update(1 + i, user, text, message_id=1 + i // users))
    return out


async def run_row(store: Any, kind: str, bodies: List[Dict[str, Any]], directory: str,
                  fake: Any) -> float:
    """Handle ``bodies`` once; the seconds from the first put until nothing is unsettled."""

    async def start(update: Any, context: Any) -> int:
        context.user_data["n"] = 0
        return 1

    async def step(update: Any, context: Any) -> int:
        context.user_data["n"] = context.user_data.get("n", 0) + 1
        return 1

    processor = FencedUpdateProcessor(store, max_concurrent=32)
    builder = processor.install(Application.builder().token(fake.token).base_url(fake.base_url))
    if kind == "pickle":
        builder = builder.persistence(PicklePersistence(os.path.join(directory, "p.pickle")))
    elif kind == "fenced":
        builder = builder.persistence(FencedPersistence(store))
    app = builder.build()
    app.add_handler(ConversationHandler(
        entry_points=[CommandHandler("start", start)],
        states={1: [MessageHandler(filters.TEXT & ~filters.COMMAND, step)]},
        fallbacks=[], name="talk", persistent=kind != "none"))
    async with app:
        await app.start()
        objects = [Update.de_json(body, app.bot) for body in bodies]
        began = time.perf_counter()
        for update in objects:
            await app.update_queue.put(update)
        while True:
            figures = store.figures()
            if figures.unsettled == 0 and len(store.due(now=0, pending_before=0, limit=1)) == 0:
                break
            await asyncio.sleep(0.01)
        took = time.perf_counter() - began
        await app.stop()
    return took


def measure(kind: str, store_kind: str, args: argparse.Namespace, dsn: Optional[str],
            dbname: Optional[str]) -> Tuple[float, Optional[float]]:
    """``(updates per second, server transactions per update or None)`` of one repeat."""
    from ptb_fence.testing import FakeBotApi

    bodies = updates(args.updates, args.users)
    with tempfile.TemporaryDirectory() as directory, FakeBotApi() as fake:
        if store_kind == "sqlite":
            store: Any = SQLiteUpdateStore(os.path.join(directory, "bench.db"))
        else:
            assert dsn is not None
            store = PostgresUpdateStore(dsn, "bench_" + uuid.uuid4().hex[:10])
        store.due(now=0, pending_before=0, limit=1)  # the schema, before counting
        before = server_commits(pg_dsn(), dbname) if store_kind == "postgres" else None
        try:
            took = asyncio.run(run_row(store, kind, bodies, directory, fake))
        finally:
            store.close()
        after = server_commits(pg_dsn(), dbname) if store_kind == "postgres" else None
    per = None if before is None or after is None else (after - before) / len(bodies)
    return len(bodies) / took, per


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=2000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--stores", default="sqlite,postgres")
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("ptb_fence").setLevel(logging.ERROR)  # the start-up notes, per row
    stores = args.stores.split(",")
    dsn = dbname = None
    if "postgres" in stores:
        problem = pg_problem(pg_dsn())
        if problem:
            print(f"PostgreSQL skipped: {problem}")
            stores.remove("postgres")
        else:
            dsn, dbname, note = create_bench_database(pg_dsn())
            if note:
                print(note)
    print(f"{args.updates} updates over {args.users} users, FencedUpdateProcessor "
          f"max_concurrent=32, median of {args.repeat}")
    print(f"{'row':<28} {'updates/s':>10} {'vs none':>8} {'server xacts/update':>20}")
    try:
        for store_kind in stores:
            base: Optional[float] = None
            for kind in KINDS:
                runs = [measure(kind, store_kind, args, dsn, dbname) for _ in range(args.repeat)]
                rate = statistics.median(r[0] for r in runs)
                xacts = [r[1] for r in runs if r[1] is not None]
                base = rate if kind == "none" else base
                ratio = f"{rate / base:.2f}x" if base else "-"
                per = f"{statistics.median(xacts):.2f}" if xacts else "-"
                print(f"{store_kind + '-' + kind:<28} {rate:>10.0f} {ratio:>8} {per:>20}",
                      flush=True)
    finally:
        if dbname is not None and dsn is not None and dsn != pg_dsn():
            drop_bench_database(pg_dsn(), dbname)
    return 0


if __name__ == "__main__":
    sys.exit(main())
