"""Process-level tests of the runtime: real bot processes sharing one database.

Every scenario runs on SQLite (one file) and on PostgreSQL (a fresh table per test). The bot
processes are ``tests/processes/proc_worker.py`` run with :data:`sys.executable`; they are paused
with SIGSTOP/SIGCONT, killed with SIGKILL, and report through files (see that module). Domain writes
go to a table WITHOUT a unique key in the store's database, so a double write would show up as two
rows: the tests assert exactly one.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from ptb_fence import OwnershipLost, SQLiteUpdateStore, UpdateIntake

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "proc_worker.py")

pytestmark = pytest.mark.timeout(60)


def body(update_id: int, chat: int) -> str:
    return json.dumps(
        {
            "update_id": update_id,
            "message": {
                "message_id": update_id,
                "date": 0,
                "chat": {"id": chat, "type": "private"},
                "text": f"u{update_id}",
            },
        }
    )


def wait_for(what: str, condition: Callable[[], Any], timeout: float, step: float = 0.02) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


class Bed:
    """One database (SQLite file or PostgreSQL), its update table and a domain table."""

    def __init__(self, kind: str, tmp_path: Any, dsn: Optional[str], tables: List[str]) -> None:
        self.kind = kind
        self.dir = str(tmp_path)
        suffix = uuid.uuid4().hex[:12]
        self.table = f"t_{suffix}"
        self.domain = f"d_{suffix}"
        self.procs: List[subprocess.Popen] = []
        self._outputs: List[Tuple[subprocess.Popen, str]] = []
        if kind == "sqlite":
            self.path = os.path.join(self.dir, "bot.sqlite3")
            self.url = "sqlite:///" + self.path
            self.dsn = None
        else:
            assert dsn is not None
            tables.extend([self.table, self.domain])
            self.url = dsn
            self.dsn = dsn
        self.store = self.make_store()  # creates the schema before any worker starts
        self.sql(
            f"CREATE TABLE {self.domain} (update_id BIGINT NOT NULL, attempt INTEGER NOT NULL, "
            "claim_id TEXT NOT NULL, pid INTEGER NOT NULL)"
        )

    # -- database ------------------------------------------------------------------------
    def make_store(self) -> Any:
        if self.kind == "sqlite":
            return SQLiteUpdateStore(self.path, self.table)
        from ptb_fence import PostgresUpdateStore

        assert self.dsn is not None
        return PostgresUpdateStore(self.dsn, self.table)

    def sql(self, statement: str, params: tuple = ()) -> List[tuple]:
        """Run one statement on a fresh connection (autocommit) and return its rows."""
        if self.kind == "sqlite":
            lite = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            try:
                return list(lite.execute(statement, params).fetchall())
            finally:
                lite.close()
        import psycopg2

        conn = psycopg2.connect(self.dsn)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(statement.replace("?", "%s"), params)
                return list(cur.fetchall()) if cur.description is not None else []
        finally:
            conn.close()

    def rows(self) -> Dict[int, Tuple[str, int, Optional[str]]]:
        """``update_id -> (state, attempts, claim_id)`` from the update table (public layout)."""
        return {
            int(r[0]): (r[1], int(r[2]), r[3])
            for r in self.sql(f"SELECT update_id, state, attempts, claim_id FROM {self.table}")
        }

    def domain_rows(self) -> List[Tuple[int, int, str, int]]:
        return [
            (int(r[0]), int(r[1]), r[2], int(r[3]))
            for r in self.sql(f"SELECT update_id, attempt, claim_id, pid FROM {self.domain}")
        ]

    def add(self, update_ids: Any, chat: Optional[int] = None) -> None:
        now = int(time.time() * 1000)
        for update_id in update_ids:
            assert self.store.add(update_id, body(update_id, chat or 1000 + update_id), now)

    def completed(self, update_ids: Any) -> bool:
        rows = self.rows()
        return all(rows.get(u, ("",))[0] == "completed" for u in update_ids)

    # -- processes -----------------------------------------------------------------------
    def spawn(self, *options: str) -> subprocess.Popen:
        n = len(self.procs)
        out = os.path.join(self.dir, f"worker{n}.log")
        with open(out, "wb") as sink:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    WORKER,
                    self.url,
                    self.table,
                    "--dir",
                    self.dir,
                    "--domain",
                    self.domain,
                    *options,
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        self._outputs.append((proc, out))
        return proc

    def ready(self, proc: subprocess.Popen, timeout: float = 15.0) -> None:
        wait_for(
            f"worker {proc.pid} to start",
            lambda: os.path.exists(os.path.join(self.dir, f"ready.{proc.pid}"))
            or proc.poll() is not None,
            timeout,
        )
        assert proc.poll() is None, f"worker {proc.pid} died:\n{self.output(proc)}"

    def started(self, update_id: int, proc: Optional[subprocess.Popen] = None) -> bool:
        pid = "*" if proc is None else str(proc.pid)
        return bool(glob.glob(os.path.join(self.dir, f"started.{update_id}.{pid}")))

    def touch(self, name: str) -> None:
        with open(os.path.join(self.dir, name), "w"):
            pass

    def events(self) -> List[Dict[str, Any]]:
        found: List[Dict[str, Any]] = []
        for name in sorted(glob.glob(os.path.join(self.dir, "runs.*.jsonl"))):
            with open(name) as f:
                found.extend(json.loads(line) for line in f if line.strip())
        return sorted(found, key=lambda e: e["t"])

    def output(self, proc: subprocess.Popen) -> str:
        for p, out in self._outputs:
            if p is proc:
                with open(out, errors="replace") as f:
                    return f.read()[-4000:]
        return ""

    def stop(self, timeout: float = 15.0) -> None:
        """Ask every live worker to close cleanly and check that it did."""
        self.touch("stop")
        for proc in self.procs:
            if proc.returncode is None:
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    raise AssertionError(
                        f"worker {proc.pid} did not stop:\n{self.output(proc)}"
                    ) from None
                assert proc.returncode == 0, f"worker {proc.pid}:\n{self.output(proc)}"

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                except ProcessLookupError:  # pragma: no cover - just exited
                    pass
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        self.store.close()


# Not conftest's store: the worker processes reach the database by URL and table name.
@pytest.fixture(params=["sqlite", "postgres"])
def bed(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Bed]:
    if request.param == "postgres":
        dsn = request.getfixturevalue("pg_dsn")
        tables = request.getfixturevalue("pg_tables")
    else:
        dsn, tables = None, []
    b = Bed(request.param, tmp_path, dsn, tables)
    try:
        yield b
    finally:
        b.cleanup()


def by_update(rows: List[Tuple[int, int, str, int]]) -> Dict[int, List[Tuple[int, int, str, int]]]:
    grouped: Dict[int, List[Tuple[int, int, str, int]]] = {}
    for row in rows:
        grouped.setdefault(row[0], []).append(row)
    return grouped


# --------------------------------------------------------------------------------------------
# Owner loss
# --------------------------------------------------------------------------------------------


def test_owner_loss_sigstop(bed: Bed) -> None:
    """A is paused (SIGSTOP) past its lease; B takes over; after SIGCONT A sees owner_lost and
    its fenced transaction is refused; only B's domain row exists."""
    bed.add([1])
    # a plain transaction(): only its ownership check (not a completing settle) fences A
    a = bed.spawn("--mode", "block", "--lost-first", "--no-complete", "--lease", "0.6",
                  "--sweep", "60", "--grace", "60")
    wait_for("A's handler to start", lambda: bed.started(1, a), 15)
    a.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    b = bed.spawn("--mode", "complete", "--lease", "2", "--sweep", "0.05", "--grace", "0.05")
    wait_for("B to complete update 1", lambda: bed.completed([1]), 20)
    assert time.monotonic() - stopped_at >= 0.4  # only after A's lease (0.6 s) lapsed
    state, attempts, claim_id = bed.rows()[1]
    assert (state, attempts) == ("completed", 2)
    bed.touch("release")
    a.send_signal(signal.SIGCONT)

    def a_lost() -> bool:
        return any(e["event"] == "lost" and e["pid"] == a.pid for e in bed.events())

    wait_for("A's transaction to be refused", a_lost, 15)
    bed.stop()
    a_events = [e for e in bed.events() if e["pid"] == a.pid]
    assert [e["event"] for e in a_events] == ["start", "owner_lost", "lost"], a_events
    assert a_events[1]["fired"] is True  # owner_lost fired after SIGCONT
    assert a_events[2]["identity_matches"] is True
    assert a_events[0]["attempt"] == 1 and a_events[0]["claim_id"] != claim_id
    assert bed.domain_rows() == [(1, 2, claim_id, b.pid)]
    assert bed.rows()[1] == ("completed", 2, claim_id)  # A's late settle did not land


