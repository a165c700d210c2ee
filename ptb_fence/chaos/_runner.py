"""ChaosRunner: drives updates through worker processes while injecting faults, then checks."""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ptb_fence.chaos._db import ChaosDatabase

__all__ = ["ChaosConfig", "ChaosRunner", "main"]

KILL = "sigkill"
STOP = "sigstop"
TERMINATE = "pg_terminate_backend"
RESTART = "pg_restart"

_PROGRESS_EVERY = 2.0
_TICK = 0.05
_READY_TIMEOUT = 60.0
_STOP_TIMEOUT = 30.0
_EXPLAIN_SLACK_MS = 1500
"""A claim up to ``lease + 1.5 s`` before a SIGKILL, a backend termination or a restart may never
reach its handler: the worker died, or the claim's commit broke after it landed (outcome
unknown). The lease term covers a claim that waited for a row (PostgreSQL) or the write lock
(SQLite) held by a paused worker, which is paused for ``lease + 1 s``."""
_EXPLAIN_AFTER_MS = 1000
_RECORD_SLACK_MS = 5
"""A request or a call may be stamped up to this long after the step's record (two clocks)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class ChaosConfig:
    """The settings of one chaos run (see ``python -m ptb_fence.chaos --help``).

    Args:
        store (:obj:`str`, optional): ``sqlite:///absolute/path`` or a PostgreSQL DSN. Default a
            SQLite file in a new temporary directory.
        updates (:obj:`int`, optional): Updates to drive. Default 5000 on PostgreSQL, 2000 on
            SQLite.
        workers (:obj:`int`, optional): Worker processes. Default 4.
        seed (:obj:`int`, optional): Seed of the plan and of the fault schedule. Default random.
        duration_limit (:obj:`float`, optional): Give up (and fail) after this many seconds.
        pg_restart (:obj:`bool`, optional): Restart PostgreSQL once mid-run. Default :obj:`True`.
        rate (:obj:`float`, optional): Updates delivered per second. Default 100 on PostgreSQL,
            50 on SQLite.
        fault_every (:obj:`float`, optional): Mean seconds between faults. Default 1.5.
        lease (:obj:`float`, optional): The workers' ``lease_seconds``. Default 1.0.
        sweep (:obj:`float`, optional): The workers' ``sweep_every_seconds``. Default 0.2.
        max_attempts (:obj:`int`, optional): The workers' ``max_attempts``. Default 5.
        max_concurrent (:obj:`int`, optional): The workers' ``max_concurrent``. Default 8.
        keep (:obj:`bool`, optional): Keep the tables and the work directory after a pass.
        run_id (:obj:`str`, optional): Names the run's tables (``chaos_<run_id>_*``). Default
            random.
        payments (:obj:`bool`, optional): The handlers charge a
            :class:`~ptb_fence.testing.FakePaymentApi` in a step, and the run checks the charges.
            Default :obj:`True`.
    """

    __slots__ = (
        "duration_limit",
        "fault_every",
        "keep",
        "lease",
        "max_attempts",
        "max_concurrent",
        "payments",
        "pg_restart",
        "rate",
        "run_id",
        "seed",
        "store",
        "sweep",
        "updates",
        "workers",
    )

    def __init__(
        self,
        *,
        store: Optional[str] = None,
        updates: Optional[int] = None,
        workers: int = 4,
        seed: Optional[int] = None,
        duration_limit: float = 600.0,
        pg_restart: bool = True,
        rate: Optional[float] = None,
        fault_every: float = 1.5,
        lease: float = 1.0,
        sweep: float = 0.2,
        max_attempts: int = 5,
        max_concurrent: int = 8,
        keep: bool = False,
        run_id: Optional[str] = None,
        payments: bool = True,
    ) -> None:
        postgres = store is not None and not store.startswith("sqlite:///")
        self.store = store
        self.updates = updates if updates is not None else (5000 if postgres else 2000)
        self.workers = workers
        self.seed = seed if seed is not None else random.SystemRandom().randrange(1, 10**6)
        self.duration_limit = duration_limit
        self.pg_restart = pg_restart
        self.rate = rate if rate is not None else (100.0 if postgres else 50.0)
        self.fault_every = fault_every
        self.lease = lease
        self.sweep = sweep
        self.max_attempts = max_attempts
        self.max_concurrent = max_concurrent
        self.keep = keep
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.payments = payments
        for name in ("updates", "workers", "max_attempts", "max_concurrent"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        for name in ("duration_limit", "rate", "fault_every", "lease", "sweep"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if not self.run_id.replace("_", "").isalnum() or not self.run_id.isascii():
            raise ValueError("--run-id may contain only letters, digits and underscores")


class _Update:
    """One planned update: who delivers it and how its handler behaves."""

    __slots__ = ("behaviour", "chat", "path", "slot", "update_id")

    def __init__(self, update_id: int, chat: int, slot: int, path: str, behaviour: str) -> None:
        self.update_id = update_id
        self.chat = chat
        self.slot = slot  # -1: recorded by the runner itself (only a sweep hands it over)
        self.path = path
        self.behaviour = behaviour

    def body(self) -> str:
        return json.dumps(
            {
                "update_id": self.update_id,
                "message": {
                    "message_id": self.update_id,
                    "date": 0,
                    "chat": {"id": self.chat, "type": "private"},
                    "from": {"id": self.chat, "is_bot": False, "first_name": "chaos"},
                    "text": f"chaos {self.path} {self.behaviour}",
                },
            },
            separators=(",", ":"),
        )


class _Worker:
    """The runner's view of one worker slot."""

    __slots__ = ("expected_death", "log", "paused_at", "proc", "slot", "starts", "stopped_until")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self.log: Optional[IO[bytes]] = None
        self.expected_death = False
        self.stopped_until: Optional[float] = None
        self.paused_at: Optional[int] = None  # when the process was last SIGSTOPped (ms)
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def running(self) -> bool:
        return self.alive and self.stopped_until is None


