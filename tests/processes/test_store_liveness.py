"""Liveness of store instances, with real processes and signals.

A subprocess holds its store's liveness and claims rows with a 120 s lease. Then:
(a) SIGKILL: another process's ``take_over_dead(now)`` makes its rows claimable at once;
(b) SIGSTOP: a frozen process is not dead, nothing is taken over; after SIGCONT it exits
cleanly; (c) a graceful ``release_liveness()`` removes the instance row. Every wait is bounded.
"""

from __future__ import annotations

import glob
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest

from store_support import fresh_table_name
from ptb_fence import Batch, ClaimTerms, MemoryUpdateStore, SQLiteUpdateStore

WORKER = str(Path(__file__).resolve().parent / "liveness_worker.py")
COUNT = 6
LEASE = 120_000


def now_ms() -> int:
    return int(time.time() * 1000)


class Where:
    """One database (SQLite file or PostgreSQL table) that the worker and the test share."""

    def __init__(self, kind: str, location: str, table: str) -> None:
        self.kind, self.location, self.table = kind, location, table

    def store(self) -> Any:
        if self.kind == "sqlite":
            return SQLiteUpdateStore(self.location, table=self.table)
        from ptb_fence import PostgresUpdateStore

        return PostgresUpdateStore(self.location, table=self.table)

    def instances(self) -> List[str]:
        query = "SELECT instance FROM ptb_fence_instances WHERE table_name = "
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.location)
            try:
                return [r[0] for r in conn.execute(query + "?", (self.table,)).fetchall()]
            finally:
                conn.close()
        import psycopg2

        pg = psycopg2.connect(self.location)
        try:
            with pg.cursor() as cur:
                cur.execute(query + "%s", (self.table,))
                return [r[0] for r in cur.fetchall()]
        finally:
            pg.close()


# Not conftest's store: the worker process reaches the database by path or DSN and table.
@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    if request.param == "sqlite":
        path = str(tmp_path / "live.db")
        SQLiteUpdateStore(path).close()  # the schema exists before the worker starts
        yield Where("sqlite", path, "telegram_updates")
    else:
        dsn: str = request.getfixturevalue("pg_dsn")
        tables: List[str] = request.getfixturevalue("pg_tables")
        table = fresh_table_name()
        tables.append(table)
        yield Where("postgres", dsn, table)