def test_owner_loss_stalled_lease_keeper(bed: Bed) -> None:
    """In one process: intake A's lease keeper stalls (its jobs are stopped) while its handler
    runs past the lease; intake B (another store on the same database) takes the update over.
    A's fenced transaction is refused even before owner_lost fired; when A's keeper runs again,
    owner_lost fires."""
    started = threading.Event()
    release = threading.Event()
    seen: Dict[str, Any] = {}
    intakes: Dict[str, UpdateIntake] = {}

    def handle_a(update: Dict[str, Any], attempt: Any) -> None:
        seen["a"] = attempt.identity
        started.set()
        assert release.wait(20)
        seen["lost_before"] = attempt.owner_lost.is_set()
        try:
            with attempt.transaction(complete=True) as conn:
                conn.cursor().execute(
                    f"INSERT INTO {bed.domain} (update_id, attempt, claim_id, pid) "
                    + ("VALUES (?, ?, ?, ?)" if bed.kind == "sqlite" else "VALUES (%s,%s,%s,%s)"),
                    (attempt.update_id, attempt.attempt, attempt.claim_id, 0),
                )
        except OwnershipLost as exc:
            seen["refused"] = exc.identity
            intakes["a"].runtime.jobs.start()  # the keeper wakes up again
            seen["fired"] = attempt.owner_lost.wait(5)
            raise
        seen["committed"] = True

    done_b = threading.Event()

    def handle_b(update: Dict[str, Any], attempt: Any) -> None:
        seen["b"] = attempt.identity
        with attempt.transaction(complete=True) as conn:
            conn.cursor().execute(
                f"INSERT INTO {bed.domain} (update_id, attempt, claim_id, pid) "
                + ("VALUES (?, ?, ?, ?)" if bed.kind == "sqlite" else "VALUES (%s,%s,%s,%s)"),
                (attempt.update_id, attempt.attempt, attempt.claim_id, 1),
            )
        done_b.set()

    store_b = bed.make_store()
    a = UpdateIntake(bed.store, handle_attempt=handle_a, lease_seconds=0.4,
                     sweep_every_seconds=60, pending_grace_seconds=60)
    b = UpdateIntake(store_b, handle_attempt=handle_b, lease_seconds=0.4,
                     sweep_every_seconds=0.05, pending_grace_seconds=0.05)
    intakes["a"] = a
    try:
        a.start()
        assert a.accept(body(7, 70)) == "accepted"
        assert started.wait(10)
        a.runtime.jobs.stop()  # the lease keeper stalls (GC pause, blocked thread, ...)
        b.start()
        assert done_b.wait(10), "B never took the update over"
        assert bed.rows()[7] == ("completed", 2, seen["b"].claim_id)
        release.set()
        assert a.idle(10)
    finally:
        release.set()
        a.close()
        b.close()
        store_b.close()
    assert seen["lost_before"] is False  # the fence does not depend on the advisory signal
    assert seen["refused"] == seen["a"]
    assert seen["fired"] is True
    assert "committed" not in seen
    assert bed.domain_rows() == [(7, 2, seen["b"].claim_id, 1)]
    assert bed.rows()[7] == ("completed", 2, seen["b"].claim_id)


