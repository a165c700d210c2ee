"""Rows that run a real PTB Application: plain PTB, Durable/Fenced processors, naive, polling.

Runs inside one child process per row (see ``run.py``). Every run builds a fresh store (a new
SQLite file, or a new PostgreSQL table that is dropped afterwards), a fresh processor and a
fresh Application, then feeds it updates the way PTB's polling does: ``await
app.update_queue.put(update)`` for each ``telegram.Update`` of a batch of up to 100. The
``poll-*`` rows instead run ``app.updater.start_polling(poll_interval=0)`` against a fake Bot
API in a process of its own that already holds the updates: the fast server of
``_fast_server.py`` (pre-serialised pages, keep-alive), or, for the reference row
``poll-plain-fakebotapi-32``, :class:`ptb_fence.testing.FakeBotApi`.

Every run also measures the CPU time of this (the bot's) process over the timed part
(``time.process_time``, all threads) and, for polling rows, of the server process
(``/proc/<pid>/stat``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from telegram import Update
from telegram.ext import (
    Application,
    ConversationHandler,
    MessageHandler,
    PicklePersistence,
    TypeHandler,
    filters,
)

from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore
from ptb_fence.ptb import DurableUpdateProcessor, FencedPersistence, FencedUpdateProcessor
from ptb_fence.stores._outbox_sql import outbox_table_name
from ptb_fence.testing import FakeBotApi

from _pg_cpu import BackendCpu
from _common import (
    BATCH,
    CompletionTracker,
    CountingStore,
    DriverCounter,
    Profiler,
    chunks,
    create_domain_table,
    domain_write,
    drop_tables,
    median,
    percentile,
    pg_connect,
    server_commits,
    sqlite_connect,
    update_dicts,
)

_LOGGER = logging.getLogger("bench")

PTB_KINDS = ("plain", "durable", "fenced", "fenced-write", "naive", "fenced-write-reply",
             "fenced-write-outbox", "conv-none", "conv-pickle", "conv-fenced")
"""Handler kinds; a ``poll-`` prefix runs the same kind over polling."""

CONV_KINDS = ("conv-none", "conv-pickle", "conv-fenced")
"""A conversation bot under FencedUpdateProcessor: a ConversationHandler whose every update
changes ``user_data`` (``n += 1``), without persistence, with PTB's PicklePersistence, or with
FencedPersistence (the state written in the completion's commit)."""

REPLY_KINDS = ("fenced-write-reply", "fenced-write-outbox")
"""Kinds that reply once per update (``sendMessage``): directly with ``await
context.bot.send_message`` after the fenced write, or through ``attempt.outbox``. An update of
these counts as done when the fake Bot API answered its reply (seen by :class:`ReplyTimer`)."""


def reply_timer(tracker: CompletionTracker) -> Any:
    """A PTB request object (``ApplicationBuilder.request``) that marks ``tracker`` with the
    update id of every ``sendMessage`` the fake Bot API answered (the reply text is ``r
    <update_id>``): the same clock for a direct reply and an outbox reply."""
    from telegram.request import HTTPXRequest

    class ReplyTimer(HTTPXRequest):
        async def do_request(self, url: str, method: str, request_data: Any = None,
                             **kwargs: Any) -> Tuple[int, bytes]:
            answer = await super().do_request(url, method, request_data=request_data, **kwargs)
            if url.endswith("/sendMessage") and request_data is not None and answer[0] == 200:
                text = str(request_data.parameters.get("text", ""))
                if text.startswith("r "):
                    tracker.mark(int(text[2:]))
            return answer

    return ReplyTimer(connection_pool_size=256)


def process_cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    except (OSError, ValueError, IndexError):
        return None


class _Run:
    """One fresh store + Application (+ FakeBotApi for polling rows) for one measured run."""

    def __init__(self, cfg: Dict[str, Any], tag: str, tracker: CompletionTracker) -> None:
        self.cfg = cfg
        self.polling: bool = cfg["kind"].startswith("poll-")
        self.kind: str = cfg["kind"][len("poll-"):] if self.polling else cfg["kind"]
        # "<kind>-metrics": the same row with ptb_fence.metrics registered and scraped
        self.metrics = self.kind.endswith("-metrics")
        if self.metrics:
            self.kind = self.kind[: -len("-metrics")]
        self.scraper: Optional[threading.Thread] = None
        self.scraping = threading.Event()
        self.scrapes = 0
        self.server_kind: str = cfg.get("server") or "fast"
        self.server_pid: Optional[int] = None
        self.store_kind: Optional[str] = cfg.get("store")
        self.concurrency: int = cfg["concurrency"]
        self.tracker = tracker
        self.tag = tag
        self.handled = 0
        self.handled_event = asyncio.Event()
        self.expected = 0
        self.store: Optional[CountingStore] = None
        self.raw_store: Any = None
        self.path: Optional[str] = None
        self.table: Optional[str] = None
        self.domain_table: Optional[str] = None
        self.naive_table: Optional[str] = None
        self.naive_path: Optional[str] = None
        self.naive_conns: List[Any] = []
        self.naive_local = threading.local()
        self.naive_lock = threading.Lock()
        self.app: Any = None
        self.server: Optional["subprocess.Popen[str]"] = None
        self.notes: List[str] = []

    # -- setup ------------------------------------------------------------------------------
    def make_store(self) -> None:
        if self.kind == "plain":
            return
        suffix = uuid.uuid4().hex[:12]
        if self.kind == "naive" and self.store_kind == "sqlite":
            # the same file settings as SQLiteUpdateStore's defaults: WAL, synchronous=NORMAL
            self.naive_table = "bench_naive"
            self.naive_path = os.path.join(self.cfg["workdir"], f"{self.tag}-{suffix}-naive.sqlite3")
            conn = sqlite_connect(self.naive_path)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(
                    "CREATE TABLE bench_naive (update_id INTEGER PRIMARY KEY, body TEXT NOT NULL)"
                )
            finally:
                conn.close()
            return
        if self.kind == "naive":
            self.naive_table = f"bench_naive_{suffix}"
            conn = pg_connect(self.cfg["dsn"])
            try:
                with conn.cursor() as cur:
                    cur.execute(
                        f'CREATE TABLE "{self.naive_table}" (update_id BIGINT PRIMARY KEY, '
                        "body TEXT NOT NULL)"
                    )
            finally:
                conn.close()
            return
        if self.store_kind == "sqlite":
            self.path = os.path.join(self.cfg["workdir"], f"{self.tag}-{suffix}.sqlite3")
            raw: Any = SQLiteUpdateStore(self.path)  # synchronous=NORMAL (the default)
            if self.kind == "fenced-write" or self.kind in REPLY_KINDS:
                self.domain_table = "bench_domain"
                create_domain_table("sqlite", self.domain_table, path=self.path)
        else:
            self.table = f"bench_{suffix}"
            if self.kind == "fenced-write" or self.kind in REPLY_KINDS:
                self.domain_table = f"bench_domain_{suffix}"
                create_domain_table("pg", self.domain_table, dsn=self.cfg["dsn"])
            raw = PostgresUpdateStore(self.cfg["dsn"], self.table)  # library defaults (pool 8)
            raw.due(now=0, pending_before=0, limit=1)  # create the table before counting
        self.raw_store = raw
        # a reply row's update is done when its reply was answered (ReplyTimer), not settled
        self.store = CountingStore(
            raw, None if self.kind in REPLY_KINDS else self.tracker,
            exact_claims=bool(self.cfg.get("claims_exact")),
        )

    def build_app(self, pending: int = 0) -> None:
        if self.polling:
            # the fake Bot API runs in a process of its own, already holding the updates
            spec = json.dumps({
                "count": pending, "chats": int(self.cfg.get("chats", 200)),
                "first_id": int(self.cfg.get("first_id", 1)),
            })
            if self.server_kind == "fakebotapi":
                cmd = [sys.executable, self.cfg["run_py"], "--fake-server", spec]
            else:
                cmd = [sys.executable, os.path.join(os.path.dirname(self.cfg["run_py"]), "_fast_server.py"), spec]
            self.server = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )
            assert self.server.stdout is not None
            info = json.loads(self.server.stdout.readline())
            token, base_url = info["token"], info["base_url"]
            self.server_pid = int(info.get("pid") or self.server.pid)
        else:
            fake = self.cfg["fake"]
            token, base_url = fake.token, fake.base_url
        builder = Application.builder().token(token).base_url(base_url)
        n = self.concurrency
        if self.kind in ("plain", "naive"):
            builder.concurrent_updates(n)
        elif self.kind == "durable":
            store: Any = self.store  # the proxy has the wrapped store's methods (duck typing)
            builder = DurableUpdateProcessor(store, max_concurrent=n).install(builder)
        else:
            store = self.store
            options = dict(self.cfg.get("processor_options") or {})
            processor = FencedUpdateProcessor(store, max_concurrent=n, **options)
            builder = processor.install(builder)
            if self.kind in REPLY_KINDS:
                builder.request(reply_timer(self.tracker))
            if self.metrics:
                self._scrape_metrics(processor)
            if self.kind == "conv-pickle":
                builder.persistence(PicklePersistence(os.path.join(
                    self.cfg["workdir"], f"{self.tag}-{uuid.uuid4().hex[:8]}.pickle")))
            elif self.kind == "conv-fenced":
                builder.persistence(FencedPersistence(store))
        self.app = builder.build()
        if self.kind in CONV_KINDS:
            step = self._handler()
            self.app.add_handler(ConversationHandler(
                entry_points=[MessageHandler(filters.TEXT, step)],
                states={1: [MessageHandler(filters.TEXT, step)]},
                fallbacks=[], name="talk", persistent=self.kind != "conv-none",
            ))
        else:
            self.app.add_handler(TypeHandler(Update, self._handler()))

    def _scrape_metrics(self, processor: Any) -> None:
        """Register the processor's metrics and scrape them every second on a thread of their
        own, as a Prometheus server would (it typically scrapes every 15 s: this is harsher)."""
        from prometheus_client import CollectorRegistry, generate_latest

        from ptb_fence.metrics import register

        registry = CollectorRegistry()
        register(processor, registry)

        def scrape() -> None:
            while not self.scraping.wait(1.0):
                generate_latest(registry)
                self.scrapes += 1

        self.scraper = threading.Thread(target=scrape, name="bench-scraper", daemon=True)
        self.scraper.start()

    def _handler(self) -> Callable[[Any, Any], Any]:
        tracker = self.tracker
        kind = self.kind

        def handled() -> None:
            self.handled += 1
            if self.handled >= self.expected:
                self.handled_event.set()

        if kind == "plain":

            async def noop_plain(update: Update, context: Any) -> None:
                tracker.mark(update.update_id)
                handled()

            return noop_plain

        if kind in ("durable", "fenced"):

            async def noop(update: Update, context: Any) -> None:
                handled()  # completion is observed on the store's settle

            return noop

        if kind in CONV_KINDS:

            async def step(update: Update, context: Any) -> int:
                context.user_data["n"] = context.user_data.get("n", 0) + 1
                handled()  # completion is observed on the store's settle
                return 1

            return step

        if kind == "fenced-write":
            assert self.store_kind is not None and self.domain_table is not None
            write = domain_write(self.store_kind, self.domain_table)

            async def fenced_write(update: Update, context: Any) -> None:
                attempt = context.attempt
                await attempt.run_in_transaction(write(attempt), complete=True)
                tracker.mark(update.update_id)  # committed, settled in the same commit
                handled()

            return fenced_write

        if kind in REPLY_KINDS:
            assert self.store_kind is not None and self.domain_table is not None
            write = domain_write(self.store_kind, self.domain_table)
            outbox = kind == "fenced-write-outbox"

            async def fenced_write_reply(update: Update, context: Any) -> None:
                attempt = context.attempt
                chat_id = update.effective_chat.id
                if outbox:
                    # held by the attempt; written in the commit of the transaction below
                    attempt.outbox.send_message(chat_id, f"r {update.update_id}")
                await attempt.run_in_transaction(write(attempt), complete=True)
                if not outbox:
                    await context.bot.send_message(chat_id, f"r {update.update_id}")
                handled()  # done when the reply was answered (the tracker, by ReplyTimer)

            return fenced_write_reply

        assert kind == "naive"
        insert = self._naive_insert()

        async def naive(update: Update, context: Any) -> None:
            await asyncio.to_thread(insert, update.update_id, update.to_json())
            tracker.mark(update.update_id)
            handled()

        return naive

    def _naive_insert(self) -> Callable[[int, str], None]:
        import sqlite3

        import psycopg2

        local = self.naive_local
        if self.naive_path is not None:
            path = self.naive_path

            def insert_sqlite(update_id: int, body: str) -> None:
                conn = getattr(local, "conn", None)
                if conn is None:
                    # sqlite3.connect is counted by DriverCounter; WAL is already set on the file
                    conn = sqlite3.connect(path, timeout=30, check_same_thread=False)
                    conn.execute("PRAGMA synchronous=NORMAL")
                    local.conn = conn
                    with self.naive_lock:
                        self.naive_conns.append(conn)
                conn.execute("INSERT INTO bench_naive (update_id, body) VALUES (?, ?)", (update_id, body))
                conn.commit()

            return insert_sqlite

        dsn = self.cfg["dsn"]
        sql = f'INSERT INTO "{self.naive_table}" (update_id, body) VALUES (%s, %s)'

        def insert(update_id: int, body: str) -> None:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = psycopg2.connect(dsn)  # counted by DriverCounter
                local.conn = conn
                with self.naive_lock:
                    self.naive_conns.append(conn)
            with conn.cursor() as cur:
                cur.execute(sql, (update_id, body))
            conn.commit()

        return insert

    # -- teardown ---------------------------------------------------------------------------
    async def stop_app(self) -> None:
        app = self.app
        if app is None:
            return
        try:
            if app.updater is not None and app.updater.running:
                await app.updater.stop()
            if app.running:
                await app.stop()
            await app.shutdown()
        finally:
            self.app = None

    def close(self) -> None:
        self.scraping.set()
        if self.scraper is not None:
            self.scraper.join(5)
        for conn in self.naive_conns:
            try:
                conn.close()
            except Exception:
                pass
        self.naive_conns = []
        if self.raw_store is not None:
            self.raw_store.close()
            self.raw_store = None
        server, self.server = self.server, None
        if server is not None:
            assert server.stdin is not None
            server.stdin.close()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

    def drop(self) -> None:
        for path in (self.path, self.naive_path):
            if path is None:
                continue
            for suffix in ("", "-wal", "-shm", "-journal"):
                try:
                    os.unlink(path + suffix)
                except FileNotFoundError:
                    pass
        naive_pg_table = None if self.naive_path is not None else self.naive_table
        tables = [t for t in (self.table, naive_pg_table) if t]
        if self.store_kind == "pg" and self.domain_table:
            tables.append(self.domain_table)
        if self.store_kind == "pg" and self.table:
            tables.append(outbox_table_name(self.table))
        if tables:
            drop_tables(self.cfg["dsn"], *tables)

    # -- completion fallback ----------------------------------------------------------------
    def completed_in_store(self) -> int:
        """Rows in state 'completed' (harness connection; used only as a fallback)."""
        if self.path is not None:
            conn = sqlite_connect(self.path)
            try:
                table = self.raw_store.table if self.raw_store is not None else "telegram_updates"
                return int(
                    conn.execute(f"SELECT count(*) FROM {table} WHERE state = 'completed'").fetchone()[0]
                )
            finally:
                conn.close()
        conn = pg_connect(self.cfg["dsn"])
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM \"{self.table}\" WHERE state = 'completed'")
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    def outbox_counts(self) -> Dict[str, int]:
        """The outbox's calls per state (a fresh store on the run's table: the run's own store
        is closed by then)."""
        if self.path is not None:
            store: Any = SQLiteUpdateStore(self.path)
        else:
            store = PostgresUpdateStore(self.cfg["dsn"], self.table, create_table=False)
        try:
            return {k: v for k, v in store.outbox_counts().items() if v}
        finally:
            store.close()

    async def wait_all(self, n: int, timeout: float) -> Tuple[float, Optional[str]]:
        """Wait until all ``n`` updates are completed; returns (end time, note).

        Completions are seen by the store proxy (or the handler). Should the library complete
        updates through a call the proxy cannot read, the table is polled once every handler
        has run (the end time is then when the table shows all of them completed).
        """
        try:
            await asyncio.wait_for(self.handled_event.wait(), timeout)
        except asyncio.TimeoutError:
            raise RuntimeError(
                f"{self.cfg['row']}: only {self.handled}/{n} updates handled within {timeout:.0f}s"
            ) from None
        if self.kind in REPLY_KINDS:
            # outbox replies are sent after the commits: give the dispatcher the same bound
            if await self.tracker.wait(n, timeout):
                return time.perf_counter(), None
            raise RuntimeError(
                f"{self.cfg['row']}: {self.tracker.count}/{n} replies answered within "
                f"{timeout:.0f}s after every handler ran"
            )
        if await self.tracker.wait(n, 2.0):
            return time.perf_counter(), None
        if self.kind in ("plain", "naive", "fenced-write"):
            raise RuntimeError(f"{self.cfg['row']}: handled but not marked complete")
        # handlers ran but the proxy did not see every completion: poll the table
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.completed_in_store() >= n:
                return time.perf_counter(), (
                    "completion observed by polling the table (settle method not recognised "
                    "by the proxy)"
                )
            await asyncio.sleep(0.005)
        raise RuntimeError(f"{self.cfg['row']}: updates handled but not completed in the store")


