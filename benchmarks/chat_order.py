"""The throughput cost of ``strict_chat_order`` (issue 13).

Usage (from the repository root)::

    python benchmarks/chat_order.py                 # 2000 updates over 200 chats, both stores
    python benchmarks/chat_order.py --quick         # 300 updates (smoke)
    python benchmarks/chat_order.py --stores sqlite --updates 1000 --chats 50

One process: a real PTB ``Application`` with a ``FencedUpdateProcessor`` (library defaults but
``max_concurrent``) polls a :class:`ptb_fence.testing.FakeBotApi` that holds the whole backlog
(``--updates`` updates, ids interleaved over ``--chats`` chats); the handler awaits
``--hold`` seconds (a Telegram call's worth of waiting). Measured: seconds from the start of
polling until every update was handled, and updates per second, for the default and for
``strict_chat_order=True``; ``ratio`` is strict / default throughput in the same run.
``order`` counts chats whose updates were handled out of ``update_id`` order (0 expected
for both: no update fails here). PostgreSQL comes from ``PTB_FENCE_POSTGRES_DSN`` (default
``postgresql://postgres@127.0.0.1:5432/test``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from telegram import Update  # noqa: E402
from telegram.ext import Application, MessageHandler, filters  # noqa: E402

from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore  # noqa: E402
from ptb_fence.ptb import FencedUpdateProcessor  # noqa: E402
from ptb_fence.testing import FakeBotApi  # noqa: E402


def make_store(kind: str, workdir: str) -> Tuple[Any, Any]:
    """A fresh store and a function that drops what it created."""
    if kind == "sqlite":
        path = os.path.join(workdir, f"bench-{uuid.uuid4().hex[:8]}.sqlite3")
        return SQLiteUpdateStore(path), lambda: None
    import psycopg2

    dsn = os.environ.get("PTB_FENCE_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    table = f"bench_order_{uuid.uuid4().hex[:10]}"

    def drop() -> None:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{table}"')
        conn.close()

    return PostgresUpdateStore(dsn, table=table), drop


async def measure(
    kind: str, strict: bool, updates: int, chats: int, hold: float, concurrent: int, cap: float
) -> Dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="ptb_fence_order_")
    store, drop = make_store(kind, workdir)
    handled: Dict[int, List[int]] = {}
    count = [0]
    done = asyncio.Event()

    async def on_message(update: Update, context: Any) -> None:
        await asyncio.sleep(hold)
        handled.setdefault(update.effective_chat.id, []).append(update.update_id)
        count[0] += 1
        if count[0] >= updates:
            done.set()

    try:
        with FakeBotApi() as fake:
            for n in range(updates):
                fake.inject_message(chat_id=1000 + n % chats, text=f"m{n}")
            processor = FencedUpdateProcessor(
                store, strict_chat_order=strict, max_concurrent=concurrent
            )
            app = processor.install(
                Application.builder().token(fake.token).base_url(fake.base_url)
            ).build()
            app.add_handler(MessageHandler(filters.TEXT, on_message))
            async with app:
                await app.start()
                assert app.updater is not None
                started = time.perf_counter()
                await app.updater.start_polling(poll_interval=0.0, timeout=1)
                try:
                    await asyncio.wait_for(done.wait(), cap)
                except asyncio.TimeoutError:
                    pass
                seconds = time.perf_counter() - started
                await app.updater.stop()
                await app.stop()
    finally:
        store.close()
        drop()
    out_of_order = sum(1 for ids in handled.values() if ids != sorted(ids))
    return {
        "handled": count[0],
        "seconds": seconds,
        "rate": count[0] / seconds if seconds > 0 else 0.0,
        "order": out_of_order,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=2000)
    parser.add_argument("--chats", type=int, default=200)
    parser.add_argument("--hold", type=float, default=0.005)
    parser.add_argument("--max-concurrent", type=int, default=32)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--cap", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    logging.getLogger("ptb_fence").setLevel(logging.ERROR)  # the table only
    updates = min(args.updates, 300) if args.quick else args.updates
    print(f"{'store':<9}{'mode':<9}{'chats':>6}{'updates':>9}{'seconds':>9}{'upd/s':>9}"
          f"{'ratio':>7}{'order':>7}")
    failed = False
    for kind in [s for s in args.stores.split(",") if s]:
        base = 0.0
        for strict in (False, True):
            row = asyncio.run(measure(kind, strict, updates, args.chats, args.hold,
                                      args.max_concurrent, args.cap))
            if not strict:
                base = row["rate"]
            ratio = row["rate"] / base if base else 0.0
            mode = "strict" if strict else "default"
            print(f"{kind:<9}{mode:<9}{args.chats:>6}{row['handled']:>9}{row['seconds']:>9.2f}"
                  f"{row['rate']:>9.0f}{ratio:>7.2f}{row['order']:>7}", flush=True)
            failed = failed or row["handled"] < updates or row["order"] > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