def test_paused_inside_fenced_transaction_writes_once(bed: Bed) -> None:
    """A is paused (SIGSTOP) inside its fenced transaction(complete=True), after its domain
    write, until long past its lease, while B sweeps. The ownership check holds the update until
    A's transaction ends (SQLite: the write lock; PostgreSQL: the FOR UPDATE row lock), so B
    cannot take it in between; after SIGCONT A completes (settled at the time of its ownership
    check: nobody could claim the row since), and B, whose claim waited for the lock, finds the
    update completed and never runs it. Written once, by A."""
    bed.add([1])
    a = bed.spawn("--mode", "complete", "--pause-in-tx", "--lease", "0.8", "--sweep", "60",
                  "--grace", "60")
    wait_for("A to be inside its transaction",
             lambda: glob.glob(os.path.join(bed.dir, f"intx.1.{a.pid}")), 15)
    a.send_signal(signal.SIGSTOP)
    b = bed.spawn("--mode", "complete", "--lease", "2", "--sweep", "0.05", "--grace", "0.05")
    time.sleep(2.0)  # A's lease (0.8 s) lapsed long ago; B's sweeps see a lapsed processing row
    assert b.poll() is None, bed.output(b)
    assert not bed.started(1, b)  # A's open transaction keeps B out
    bed.touch("release")
    a.send_signal(signal.SIGCONT)
    wait_for("A to complete the update", lambda: bed.completed([1]), 15)
    time.sleep(1.0)  # B's sweeps go on: the completed update is not taken again
    bed.stop()
    events = [(e["event"], e["pid"], e["attempt"]) for e in bed.events()]
    assert events == [
        ("start", a.pid, 1),
        ("commit", a.pid, 1),
    ]
    state, attempts, claim_id = bed.rows()[1]
    assert (state, attempts) == ("completed", 1)
    assert bed.domain_rows() == [(1, 1, claim_id, a.pid)]