async def _throughput_run(
    cfg: Dict[str, Any], n: int, tag: str, counter: DriverCounter, measure_server: bool,
    profiler: Optional[Profiler] = None,
) -> Dict[str, Any]:
    tracker = CompletionTracker()
    run = _Run(cfg, tag, tracker)
    admin_dsn, bench_db = cfg.get("admin_dsn"), cfg.get("bench_db")
    pg_row = cfg.get("store") == "pg"
    try:
        run.make_store()
        before = (
            server_commits(admin_dsn, bench_db) if (measure_server and pg_row and bench_db) else None
        )
        polling = run.polling
        run.build_app(pending=n if polling else 0)
        run.expected = n
        app = run.app
        updates: List[Update] = []
        if not polling:
            updates = [Update.de_json(d, app.bot) for d in update_dicts(n)]
        await app.initialize()
        await app.start()
        await asyncio.sleep(0.1)  # the processor's first sweep runs now, outside the count
        counter.reset()
        if run.store is not None:
            run.store.reset_calls()
            run.store.claims.reset()
        if profiler is not None:
            profiler.resume()
        # the PostgreSQL backends' CPU (this run's private database), read outside the clock
        pg_cpu = BackendCpu.for_run(cfg) if pg_row and measure_server else None
        pg_cpu0 = pg_cpu.snapshot() if pg_cpu is not None else None
        server_cpu0 = process_cpu_seconds(run.server_pid) if run.server_pid else None
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        producers = int(cfg.get("producers") or 1)
        if polling:
            await app.updater.start_polling(poll_interval=0.0, timeout=1)
        elif producers > 1:
            # a webhook burst: every producer awaits its own put (as PTB's webhook handler
            # does per request), all at once; concurrent puts are recorded together
            async def produce(share: List[Update]) -> None:
                for update in share:
                    await app.update_queue.put(update)

            await asyncio.gather(*(produce(updates[i::producers]) for i in range(producers)))
        else:
            for batch in chunks(updates, BATCH):
                for update in batch:
                    await app.update_queue.put(update)
                await asyncio.sleep(0)  # polling awaits the next getUpdates between batches
        t1, note = await run.wait_all(n, cfg.get("timeout", 300))
        cpu1 = time.process_time()
        server_cpu1 = process_cpu_seconds(run.server_pid) if run.server_pid else None
        pg_cpu1 = pg_cpu.snapshot() if pg_cpu is not None and pg_cpu0 is not None else None
        if pg_cpu is not None:
            pg_cpu.close()
        if profiler is not None:
            profiler.pause()
        counts = counter.snapshot()
        calls = run.store.calls() if run.store is not None else {}
        claims_peak = (
            run.store.claims.peak if run.store is not None and run.store.claims.exact else None
        )
        await run.stop_app()
        run.close()
        after = (
            server_commits(admin_dsn, bench_db) if (before is not None and bench_db) else None
        )
        if run.kind not in ("plain", "naive"):
            completed = run.completed_in_store()  # a check of the harness itself, not timed
            if completed != n:
                raise RuntimeError(
                    f"{cfg['row']}: the store shows {completed} of {n} updates completed"
                )
        if run.kind == "fenced-write-outbox":
            outbox = run.outbox_counts()  # every reply recorded sent, none twice: not timed
            if outbox.get("sent") != n or sum(outbox.values()) != n:
                raise RuntimeError(f"{cfg['row']}: the outbox shows {outbox} for {n} replies")
        result: Dict[str, Any] = {
            "n": n,
            "seconds": t1 - t0,
            "rate": n / (t1 - t0),
            "cpu_seconds": cpu1 - cpu0,
            "server_cpu_seconds": (
                None if server_cpu0 is None or server_cpu1 is None else server_cpu1 - server_cpu0
            ),
            "driver": counts,
            "calls": calls,
            "claims_peak": claims_peak,
            "server_commits": None if before is None or after is None else after - before,
        }
        if pg_cpu0 is not None and pg_cpu1 is not None:
            ns, backends, new, gone = BackendCpu.delta(pg_cpu0, pg_cpu1)
            result["pg_backend"] = {"cpu_seconds": ns / 1e9, "backends": backends, "new": new, "gone": gone}
        elif pg_cpu is not None and pg_cpu.problem:
            result["note"] = "PostgreSQL backend CPU not measured: " + pg_cpu.problem
        if note:
            result["note"] = note
        return result
    finally:
        try:
            await run.stop_app()
        except Exception:
            _LOGGER.exception("stopping the application failed")
        try:
            run.close()
        except Exception:
            pass
        run.drop()


