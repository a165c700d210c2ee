"""Scale-out rows: one and several bot processes on one PostgreSQL table, side by side.

A ``scaleout-*`` row runs in its child (``run.py --child``) as a coordinator that starts the bot
processes and measures around them; it is no bot itself, so its work is in none of the bot
figures. Each measured run is a pair: one bot process alone, then ``processes`` bot processes
at once (the order alternates from run to run), each on a fresh shared table:

- every bot process is a real PTB ``Application`` with a ``FencedUpdateProcessor`` on the same
  PostgreSQL table, polling a fast fake Bot API of its own (``_fast_server.py``) that holds
  ``updates`` updates with ids disjoint from the other processes'. Telegram lets one process
  poll a bot token; several receiving processes are webhooks behind a load balancer. Polling
  is used here because it is the receiving path the harness measures at full speed; what the
  processes share is the table and the server, as receivers behind a load balancer do;
- the coordinator starts the processes, waits until each has started its Application, then
  tells them all to start polling at once; each reports its own start and end
  (``time.monotonic``, one clock for the machine), CPU time, and statements and commits counted
  at its driver. Aggregate throughput: all updates over (last end - first start);
- the PostgreSQL backends' CPU time (``_pg_cpu.BackendCpu``) is read before the start and after
  the last process has finished, while every connection is still open; the server's
  ``xact_commit`` of the private database around the whole pair member (start to exit).

Run a bot process by hand as ``python benchmarks/_scaleout.py '<json spec>'`` (see
:func:`bot_main`); it speaks a line protocol on stdin/stdout (``READY``, ``go``, ``DONE``,
``stop``, ``CHECKED``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (HERE, ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)

READY, DONE, CHECKED = "READY ", "DONE ", "CHECKED "


def _load() -> List[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return []


# ================================================================================================
# one bot process
# ================================================================================================
def _shared_run_class() -> Any:
    from ptb_fence import PostgresUpdateStore

    from _common import CountingStore, pg_connect
    from _ptb_rows import _Run

    class SharedTableRun(_Run):
        """A polling run on a table (and domain table) the coordinator made and drops."""

        def make_store(self) -> None:
            raw = PostgresUpdateStore(self.cfg["dsn"], self.cfg["table"])  # library defaults
            if self.kind == "fenced-write":
                self.domain_table = self.cfg["domain_table"]
            self.raw_store = raw
            self.store = CountingStore(raw, self.tracker)

        def drop(self) -> None:
            pass  # the tables are shared: the coordinator drops them

        def completed_in_store(self) -> int:
            first = int(self.cfg["first_id"])
            conn = pg_connect(self.cfg["dsn"])
            try:
                with conn.cursor() as cur:
                    cur.execute(
                        f"SELECT count(*) FROM \"{self.cfg['table']}\" WHERE state = 'completed' "
                        "AND update_id BETWEEN %s AND %s",
                        (first, first + int(self.cfg["updates"]) - 1),
                    )
                    return int(cur.fetchone()[0])
            finally:
                conn.close()

    return SharedTableRun


def _say(prefix: str, payload: Dict[str, Any]) -> None:
    sys.stdout.write(prefix + json.dumps(payload) + "\n")
    sys.stdout.flush()


async def _bot(cfg: Dict[str, Any]) -> None:
    from _common import CompletionTracker, DriverCounter
    from _ptb_rows import process_cpu_seconds

    counter = DriverCounter()
    counter.install()
    n = int(cfg["updates"])
    tracker = CompletionTracker()
    run = _shared_run_class()(cfg, f"bot{cfg.get('index', 0)}", tracker)
    loop = asyncio.get_running_loop()
    try:
        run.make_store()
        run.build_app(pending=n)
        run.expected = n
        app = run.app
        await app.initialize()
        await app.start()
        await asyncio.sleep(0.1)  # the processor's first sweep runs now, outside the count
        _say(READY, {"pid": os.getpid(), "server_pid": run.server_pid})
        go = await loop.run_in_executor(None, sys.stdin.readline)
        if go.strip() != "go":
            raise RuntimeError(f"expected 'go' from the coordinator, got {go!r}")
        counter.reset()
        assert run.store is not None
        run.store.reset_calls()
        server_cpu0 = process_cpu_seconds(run.server_pid) if run.server_pid else None
        cpu0 = time.process_time()
        t0 = time.monotonic()  # CLOCK_MONOTONIC: comparable between the processes
        await app.updater.start_polling(poll_interval=0.0, timeout=1)
        _end, note = await run.wait_all(n, float(cfg.get("timeout", 300)))
        t1 = time.monotonic()
        cpu1 = time.process_time()
        server_cpu1 = process_cpu_seconds(run.server_pid) if run.server_pid else None
        _say(DONE, {
            "n": n, "t0": t0, "t1": t1, "cpu_seconds": cpu1 - cpu0,
            "server_cpu_seconds": (
                None if server_cpu0 is None or server_cpu1 is None else server_cpu1 - server_cpu0
            ),
            "driver": counter.snapshot(), "calls": run.store.calls(), "note": note,
        })
        # the connections stay open until every process is done and the server's CPU is read
        stop = await loop.run_in_executor(None, sys.stdin.readline)
        if stop.strip() != "stop":
            raise RuntimeError(f"expected 'stop' from the coordinator, got {stop!r}")
        await run.stop_app()
        run.close()
        _say(CHECKED, {"completed": run.completed_in_store()})
    finally:
        try:
            await run.stop_app()
        finally:
            run.close()


def bot_main(spec: str) -> int:
    """One bot process: ``spec`` is the JSON of a ``poll-fenced`` / ``poll-fenced-write`` row's
    child configuration plus ``table``, ``domain_table``, ``first_id`` and ``index``."""
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(_bot(json.loads(spec)))
    return 0


# ================================================================================================
# the coordinator (the row's child)
# ================================================================================================
class _Bot:
    """A bot process started by the coordinator."""

    def __init__(self, spec: Dict[str, Any]) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env, cwd=ROOT,
        )
        self.stderr: List[str] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip())

    def expect(self, prefix: str) -> Dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(prefix):
                result: Dict[str, Any] = json.loads(line[len(prefix):])
                return result
        self.proc.wait(10)
        self._reader.join(5)
        tail = " | ".join(l.strip() for l in self.stderr[-3:])
        raise RuntimeError(f"bot process exited {self.proc.returncode} before {prefix.strip()}: {tail}")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)

    def warnings(self) -> List[str]:
        return [l for l in self.stderr if l.startswith(("WARNING", "ERROR"))]


def _create_tables(cfg: Dict[str, Any], write: bool) -> Dict[str, Optional[str]]:
    from ptb_fence import PostgresUpdateStore

    from _common import create_domain_table

    suffix = uuid.uuid4().hex[:12]
    table = f"bench_scale_{suffix}"
    store = PostgresUpdateStore(cfg["dsn"], table)
    try:
        store.due(now=0, pending_before=0, limit=1)  # create the table before the processes start
    finally:
        store.close()
    domain = None
    if write:
        domain = f"bench_scale_domain_{suffix}"
        create_domain_table("pg", domain, dsn=cfg["dsn"])
    return {"table": table, "domain_table": domain}


def _pair_member(cfg: Dict[str, Any], processes: int, n: int, tag: str) -> Dict[str, Any]:
    """``processes`` bot processes at once on a fresh shared table, ``n`` updates each."""
    from _common import drop_tables, server_commits
    from _pg_cpu import BackendCpu

    kind = "poll-" + cfg["kind"][len("scaleout-"):]  # poll-fenced / poll-fenced-write
    tables = _create_tables(cfg, kind == "poll-fenced-write")
    admin_dsn, bench_db = cfg.get("admin_dsn"), cfg.get("bench_db")
    private = bool(bench_db) and str(bench_db).startswith("ptb_fence_bench_")
    commits0 = server_commits(admin_dsn, bench_db) if private else None
    probe = BackendCpu.for_run(cfg)
    bots: List[_Bot] = []
    watchdog = threading.Timer(float(cfg.get("timeout", 600)), lambda: [b.proc.kill() for b in bots])
    watchdog.daemon = True
    watchdog.start()
    try:
        for index in range(processes):
            spec = {
                key: cfg[key] for key in ("dsn", "concurrency", "chats", "run_py", "workdir",
                                          "timeout", "processor_options") if key in cfg
            }
            spec.update(
                row=f"{cfg['row']}/{tag}/p{index}", kind=kind, store="pg", server="fast",
                updates=n, first_id=1 + index * n, index=index, **tables,
            )
            bots.append(_Bot(spec))
        for bot in bots:
            bot.expect(READY)
        load0 = _load()
        cpu0 = probe.snapshot() if probe is not None else None
        for bot in bots:
            bot.send("go")
        done = [bot.expect(DONE) for bot in bots]
        cpu1 = probe.snapshot() if probe is not None and cpu0 is not None else None
        for bot in bots:
            bot.send("stop")
        checked = [bot.expect(CHECKED)["completed"] for bot in bots]
        for bot in bots:
            bot.finish()
        if any(c != n for c in checked):
            raise RuntimeError(f"{cfg['row']}: the store shows {checked} of {n} updates completed per process")
        commits1 = server_commits(admin_dsn, bench_db) if commits0 is not None else None
    finally:
        watchdog.cancel()
        for bot in bots:
            if bot.proc.poll() is None:
                bot.proc.kill()
                bot.proc.wait()
        if probe is not None:
            probe.close()
        drop_tables(cfg["dsn"], *[t for t in tables.values() if t])
    total = n * processes
    t0 = min(d["t0"] for d in done)
    t1 = max(d["t1"] for d in done)
    driver: Dict[str, int] = {}
    calls: Dict[str, int] = {}
    for d in done:
        for k, v in d["driver"].items():
            driver[k] = driver.get(k, 0) + v
        for k, v in d["calls"].items():
            calls[k] = calls.get(k, 0) + v
    server_cpu = [d["server_cpu_seconds"] for d in done]
    member: Dict[str, Any] = {
        "processes": processes,
        "n": total,
        "seconds": t1 - t0,
        "rate": total / (t1 - t0),
        "process_rates": [d["n"] / (d["t1"] - d["t0"]) for d in done],
        "start_spread_ms": (max(d["t0"] for d in done) - t0) * 1000.0,
        "cpu_us_per_update": sum(d["cpu_seconds"] for d in done) / total * 1e6,
        "cpu_busy": [d["cpu_seconds"] / (d["t1"] - d["t0"]) for d in done],
        "fast_server_cpu_us_per_update": (
            None if None in server_cpu else sum(server_cpu) / total * 1e6
        ),
        "statements_per_update": driver.get("statements", 0) / total,
        "commits_per_update": driver.get("commits", 0) / total,
        "calls_per_update": {k: v / total for k, v in sorted(calls.items())},
        "server_commits_per_update": (
            None if commits0 is None or commits1 is None else (commits1 - commits0) / total
        ),
        "load": load0,
        "notes": sorted({d["note"] for d in done if d.get("note")}),
        "warnings": [w for bot in bots for w in bot.warnings()][:5],
    }
    if cpu0 is not None and cpu1 is not None:
        ns, backends, new, gone = BackendCpu.delta(cpu0, cpu1)
        member["pg_cpu_us_per_update"] = ns / 1e3 / total
        member["pg_backends"] = {"backends": backends, "new": new, "gone": gone}
    else:
        member["pg_cpu_us_per_update"] = None
        member["pg_cpu_problem"] = (probe.problem if probe is not None else None) or (
            "not the run's own database: its backends would include other sessions'"
        )
    return member


def _summary(members: List[Dict[str, Any]]) -> Dict[str, Any]:
    from _common import median

    def med(key: str) -> Optional[float]:
        values = [m[key] for m in members if m.get(key) is not None]
        return median(values) if len(values) == len(members) else None

    rates = [m["rate"] for m in members]
    return {
        "processes": members[0]["processes"],
        "rates": rates,
        "median": median(rates),
        "cpu_us_per_update": med("cpu_us_per_update"),
        "pg_cpu_us_per_update": med("pg_cpu_us_per_update"),
        "statements_per_update": med("statements_per_update"),
        "commits_per_update": med("commits_per_update"),
        "server_commits_per_update": med("server_commits_per_update"),
        "fast_server_cpu_us_per_update": med("fast_server_cpu_us_per_update"),
        "runs": members,
    }


def measure_scaleout(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """A warm-up pair member (one process, not reported), then ``runs`` pairs: one process and
    ``processes`` processes (alternating which goes first)."""
    from _common import median

    processes = int(cfg.get("processes", 2))
    if processes < 2:
        raise ValueError("a scale-out row compares one process with 2 or more")
    n = int(cfg["updates"])
    warm = int(cfg.get("warmup", 0))
    if warm:
        _pair_member(cfg, 1, warm, "warmup")
    one: List[Dict[str, Any]] = []
    many: List[Dict[str, Any]] = []
    load_start = _load()
    for index in range(int(cfg["runs"])):
        order = (1, processes) if index % 2 == 0 else (processes, 1)
        for count in order:
            member = _pair_member(cfg, count, n, f"run{index}x{count}")
            (one if count == 1 else many).append(member)
    ratios = [m["rate"] / o["rate"] for o, m in zip(one, many)]
    cores = os.cpu_count()
    try:
        usable: Optional[int] = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = cores
    return {
        "scaleout": {"one": _summary(one), "many": _summary(many)},
        "processes": processes,
        "updates_per_process": n,
        "speedups": ratios,
        "speedup_median": median(ratios),
        "cores": cores,
        "usable_cores": usable,
        "load_start": load_start,
        "load_end": _load(),
    }


if __name__ == "__main__":
    sys.exit(bot_main(sys.argv[1]))