def test_owner_loss_with_clock_skew(bed: Bed, caplog: pytest.LogCaptureFixture) -> None:
    """Intake A's clock runs 3 s behind (another host): its lease looks live to A but lapsed to
    B, which takes the update over. The claim id, not the clock, fences A: its next renewal is
    refused (owner_lost fires) and its fenced transaction is refused."""
    started = threading.Event()
    seen: Dict[str, Any] = {}
    done_b = threading.Event()
    insert = f"INSERT INTO {bed.domain} (update_id, attempt, claim_id, pid) " + (
        "VALUES (?, ?, ?, ?)" if bed.kind == "sqlite" else "VALUES (%s, %s, %s, %s)"
    )

    def handle_a(update: Dict[str, Any], attempt: Any) -> None:
        started.set()
        assert done_b.wait(10)
        seen["fired"] = attempt.owner_lost.wait(5)
        try:
            with attempt.transaction() as conn:
                conn.cursor().execute(insert, (attempt.update_id, attempt.attempt,
                                               attempt.claim_id, 0))
        except OwnershipLost:
            seen["refused"] = True
            raise

    def handle_b(update: Dict[str, Any], attempt: Any) -> None:
        with attempt.transaction(complete=True) as conn:
            conn.cursor().execute(insert, (attempt.update_id, attempt.attempt,
                                           attempt.claim_id, 1))
        seen["b"] = attempt.claim_id
        done_b.set()

    store_b = bed.make_store()
    a = UpdateIntake(bed.store, handle_attempt=handle_a, lease_seconds=1.0,
                     sweep_every_seconds=60, pending_grace_seconds=60,
                     clock=lambda: time.time() - 3.0)
    b = UpdateIntake(store_b, handle_attempt=handle_b, lease_seconds=1.0,
                     sweep_every_seconds=0.05, pending_grace_seconds=0.05)
    try:
        with caplog.at_level("WARNING", logger="ptb_fence.lease"):
            a.start()
            assert a.accept(body(9, 90)) == "accepted"
            assert started.wait(10)
            b.start()
            assert done_b.wait(10), "B never took the update over"
            assert a.idle(10)
    finally:
        done_b.set()
        a.close()
        b.close()
        store_b.close()
    assert seen["fired"] is True
    assert "its renewal was refused" in caplog.text
    assert seen.get("refused") is True
    assert bed.domain_rows() == [(9, 2, seen["b"], 1)]
    assert bed.rows()[9] == ("completed", 2, seen["b"])