async def _latency_phase(cfg: Dict[str, Any], counter: DriverCounter) -> Dict[str, Any]:
    """Low load: ``rate`` updates/s for ``seconds``, one put at a time; enqueue → completion."""
    rate = float(cfg["latency_rate"])
    count = max(5, int(round(rate * float(cfg["latency_seconds"]))))
    tracker = CompletionTracker()
    run = _Run(cfg, "latency", tracker)
    try:
        run.make_store()
        run.build_app()
        run.expected = count
        app = run.app
        updates = [Update.de_json(d, app.bot) for d in update_dicts(count)]
        await app.initialize()
        await app.start()
        await asyncio.sleep(0.2)
        enqueued: Dict[int, float] = {}
        start = time.perf_counter()
        for i, update in enumerate(updates):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            enqueued[update.update_id] = time.perf_counter()
            await app.update_queue.put(update)
        await run.wait_all(count, 60)
        times = tracker.times
        latencies = [
            (times[uid] - t) * 1000.0 for uid, t in enqueued.items() if uid in times
        ]
        return {
            "n": len(latencies),
            "p50_ms": percentile(latencies, 0.5),
            "p99_ms": percentile(latencies, 0.99),
            "max_ms": max(latencies) if latencies else float("nan"),
        }
    finally:
        try:
            await run.stop_app()
        except Exception:
            _LOGGER.exception("stopping the application failed")
        try:
            run.close()
        except Exception:
            pass
        run.drop()