class ChaosRunner:
    """Runs one chaos configuration and checks the outcome from the database.

    Args:
        config (:class:`ChaosConfig`): The run's settings.
        out (file, optional): Where progress and the table go. Defaults to ``sys.stdout``.
    """

    __slots__ = (
        "_app_name",
        "_conn",
        "_config",
        "_db",
        "_dir",
        "_fault_times",
        "_faults",
        "_feed_done",
        "_feed_files",
        "_fed",
        "_notes",
        "_out",
        "_pay",
        "_plan",
        "_recorder",
        "_recorder_queue",
        "_recorder_done",
        "_recorder_error",
        "_restart",
        "_rng",
        "_tmp_dirs",
        "_unexpected",
        "_workers",
        "_t0",
        "_terminated_backends",
    )

    def __init__(self, config: ChaosConfig, out: Optional[IO[str]] = None) -> None:
        self._config = config
        self._out = out if out is not None else sys.stdout
        self._rng = random.Random(config.seed)
        self._tmp_dirs: List[str] = []
        store = config.store
        if store is None:
            tmp = tempfile.mkdtemp(prefix="ptb_fence_chaos_")
            self._tmp_dirs.append(tmp)
            store = "sqlite://" + os.path.join(os.path.abspath(tmp), "chaos.sqlite3")
            config.store = store
        self._db = ChaosDatabase(store, f"chaos_{config.run_id}")
        if self._db.is_sqlite:
            assert self._db.path is not None
            self._dir = os.path.join(
                os.path.dirname(os.path.abspath(self._db.path)), f"chaos_{config.run_id}"
            )
        else:
            self._dir = tempfile.mkdtemp(prefix=f"ptb_fence_chaos_{config.run_id}_")
            self._tmp_dirs.append(self._dir)
        os.makedirs(self._dir, exist_ok=True)
        self._app_name = f"ptb_fence_chaos_{config.run_id}"
        self._conn: Any = None
        self._plan: List[_Update] = []
        self._workers = [_Worker(slot) for slot in range(config.workers)]
        self._feed_files: Dict[int, IO[bytes]] = {}
        self._fed = 0
        self._feed_done = False
        self._faults: Dict[str, int] = {KILL: 0, STOP: 0, TERMINATE: 0, RESTART: 0}
        self._terminated_backends = 0
        self._fault_times: List[Tuple[str, int, int]] = []
        self._pay: Any = None  # the FakePaymentApi of a run with payments
        self._notes: Dict[str, str] = {}
        self._unexpected: List[str] = []
        self._recorder_queue: "queue.Queue[Optional[Tuple[int, str]]]" = queue.Queue()
        self._recorder: Optional[threading.Thread] = None
        self._recorder_done = threading.Event()
        self._recorder_error: List[str] = []
        self._restart: Optional[threading.Thread] = None
        self._t0 = time.monotonic()

    # -- output ------------------------------------------------------------------------------
    def _say(self, text: str) -> None:
        self._out.write(text + "\n")
        self._out.flush()

    def _elapsed(self) -> float:
        return time.monotonic() - self._t0

    # -- database ----------------------------------------------------------------------------
    def _query(
        self, text: str, params: Optional[Mapping[str, Any]] = None
    ) -> Optional[List[Tuple[Any, ...]]]:
        """A runner query. Returns None if the database is unreachable right now (reconnects later)."""
        try:
            if self._conn is None:
                self._conn = self._db.connect(self._app_name + "_runner", timeout=2.0)
            return self._db.query(self._conn, text, params)
        except Exception:
            conn, self._conn = self._conn, None
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass
            return None

    def _query_patiently(
        self, text: str, params: Optional[Mapping[str, Any]] = None, patience: float = 120.0
    ) -> List[Tuple[Any, ...]]:
        deadline = time.monotonic() + patience
        while True:
            rows = self._query(text, params)
            if rows is not None:
                return rows
            if time.monotonic() > deadline:
                raise RuntimeError(f"the database stayed unreachable for {patience:g}s")
            time.sleep(0.5)

    def _make_store(self) -> Any:
        db = self._db
        if db.is_sqlite:
            from ptb_fence import SQLiteUpdateStore

            return SQLiteUpdateStore(db.path or "", db.table("updates"))
        from ptb_fence import PostgresUpdateStore

        return PostgresUpdateStore(db.dsn(self._app_name + "_runner"), db.table("updates"))

    # -- plan ----------------------------------------------------------------------------------
    def _make_plan(self) -> None:
        config = self._config
        rng = self._rng
        n = config.updates
        base = rng.randrange(10**6, 10**9)
        failing = set(rng.sample(range(n), min(n, max(2, n // 200))))
        chats = max(20, n // 25)
        for i in range(n):
            if i in failing:
                behaviour = "fail"
            elif rng.random() < 0.10:
                behaviour = rng.choice(
                    ("transient-before", "transient-step", "transient-inside")
                    if config.payments else ("transient-before", "transient-inside")
                )
            else:
                behaviour = "ok"
            path = "plain" if rng.random() < 0.20 else "complete"
            slot = -1 if rng.random() < 0.10 else rng.randrange(config.workers)
            self._plan.append(_Update(base + i, 10_000 + rng.randrange(chats), slot, path, behaviour))

    # -- workers -------------------------------------------------------------------------------
    def _worker_command(self, slot: int) -> List[str]:
        config = self._config
        return [
            sys.executable,
            "-m",
            "ptb_fence.chaos._worker",
            "--store",
            self._db.url,
            "--prefix",
            self._db.prefix,
            "--dir",
            self._dir,
            "--slot",
            str(slot),
            "--application-name",
            self._app_name,
            "--seed",
            str(config.seed),
            "--lease",
            str(config.lease),
            "--sweep",
            str(config.sweep),
            "--grace",
            str(max(config.sweep, config.lease / 2)),
            "--max-attempts",
            str(config.max_attempts),
            "--max-concurrent",
            str(config.max_concurrent),
        ] + (["--pay", self._pay.url] if self._pay is not None else [])

    def _spawn(self, worker: _Worker) -> None:
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if worker.log is None:
            worker.log = open(os.path.join(self._dir, f"worker.{worker.slot}.log"), "ab")
        worker.proc = subprocess.Popen(
            self._worker_command(worker.slot),
            stdin=subprocess.DEVNULL,
            stdout=worker.log,
            stderr=worker.log,
            env=env,
            start_new_session=True,  # a Ctrl-C of the runner reaches the runner only
        )
        worker.expected_death = False
        worker.stopped_until = None
        worker.paused_at = None
        worker.starts += 1

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT
        while True:
            ready = [
                w for w in self._workers
                if w.proc is not None
                and os.path.exists(os.path.join(self._dir, f"ready.{w.slot}.{w.proc.pid}"))
            ]
            if len(ready) == len(self._workers):
                return
            for w in self._workers:
                if w.proc is not None and w.proc.poll() is not None:
                    raise RuntimeError(
                        f"worker {w.slot} exited with {w.proc.returncode} during start-up; see "
                        f"{os.path.join(self._dir, f'worker.{w.slot}.log')}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers were not ready within {_READY_TIMEOUT:g}s")
            time.sleep(0.05)

    def _reap(self) -> None:
        """Restart every worker that died (killed by a fault, or unexpectedly)."""
        for worker in self._workers:
            proc = worker.proc
            if proc is None or proc.poll() is None:
                continue
            if not worker.expected_death:
                self._unexpected.append(
                    f"worker {worker.slot} (pid {proc.pid}) exited with {proc.returncode} at "
                    f"{self._elapsed():.1f}s"
                )
            self._spawn(worker)

    def _stop_workers(self) -> None:
        with open(os.path.join(self._dir, "stop"), "w"):
            pass
        for worker in self._workers:
            if worker.alive and worker.stopped_until is not None:
                assert worker.proc is not None
                os.kill(worker.proc.pid, signal.SIGCONT)
                worker.stopped_until = None
        deadline = time.monotonic() + _STOP_TIMEOUT
        for worker in self._workers:
            proc = worker.proc
            if proc is None:
                continue
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._unexpected.append(
                    f"worker {worker.slot} (pid {proc.pid}) did not stop within {_STOP_TIMEOUT:g}s"
                )
                proc.kill()
                proc.wait()
            else:
                if proc.returncode != 0 and not worker.expected_death:
                    self._unexpected.append(
                        f"worker {worker.slot} (pid {proc.pid}) exited with {proc.returncode} "
                        "when stopped"
                    )
            if worker.log is not None:
                worker.log.close()
                worker.log = None

    # -- feeding -------------------------------------------------------------------------------
    def _record_loop(self, store: Any) -> None:
        """The runner's own share: recorded straight into the store. Only sweeps take them."""
        try:
            done = False
            while not done:
                batch: List[Tuple[int, str, int]] = []
                item = self._recorder_queue.get()
                while True:
                    if item is None:
                        done = True
                        break
                    batch.append((item[0], item[1], _now_ms()))
                    try:
                        item = self._recorder_queue.get_nowait()
                    except queue.Empty:
                        break
                while batch:
                    try:
                        store.add_many(batch)
                        batch = []
                    except Exception:  # the database is down: try again
                        time.sleep(0.2)
        except BaseException as exc:  # pragma: no cover - reported as a failed criterion
            self._recorder_error.append(f"{type(exc).__name__}: {exc}")
        finally:
            self._recorder_done.set()

    def _feed_tick(self, feed_start: float) -> None:
        if self._feed_done:
            return
        due = min(len(self._plan), int((time.monotonic() - feed_start) * self._config.rate) + 1)
        touched: Set[int] = set()
        while self._fed < due:
            update = self._plan[self._fed]
            self._fed += 1
            if update.slot < 0:
                self._recorder_queue.put((update.update_id, update.body()))
            else:
                handle = self._feed_files[update.slot]
                handle.write(update.body().encode() + b"\n")
                touched.add(update.slot)
        for slot in touched:
            self._feed_files[slot].flush()
        if self._fed >= len(self._plan):
            self._feed_done = True
            self._recorder_queue.put(None)

    # -- faults --------------------------------------------------------------------------------
    def _pick(self, prefer_busy: bool = False) -> Optional[_Worker]:
        running = [w for w in self._workers if w.running]
        if not running:
            return None
        if prefer_busy:
            # the worker that started a handler most recently is likely to have attempts in flight
            rows = self._query(self._db.statements()["chaos_latest_run_pid"])
            if rows:
                for worker in running:
                    if worker.proc is not None and worker.proc.pid == rows[0][0]:
                        return worker
        return self._rng.choice(running)

    def _fault(self, kind: str) -> bool:
        if kind == KILL:
            worker = self._pick()
            if worker is None or worker.proc is None:
                return False
            worker.expected_death = True
            now = _now_ms()
            # a pause holds back the claims made right before it: a kill soon after the pause
            # explains them as if it had struck when the pause began
            lease_ms = int(self._config.lease * 1000)
            window = (lease_ms + 1000) + lease_ms + _EXPLAIN_SLACK_MS
            paused = worker.paused_at
            start = paused if paused is not None and now - paused <= window else now
            self._log_fault(KILL, start, now, worker.proc.pid)
            os.kill(worker.proc.pid, signal.SIGKILL)
            worker.proc.wait()
            self._spawn(worker)  # restarted at once. It goes on with its feed
        elif kind == STOP:
            worker = self._pick(prefer_busy=True)
            if worker is None or worker.proc is None:
                return False
            self._log_fault(STOP, _now_ms(), _now_ms(), worker.proc.pid)
            worker.paused_at = _now_ms()
            os.kill(worker.proc.pid, signal.SIGSTOP)
            worker.stopped_until = time.monotonic() + self._config.lease + 1.0
        elif kind == TERMINATE:
            if self._restart is not None and self._restart.is_alive():
                return False
            started = _now_ms()
            rows = self._query(
                self._db.statements()["chaos_terminate_backends"],
                {"application_name": self._app_name},
            )
            if rows is None:
                return False
            self._log_fault(TERMINATE, started, _now_ms(), int(rows[0][0]))
            self._terminated_backends += int(rows[0][0])
        else:  # pragma: no cover
            raise ValueError(kind)
        self._faults[kind] += 1
        return True

    def _log_fault(self, kind: str, start: int, end: int, detail: int) -> None:
        """Remember a fault (and log it to ``DIR/faults.jsonl`` for inspection)."""
        if kind != STOP:  # a paused worker's claims still reach their handler after SIGCONT
            self._fault_times.append((kind, start, end))
        line = json.dumps({"kind": kind, "start_ms": start, "end_ms": end, "detail": detail})
        with open(os.path.join(self._dir, "faults.jsonl"), "a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    def _restart_reason(self) -> Optional[str]:
        """Why a PostgreSQL restart is impossible here (None: it is possible)."""
        if not self._config.pg_restart:
            return "disabled by --no-pg-restart"
        if not self._db.is_local_postgres():
            return "the DSN does not point at this machine"
        if os.geteuid() != 0:
            return "the runner is not root (pg_ctlcluster needs the rights)"
        if shutil.which("pg_ctlcluster") is None:
            return "pg_ctlcluster not found"
        try:
            versions = sorted(os.listdir("/etc/postgresql"))
        except OSError:
            return "/etc/postgresql not found"
        if len(versions) != 1:
            return f"expected one cluster version in /etc/postgresql, found {versions}"
        return None

    def _restart_postgres(self) -> None:
        version = sorted(os.listdir("/etc/postgresql"))[0]
        started = time.monotonic()
        started_ms = _now_ms()
        try:
            result = subprocess.run(
                ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
                capture_output=True,
                text=True,
                timeout=120,
            )
        except Exception as exc:
            self._notes[RESTART] = f"failed: {exc}"
            return
        ready = wait_for_postgres(self._db.url, timeout=120.0)
        took = time.monotonic() - started
        self._log_fault(RESTART, started_ms, _now_ms(), 0)
        if result.returncode != 0:
            self._notes[RESTART] = f"failed (exit {result.returncode}): {result.stderr.strip()[:200]}"
            return
        if not ready:
            self._notes[RESTART] = "PostgreSQL did not come back within 120 s"
            return
        self._faults[RESTART] += 1
        self._notes[RESTART] = f"down and back in {took:.1f} s"

    # -- progress ------------------------------------------------------------------------------
    def _states(self) -> Optional[Dict[str, int]]:
        rows = self._query(self._db.admin_sql().state_totals)
        if rows is None:
            return None
        states: Dict[str, int] = {}
        for state, count, unsettled in rows:
            states[str(state)] = int(count)
            if state == "abandoned":
                states["unacknowledged"] = int(unsettled or 0)
        return states

    def _progress(self, states: Optional[Dict[str, int]]) -> None:
        faults = self._faults
        up = sum(1 for w in self._workers if w.alive)
        stopped = sum(1 for w in self._workers if w.stopped_until is not None)
        if states is None:
            db = "database unreachable"
        else:
            recorded = sum(v for k, v in states.items() if k != "unacknowledged")
            db = (
                f"recorded {recorded} completed {states.get('completed', 0)} "
                f"exhausted {states.get('abandoned', 0)} pending {states.get('pending', 0)} "
                f"processing {states.get('processing', 0)} failed {states.get('failed', 0)}"
            )
        self._say(
            f"[{self._elapsed():6.1f}s] fed {self._fed}/{len(self._plan)} | {db} | "
            f"kill {faults[KILL]} stop {faults[STOP]} terminate {faults[TERMINATE]} "
            f"restart {faults[RESTART]} | workers {up - stopped} up, {stopped} stopped"
        )

    def _finished(self, states: Optional[Dict[str, int]]) -> bool:
        if states is None or not self._feed_done or not self._recorder_done.is_set():
            return False
        final = states.get("completed", 0) + states.get("abandoned", 0)
        return final >= len(self._plan) and states.get("unacknowledged", 0) == 0

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> int:
        """Run the configuration. Print progress and the table. Returns the exit code."""
        config = self._config
        db = self._db
        self._t0 = time.monotonic()
        self._make_plan()
        restart_reason = self._restart_reason() if not db.is_sqlite else "not PostgreSQL"
        if restart_reason is not None:
            self._notes[RESTART] = f"skipped: {restart_reason}"
        enabled = [KILL, STOP] + ([] if db.is_sqlite else [TERMINATE])
        self._say(
            f"ptb_fence chaos run {config.run_id}: {db.describe()}, {len(self._plan)} updates, "
            f"{config.workers} workers, seed {config.seed}, lease {config.lease:g}s, sweep "
            f"{config.sweep:g}s, max_attempts {config.max_attempts}"
        )
        if restart_reason is not None:
            self._say(f"PostgreSQL restart skipped: {restart_reason}")
        self._say(f"work directory: {self._dir}")
        if config.payments:
            from ptb_fence.testing import FakePaymentApi

            self._pay = FakePaymentApi().start()
            self._say(f"payments: a FakePaymentApi at {self._pay.url}")
        store = self._make_store()
        store.due(now=0, pending_before=0, limit=1)  # the table exists before any worker starts
        conn = db.connect(self._app_name + "_runner", timeout=30.0)
        try:
            db.create_tables(conn)
            db.create_claim_log(conn)
        finally:
            conn.close()
        limit_reached = False
        try:
            for slot in range(config.workers):
                self._feed_files[slot] = open(os.path.join(self._dir, f"feed.{slot}.jsonl"), "ab")
            for worker in self._workers:
                self._spawn(worker)
            self._wait_ready()
            self._recorder = threading.Thread(
                target=self._record_loop, args=(store,), name="chaos-recorder", daemon=True
            )
            self._recorder.start()
            feed_start = time.monotonic()
            feed_seconds = len(self._plan) / config.rate
            restart_at = (
                feed_start + max(3.0, 0.4 * feed_seconds) if restart_reason is None else None
            )
            first_round = list(enabled)
            self._rng.shuffle(first_round)
            next_fault = feed_start + config.fault_every
            next_progress = time.monotonic() + _PROGRESS_EVERY
            next_check = 0.0
            while True:
                now = time.monotonic()
                for worker in self._workers:
                    if worker.stopped_until is not None and now >= worker.stopped_until:
                        if worker.alive and worker.proc is not None:
                            os.kill(worker.proc.pid, signal.SIGCONT)
                        worker.stopped_until = None
                self._reap()
                self._feed_tick(feed_start)
                all_kinds = all(self._faults[k] for k in enabled) and (
                    restart_at is None or self._restart is not None
                )
                faulting = not self._feed_done or not all_kinds
                if faulting and now >= next_fault:
                    kind = first_round.pop() if first_round else self._rng.choice(enabled)
                    if not self._fault(kind) and kind not in first_round:
                        first_round.append(kind)  # not possible now: try it next time
                    next_fault = now + config.fault_every * self._rng.uniform(0.5, 1.5)
                if restart_at is not None and self._restart is None and now >= restart_at:
                    self._restart = threading.Thread(
                        target=self._restart_postgres, name="chaos-pg-restart", daemon=True
                    )
                    self._restart.start()
                    self._say(f"[{self._elapsed():6.1f}s] restarting PostgreSQL")
                if now >= next_progress or now >= next_check:
                    restarting = self._restart is not None and self._restart.is_alive()
                    states = None if restarting else self._states()
                    if now >= next_progress:
                        self._progress(states)
                        next_progress = now + _PROGRESS_EVERY
                    next_check = now + 0.5
                    if not faulting and not restarting and self._finished(states):
                        break
                if self._elapsed() > config.duration_limit:
                    limit_reached = True
                    self._say(f"[{self._elapsed():6.1f}s] duration limit reached: stopping")
                    break
                time.sleep(_TICK)
        finally:
            for handle in self._feed_files.values():
                handle.close()
            self._stop_workers()
            if not self._recorder_done.is_set():
                self._recorder_queue.put(None)
            if self._recorder is not None:
                self._recorder.join(60)
            if self._restart is not None:
                self._restart.join(180)
            store.close()
        if not db.is_sqlite:
            wait_for_postgres(db.url, timeout=120.0)
        verdict = self._verify(limit_reached)
        if self._pay is not None:
            verdict["payments"] = self._verify_payments(verdict["failures"])
            self._pay.stop()
        ok = not verdict["failures"]
        self._print_table(verdict, ok)
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if ok and not config.keep:
            self._cleanup()
        elif not ok:
            self._say(f"kept for inspection: tables {db.prefix}_* in {db.describe()}; {self._dir}")
        return 0 if ok else 1

    def close(self) -> None:
        """Stop every worker still running (after an interruption), and the payment API."""
        if self._pay is not None:
            self._pay.stop()
        for worker in self._workers:
            if worker.proc is not None and worker.proc.poll() is None:
                try:
                    worker.proc.kill()
                    worker.proc.wait(10)
                except Exception:  # pragma: no cover
                    pass

    def _cleanup(self) -> None:
        db = self._db
        conn = db.connect(self._app_name + "_runner", timeout=30.0)
        try:
            db.drop_tables(conn)
        finally:
            conn.close()
        shutil.rmtree(self._dir, ignore_errors=True)
        for tmp in self._tmp_dirs:
            shutil.rmtree(tmp, ignore_errors=True)

    # -- verification --------------------------------------------------------------------------
    def _verify(self, limit_reached: bool) -> Dict[str, Any]:
        config = self._config
        db = self._db
        q = self._query_patiently
        sql = db.statements()
        rows = {
            int(u): (str(state), int(attempts), settled, claim)
            for u, state, attempts, settled, claim in q(db.admin_sql().all_rows)
        }
        domain: Dict[int, int] = {}
        domain_keys: Set[Tuple[int, int, str]] = set()
        for u, a, c in q(sql["chaos_domain_writes"]):
            domain[int(u)] = domain.get(int(u), 0) + 1
            domain_keys.add((int(u), int(a), str(c)))
        runs: Dict[int, Set[Tuple[int, str]]] = {}
        for u, a, c in q(sql["chaos_runs"]):
            runs.setdefault(int(u), set()).add((int(a), str(c)))
        delivered = {
            (int(u), int(a), str(c))
            for u, a, c in q(sql["chaos_exhaustions"])
        }
        lease_ms = max(1, int(config.lease * 1000))
        claims: Dict[int, Dict[Tuple[int, str], int]] = {}
        for u, a, c, due_at in q(sql["chaos_claims"]):
            claims.setdefault(int(u), {})[(int(a), str(c))] = int(due_at) - lease_ms
        events: Dict[str, List[Tuple[int, int, str]]] = {}
        for kind, u, a, c in q(sql["chaos_events"]):
            events.setdefault(str(kind), []).append((int(u), int(a), str(c)))

        failures: List[str] = []
        planned = {p.update_id: p for p in self._plan}
        missing = [u for u in planned if u not in rows]
        unfinished = [
            u for u in planned if u in rows and rows[u][0] not in ("completed", "abandoned")
        ]
        effectless = [u for u in planned if u in rows and rows[u][0] == "completed" and not domain.get(u)]
        lost = len(missing) + len(unfinished) + len(effectless)
        if lost:
            failures.append(
                f"lost updates = {lost}: {len(missing)} never recorded {missing[:5]}, "
                f"{len(unfinished)} neither completed nor exhausted "
                f"{[(u, rows[u][0]) for u in unfinished[:5]]}, {len(effectless)} completed "
                f"without their domain row {effectless[:5]}"
            )
        duplicates = sum(n - 1 for n in domain.values() if n > 1)
        if duplicates:
            worst = sorted((n, u) for u, n in domain.items() if n > 1)[-5:]
            failures.append(f"duplicate domain rows = {duplicates} (update, rows): {[(u, n) for n, u in worst]}")
        stray = [u for u in domain if u not in planned]
        if stray:
            failures.append(f"domain rows of updates never planned: {stray[:5]}")

        # the claim log (a trigger) against the attempts counter and the handler-run log. An
        # attempt given back (released at a stop, or taken over from a dead process whose
        # handlers did not run alone) is claimed again with the same number: the numbers
        # claimed are exactly 1..attempts, and each earlier claim of a repeated number had a
        # fault right after it.
        miscounted = [
            (u, r[1], sorted(a for a, _ in claims.get(u, {})))
            for u, r in rows.items()
            if sorted({a for a, _ in claims.get(u, {})}) != list(range(1, r[1] + 1))
        ]
        if miscounted:
            failures.append(
                f"the claim log disagrees with the attempts counter (update, attempts, claimed "
                f"attempt numbers): {miscounted[:5]}"
            )
        repeated = []
        for u, made in claims.items():
            latest: Dict[int, int] = {}
            for (a, _c), claimed_at in made.items():
                latest[a] = max(latest.get(a, claimed_at), claimed_at)
            for (a, c), claimed_at in made.items():
                if claimed_at < latest[a] and not self._explained(claimed_at):
                    repeated.append((u, a, c, claimed_at))
        if repeated:
            failures.append(
                "attempts given back with no SIGKILL, backend termination or restart within "
                f"lease + 1.5 s after their claim (update, attempt, claim, claimed at ms): "
                f"{repeated[:5]}"
            )
        unclaimed = [
            (u, a, c) for u, done in runs.items() for a, c in done if (a, c) not in claims.get(u, {})
        ]
        if unclaimed:
            failures.append(f"handler runs without a recorded claim: {unclaimed[:5]}")
        never_ran: Dict[int, List[Tuple[int, str]]] = {}
        unexplained = []
        for u, made in claims.items():
            for key, claimed_at in made.items():
                if key in runs.get(u, set()):
                    continue
                never_ran.setdefault(u, []).append(key)
                if not self._explained(claimed_at):
                    unexplained.append((u, key[0], key[1], claimed_at))
        if unexplained:
            failures.append(
                "claims whose handler never started, with no SIGKILL, backend termination or "
                "restart within lease + 1.5 s after them (update, attempt, claim, claimed at "
                f"ms): {unexplained[:5]}"
            )

        failing = [p.update_id for p in self._plan if p.behaviour == "fail"]
        bad_failing = []
        for u in failing:
            row = rows.get(u)
            numbers = sorted(a for a, _ in runs.get(u, set()))
            lost_claims = len(never_ran.get(u, []))
            # every attempt number ran or was claimed without reaching its handler (a number
            # given back by a crash may have run twice)
            covered = set(numbers) | {a for a, _ in never_ran.get(u, [])}
            if (
                row is None
                or row[0] != "abandoned"
                or row[1] != config.max_attempts
                or covered != set(range(1, config.max_attempts + 1))
                or domain.get(u)
            ):
                bad_failing.append(
                    (
                        u,
                        row[0] if row else None,
                        row[1] if row else None,
                        numbers,
                        lost_claims,
                        domain.get(u, 0),
                    )
                )
        if bad_failing:
            failures.append(
                f"always-failing updates not exhausted after exactly {config.max_attempts} "
                "attempts, each run or lost (update, state, attempts, run attempt numbers, claims "
                f"that never ran, domain rows): {bad_failing[:5]}"
            )
        exhausted = [u for u, r in rows.items() if r[0] == "abandoned"]
        unacknowledged = [u for u in exhausted if rows[u][2] is None]
        undelivered = [u for u in exhausted if (u, rows[u][1], str(rows[u][3])) not in delivered]
        if unacknowledged or undelivered:
            failures.append(
                f"exhaustions not acknowledged: {unacknowledged[:5]} ({len(unacknowledged)}); "
                f"not delivered to handle_exhaustion with their exact identity: "
                f"{undelivered[:5]} ({len(undelivered)})"
            )
        fenced = events.get("fenced_out", [])
        leaked = [key for key in fenced if key in domain_keys]
        inside = {p.update_id for p in self._plan if p.behaviour == "transient-inside"}
        leaked += [key for key in domain_keys if key[0] in inside and key[1] == 1]
        if leaked:
            failures.append(
                f"writes that were rolled back are in the domain table (update, attempt, "
                f"claim): {leaked[:5]}"
            )
        if self._recorder_error:
            failures.append(f"the runner could not record its share: {self._recorder_error[0]}")
        if self._unexpected:
            failures.append(f"workers exited unexpectedly: {'; '.join(self._unexpected[:5])}")
        if limit_reached:
            failures.append(f"duration limit of {config.duration_limit:g}s reached")

        transient = {p.update_id for p in self._plan if p.behaviour.startswith("transient")}
        stats = self._worker_stats()
        return {
            "failures": failures,
            "lost": lost,
            "duplicates": duplicates,
            "attempts": sum(r[1] for r in rows.values()),
            "runs": sum(len(v) for v in runs.values()),
            "completed": sum(1 for r in rows.values() if r[0] == "completed"),
            "domain_rows": sum(domain.values()),
            "fenced_out": len(set(fenced)),
            "skips": len(set(events.get("skip", []))),
            "tx_errors": len(set(events.get("tx_error", []))),
            "exhaustion_failures": len(events.get("exhaustion_failed", [])),
            "exhausted": len(exhausted),
            "exhausted_acknowledged": len(exhausted) - len(unacknowledged),
            "exhausted_other": len([u for u in exhausted if u not in set(failing)]),
            "transient_runs": sum(
                1 for u in transient for a, _ in runs.get(u, set()) if a == 1
            ),
            "failing_runs": sum(len(runs.get(u, set())) for u in failing),
            "failing_never_ran": sum(len(never_ran.get(u, [])) for u in failing),
            "never_ran": sum(len(v) for v in never_ran.values()),
            "claims": sum(len(v) for v in claims.values()),
            "failing": len(failing),
            "stats": stats,
        }

    def _read_steps(self) -> Dict[int, List[Any]]:
        """The step records of every planned update, read through the store."""
        deadline = time.monotonic() + 120.0
        while True:
            store = None
            try:
                store = self._make_store()
                return {p.update_id: store.steps_of(p.update_id) for p in self._plan}
            except Exception:  # the database is still coming back: try again
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
            finally:
                if store is not None:
                    store.close()

    def _read_calls(self) -> List[Dict[str, Any]]:
        """The workers' log of every call of the step's function (``DIR/calls.*.jsonl``)."""
        calls: List[Dict[str, Any]] = []
        for name in sorted(os.listdir(self._dir)):
            if not (name.startswith("calls.") and name.endswith(".jsonl")):
                continue
            with open(os.path.join(self._dir, name), encoding="utf-8") as handle:
                for line in handle:
                    try:
                        calls.append(json.loads(line))
                    except ValueError:  # a line cut short by a SIGKILL
                        continue
        return calls

    def _verify_payments(self, failures: List[str]) -> Dict[str, Any]:
        """Check the payment API's charges and requests against the step records.

        Every update is charged at most once. An update with a step record is charged exactly
        once, with the record's key and id. A completed update has a step record. No step
        that began after its record landed calls its function. A stale attempt's step that
        read no record may still call, with the same key. Every request after a record
        comes from such a call or from one made before the record. Violations go to
        ``failures``.
        """
        assert self._pay is not None
        charges = self._pay.charges
        requests = self._pay.requests
        steps = self._read_steps()
        calls = self._read_calls()
        planned = {p.update_id for p in self._plan}
        rows = {
            int(u): str(state)
            for u, state, _a, _s, _c in self._query_patiently(self._db.admin_sql().all_rows)
        }
        records: Dict[int, Any] = {}
        odd_records = []
        for u, found in steps.items():
            if len(found) != 1 or found[0].name != "charge":
                if found:
                    odd_records.append((u, [r.name for r in found]))
                continue
            records[u] = found[0]
        if odd_records:
            failures.append(f"step records other than one 'charge' step: {odd_records[:5]}")
        charged: Dict[int, List[Dict[str, Any]]] = {}
        stray = []
        for made in charges:
            reference = str(made.get("reference"))
            if reference.isdigit() and int(reference) in planned:
                charged.setdefault(int(reference), []).append(made)
            else:
                stray.append(made["id"])
        if stray:
            failures.append(f"charges of updates never planned: {stray[:5]}")
        twice = [(u, len(c)) for u, c in charged.items() if len(c) > 1]
        if twice:
            failures.append(
                f"updates charged more than once = {len(twice)} (update, charges): {twice[:5]}"
            )
        uncharged = [u for u in records if not charged.get(u)]
        if uncharged:
            failures.append(f"step records with no charge at the payment API: {uncharged[:5]}")
        unrecorded = [u for u, state in rows.items() if state == "completed" and u not in records]
        if unrecorded:
            failures.append(f"completed updates without their step record: {unrecorded[:5]}")
        mismatched = [
            u for u, record in records.items()
            if charged.get(u) and (
                charged[u][0]["idempotency_key"] != record.key
                or json.loads(record.result) != {"id": charged[u][0]["id"]}
            )
        ]
        if mismatched:
            failures.append(
                f"step records that are not their update's charge (key or id): {mismatched[:5]}"
            )

        # after a record landed no step calls its function. Only a stale attempt whose step
        # read no record before it landed may call, with the same key. Its request may arrive
        # after the record, and the API answers it with the same charge
        key_update = {record.key: u for u, record in records.items()}
        budget: Dict[str, int] = {}  # requests each key may still send after its record
        late_calls, bad_calls = 0, []
        for call in calls:
            key = str(call["key"])
            record = records.get(int(call["update_id"]))
            if record is None or record.key != key:
                continue
            if call["called"] <= record.recorded_at + _RECORD_SLACK_MS:
                budget[key] = budget.get(key, 0) + 1
                continue
            late_calls += 1
            if call["began"] <= record.recorded_at + _RECORD_SLACK_MS and (
                call["claim_id"] != record.claim_id
            ):
                budget[key] = budget.get(key, 0) + 1
            else:
                bad_calls.append((call["update_id"], call["attempt"], call["began"],
                                  call["called"], record.recorded_at))
        if bad_calls:
            failures.append(
                "step functions called by a step that began after its record landed (update, "
                f"attempt, step began ms, called ms, recorded ms): {bad_calls[:5]}"
            )
        seen: Set[Optional[str]] = set()
        reused, late_requests, bad_requests = 0, 0, []
        late: List[Tuple[Any, int, Any]] = []
        for request in requests:
            if request.key in seen:
                reused += 1
            seen.add(request.key)
            body = request.body
            reference = str(body.get("reference")) if isinstance(body, dict) else ""
            owner = int(reference) if reference.isdigit() else key_update.get(request.key or "")
            record = records.get(owner) if owner is not None else None
            if record is None:
                continue
            at = int(request.time * 1000)
            if request.key == record.key:
                # each request used up one call of its key
                budget[record.key] = budget.get(record.key, 0) - 1
            if at > record.recorded_at + _RECORD_SLACK_MS:
                late.append((owner, at, record))
                late_requests += 1
                if request.key != record.key:
                    bad_requests.append((owner, request.key, at, record.recorded_at))
        over = {key for key, left in budget.items() if left < 0}
        bad_requests += [
            (owner, record.key, at, record.recorded_at) for owner, at, record in late
            if record.key in over
        ]
        if bad_requests:
            failures.append(
                "payment requests after the step's record landed that no call before it "
                f"explains (update, key, request ms, recorded ms): {bad_requests[:5]}"
            )
        exhausted = [u for u, state in rows.items() if state == "abandoned"]
        return {
            "charges": len(charges),
            "charged": len(charged),
            "twice": len(twice),
            "records": len(records),
            "records_once": sum(1 for u in records if len(charged.get(u, [])) == 1),
            "exhausted_recorded": sum(1 for u in exhausted if u in records),
            "exhausted_charged": sum(1 for u in exhausted if charged.get(u)),
            "exhausted": len(exhausted),
            "requests": len(requests),
            "reused": reused,
            "calls": len(calls),
            "late_calls": late_calls,
            "late_requests": late_requests,
            "step_fenced_out": len(
                [e for e in self._query_patiently(self._db.statements()["chaos_events"])
                 if e[0] == "step_refused"]
            ),
        }

    def _explained(self, claimed_at: int) -> bool:
        """Whether a fault may have stopped a claim made at ``claimed_at`` reaching its handler."""
        before = int(self._config.lease * 1000) + _EXPLAIN_SLACK_MS
        return any(
            start - before <= claimed_at <= end + _EXPLAIN_AFTER_MS
            for _, start, end in self._fault_times
        )

    def _worker_stats(self) -> Dict[str, int]:
        totals: Dict[str, int] = {}
        try:
            names = os.listdir(self._dir)
        except OSError:
            return totals
        for name in names:
            if not (name.startswith("stats.") and name.endswith(".json")):
                continue
            try:
                with open(os.path.join(self._dir, name), encoding="utf-8") as handle:
                    counters = json.load(handle).get("counters", {})
            except (OSError, ValueError):
                continue
            for key, value in counters.items():
                totals[key] = totals.get(key, 0) + int(value)
        return totals

    def _print_table(self, v: Dict[str, Any], ok: bool) -> None:
        config = self._config
        faults = self._faults
        db = self._db
        by_runner = sum(1 for p in self._plan if p.slot < 0)
        stats = v["stats"]
        store_errors = ", ".join(
            f"{step} {stats.get('store_error_' + step, 0)}"
            for step in ("claim", "renew", "settle", "sweep")
        )
        na = "n/a (SQLite)"
        rows: List[Tuple[str, str]] = [
            ("store", db.describe()),
            ("workers", f"{config.workers} (lease {config.lease:g} s, sweep {config.sweep:g} s, "
                        f"max_attempts {config.max_attempts}, seed {config.seed})"),
            ("updates", f"{len(self._plan)} ({len(self._plan) - by_runner} accepted by workers, "
                        f"{by_runner} recorded by the runner)"),
            ("faults: SIGKILL worker (restarted)", str(faults[KILL])),
            ("faults: SIGSTOP worker > lease, SIGCONT", str(faults[STOP])),
            ("faults: pg_terminate_backend",
             na if db.is_sqlite else f"{faults[TERMINATE]} ({self._terminated_backends} backends)"),
            ("faults: PostgreSQL restart",
             na if db.is_sqlite else f"{faults[RESTART]} ({self._notes.get(RESTART, '')})"),
            ("faults: transient handler failures", str(v["transient_runs"])),
            ("faults: always-failing handler runs",
             f"{v['failing_runs']} ({v['failing']} updates"
             + (f"; {v['failing_never_ran']} claims never ran" if v["failing_never_ran"] else "")
             + ")"),
            ("faults: exhaustion handler failures", str(v["exhaustion_failures"])),
            ("attempts", str(v["attempts"])),
            ("handler runs", str(v["runs"])),
            ("claims that never reached a handler", f"{v['never_ran']} (each right before a fault)"
             if v["never_ran"] else "0"),
            ("handled (completed)", str(v["completed"])),
            ("fenced domain rows", str(v["domain_rows"])),
            ("duplicate domain rows", str(v["duplicates"])),
            ("fenced-out transactions", str(v["fenced_out"])),
            ("idempotent skips (plain transaction)", str(v["skips"])),
            ("transactions broken by the database", str(v["tx_errors"])),
            ("store errors seen by workers", store_errors),
            ("lost updates", str(v["lost"])),
            ("exhaustions", f"{v['exhausted']} ({v['exhausted_acknowledged']} acknowledged, "
                            f"{v['exhausted_other']} not planned to fail)"),
        ]
        rows += self._payment_rows(v.get("payments"))
        rows += [
            ("wall time", f"{self._elapsed():.1f} s"),
            ("result", "PASS" if ok else "FAIL"),
        ]
        width = max(len(name) for name, _ in rows)
        value_width = max(len(value) for _, value in rows)
        self._say("")
        self._say(f"| {'metric'.ljust(width)} | {'value'.ljust(value_width)} |")
        self._say(f"|{'-' * (width + 2)}|{'-' * (value_width + 2)}|")
        for name, value in rows:
            self._say(f"| {name.ljust(width)} | {value.ljust(value_width)} |")
        self._say("")
        for failure in v["failures"]:
            self._say(f"FAIL: {failure}")
        if ok:
            self._say(
                "PASS: nothing lost, nothing written twice, every exhaustion delivered"
                + (", every update charged at most once" if v.get("payments") else "")
            )

    def _payment_rows(self, p: Optional[Dict[str, Any]]) -> List[Tuple[str, str]]:
        """The table's rows about payments made in steps."""
        if p is None:
            return [("payments", "off (--no-payments)")]
        return [
            ("payments: charges", f"{p['charges']} ({p['charged']} updates charged, "
                                  f"{p['twice']} charged twice)"),
            ("payments: step records", f"{p['records']} ({p['records_once']} charged exactly "
                                       "once)"),
            ("payments: exhausted after their step",
             f"{p['exhausted_recorded']} of {p['exhausted']} ({p['exhausted_charged']} charged)"),
            ("payments: step function calls", str(p["calls"])),
            ("payments: requests", str(p["requests"])),
            ("payments: requests with a reused key", str(p["reused"])),
            ("payments: calls after the record",
             f"{p['late_calls']} (stale steps that read no record before it landed)"),
            ("payments: requests after the record",
             f"{p['late_requests']} (sent by calls made before the record landed)"),
            ("payments: step records refused (stale)", str(p["step_fenced_out"])),
        ]


def wait_for_postgres(dsn: str, timeout: float) -> bool:
    """Wait until PostgreSQL at ``dsn`` accepts connections (``pg_isready``, then a connect)."""
    import psycopg2

    deadline = time.monotonic() + timeout
    pg_isready = shutil.which("pg_isready")
    while time.monotonic() < deadline:
        if pg_isready is not None:
            try:
                parts = psycopg2.extensions.parse_dsn(dsn)
                args = [pg_isready, "-q", "-t", "2"]
                if parts.get("host"):
                    args += ["-h", parts["host"]]
                if parts.get("port"):
                    args += ["-p", str(parts["port"])]
                if subprocess.run(args, timeout=10).returncode != 0:
                    time.sleep(0.2)
                    continue
            except Exception:
                pass
        try:
            conn = psycopg2.connect(dsn, connect_timeout=2)
            conn.close()
            return True
        except Exception:
            time.sleep(0.2)
    return False


def parse_args(argv: Optional[Sequence[str]] = None) -> ChaosConfig:
    """Build a :class:`ChaosConfig` from the command line."""
    from ptb_fence import chaos

    parser = argparse.ArgumentParser(
        prog="python -m ptb_fence.chaos",
        description=(chaos.__doc__ or "").split("\n\n")[0],
        epilog=(chaos.__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--store",
        help="sqlite:///ABSOLUTE/PATH or a PostgreSQL DSN (default: SQLite in a temp directory)",
    )
    parser.add_argument(
        "--updates", type=int, help="updates to drive (default 5000 on PostgreSQL, 2000 on SQLite)"
    )
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--seed", type=int, help="seed of the plan and the faults (default random)")
    parser.add_argument(
        "--duration-limit",
        type=float,
        default=600.0,
        help="fail if the run is not done after this many seconds (default 600)",
    )
    parser.add_argument(
        "--no-pg-restart", action="store_true", help="do not restart PostgreSQL mid-run"
    )
    parser.add_argument(
        "--rate",
        type=float,
        help="updates delivered per second (default 100 on PostgreSQL, 50 on SQLite)",
    )
    parser.add_argument(
        "--fault-every", type=float, default=1.5, help="mean seconds between faults (default 1.5)"
    )
    parser.add_argument("--lease", type=float, default=1.0, help="workers' lease (default 1.0 s)")
    parser.add_argument("--sweep", type=float, default=0.2, help="workers' sweep (default 0.2 s)")
    parser.add_argument("--max-attempts", type=int, default=5, help="default 5")
    parser.add_argument(
        "--max-concurrent", type=int, default=8, help="handlers per worker (default 8)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the tables and the work directory after a pass"
    )
    parser.add_argument("--run-id", help="names the tables chaos_<run-id>_* (default random)")
    parser.add_argument(
        "--no-payments",
        action="store_true",
        help="the handlers charge no FakePaymentApi in a step (default: they do, and the run "
        "checks every update is charged at most once)",
    )
    ns = parser.parse_args(argv)
    try:
        return ChaosConfig(
            store=ns.store,
            updates=ns.updates,
            workers=ns.workers,
            seed=ns.seed,
            duration_limit=ns.duration_limit,
            pg_restart=not ns.no_pg_restart,
            rate=ns.rate,
            fault_every=ns.fault_every,
            lease=ns.lease,
            sweep=ns.sweep,
            max_attempts=ns.max_attempts,
            max_concurrent=ns.max_concurrent,
            keep=ns.keep,
            run_id=ns.run_id,
            payments=not ns.no_payments,
        )
    except ValueError as exc:
        parser.error(str(exc))
        raise  # pragma: no cover - parser.error exits


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m ptb_fence.chaos``: run one configuration. Returns 0 when every criterion holds."""
    config = parse_args(argv)
    try:
        runner = ChaosRunner(config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return runner.run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:  # the run could not be set up (workers did not start, …)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        runner.close()