# --------------------------------------------------------------------------------------------
# Exactly once / at least once across a SIGKILL right after the commit
# --------------------------------------------------------------------------------------------


def test_complete_true_is_not_rerun_after_sigkill(bed: Bed) -> None:
    """transaction(complete=True) commits the domain row and the completion together: a worker
    killed right after that commit is not re-run by the next process."""
    bed.add([1, 2], chat=5)  # one chat: 2 waits for 1, so the kill leaves 2 pending
    a = bed.spawn("--mode", "complete", "--kill-after-commit", "1", "--lease", "2",
                  "--sweep", "60", "--grace", "60")
    a.wait(15)
    assert a.returncode == -signal.SIGKILL, bed.output(a)
    rows = bed.rows()
    assert rows[1][:2] == ("completed", 1)
    assert rows[2][:2] == ("pending", 0)
    b = bed.spawn("--mode", "complete", "--lease", "2", "--sweep", "0.05", "--grace", "0.05")
    bed.ready(b)
    wait_for("B to handle update 2", lambda: bed.completed([2]), 15)
    time.sleep(0.5)  # B swept several times more
    bed.stop()
    starts = [(e["update_id"], e["pid"]) for e in bed.events() if e["event"] == "start"]
    assert starts == [(1, a.pid), (2, b.pid)]
    assert sorted(r[:2] + (r[3],) for r in bed.domain_rows()) == [(1, 1, a.pid), (2, 1, b.pid)]
    assert bed.rows()[1][:2] == ("completed", 1)


def test_plain_transaction_is_rerun_once_after_sigkill(bed: Bed) -> None:
    """A plain transaction() commits the domain row but not the completion: a worker killed
    right after it is re-run once (at least once); the idempotency check inside the fenced
    transaction keeps it at one domain row."""
    bed.add([1, 2], chat=5)
    # A's lease is far longer than finding a dead process takes (about 3 s on PostgreSQL): B
    # takes over through the dead-process path, which gives the crashed attempt back
    a = bed.spawn("--mode", "plain", "--kill-after-commit", "1", "--lease", "15",
                  "--sweep", "60", "--grace", "60")
    a.wait(15)
    assert a.returncode == -signal.SIGKILL, bed.output(a)
    assert bed.rows()[1][:2] == ("processing", 1)
    assert len(bed.domain_rows()) == 1
    b = bed.spawn("--mode", "plain", "--lease", "2", "--sweep", "0.05", "--grace", "0.05")
    wait_for("B to handle updates 1 and 2", lambda: bed.completed([1, 2]), 15)
    bed.stop()
    events = [(e["event"], e["update_id"], e["pid"], e["attempt"]) for e in bed.events()]
    # B's attempt is attempt 1 again: the dead process's attempt was given back (its handler
    # did not run alone), with a new claim id
    assert [e for e in events if e[1] == 1] == [
        ("start", 1, a.pid, 1),
        ("commit", 1, a.pid, 1),
        ("start", 1, b.pid, 1),
        ("skip", 1, b.pid, 1),
        ("commit", 1, b.pid, 1),
    ]
    assert sorted(r[:2] + (r[3],) for r in bed.domain_rows()) == [(1, 1, a.pid), (2, 1, b.pid)]
    rows = bed.rows()
    assert rows[1][:2] == ("completed", 1)
    assert rows[2][:2] == ("completed", 1)