def start_worker(where: Where, first: int, *extra: str) -> Tuple["subprocess.Popen[str]", str]:
    proc = subprocess.Popen(
        [sys.executable, WORKER, where.kind, where.location, where.table, str(first), str(COUNT),
         *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # bounded by the test timeout
    assert line.startswith("READY "), f"worker said {line!r} (exit code {proc.poll()})"
    return proc, line.split()[1]


def claim_all(store: Any, ids: range) -> List[Any]:
    at = now_ms()
    return [
        store.claim_owned(u, now=at, lease_until=at + LEASE, max_attempts=5) for u in ids
    ]


def until(predicate: Callable[[], Any], seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_killed_instance_is_taken_over_at_once(where: Where) -> None:
    ids = range(100, 100 + COUNT)
    proc, instance = start_worker(where, ids[0])
    with where.store() as store:
        store.hold_liveness()
        try:
            assert instance in where.instances()
            assert store.take_over_dead(now=now_ms()) == 0, "a live instance was taken over"
            assert claim_all(store, ids) == [None] * COUNT
            killed_at = time.monotonic()
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            taken = until(lambda: store.take_over_dead(now=now_ms()), 10.0)
            assert taken == COUNT
            identities = claim_all(store, ids)
            # the claim marked isolated (its handler ran alone) spent its attempt; the others
            # were given back (any handler of the dead process may have killed it)
            assert [None if i is None else i.attempt for i in identities] == [2] + [1] * (
                COUNT - 1
            ), identities
            # and every one of them is suspect now: the charged one and the one whose handler
            # had run past its probation are suspect again (alone); the others, whose
            # handlers had not started as suspects, start on probation
            assert [store.claimed_suspect(i) for i in identities] == [2, 2] + [1] * (COUNT - 2)
            assert time.monotonic() - killed_at < 15, "far sooner than the 120 s lease"
            assert instance not in where.instances()
            assert store.take_over_dead(now=now_ms()) == 0
            # the survivor's own claims are never taken over
            assert all(store.owns(i, now_ms()) for i in identities)
        finally:
            store.release_liveness()
    if where.kind == "sqlite":
        assert not os.path.exists(f"{where.location}.instances/{instance}.lock")


@pytest.mark.timeout(60)
def test_frozen_instance_is_not_dead_and_graceful_release_removes_it(where: Where) -> None:
    ids = range(200, 200 + COUNT)
    proc, instance = start_worker(where, ids[0])
    assert proc.stdin is not None and proc.stdout is not None
    with where.store() as store:
        proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(0.5)
            for _ in range(3):
                assert store.take_over_dead(now=now_ms()) == 0, "a frozen process was taken over"
            assert claim_all(store, ids) == [None] * COUNT
            assert instance in where.instances()
        finally:
            proc.send_signal(signal.SIGCONT)
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "BYE"
        assert proc.wait(timeout=20) == 0
        # graceful: the instance row is gone; its claims keep their lease (not dead)
        assert instance not in where.instances()
        assert store.take_over_dead(now=now_ms()) == 0
        assert claim_all(store, ids) == [None] * COUNT


def test_claims_record_the_instance_only_while_liveness_is_held(tmp_path: Path) -> None:
    path = str(tmp_path / "rec.db")
    with SQLiteUpdateStore(path) as store:
        store.add(1, "a", 0)
        store.claim_owned(1, now=0, lease_until=LEASE, max_attempts=5)
        instance = store.hold_liveness()
        store.add(2, "b", 0)
        store.claim(2, now=0, lease_until=LEASE, max_attempts=5)
        store.commit(Batch(ClaimTerms(0, LEASE, 5), claimed_records=((3, "c", 0),)))
        store.commit(Batch(ClaimTerms(0, LEASE, 5), claimed_records=((4, "d", 0),)))
        store.release_liveness()
        store.add(5, "e", 0)
        store.claim_owned(5, now=0, lease_until=LEASE, max_attempts=5)
    conn = sqlite3.connect(path)
    try:
        rows = dict(conn.execute("SELECT update_id, instance FROM telegram_updates"))
    finally:
        conn.close()
    assert rows == {1: None, 2: instance, 3: instance, 4: instance, 5: None}


def test_two_store_objects_in_one_process_see_each_other_alive(tmp_path: Path) -> None:
    path = str(tmp_path / "two.db")
    with SQLiteUpdateStore(path) as a, SQLiteUpdateStore(path) as b:
        a.hold_liveness()
        b.hold_liveness()
        a.add(1, "x", 0)
        mine = a.claim_owned(1, now=0, lease_until=LEASE, max_attempts=5)
        assert b.take_over_dead(now=1) == 0
        assert a.owns(mine, 1)
    with SQLiteUpdateStore(path) as c:  # both closed: released gracefully, nothing dead
        assert c.take_over_dead(now=2) == 0


def test_memory_liveness_is_in_process() -> None:
    store = MemoryUpdateStore()
    instance = store.hold_liveness()
    assert store.hold_liveness() == instance
    store.add(1, "x", 0)
    mine = store.claim_owned(1, now=0, lease_until=LEASE, max_attempts=5)
    assert store.take_over_dead(now=1) == 0 and store.owns(mine, 1)
    store.close()
    assert store.hold_liveness() != instance


def test_an_older_sqlite_table_gets_the_instance_column(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE telegram_updates (update_id INTEGER PRIMARY KEY, body TEXT NOT NULL, "
        "state TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0, "
        "due_at INTEGER, received_at INTEGER NOT NULL, settled_at INTEGER, error TEXT, "
        "claim_id TEXT, fingerprint TEXT)"
    )
    conn.execute("INSERT INTO telegram_updates (update_id, body, due_at, received_at) "
                 "VALUES (7, 'old', 1, 1)")
    conn.commit()
    conn.close()
    stores = [SQLiteUpdateStore(path), SQLiteUpdateStore(path)]  # the second sees it done
    try:
        stores[0].hold_liveness()
        identity = stores[0].claim_owned(7, now=2, lease_until=LEASE, max_attempts=5)
        assert identity is not None and identity.attempt == 1
        assert stores[1].take_over_dead(now=3) == 0
    finally:
        for store in stores:
            store.close()


@pytest.mark.timeout(30)
def test_a_forked_child_does_not_end_or_use_its_parents_instance(tmp_path: Path) -> None:
    path = str(tmp_path / "fork.db")
    with SQLiteUpdateStore(path) as parent:
        instance = parent.hold_liveness()
        pid = os.fork()
        if pid == 0:  # the child: closes its copy, claims without the parent's instance
            code = 1
            try:
                parent.add(1, "child", 0)
                parent.claim_owned(1, now=0, lease_until=LEASE, max_attempts=5)
                code = 0 if parent.instance is None else 2
                parent.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        where = Where("sqlite", path, "telegram_updates")
        assert where.instances() == [instance], "the child removed its parent's instance"
        assert os.path.exists(f"{path}.instances/{instance}.lock")
        with SQLiteUpdateStore(path) as other:
            assert other.take_over_dead(now=1) == 0, "the parent was taken for dead"
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("SELECT instance FROM telegram_updates").fetchall() == [(None,)]
        finally:
            conn.close()
        assert parent.instance == instance


def _terminate_liveness_backend(dsn: str, instance: str) -> None:
    """End the backend holding ``instance``'s advisory lock (only that one: the server is
    shared), and wait until it has exited: without a timeout ``pg_terminate_backend`` only
    signals it, and the exiting backend may still hold the lock a moment later."""
    import psycopg2

    admin = psycopg2.connect(dsn)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_locks "
                "WHERE locktype = 'advisory' AND classid = %s::oid AND objid = %s::oid",
                (0x70746266, instance_key_u32(instance)),
            )
            assert cur.fetchall() == [(True,)]
    finally:
        admin.close()


def _liveness_lock_held(dsn: str, instance: str) -> bool:
    import psycopg2

    admin = psycopg2.connect(dsn)
    try:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND classid = %s::oid AND objid = %s::oid AND granted",
                (0x70746266, instance_key_u32(instance)),
            )
            return bool(cur.fetchone()[0])
    finally:
        admin.close()


@pytest.mark.timeout(60)
def test_postgres_liveness_connection_lost_is_no_proof_and_held_again(
    pg_dsn: str, pg_tables: List[str]
) -> None:
    """The backend of the liveness connection is terminated while the process lives and keeps
    calling take_over_dead (the runtime does, every second): nobody takes its claims over, and
    its next call holds the instance again. Once it stops (as a dead process does), it is found
    dead a few seconds later."""
    from ptb_fence import PostgresUpdateStore
    from ptb_fence.stores.postgres._sql import BEAT_STALE_MS

    table = fresh_table_name()
    pg_tables.append(table)
    where = Where("postgres", pg_dsn, table)
    with PostgresUpdateStore(pg_dsn, table=table) as owner, \
            PostgresUpdateStore(pg_dsn, table=table) as other:
        instance = owner.hold_liveness()
        owner.add(1, "x", 0)
        mine = owner.claim_owned(1, now=now_ms(), lease_until=now_ms() + LEASE, max_attempts=5)
        assert mine is not None
        _terminate_liveness_backend(pg_dsn, instance)
        assert not _liveness_lock_held(pg_dsn, instance)
        assert other.take_over_dead(now=now_ms()) == 0, "a free lock alone is no proof"
        until_ = time.monotonic() + BEAT_STALE_MS / 1000 * 2
        while time.monotonic() < until_:
            assert owner.take_over_dead(now=now_ms()) == 0
            assert other.take_over_dead(now=now_ms()) == 0, "a live instance was taken over"
            time.sleep(0.3)
        assert _liveness_lock_held(pg_dsn, instance), "not held again"
        assert owner.owns(mine, now_ms())
        assert instance in where.instances()
        # the owner no longer calls take_over_dead and loses its lock again: a dead process
        _terminate_liveness_backend(pg_dsn, instance)
        taken = until(lambda: other.take_over_dead(now=now_ms()), BEAT_STALE_MS / 1000 + 10)
        assert taken == 1
        assert not owner.owns(mine, now_ms()), "a taken-over claim must be refused"
        assert instance not in where.instances()


@pytest.mark.timeout(30)
def test_a_forked_child_does_not_end_its_parents_postgres_session(
    pg_dsn: str, pg_tables: List[str]
) -> None:
    """A forked child that closes what it inherited (the store, the parked liveness
    connection) leaves the parent's liveness session alone."""
    import gc

    from ptb_fence import PostgresUpdateStore
    from ptb_fence.stores.postgres import _liveness

    table = fresh_table_name()
    pg_tables.append(table)
    with PostgresUpdateStore(pg_dsn, table=table) as parent, \
            PostgresUpdateStore(pg_dsn, table=table) as other:
        instance = parent.hold_liveness()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = 0 if parent.instance is None else 2
                parent.close()  # parks the inherited liveness connection
                for conn in _liveness._INHERITED:
                    conn.close()  # would send the server a goodbye on the parent's session
                gc.collect()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.5)
        assert _liveness_lock_held(pg_dsn, instance)
        assert other.take_over_dead(now=now_ms()) == 0
        assert parent.instance == instance


@pytest.mark.timeout(30)
def test_a_forked_child_leaves_its_parents_postgres_transaction_alone(
    pg_dsn: str, pg_tables: List[str]
) -> None:
    """A child forked inside a transaction of the store, whose code then ends that transaction
    too (as a raw ``os.fork()`` child falling out of the ``with`` block would), does not end or
    write the parent's session; the child's store opens connections of its own."""
    from ptb_fence import PostgresUpdateStore

    table = fresh_table_name()
    pg_tables.append(table)
    with PostgresUpdateStore(pg_dsn, table=table) as parent:
        parent.add(1, "x", 0)
        with parent.transaction() as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                backend = cur.fetchone()[0]
                cur.execute(f"UPDATE {table} SET body = 'parent' WHERE update_id = 1")  # noqa: S608
            pid = os.fork()
            if pid == 0:
                import psycopg2

                code = 1
                try:
                    parent.add(2, "child", 0)
                    code = 3
                    try:
                        conn.commit()  # on the inherited connection: must not reach the server
                    except psycopg2.Error:
                        code = 0
                    conn.close()
                    parent.close()
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0  # 3: the child committed for it
            with conn.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                assert cur.fetchone()[0] == backend, "the child ended the parent's session"
            conn.rollback()  # the parent's choice: nothing of its transaction was committed
        bodies = dict(
            (u.update_id, u.body) for u in parent.due(now=1, pending_before=1, limit=5))
        assert bodies == {1: "x", 2: "child"}


@pytest.mark.timeout(30)
def test_a_forked_child_uses_a_callers_pool_without_its_parents_connections(
    pg_dsn: str, pg_tables: List[str]
) -> None:
    """With a caller's psycopg2 pool, a forked child's store calls get connections of their
    own (the pool's connections the store used in the parent are closed on their detached
    copies, not handed out), and the parent's sessions are untouched."""
    import psycopg2.pool

    from ptb_fence import PostgresUpdateStore

    table = fresh_table_name()
    pg_tables.append(table)
    pool = psycopg2.pool.ThreadedConnectionPool(1, 4, pg_dsn)
    try:
        with PostgresUpdateStore(pool, table=table) as store:
            store.add(1, "x", 0)
            used = pool.getconn()
            with used.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                backend = cur.fetchone()[0]
            used.rollback()
            pool.putconn(used)
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    store.add(2, "child", 0)
                    due = store.due(now=1, pending_before=1, limit=5)
                    code = 0 if sorted(u.update_id for u in due) == [1, 2] else 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            assert sorted(u.update_id for u in store.due(now=1, pending_before=1, limit=5)) == [1, 2]
            used = pool.getconn()
            with used.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                assert cur.fetchone()[0] == backend, "the parent's pooled session was ended"
            used.rollback()
            pool.putconn(used)
    finally:
        pool.closeall()


@pytest.mark.timeout(90)
def test_postgres_takeover_skips_a_row_that_a_lingering_session_locks(
    pg_dsn: str, pg_tables: List[str]
) -> None:
    """A dead instance's row can stay locked after the process is gone: a session the server
    keeps (a dead host's connection until TCP gives up, a child's copy of a connection the
    store could not know of, e.g. a caller's own). The takeover takes the other rows at once
    without waiting for that one, keeps the instance listed, and takes the row once the lock
    is gone; other processes' checks are not held up meanwhile."""
    import threading

    import psycopg2

    from ptb_fence.stores.postgres._sql import BEAT_STALE_MS

    table = fresh_table_name()
    pg_tables.append(table)
    where = Where("postgres", pg_dsn, table)
    ids = range(800, 800 + COUNT)
    proc, instance = start_worker(where, ids[0])
    lingering = psycopg2.connect(pg_dsn)  # stands for the session that outlives the process
    try:
        with lingering.cursor() as cur:
            cur.execute(f"SELECT 1 FROM {table} WHERE update_id = %s FOR UPDATE", (ids[0],))  # noqa: S608
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        with where.store() as store:
            found: List[int] = []

            def check() -> None:
                found.append(until(lambda: store.take_over_dead(now=now_ms()),
                                   BEAT_STALE_MS / 1000 + 10))

            checking = threading.Thread(target=check, daemon=True)
            checking.start()
            checking.join(BEAT_STALE_MS / 1000 + 20)
            assert not checking.is_alive(), "the takeover waited for the locked row"
            assert found == [COUNT - 1]
            assert instance in where.instances(), "forgotten with a row still to take over"
            lingering.rollback()
            assert until(lambda: store.take_over_dead(now=now_ms()), 10.0) == 1
            assert instance not in where.instances()
            assert all(i is not None for i in claim_all(store, ids))  # every row claimable
    finally:
        lingering.close()


def instance_key_u32(instance: str) -> int:
    from ptb_fence.stores.postgres._sql import instance_key

    return instance_key(instance) & 0xFFFFFFFF


def test_sqlite_lock_file_removed_or_replaced_is_no_proof_and_held_again(tmp_path: Path) -> None:
    """Someone deletes the live instance's lock file, or puts another file in its place: that
    proves nothing, so nobody takes its claims over; the owner's next take_over_dead holds
    the instance again, and once it is really gone it is found dead."""
    path = str(tmp_path / "gone.db")
    with SQLiteUpdateStore(path) as owner, SQLiteUpdateStore(path) as other:
        instance = owner.hold_liveness()
        lock_file = f"{path}.instances/{instance}.lock"
        owner.add(1, "x", 0)
        mine = owner.claim_owned(1, now=1, lease_until=LEASE, max_attempts=5)
        os.unlink(lock_file)
        assert other.take_over_dead(now=2) == 0
        assert owner.owns(mine, 2)
        assert owner.take_over_dead(now=3) == 0
        assert os.path.exists(lock_file)
        assert other.take_over_dead(now=4) == 0 and owner.owns(mine, 4)
        with open(lock_file + ".new", "w", encoding="utf-8"):
            pass
        os.rename(lock_file + ".new", lock_file)  # an empty, unlocked file in its place
        assert other.take_over_dead(now=5) == 0 and owner.owns(mine, 5)
        assert owner.take_over_dead(now=6) == 0
        with open(lock_file, encoding="utf-8") as file:
            assert file.read().strip() == instance
        assert other.take_over_dead(now=7) == 0 and owner.owns(mine, 7)
        assert sorted(os.listdir(f"{path}.instances")) == [instance + ".lock"]
    with SQLiteUpdateStore(path) as third:  # closed: released gracefully, nothing dead
        assert third.take_over_dead(now=8) == 0


@pytest.mark.timeout(60)
def test_sqlite_instance_seen_through_another_path_to_the_file(tmp_path: Path) -> None:
    """The owner reaches the database through a path the checking process does not have
    (another container's mount of the volume; here a symlinked directory, removed once the
    owner is running): its lock file is found next to the checker's own path to the file."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    SQLiteUpdateStore(str(real / "live.db")).close()
    ids = range(300, 300 + COUNT)
    proc, instance = start_worker(Where("sqlite", str(link / "live.db"), "telegram_updates"), ids[0])
    link.unlink()
    where = Where("sqlite", str(real / "live.db"), "telegram_updates")
    with where.store() as store:
        store.hold_liveness()
        try:
            for _ in range(3):
                assert store.take_over_dead(now=now_ms()) == 0, "a live instance was taken over"
            assert claim_all(store, ids) == [None] * COUNT
            assert instance in where.instances()
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            assert until(lambda: store.take_over_dead(now=now_ms()), 10.0) == COUNT
            assert instance not in where.instances()
        finally:
            store.release_liveness()
    assert not (real / "live.db.instances" / f"{instance}.lock").exists()


# Run as another OS user (nobody): everything is imported first, then the process gives up
# root; it checks for dead instances five times and reports what it saw and logged.
_OTHER_USER_CHECK = r"""
import json, logging, os, sys, time
from ptb_fence import SQLiteUpdateStore

records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)


