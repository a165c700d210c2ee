"""Recovery measurements (issue 12): how long until every update is handled after a signal.

Usage (from the repository root)::

    python benchmarks/recovery.py            # every scenario, SQLite and PostgreSQL
    python benchmarks/recovery.py --quick    # fewer updates, SQLite and PostgreSQL (smoke)
    python benchmarks/recovery.py --only sigkill-restart --stores sqlite
    python benchmarks/recovery.py --front intake       # the same with blocking UpdateIntake
    python benchmarks/recovery.py --only backlog-share --backlog 20000

Each scenario runs real PTB bot processes (``tests/processes/ptb_bot_worker.py``: a
``FencedUpdateProcessor`` with the library defaults, lease 120 s and sweep 30 s; handler: 50 ms
+ one fenced INSERT with ``run_in_transaction(..., complete=True)``) against a
:class:`ptb_fence.testing.FakeBotApi`, ``--updates`` updates over 30 chats; the signal comes
after about a third of them were handled, and a new process is started right away.

``--front intake`` runs ``tests/processes/intake_worker.py`` instead: a blocking
:class:`ptb_fence.UpdateIntake` fed by a getUpdates thread, stopped with ``close()`` on
SIGTERM/SIGINT, the same handler in ``with attempt.transaction(complete=True)``.

Columns: seconds from the signal until every update is handled; updates that waited for a
lapsed lease (handled more than 90 % of a lease after the signal); lost (not handled within
``--cap`` seconds); duplicates (more than one fenced domain row for an update).

``sigkill-slow`` puts ``--slow-handlers`` updates (default 16, of other chats) whose handlers
take ``--handler-seconds`` (default 2 s, as a handler calling a payment API or an LLM) in flight,
SIGKILLs the process once every one of them started and restarts it at once: the row's time is
from the kill until all are handled, and its goal (printed met or missed) is 3 handlers' time +
5 s. ``crash-loop`` sends one update whose handler SIGKILLs its own process (as a segfault
would) beside ``--slow-handlers`` healthy ones in one ``getUpdates`` batch, with
``max_attempts=3``, and restarts the bot each time it dies (``Restart=always``): the row shows
the crashes, the most runs of a healthy update (its handler's starts, goal 2) and the poison's
end (abandoned after its attempts). Both are in the default list.

``backlog-share`` (not in the default list) records ``--backlog`` updates (default 20,000, over
30 chats, received an hour ago: an outage) as ``pending`` straight into the store, then starts
two processes (no polling: their sweeps take the backlog) and samples every 100 ms the rows in
``processing`` per process (the ``instance`` column of each claim; each worker writes its
instance id to ``instance.<pid>``) and each process's peak RSS (``VmHWM``). It prints, per
process, the most claims held at once (the bound is ``max_concurrent + ingest_claim_buffer``
= 32 + 8), its share of the backlog and its peak RSS, and the seconds until the backlog was
drained.

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
WORKERS = {"ptb": os.path.join(ROOT, "tests", "processes", "ptb_bot_worker.py"),
           "intake": os.path.join(ROOT, "tests", "processes", "intake_worker.py")}
LEASE = 120.0
DEFAULTS = ["--lease", "120", "--sweep", "30", "--grace", "60", "--max-life", "600",
            "--max-concurrent", "32", "--slow", "w", "--slow-seconds", "0.05"]
SCENARIOS = ["sigterm-burst", "sigint-stream", "sigterm-backlog", "sigkill-restart",
             "sigkill-second", "hung-handler", "sigkill-slow", "crash-loop"]
CRASH_LOOP_ATTEMPTS = 3
"""``max_attempts`` of the ``crash-loop`` scenario: the poison ends after this many charged
crashes (plus the first, which no update is charged for)."""
CLAIM_BOUND = 32 + 8
"""``--max-concurrent`` of :data:`DEFAULTS` + the default ``ingest_claim_buffer``."""

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

    def record_pending(self, count: int, chats: int = 30) -> List[int]:
        """Record ``count`` message updates ``pending``, received an hour ago (a backlog)."""
        import json

        from ptb_fence.testing import make_message_update

        if self.kind == "sqlite":
            from ptb_fence import SQLiteUpdateStore

            store: Any = SQLiteUpdateStore(self.path)
        else:
            from ptb_fence import PostgresUpdateStore

            store = PostgresUpdateStore(self.url, self.table)
        at = int(time.time() * 1000) - 3_600_000
        ids = list(range(1, count + 1))
        try:
            for first in range(0, count, 1000):
                store.add_many([
                    (u, json.dumps(make_message_update(u, 1 + u % chats, "w", message_id=u)), at)
                    for u in ids[first:first + 1000]])
        finally:
            store.close()
        return ids

    def states_by_instance(self) -> Dict[Tuple[str, Optional[str]], int]:
        """``{(state, instance): rows}``."""
        return {(r[0], r[1]): r[2] for r in self._q(
            f"SELECT state, instance, COUNT(*) FROM {self.table} GROUP BY state, instance")}

    def domain_by_pid(self) -> Dict[int, int]:
        return {r[0]: r[1] for r in self._q(
            f"SELECT pid, COUNT(DISTINCT update_id) FROM {self.domain} GROUP BY pid")}

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

    def __init__(self, fake: FakeBotApi, store: Store, workdir: str, front: str = "ptb") -> None:
        self.fake, self.store, self.dir = fake, store, workdir
        self.worker = WORKERS[front]
        self.procs: List[Any] = []

    def spawn(self, *extra: str) -> Any:
        out = open(os.path.join(self.dir, f"out.{len(self.procs)}"), "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, self.worker, self.fake.base_url, self.fake.token, self.store.url,
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


def scenario(name: str, kind: str, updates: int, cap: float, front: str = "ptb",
             handlers: int = 16, seconds: float = 2.0) -> Any:
    workdir = tempfile.mkdtemp(prefix="ptb_fence_recovery_")
    store = Store(kind, workdir)
    try:
        with FakeBotApi() as fake:
            run = Run(fake, store, workdir, front)
            try:
                if name == "backlog-share":
                    return _backlog_share(run, updates, cap)
                if name == "sigkill-slow":
                    return _sigkill_slow(run, handlers, seconds, cap)
                if name == "crash-loop":
                    return _crash_loop(run, handlers, seconds, cap)
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
    hang_id: Optional[int] = None
    extra: List[str] = []
    if name == "hung-handler":
        # first, so it is running when the signal comes (injected last, it was sometimes not
        # even fetched yet: the stop then had nothing to wait for)
        hang_id = fake.inject_message(chat_id=31, text="hang")
        extra = ["--hang", "hang"]
    ids = [fake.inject_message(chat_id=1 + i % 30, text="w") for i in range(first_n)]
    if hang_id is not None:
        ids.append(hang_id)
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


def _starts(run: Run, update_id: int) -> int:
    """How many processes started ``update_id``'s handler (each writes ``started.<id>.<pid>``)."""
    return len(glob.glob(os.path.join(run.dir, f"started.{update_id}.*")))