# --------------------------------------------------------------------------------------------
# Killed mid-handler
# --------------------------------------------------------------------------------------------


def test_worker_killed_mid_handler_loses_nothing(bed: Bed) -> None:
    """SIGKILL a worker while handlers run; a second process finds it dead and takes everything
    over (long before the lease): every update handled, exactly one domain row each."""
    ids = list(range(1, 21))
    bed.add(ids)
    a = bed.spawn("--mode", "complete", "--sleep", "0.3", "--max-concurrent", "4",
                  "--lease", "15", "--sweep", "60", "--grace", "60")

    def in_flight() -> "set[int]":
        events = [e for e in bed.events() if e["pid"] == a.pid]
        begun = {e["update_id"] for e in events if e["event"] == "start"}
        done = {e["update_id"] for e in events if e["event"] == "commit"}
        return begun - done if len(done) >= 4 else set()

    wait_for("A to be mid-handler after some commits", in_flight, 20)
    a.kill()
    a.wait(10)
    a_done = {r[0] for r in bed.domain_rows() if r[3] == a.pid}  # the database is the truth
    interrupted = {e["update_id"] for e in bed.events() if e["event"] == "start"} - a_done
    assert interrupted and a_done
    rows = bed.rows()
    assert all(rows[u][0] == "processing" for u in interrupted)
    b = bed.spawn("--mode", "complete", "--max-concurrent", "8", "--lease", "2",
                  "--sweep", "0.05", "--grace", "0.05")
    wait_for("every update to complete", lambda: bed.completed(ids), 30)
    bed.stop()
    grouped = by_update(bed.domain_rows())
    assert sorted(grouped) == ids
    assert all(len(v) == 1 for v in grouped.values()), grouped
    rows = bed.rows()
    for u in ids:
        (_, attempt, claim_id, pid), = grouped[u]
        assert rows[u] == ("completed", attempt, claim_id)
        assert pid == (a.pid if u in a_done else b.pid)
    for u in interrupted:
        # taken over; the dead process's attempt was given back (its handlers ran together,
        # so the crash is charged to none of them)
        assert rows[u][1] == 1


def test_worker_killed_inside_fenced_transaction(bed: Bed) -> None:
    """SIGKILL while the handler holds its fenced transaction open (SQLite write lock /
    PostgreSQL row lock) after its domain write: the database rolls it back and releases the
    lock, and a second process finds A dead and takes the update over (long before the
    lease)."""
    bed.add([1])
    a = bed.spawn("--mode", "complete", "--pause-in-tx", "--lease", "15", "--sweep", "60",
                  "--grace", "60")
    wait_for("A to be inside its transaction",
             lambda: glob.glob(os.path.join(bed.dir, f"intx.1.{a.pid}")), 15)
    a.kill()
    a.wait(10)
    b = bed.spawn("--mode", "complete", "--lease", "2", "--sweep", "0.05", "--grace", "0.05")
    wait_for("B to complete the update", lambda: bed.completed([1]), 15)
    bed.stop()
    state, attempts, claim_id = bed.rows()[1]
    assert (state, attempts) == ("completed", 1)  # the crashed attempt was given back
    assert bed.domain_rows() == [(1, 1, claim_id, b.pid)]


# --------------------------------------------------------------------------------------------
# Several processes, one database
# --------------------------------------------------------------------------------------------