logging.getLogger("ptb_fence").addHandler(Keep())
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
store = SQLiteUpdateStore(sys.argv[1])
results = []
for _ in range(5):
    try:
        results.append(store.take_over_dead(now=int(time.time() * 1000)))
    except Exception as exc:
        results.append(repr(exc))
store.close()
print(json.dumps({"results": results,
                  "logged": [[r.levelname, r.getMessage()] for r in records
                             if r.levelno >= logging.WARNING]}))
"""


@pytest.mark.timeout(90)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_sqlite_liveness_checked_by_another_os_user() -> None:
    """Bot processes of another OS user share the database: the check needs no write access to
    their lock files; a lock file it cannot read is skipped (its instance counts as alive,
    one WARNING) and the other instances are still checked."""
    import json
    import shutil
    import stat
    import tempfile

    directory = tempfile.mkdtemp(prefix="ptb_fence_users_")
    try:
        os.chmod(directory, 0o777)  # every user may create the database's side files here
        path = os.path.join(directory, "shared.db")
        SQLiteUpdateStore(path).close()
        os.chmod(path, 0o666)
        where = Where("sqlite", path, "telegram_updates")
        alive, alive_id = start_worker(where, 400)
        hidden, hidden_id = start_worker(where, 500)
        dead, dead_id = start_worker(where, 600)
        try:
            # an instance whose lock file this user cannot read (an owner with umask 077)
            os.chmod(f"{path}.instances/{hidden_id}.lock", 0o600)
            dead.send_signal(signal.SIGKILL)
            dead.wait(timeout=10)
            out = subprocess.run(
                [sys.executable, "-c", _OTHER_USER_CHECK, path],
                capture_output=True, text=True, timeout=60,
            )
            assert out.returncode == 0, out.stderr
            report = json.loads(out.stdout)
            assert report["results"] == [COUNT, 0, 0, 0, 0], report
            warnings = [m for level, m in report["logged"] if level == "WARNING"]
            assert len(warnings) == 1 and hidden_id in warnings[0], report["logged"]
            assert [level for level, _ in report["logged"]] == ["WARNING"], report["logged"]
            assert sorted(where.instances()) == sorted([alive_id, hidden_id])
            mode = stat.S_IMODE(os.stat(f"{path}.instances/{alive_id}.lock").st_mode)
            assert mode & 0o044, oct(mode)  # readable by others
        finally:
            for proc in (alive, hidden, dead):
                proc.kill()
                proc.wait(timeout=10)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


_OTHER_USER_HOLD = r"""
import os, sys
from ptb_fence import SQLiteUpdateStore