def pairs_with_plain(cfg: Dict[str, Any]) -> bool:
    """Whether a row's measured runs alternate with plain PTB polling runs (the polling rows
    other than ``poll-plain-32`` itself; not while profiling)."""
    if not cfg["kind"].startswith("poll-") or cfg.get("profile") or not cfg.get("paired", True):
        return False
    return not (cfg["kind"] == "poll-plain" and (cfg.get("server") or "fast") == "fast")


PAIRED_BASELINES = {"poll-conv-fenced": "poll-conv-none"}
"""Rows whose measured runs also alternate with runs of another row's kind in the same process
(``paired_rows``): a goal that compares the two reads the ratio of runs seconds apart, not of
rows measured a minute apart on a machine whose speed drifts by tens of percent meanwhile."""


def paired_baseline(cfg: Dict[str, Any]) -> Optional[str]:
    """The kind ``cfg``'s runs alternate with (see :data:`PAIRED_BASELINES`), if any (not while
    profiling)."""
    if cfg.get("profile") or not cfg.get("paired", True):
        return None
    return PAIRED_BASELINES.get(cfg["kind"])


def _paired(runs: List[Dict[str, Any]], others: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The figures of ``others``, runs alternated with ``runs`` (the i-th of each a pair), and
    the ratios of each pair; :obj:`None` without such runs."""
    if not others:
        return None
    rates = [r["rate"] for r in others]
    ratios = [r["rate"] / o["rate"] for r, o in zip(runs, others)]
    return {
        "rates": rates,
        "median": median(rates),
        "cpu_us_per_update": median([o["cpu_seconds"] / o["n"] * 1e6 for o in others]),
        "ratios": ratios,
        "ratio_median": median(ratios),
    }


async def measure_ptb_row(cfg: Dict[str, Any], counter: DriverCounter) -> Dict[str, Any]:
    """Warm-up, ``runs`` measured runs, then the low-load latency phase.

    Polling rows (except plain PTB's own) alternate each measured run with a run of plain PTB
    polling the fast server in this same process (``paired_plain``): the machine's load changes
    over the minutes between rows, and a ratio of runs seconds apart is steadier than a ratio of
    rows minutes apart. Rows in :data:`PAIRED_BASELINES` also alternate with runs of their
    baseline row's kind (``paired_rows``), each baseline run next to the row's run it pairs.

    With ``claims_check`` (and without ``claims_exact``), one more run after them, not timed,
    tallies the claims held exactly (``claims_check_peak``); its figures stay out of the rest.
    """
    fake = FakeBotApi().start()
    cfg = dict(cfg, fake=fake)
    paired = pairs_with_plain(cfg)
    plain_cfg = dict(cfg, kind="poll-plain", server="fast", store=None, row=cfg["row"] + "/plain")
    plain_runs: List[Dict[str, Any]] = []
    base_kind = paired_baseline(cfg)
    base_cfg = None if base_kind is None else dict(
        cfg, kind=base_kind, row=cfg["row"] + "/" + base_kind[5:]
    )
    base_runs: List[Dict[str, Any]] = []
    try:
        n = int(cfg["updates"])
        warm = int(cfg.get("warmup", 0))
        if warm:
            await _throughput_run(cfg, warm, "warmup", counter, measure_server=False)
            if paired:
                await _throughput_run(plain_cfg, warm, "plainwarmup", counter, measure_server=False)
            if base_cfg is not None:
                await _throughput_run(base_cfg, warm, "basewarmup", counter, measure_server=False)
        runs = []
        profiler = Profiler(cfg.get("profile") or "", int(cfg.get("profile_top", 30)),
                            cfg["workdir"], bool(cfg.get("profile_gil")))
        with profiler:
            for index in range(int(cfg["runs"])):
                if paired and index % 2 == 0:
                    plain_runs.append(
                        await _throughput_run(plain_cfg, n, f"plain{index}", counter, measure_server=False)
                    )
                if base_cfg is not None and index % 2 == 0:
                    base_runs.append(
                        await _throughput_run(base_cfg, n, f"base{index}", counter, measure_server=False)
                    )
                runs.append(
                    await _throughput_run(
                        cfg, n, f"run{index}", counter, measure_server=True, profiler=profiler
                    )
                )
                if base_cfg is not None and index % 2 == 1:
                    base_runs.append(
                        await _throughput_run(base_cfg, n, f"base{index}", counter, measure_server=False)
                    )
                if paired and index % 2 == 1:
                    plain_runs.append(
                        await _throughput_run(plain_cfg, n, f"plain{index}", counter, measure_server=False)
                    )
        latency = None
        reply_row = cfg["kind"].startswith("poll-") and cfg["kind"][5:] in REPLY_KINDS
        if (
            float(cfg.get("latency_seconds", 0)) > 0
            and (not cfg["kind"].startswith("poll-") or reply_row)
            and int(cfg.get("producers") or 1) == 1  # a burst row's latency is its -32 row's
        ):
            latency = await _latency_phase(cfg, counter)
        claims_check = None
        if cfg.get("claims_check") and not cfg.get("claims_exact"):
            # the exact tally serialises the store calls that grant or end claims, which slows
            # the row: its peak comes from one more run, outside the timed figures
            claims_check = await _throughput_run(
                dict(cfg, claims_exact=True), n, "claimscheck", counter, measure_server=False
            )
    finally:
        fake.stop()
    rates = [r["rate"] for r in runs]
    total_n = sum(r["n"] for r in runs)
    cpu_us = [r["cpu_seconds"] / r["n"] * 1e6 for r in runs]
    busy = [r["cpu_seconds"] / r["seconds"] for r in runs]
    server_us = [
        r["server_cpu_seconds"] / r["n"] * 1e6 for r in runs if r.get("server_cpu_seconds") is not None
    ]
    calls: Dict[str, int] = {}
    driver: Dict[str, int] = {}
    for r in runs:
        for k, v in r["calls"].items():
            calls[k] = calls.get(k, 0) + v
        for k, v in r["driver"].items():
            driver[k] = driver.get(k, 0) + v
    server = [r["server_commits"] for r in runs if r.get("server_commits") is not None]
    pg_us = [r["pg_backend"]["cpu_seconds"] / r["n"] * 1e6 for r in runs if r.get("pg_backend")]
    notes = sorted({r["note"] for r in runs if r.get("note")})
    paired_plain = _paired(runs, plain_runs)
    paired_rows = _paired(runs, base_runs)
    if paired_rows is not None:
        paired_rows["kind"] = base_kind
    return {
        "paired_plain": paired_plain,
        "paired_rows": paired_rows,
        "rates": rates,
        "median": median(rates),
        "seconds": [r["seconds"] for r in runs],
        "cpu_us_per_update": median(cpu_us),
        "cpu_us_per_update_runs": cpu_us,
        "cpu_busy": median(busy),
        "server_cpu_us_per_update": median(server_us) if server_us else None,
        "handled": total_n,
        "calls_per_update": {k: v / total_n for k, v in sorted(calls.items())},
        "claims_peak": max(
            (r["claims_peak"] for r in runs if r.get("claims_peak") is not None), default=None
        ),
        "claims_check_peak": None if claims_check is None else claims_check["claims_peak"],
        "claims_check_updates": None if claims_check is None else claims_check["n"],
        "claims_check_rate": None if claims_check is None else claims_check["rate"],
        "store_calls_per_update": sum(calls.values()) / total_n if calls else None,
        "statements_per_update": driver.get("statements", 0) / total_n if counter.installed else None,
        "commits_per_update": driver.get("commits", 0) / total_n if counter.installed else None,
        "server_commits_per_update": (sum(server) / total_n) if len(server) == len(runs) else None,
        "pg_cpu_us_per_update": median(pg_us) if len(pg_us) == len(runs) else None,
        "pg_cpu_us_per_update_runs": pg_us,
        "pg_backends": [r["pg_backend"] for r in runs if r.get("pg_backend")],
        "latency": latency,
        "notes": notes,
        "profile": profiler.report,
    }