def test_three_processes_share_one_database(bed: Bed) -> None:
    """Three processes sweep one database while one of them accepts 200 updates: every update
    is handled, with exactly one domain row each, written by the attempt that completed it."""
    n = 200
    # handlers take 50 ms, 4 at a time, so the acceptor accepts faster than it handles and the
    # others' sweeps (grace 0.1 s) reach the rows still pending
    common = ("--mode", "complete", "--lease", "2", "--sweep", "0.1", "--grace", "0.1",
              "--max-concurrent", "4", "--sleep", "0.05")
    others = [bed.spawn(*common), bed.spawn(*common)]
    for proc in others:
        bed.ready(proc)
    t0 = time.monotonic()
    acceptor = bed.spawn(*common, "--accept", f"1:{n}:20")
    ids = list(range(1, n + 1))
    wait_for("all 200 updates to complete", lambda: bed.completed(ids), 40, step=0.1)
    elapsed = time.monotonic() - t0
    bed.stop()
    rows = bed.rows()
    grouped = by_update(bed.domain_rows())
    assert sorted(grouped) == ids
    duplicates = {u: v for u, v in grouped.items() if len(v) != 1}
    assert not duplicates, duplicates
    for u in ids:
        (_, attempt, claim_id, _pid), = grouped[u]
        assert rows[u] == ("completed", attempt, claim_id)
    events = bed.events()
    commits = [e for e in events if e["event"] == "commit"]
    assert sorted(e["update_id"] for e in commits) == ids  # one committed attempt per update
    # no update was claimed by two live attempts: every run has its own claim, and a run that
    # did not commit was refused by the fence (never a silent second write)
    starts = [e for e in events if e["event"] == "start"]
    assert len({e["claim_id"] for e in starts}) == len(starts)
    committed_claims = {e["claim_id"] for e in commits}
    lost_claims = {e["claim_id"] for e in events if e["event"] == "lost"}
    assert {e["claim_id"] for e in starts} <= committed_claims | lost_claims
    # a takeover needs the previous lease (2 s, renewed) to lapse first: consecutive runs of one
    # update can never start within a lease of each other (1 s of slack for a late start log)
    runs: Dict[int, List[float]] = {}
    for e in starts:
        runs.setdefault(e["update_id"], []).append(e["t"])
    overlapping = {
        u: ts for u, ts in runs.items() if any(b - a < 1.0 for a, b in zip(ts, ts[1:]))
    }
    assert not overlapping, overlapping
    pids = {e["pid"] for e in commits}
    assert len(pids) >= 2, "the work was not shared: the test did not exercise contention"
    print(f"{bed.kind}: {n} updates in {elapsed:.2f}s by {len(pids)} processes; "
          f"{len(starts)} runs, {len(lost_claims)} refused")


class _HungRenewals:
    """The real store, except that lease renewals hang until ``gate`` opens (a dead connection
    without a timeout)."""

    def __init__(self, store: Any, gate: threading.Event) -> None:
        self._store = store
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def renew_owned_many(self, *args: Any, **kwargs: Any) -> Any:
        self._gate.wait(30)
        return self._store.renew_owned_many(*args, **kwargs)

    def renew_owned(self, *args: Any, **kwargs: Any) -> Any:
        self._gate.wait(30)
        return self._store.renew_owned(*args, **kwargs)


def test_owner_lost_fires_while_renewals_hang(bed: Bed) -> None:
    """A renewal that never returns must not stop the keeper from firing owner_lost when the
    last proven lease passes (hung ticks used to pile up until APScheduler skipped them all)."""
    gate = threading.Event()
    seen: Dict[str, Any] = {}

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        t0 = time.monotonic()
        seen["fired"] = attempt.owner_lost.wait(5)
        seen["after"] = time.monotonic() - t0

    intake = UpdateIntake(_HungRenewals(bed.store, gate), handle_attempt=handle,
                          lease_seconds=0.4, sweep_every_seconds=60, pending_grace_seconds=60)
    try:
        intake.start()
        assert intake.accept(body(3, 30)) == "accepted"
        assert intake.idle(10)
    finally:
        gate.set()
        intake.close()
    assert seen["fired"] is True
    assert seen["after"] < 2.0
    assert bed.rows()[3][0] == "processing"  # its completion could not land after the lease