os.setgroups([])
os.setgid(65534)
os.setuid(65534)
store = SQLiteUpdateStore(sys.argv[1])
print(store.hold_liveness())
store.close()
"""


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_sqlite_lock_directory_takes_the_group_of_the_database_directory() -> None:
    """The database's directory is writable by a group the bots share (no setgid bit, so files
    made there get their creator's group): the lock directory the first bot creates takes that
    group with the directory's mode, so a bot of another user of the group holds liveness too."""
    import shutil
    import tempfile

    directory = tempfile.mkdtemp(prefix="ptb_fence_group_")
    try:
        os.chown(directory, 0, 65534)
        os.chmod(directory, 0o775)  # the shared group may write; no setgid bit
        path = os.path.join(directory, "shared.db")
        SQLiteUpdateStore(path).close()
        os.chown(path, 0, 65534)
        os.chmod(path, 0o664)  # (SQLite gives its -wal and -shm files the same)
        with SQLiteUpdateStore(path) as first:  # root, primary group root
            first.hold_liveness()
            out = subprocess.run(
                [sys.executable, "-c", _OTHER_USER_HOLD, path],
                capture_output=True, text=True, timeout=60,
            )
            assert out.returncode == 0, out.stderr
            assert len(out.stdout.strip()) == 32, out.stdout
            assert os.stat(f"{path}.instances").st_gid == 65534
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _postgres_bin() -> Optional[str]:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture
def own_postgres() -> Iterator[Tuple[str, Callable[[float], None]]]:
    """A PostgreSQL server of this test alone (the shared one is never restarted): its DSN and
    ``restart(down_seconds)``. Needs root, the ``postgres`` OS user and the server binaries."""
    import shutil
    import socket
    import tempfile

    binaries = _postgres_bin()
    if os.geteuid() != 0 or binaries is None or not _has_user("postgres"):
        pytest.skip("needs root, the postgres OS user and /usr/lib/postgresql/*/bin")
    directory = tempfile.mkdtemp(prefix="ptb_fence_own_pg_")
    shutil.chown(directory, "postgres")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data = os.path.join(directory, "data")
    options = f"-p {port} -k {directory} -c listen_addresses=127.0.0.1"

    def pg_ctl(*args: str) -> None:
        subprocess.run(
            [os.path.join(binaries, "pg_ctl"), "-D", data, "-o", options,
             "-l", os.path.join(directory, "log"), *args],
            user="postgres", check=True, capture_output=True, timeout=60,
        )

    subprocess.run([os.path.join(binaries, "initdb"), "-D", data, "-A", "trust", "-U", "postgres"],
                   user="postgres", check=True, capture_output=True, timeout=120)
    pg_ctl("-w", "start")

    def restart(down: float) -> None:
        pg_ctl("-m", "fast", "-w", "stop")
        time.sleep(down)
        pg_ctl("-w", "start")

    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", restart
    finally:
        try:
            pg_ctl("-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.timeout(180)
def test_postgres_restart_is_no_proof_of_death(
    own_postgres: Tuple[str, Callable[[float], None]]
) -> None:
    """The server restarts (down longer than an instance may go without refreshing its row):
    every liveness lock is gone, but a live process (calling take_over_dead, as a running bot
    does) is not taken for dead; it holds its lock again, and a later SIGKILL is found."""
    from ptb_fence.stores.postgres._sql import BEAT_STALE_MS

    dsn, restart = own_postgres
    where = Where("postgres", dsn, "telegram_updates")
    where.store().close()
    ids = range(700, 700 + COUNT)
    proc, instance = start_worker(where, ids[0], "tick")
    try:
        with where.store() as store:
            store.hold_liveness()
            restart(BEAT_STALE_MS / 1000 + 2)
            after = time.monotonic()
            while time.monotonic() - after < BEAT_STALE_MS / 1000 + 3:
                assert store.take_over_dead(now=now_ms()) == 0, "a live instance was taken over"
                time.sleep(0.2)
            assert claim_all(store, ids) == [None] * COUNT
            assert instance in where.instances()
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            taken = until(lambda: store.take_over_dead(now=now_ms()), BEAT_STALE_MS / 1000 + 10)
            assert taken == COUNT
            assert instance not in where.instances()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.timeout(90)
def test_postgres_a_new_tables_schema_does_not_hold_up_live_takeover_checks(pg_dsn: str) -> None:
    """Every store of a new table applies its schema, which includes ``ptb_fence_instances``,
    the table that every live instance of the database refreshes at every takeover check. An
    open transaction on it (a process frozen between its check and the commit, SIGSTOPped or
    swapped out) must not make that schema queue for an ACCESS EXCLUSIVE lock: every other
    instance's check would queue behind it (their takeover watch stuck, their own refreshes
    late) for as long as the frozen process stays frozen. In a schema of its own, so that the
    shared instances table of other tests is never locked."""
    import threading
    import uuid

    import psycopg2

    from ptb_fence import PostgresUpdateStore

    schema = f"ptbf_frozen_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(pg_dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in pg_dsn else "?"
    dsn = f"{pg_dsn}{sep}options=-csearch_path%3D{schema}"
    frozen = psycopg2.connect(dsn)
    live = PostgresUpdateStore(dsn, table="live_updates")
    done: dict = {}
    try:
        instance = live.hold_liveness()
        live.take_over_dead(now=now_ms())
        with frozen.cursor() as cur:  # its refresh, left uncommitted: the process froze here
            cur.execute("UPDATE ptb_fence_instances SET seen_at = seen_at WHERE instance <> %s",
                        (instance,))

        def newcomer() -> None:
            with PostgresUpdateStore(dsn, table="new_updates") as store:
                done["newcomer"] = store.take_over_dead(now=now_ms())  # applies the schema

        def check() -> None:
            done["live"] = live.take_over_dead(now=now_ms())

        starting = threading.Thread(target=newcomer, daemon=True)
        starting.start()
        time.sleep(1.0)  # the newcomer's schema is applied (or queued) first
        checking = threading.Thread(target=check, daemon=True)
        checking.start()
        # short bounds: both wait forever when the schema queues, and meanwhile the waiting
        # schema holds the database-wide metadata lock that every new store of the server takes
        checking.join(5)
        starting.join(5)
        assert done == {"live": 0, "newcomer": 0}, (
            f"still waiting behind the open transaction: {sorted({'live', 'newcomer'} - set(done))}")
    finally:
        frozen.rollback()
        frozen.close()
        live.close()
        with admin.cursor() as cur:
            cur.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()