def _sigkill_slow(run: Run, handlers: int, seconds: float, cap: float) -> Tuple[float, int, int, int]:
    """``handlers`` slow handlers in flight, SIGKILL, an immediate restart: seconds from the
    kill until all are handled, most runs of one update, lost, duplicates."""
    slow = ("--slow", "slow", "--slow-seconds", str(seconds))
    ids = [run.fake.inject_message(chat_id=100 + i, text="slow") for i in range(handlers)]
    first = run.spawn("--run-polling", *slow)
    run.ready(first)
    _wait(lambda: all(_starts(run, u) for u in ids), cap)
    killed = time.time()
    first.send_signal(signal.SIGKILL)
    first.wait(cap)
    run.spawn("--run-polling", *slow)
    _wait(lambda: set(run.store.completed()) >= set(ids), cap)
    done = run.store.completed()
    took = (max(done[u] for u in ids if u in done) / 1000.0 - killed) if done else float("nan")
    lost = sum(1 for u in ids if u not in done)
    dups = sum(1 for c in run.store.domain_counts().values() if c > 1)
    return took, max(_starts(run, u) for u in ids), lost, dups


def _crash_loop(run: Run, handlers: int, seconds: float, cap: float) -> Dict[str, Any]:
    """A poison update beside ``handlers`` healthy ones (handlers of ``seconds`` / 10), the
    bot restarted each time it dies, until every update settled or ``cap`` passed."""
    extra = ("--crash", "crash", "--max-attempts", str(CRASH_LOOP_ATTEMPTS),
             "--slow", "slow", "--slow-seconds", str(seconds / 10))
    poison = run.fake.inject_message(chat_id=99, text="crash")
    healthy = [run.fake.inject_message(chat_id=100 + i, text="slow") for i in range(handlers)]
    began = time.time()
    deadline = time.monotonic() + cap
    proc = run.spawn("--run-polling", *extra)
    crashes = 0

    def settled() -> bool:
        try:
            states = dict(run.store._q(f"SELECT update_id, state FROM {run.store.table}"))
        except Exception:  # noqa: BLE001 - the first process has not made its table yet
            return False
        return all(states.get(u) in ("completed", "abandoned") for u in [poison] + healthy)

    while not settled() and time.monotonic() < deadline and crashes < 4 * CRASH_LOOP_ATTEMPTS:
        if proc.poll() is not None:  # it died: the supervisor starts it again at once
            crashes += 1
            proc = run.spawn("--run-polling", *extra)
        time.sleep(0.05)
    took = time.time() - began
    states = dict(run.store._q(f"SELECT update_id, state FROM {run.store.table}"))
    done = run.store.completed()
    return {
        "crashes": crashes,
        "took": took,
        "healthy_runs": max(_starts(run, u) for u in healthy),
        "poison": states.get(poison, "missing"),
        "lost": sum(1 for u in healthy if u not in done),
        "dups": sum(1 for c in run.store.domain_counts().values() if c > 1),
    }


