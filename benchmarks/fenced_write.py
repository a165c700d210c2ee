"""A small fenced-write benchmark (issue 14, item 1): a real PTB Application polling a fast,
pre-serialised fake ``getUpdates`` server (its own process), handler
``await context.attempt.run_in_transaction(insert, complete=True)``.

Usage::

    python benchmarks/fenced_write.py poll --kind fenced-pg --updates 3000 --concurrency 32
    python benchmarks/fenced_write.py poll --kind plain
    python benchmarks/fenced_write.py latency --kind fenced-sqlite --count 300 --rate 20
    python benchmarks/fenced_write.py writes --kind fenced-pg --count 3000 --concurrency 32
    python benchmarks/fenced_write.py writes --kind fenced-pg --steps 1   # the cost of a step

``poll`` prints updates/s and the bot process's CPU µs per update (first to last handled
update); ``latency`` puts one update at a time (``update_queue.put``, as a webhook does) and
prints p50/p99 from the put to the handler's end (for the fenced kinds: after the fenced commit).
``writes`` measures the fenced write alone, without PTB: ``--concurrency`` tasks await
``run_in_transaction(insert, complete=True)`` for ``--count`` claimed attempts on 8 store
threads, grouped (the library's path) and alone (a transaction of its own each), alternating;
it prints writes/s, CPU µs and commits (PostgreSQL, counted at the driver) per write.
Only for measuring: noisy on a shared machine; compare kinds within one sitting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

TOKEN = "123456:BENCH-TOKEN"
_BOT = {"id": 123456, "is_bot": True, "first_name": "Bench", "username": "bench_bot"}


# -- the fast fake Bot API (its own process) ---------------------------------------------------
def _update(update_id: int, chats: int) -> Dict[str, Any]:
    chat = 1000 + update_id % chats
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": 1_700_000_000,
            "chat": {"id": chat, "type": "private", "first_name": "u"},
            "from": {"id": chat, "is_bot": False, "first_name": "u"},
            "text": f"hello {update_id}",
        },
    }


def serve(count: int, chats: int) -> None:
    """Serve ``count`` updates (ids 1..count) in pre-serialised pages of 100; keep-alive."""
    page = 100
    updates = [_update(i, chats) for i in range(1, count + 1)]
    pages: Dict[int, bytes] = {}
    for start in range(1, count + 1, page):
        pages[start] = json.dumps({"ok": True, "result": updates[start - 1:start - 1 + page]}).encode()
    empty = b'{"ok":true,"result":[]}'
    me = json.dumps({"ok": True, "result": _BOT}).encode()
    true = b'{"ok":true,"result":true}'
    offset_re = re.compile(rb'"?offset"?\s*[:=]\s*"?(-?\d+)')

    def body_for(path: bytes, body: bytes) -> bytes:
        method = path.rsplit(b"/", 1)[-1].lower()
        if method == b"getupdates":
            found = offset_re.search(body)
            offset = max(1, int(found.group(1))) if found else 1
            if offset in pages:
                return pages[offset]
            if offset > count:
                return empty
            return json.dumps({"ok": True, "result": updates[offset - 1:offset - 1 + page]}).encode()
        if method == b"getme":
            return me
        return true

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:].strip())
                body = await reader.readexactly(length) if length else b""
                path = head.split(b" ", 2)[1]
                payload = body_for(path, body)
                if payload is empty:
                    await asyncio.sleep(0.05)  # nothing new: a short long-poll
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(payload)).encode() + b"\r\n\r\n" + payload
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        print(json.dumps({"base_url": f"http://127.0.0.1:{port}/bot"}), flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# -- the bot ---------------------------------------------------------------------------------
def _store(kind: str, workdir: str) -> Any:
    from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore

    if kind == "fenced-sqlite":
        path = os.path.join(workdir, f"fw-{uuid.uuid4().hex[:8]}.db")
        store = SQLiteUpdateStore(path)
        with store.transaction() as conn:
            conn.execute("CREATE TABLE notes (update_id INTEGER PRIMARY KEY, body TEXT)")
        return store
    dsn = os.environ.get("PTB_FENCE_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    table = "fw_" + uuid.uuid4().hex[:12]
    store = PostgresUpdateStore(dsn, table)
    with store.transaction() as conn:
        with conn.cursor() as cur:
            cur.execute(f'CREATE TABLE "{table}_notes" (update_id BIGINT PRIMARY KEY, body TEXT)')
    return store


def _drop(kind: str, store: Any) -> None:
    if kind == "fenced-pg":
        table = store.table
        with store.transaction() as conn:
            with conn.cursor() as cur:
                cur.execute(f'DROP TABLE IF EXISTS "{table}_notes"')
                cur.execute(f'DROP TABLE IF EXISTS "{table}"')
    store.close()


def _insert(kind: str, store: Any, update_id: int, text: str) -> Any:
    if kind == "fenced-sqlite":
        def write(conn: Any) -> None:
            conn.execute("INSERT INTO notes VALUES (?, ?)", (update_id, text))
    else:
        sql = f'INSERT INTO "{store.table}_notes" VALUES (%s, %s)'

        def write(conn: Any) -> None:
            with conn.cursor() as cur:
                cur.execute(sql, (update_id, text))
    return write


def _application(kind: str, base_url: str, concurrency: int, store: Any) -> Any:
    from telegram.ext import Application

    builder = Application.builder().token(TOKEN).base_url(base_url)
    if kind == "plain":
        return builder.concurrent_updates(concurrency).build()
    from ptb_fence.ptb import FencedUpdateProcessor

    return FencedUpdateProcessor(store, max_concurrent=concurrency).install(builder).build()


def _thread_cpu() -> Dict[str, float]:
    """CPU seconds per thread kind (Linux /proc), for a rough split of the bot's CPU."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: Dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(task), "other").split("_")[0].rstrip("-0123456789")
        out[name + ".user"] = out.get(name + ".user", 0.0) + int(fields[11]) / tick
        out[name + ".sys"] = out.get(name + ".sys", 0.0) + int(fields[12]) / tick
    return {k: round(v, 2) for k, v in out.items()}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def poll(kind: str, updates: int, concurrency: int, chats: int) -> Dict[str, Any]:
    from telegram import Update
    from telegram.ext import TypeHandler

    server = subprocess.Popen([sys.executable, __file__, "serve", "--updates", str(updates),
                               "--chats", str(chats)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    base_url = json.loads(server.stdout.readline())["base_url"]
    workdir = tempfile.mkdtemp(prefix="fenced-write-")
    store = None if kind == "plain" else _store(kind, workdir)
    marks: Dict[str, float] = {}
    done = [0]
    try:
        app = _application(kind, base_url, concurrency, store)

        def handled(application: Any) -> None:
            done[0] += 1
            if done[0] == 1:
                marks["t0"], marks["c0"] = time.perf_counter(), _cpu()
            if done[0] == updates:
                marks["t1"], marks["c1"] = time.perf_counter(), _cpu()
                marks["threads"] = sum(
                    t.name.startswith("ptb_fence-store") for t in threading.enumerate())
                if os.environ.get("FENCED_WRITE_THREAD_CPU"):
                    marks["by_thread"] = _thread_cpu()
                application.stop_running()

        async def plain(update: Update, context: Any) -> None:
            handled(context.application)

        async def fenced(update: Update, context: Any) -> None:
            text = update.effective_message.text if update.effective_message else ""
            write = _insert(kind, store, update.update_id, text or "")
            await context.attempt.run_in_transaction(write, complete=True)
            handled(context.application)

        app.add_handler(TypeHandler(Update, plain if kind == "plain" else fenced))
        app.run_polling(poll_interval=0, timeout=1, close_loop=False, stop_signals=None)
    finally:
        server.terminate()
        server.wait(10)
        if store is not None:
            _drop(kind, store)
    seconds = marks["t1"] - marks["t0"]
    return {
        "kind": kind,
        "updates": updates,
        "concurrency": concurrency,
        "upd_s": round((updates - 1) / seconds, 1),
        "cpu_us_per_update": round((marks["c1"] - marks["c0"]) * 1e6 / (updates - 1), 1),
        "store_threads": marks.get("threads", 0),
        **({"cpu_s_by_thread": marks["by_thread"]} if "by_thread" in marks else {}),
    }


def _percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def latency(kind: str, count: int, rate: float) -> Dict[str, Any]:
    from telegram import Update
    from telegram.ext import TypeHandler

    server = subprocess.Popen([sys.executable, __file__, "serve", "--updates", "0"],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    base_url = json.loads(server.stdout.readline())["base_url"]
    workdir = tempfile.mkdtemp(prefix="fenced-write-")
    store = None if kind == "plain" else _store(kind, workdir)
    ended: Dict[int, float] = {}
    began: Dict[int, float] = {}
    put: Dict[int, float] = {}
    try:
        app = _application(kind, base_url, 32, store)

        async def plain(update: Update, context: Any) -> None:
            ended[update.update_id] = time.perf_counter()

        async def fenced(update: Update, context: Any) -> None:
            began[update.update_id] = time.perf_counter()
            write = _insert(kind, store, update.update_id, "x")
            await context.attempt.run_in_transaction(write, complete=True)
            ended[update.update_id] = time.perf_counter()

        app.add_handler(TypeHandler(Update, plain if kind == "plain" else fenced))

        async def main() -> List[float]:
            await app.initialize()
            await app.start()
            await asyncio.sleep(0.3)
            for i in range(1, count + 1):
                update = Update.de_json(_update(i, 50), app.bot)
                put[i] = time.perf_counter()
                await app.update_queue.put(update)
                deadline = time.perf_counter() + 10
                while i not in ended and time.perf_counter() < deadline:
                    await asyncio.sleep(0.0002)
                await asyncio.sleep(max(0.0, 1.0 / rate - (time.perf_counter() - put[i])))
            await app.stop()
            await app.shutdown()
            return [(ended[i] - put[i]) * 1000 for i in put if i in ended]

        values = asyncio.run(main())
    finally:
        server.terminate()
        server.wait(10)
        if store is not None:
            _drop(kind, store)
    warm = values[5:]  # the first few include connection set-up
    out = {
        "kind": kind,
        "n": len(warm),
        "p50_ms": round(_percentile(warm, 0.5), 2),
        "p99_ms": round(_percentile(warm, 0.99), 2),
    }
    if began:  # put -> handler start (recorded and claimed), and the fenced write itself
        to_handler = [(began[i] - put[i]) * 1000 for i in sorted(began)][5:]
        write = [(ended[i] - began[i]) * 1000 for i in sorted(began) if i in ended][5:]
        out["to_handler_p50_ms"] = round(_percentile(to_handler, 0.5), 2)
        out["to_handler_p99_ms"] = round(_percentile(to_handler, 0.99), 2)
        out["write_p50_ms"] = round(_percentile(write, 0.5), 2)
        out["write_p99_ms"] = round(_percentile(write, 0.99), 2)
    return out


def writes(kind: str, count: int, concurrency: int, grouped: bool,
           steps: int = 0) -> Dict[str, Any]:
    """``count`` fenced writes by ``concurrency`` tasks on 8 store threads, without PTB.

    With ``steps`` each attempt first does that many ``attempt.step`` calls (a no-op ``fn``).
    """
    from ptb_fence import PostgresUpdateStore, RuntimeOptions, SQLiteUpdateStore
    from ptb_fence.runtime._hop import StoreHop
    from ptb_fence.runtime._runtime import FrontEndHooks, Runtime

    commits = [0]
    workdir = tempfile.mkdtemp(prefix="fenced-write-")
    pool: Any = None
    if kind == "fenced-sqlite":
        store: Any = SQLiteUpdateStore(os.path.join(workdir, "w.db"))
        with store.transaction() as conn:
            conn.execute("CREATE TABLE notes (update_id INTEGER PRIMARY KEY, body TEXT)")
    else:
        import psycopg2.extensions
        import psycopg2.pool

        class Counting(psycopg2.extensions.connection):
            def commit(self) -> None:
                commits[0] += 1
                super().commit()

        dsn = os.environ.get("PTB_FENCE_POSTGRES_DSN",
                             "postgresql://postgres@127.0.0.1:5432/test")
        pool = psycopg2.pool.ThreadedConnectionPool(1, 8, dsn, connection_factory=Counting)
        store = PostgresUpdateStore(pool, "fw_" + uuid.uuid4().hex[:12])
        with store.transaction() as conn:
            with conn.cursor() as cur:
                cur.execute(f'CREATE TABLE "{store.table}_notes" '
                            "(update_id BIGINT PRIMARY KEY, body TEXT)")
    hop = StoreHop(8, 8 + concurrency)
    runtime = Runtime(store, RuntimeOptions(lease_seconds=60), attempt_aware=True,
                      handle_exhaustion=False, hooks=FrontEndHooks(executor=lambda: hop))
    now = int(time.time() * 1000)
    store.add_many([(i, json.dumps(_update(i, 50)), now) for i in range(1, count + 1)])
    attempts = [runtime.claim(i) for i in range(1, count + 1)]

    async def run() -> "tuple[float, float, int]":
        gate = asyncio.Semaphore(concurrency)

        async def one(attempt: Any) -> None:
            write = _insert(kind, store, attempt.update_id, "x")
            async with gate:
                for number in range(steps):
                    await attempt.step(f"step-{number}", lambda key: {"key": key})
                if grouped:
                    await attempt.run_in_transaction(write, complete=True)
                else:  # as before grouping: each in a transaction of its own
                    await hop.run(lambda: attempt.run_alone(write, None, True))

        before = commits[0]
        t0, c0 = time.perf_counter(), _cpu()
        await asyncio.gather(*(one(a) for a in attempts))
        return time.perf_counter() - t0, _cpu() - c0, commits[0] - before

    try:
        seconds, cpu, committed = asyncio.run(run())
        assert all(a is not None and a.completed for a in attempts)
    finally:
        hop.stop()
        _drop(kind, store)
        if pool is not None:
            pool.closeall()
    return {
        "kind": kind,
        "grouped": grouped,
        "writes": count,
        "steps_per_write": steps,
        "concurrency": concurrency,
        "writes_s": round(count / seconds, 1),
        "cpu_us_per_write": round(cpu * 1e6 / count, 1),
        **({"commits_per_write": round(committed / count, 3)} if kind == "fenced-pg" else {}),
    }


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("serve")
    s.add_argument("--updates", type=int, default=3000)
    s.add_argument("--chats", type=int, default=200)
    p = commands.add_parser("poll")
    p.add_argument("--kind", choices=("plain", "fenced-pg", "fenced-sqlite"), required=True)
    p.add_argument("--updates", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--chats", type=int, default=200)
    lat = commands.add_parser("latency")
    lat.add_argument("--kind", choices=("plain", "fenced-pg", "fenced-sqlite"), required=True)
    lat.add_argument("--count", type=int, default=300)
    lat.add_argument("--rate", type=float, default=20.0)
    w = commands.add_parser("writes")
    w.add_argument("--kind", choices=("fenced-pg", "fenced-sqlite"), required=True)
    w.add_argument("--count", type=int, default=3000)
    w.add_argument("--concurrency", type=int, default=32)
    w.add_argument("--rounds", type=int, default=3)
    w.add_argument("--steps", type=int, default=0,
                   help="also run each round with this many attempt.step calls per write")
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.updates, args.chats)
    elif args.command == "poll":
        print(json.dumps(poll(args.kind, args.updates, args.concurrency, args.chats)), flush=True)
    elif args.command == "writes":
        for _ in range(args.rounds):  # alternating: the machine's load hits both alike
            for grouped in (False, True):
                print(json.dumps(writes(args.kind, args.count, args.concurrency, grouped)),
                      flush=True)
            if args.steps:  # the cost of the steps: compare with the grouped row above
                print(json.dumps(writes(args.kind, args.count, args.concurrency, True,
                                        args.steps)), flush=True)
    else:
        print(json.dumps(latency(args.kind, args.count, args.rate)), flush=True)


if __name__ == "__main__":
    main()