def _peak_rss_mb(pid: int) -> Optional[float]:
    """The process's peak resident set (``VmHWM``), in MB; :obj:`None` once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as file:
            for line in file:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _backlog_share(run: Run, backlog: int, cap: float) -> Dict[str, Any]:
    """Two processes work off a recorded backlog; see the module docstring."""
    store = run.store
    ids = store.record_pending(backlog)
    began = time.monotonic()
    procs = [run.spawn("--max-life", str(cap + 60)) for _ in range(2)]
    rss: Dict[int, float] = {p.pid: 0.0 for p in procs}
    by_instance: Dict[Optional[str], int] = {}  # the most rows in processing per instance
    drained = float("nan")
    while time.monotonic() - began < cap:
        for proc in procs:
            mb = _peak_rss_mb(proc.pid)
            if mb is not None:
                rss[proc.pid] = max(rss[proc.pid], mb)
        counts = store.states_by_instance()
        for (state, instance), n in counts.items():
            if state == "processing":
                by_instance[instance] = max(by_instance.get(instance, 0), n)
        if sum(n for (state, _), n in counts.items() if state == "completed") >= backlog:
            drained = time.monotonic() - began
            break
        time.sleep(0.1)
    owners: Dict[Optional[str], int] = {}
    for proc in procs:
        path = os.path.join(run.dir, f"instance.{proc.pid}")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as file:
                owners[file.read().strip()] = proc.pid
    peak = {p.pid: 0 for p in procs}
    unknown = 0  # processing rows of no known instance (none expected)
    for instance, n in by_instance.items():
        if instance in owners:
            peak[owners[instance]] = n
        else:
            unknown = max(unknown, n)
    with open(os.path.join(run.dir, "stop"), "w", encoding="utf-8"):
        pass
    for proc in procs:
        proc.wait(60)
    done = store.completed()
    by_pid = store.domain_by_pid()
    return {
        "drained": drained,
        "lost": sum(1 for u in ids if u not in done),
        "dups": sum(1 for c in store.domain_counts().values() if c > 1),
        "unknown": unknown,
        "procs": [(p.pid, peak[p.pid], by_pid.get(p.pid, 0) / backlog, rss[p.pid]) for p in procs],
    }


def _print_backlog(kind: str, front: str, backlog: int, result: Dict[str, Any]) -> bool:
    """Print one backlog-share row per process; returns whether it failed."""
    failed = bool(result["lost"] or result["dups"])
    for i, (pid, peak, share, rss) in enumerate(result["procs"]):
        failed |= peak > CLAIM_BOUND
        print(f"{'backlog-share':<14} {front:<7} {kind:<9} {backlog:>8} {result['drained']:>9.1f} s "
              f"{i + 1:>5} {peak:>4}/{CLAIM_BOUND} {share:>6.1%} {rss:>8.1f} MB "
              f"{result['lost']:>5} {result['dups']:>5} {result['unknown']:>8}", flush=True)
    return failed


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60 updates, cap 60 s")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--cap", type=float, default=200.0, help="seconds to wait for each")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--only", default=",".join(SCENARIOS),
                        help="scenarios, comma-separated (also: backlog-share)")
    parser.add_argument("--front", default="ptb", help="ptb, intake or ptb,intake")
    parser.add_argument("--backlog", type=int, default=20_000, help="backlog-share's backlog")
    parser.add_argument("--slow-handlers", type=int, default=16,
                        help="sigkill-slow's handlers in flight; crash-loop's healthy updates")
    parser.add_argument("--handler-seconds", type=float, default=2.0,
                        help="sigkill-slow's handler time (crash-loop's: a tenth of it)")
    args = parser.parse_args(argv)
    if args.quick:
        args.updates, args.cap = 60, 60.0
    names = args.only.split(",")
    special = ("backlog-share", "sigkill-slow", "crash-loop")
    failed = False
    goals: List[str] = []
    if any(name not in special for name in names):
        print(f"{'scenario':<18} {'front':<7} {'store':<9} {'signal->all handled':>20} "
              f"{'waited for lease':>17} {'lost':>5} {'dups':>5}")
    for name in (n for n in names if n not in special):
        for front in args.front.split(","):
            for kind in args.stores.split(","):
                took, waited, lost, dups = scenario(name, kind, args.updates, args.cap, front)
                failed |= bool(lost or dups)
                print(f"{name:<18} {front:<7} {kind:<9} {took:>18.1f} s {waited:>17} {lost:>5} "
                      f"{dups:>5}", flush=True)
    if "sigkill-slow" in names:
        goal = 3 * args.handler_seconds + 5
        print(f"{'scenario':<14} {'front':<7} {'store':<9} {'in flight':>9} {'handler':>8} "
              f"{'kill->all handled':>18} {'most runs':>9} {'lost':>5} {'dups':>5}")
        for front in args.front.split(","):
            for kind in args.stores.split(","):
                took, runs, lost, dups = scenario(
                    "sigkill-slow", kind, 0, args.cap, front, args.slow_handlers,
                    args.handler_seconds)
                failed |= bool(lost or dups)
                print(f"{'sigkill-slow':<14} {front:<7} {kind:<9} {args.slow_handlers:>9} "
                      f"{args.handler_seconds:>7.1f}s {took:>16.1f} s {runs:>9} {lost:>5} "
                      f"{dups:>5}", flush=True)
                goals.append(f"sigkill-slow {front} {kind}: {took:.1f} s <= {goal:g} s "
                             f"(3 handlers' time + 5 s): {'met' if took <= goal else 'MISSED'}")
    if "crash-loop" in names:
        print(f"{'scenario':<14} {'front':<7} {'store':<9} {'healthy':>7} {'crashes':>7} "
              f"{'settled in':>11} {'most runs':>9} {'poison':>10} {'lost':>5} {'dups':>5}")
        for front in args.front.split(","):
            for kind in args.stores.split(","):
                loop = scenario("crash-loop", kind, 0, args.cap, front, args.slow_handlers,
                                args.handler_seconds)
                failed |= bool(loop["lost"] or loop["dups"])
                print(f"{'crash-loop':<14} {front:<7} {kind:<9} {args.slow_handlers:>7} "
                      f"{loop['crashes']:>7} {loop['took']:>9.1f} s {loop['healthy_runs']:>9} "
                      f"{loop['poison']:>10} {loop['lost']:>5} {loop['dups']:>5}", flush=True)
                ok = (loop["healthy_runs"] <= 2 and loop["poison"] == "abandoned"
                      and loop["crashes"] <= CRASH_LOOP_ATTEMPTS + 1)
                goals.append(f"crash-loop {front} {kind}: {loop['crashes']} crashes, healthy "
                             f"runs <= {loop['healthy_runs']}, poison {loop['poison']} (goal: "
                             f"<= {CRASH_LOOP_ATTEMPTS + 1} crashes, <= 2 runs, abandoned): "
                             f"{'met' if ok else 'MISSED'}")
    if goals:
        print("TARGETS")
        for line in goals:
            print("  " + line)
    if "backlog-share" in names:
        print(f"{'scenario':<14} {'front':<7} {'store':<9} {'backlog':>8} {'drained':>11} "
              f"{'proc':>5} {'max claims':>9} {'share':>6} {'peak RSS':>11} {'lost':>5} "
              f"{'dups':>5} {'unknown':>8}")
        for front in args.front.split(","):
            for kind in args.stores.split(","):
                result = scenario("backlog-share", kind, args.backlog, args.cap, front)
                failed |= _print_backlog(kind, front, args.backlog, result)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
