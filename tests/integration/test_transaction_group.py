"""Concurrent fenced writes on the store's own connection share one commit (a savepoint each).

Real threads call ``attempt.run_in_transaction`` on real SQLite files and real PostgreSQL
tables. One write is held open first, so the others queue behind its commit and then run as
one group. Commits are counted at the driver (a psycopg2 ``connection_factory``, sqlite3's
trace callback). A member that raises, a stale member and a failing commit never take the
others down, and the outbox calls of a member rolled back never reach the sender.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import psycopg2
import pytest

from ptb_fence import (
    OwnershipLost,
    TransactionEnded,
    UsageError,
    PostgresUpdateStore,
    RuntimeOptions,
    SQLiteUpdateStore,
    current_attempt,
)
from ptb_fence.runtime._attempt import enter_attempt
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._runtime import Runtime
from ptb_fence.runtime._transaction_group import FLIGHTS, in_flight, queued
from runtime_support import FakeClock, body, wait_until


class _Boom(Exception):
    pass


class Db:
    """A real store, a notes table in its database, and the commits its driver made."""

    def __init__(self, kind: str, store: Any, connect: Callable[[], Any], notes: str,
                 commits: List[Tuple[int, str]]) -> None:
        self.kind, self.store, self._connect, self.notes_table = kind, store, connect, notes
        self.mark = "?" if kind == "sqlite" else "%s"
        self.log = commits  # (connection id, "COMMIT" or a statement)
        self.clock = FakeClock()
        self.runtime = Runtime(store, RuntimeOptions(clock=self.clock, lease_seconds=60),
                               attempt_aware=True, handle_exhaustion=False)

    def query(self, sql: str, params: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
        conn = self._connect()
        try:
            cur = conn.cursor()
            cur.execute(sql.replace("?", self.mark), params)
            return list(cur.fetchall())
        finally:
            conn.close()

    def execute(self, sql: str) -> None:
        conn = self._connect()
        try:
            conn.cursor().execute(sql)
            conn.commit()
        finally:
            conn.close()

    def insert(self, conn: Any, update_id: int) -> None:
        if self.kind == "sqlite":  # the commits on this thread's connection are counted
            conn.set_trace_callback(self._traced(id(conn.target)))
        conn.cursor().execute(
            f"INSERT INTO {self.notes_table} VALUES ({self.mark})", (update_id,))

    def _traced(self, conn_id: int) -> Callable[[str], None]:
        def trace(sql: str) -> None:
            self.log.append((conn_id, sql.strip().upper()))
        return trace

    def notes(self) -> List[int]:
        return sorted(int(u) for (u,) in self.query(f"SELECT update_id FROM {self.notes_table}"))

    def members_notes(self) -> List[int]:
        """The notes of the members (the holders' are 101 and up)."""
        return [u for u in self.notes() if u < 100]

    def commits(self) -> int:
        return sum(1 for _, sql in list(self.log) if sql == "COMMIT")

    def savepoints(self) -> int:
        return sum(1 for _, sql in list(self.log) if sql.upper().startswith("SAVEPOINT"))

    def claimed(self, *update_ids: int) -> List[Attempt]:
        attempts = []
        for update_id in update_ids:
            assert self.store.add(update_id, body(update_id), self.clock.ms())
            attempt = self.runtime.claim(update_id)
            assert attempt is not None
            attempts.append(attempt)
        return attempts

    def state(self, update_id: int) -> Tuple[str, int]:
        (found,) = self.query(
            f"SELECT state, attempts FROM {self.table} WHERE update_id = ?", (update_id,))
        return str(found[0]), int(found[1])

    table = "telegram_updates"


def _sqlite_db(tmp_path: Any) -> Db:
    path = str(tmp_path / "group.db")
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute("CREATE TABLE notes_g (update_id INTEGER NOT NULL)")
    return Db("sqlite", store, lambda: sqlite3.connect(path, timeout=10), "notes_g", [])


def _pg_db(dsn: str, tables: List[str]) -> Tuple[Db, Any]:
    import psycopg2.extensions
    import psycopg2.pool

    log: List[Tuple[int, str]] = []

    class CountingCursor(psycopg2.extensions.cursor):
        def execute(self, query: Any, vars: Any = None) -> Any:  # noqa: A002
            log.append((id(self.connection), " ".join(str(query).split())[:60]))
            return super().execute(query, vars)

    class CountingConnection(psycopg2.extensions.connection):
        def cursor(self, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("cursor_factory", CountingCursor)
            return super().cursor(*args, **kwargs)

        def commit(self) -> None:
            log.append((id(self), "COMMIT"))
            super().commit()

    table = "t_" + uuid.uuid4().hex[:16]
    notes = "n_" + uuid.uuid4().hex[:16]
    tables += [table, notes]
    setup = psycopg2.connect(dsn)
    setup.autocommit = True
    with setup.cursor() as cur:
        cur.execute(f"CREATE TABLE {notes} (update_id BIGINT NOT NULL)")
    setup.close()
    pool = psycopg2.pool.ThreadedConnectionPool(1, 8, dsn, connection_factory=CountingConnection)
    db = Db("postgres", PostgresUpdateStore(pool, table), lambda: psycopg2.connect(dsn),
            notes, log)
    db.table = table
    return db, pool


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: Any, tmp_path: Any) -> Any:
    pool = None
    if request.param == "sqlite":
        made = _sqlite_db(tmp_path)
    else:
        made, pool = _pg_db(request.getfixturevalue("pg_dsn"),
                            request.getfixturevalue("pg_tables"))
    try:
        yield made
    finally:
        if made.runtime.outbox is not None:
            made.runtime.outbox.stop()
        made.store.close()
        if pool is not None:
            pool.closeall()


@pytest.fixture
def pg_db(pg_dsn: str, pg_tables: List[str]) -> Any:
    made, pool = _pg_db(pg_dsn, pg_tables)
    try:
        yield made
    finally:
        made.store.close()
        pool.closeall()


# -- driving real threads ------------------------------------------------------------------------
class Outcome:
    """What one thread's ``run_in_transaction`` returned or raised."""

    def __init__(self) -> None:
        self.value: Any = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()


def _call(attempt: Attempt, fn: Callable[[Any], Any], complete: bool = True) -> Outcome:
    """Start a thread that awaits ``attempt.run_in_transaction(fn)`` on an event loop of its
    own, as a handler of ``attempt`` (the block runs on a worker thread)."""
    outcome = Outcome()

    def run() -> None:
        enter_attempt(attempt)  # as a front end does around a handler
        try:
            outcome.value = asyncio.run(attempt.run_in_transaction(fn, complete=complete))
        except BaseException as exc:  # checked by the test
            outcome.error = exc
        finally:
            outcome.done.set()

    threading.Thread(target=run, daemon=True).start()
    return outcome


def _grouped(db: Db, members: List[Tuple[Attempt, Callable[[Any], Any]]]
             ) -> Tuple[List[Outcome], int]:
    """Holders (updates 101, 102, ...) take every flight and keep their transactions open
    until every member waits behind them, then let go: the members run together after.
    Returns the members' outcomes and the commits made from the holders' start on."""
    holders = db.claimed(*range(101, 101 + FLIGHTS))
    before = db.commits()
    holding = threading.Semaphore(0)
    release = threading.Event()

    def hold(conn: Any) -> str:
        attempt = current_attempt()
        assert attempt is not None
        db.insert(conn, attempt.update_id)
        holding.release()
        assert release.wait(30)
        return "held"

    held = []
    for holder in holders:
        held.append(_call(holder, hold))
        count = len(held)
        assert wait_until(lambda: in_flight(db.runtime.port) == count, 30)
    # the first holds its transaction open (on SQLite the others wait for its write lock)
    assert holding.acquire(timeout=30)
    outcomes = []
    for attempt, fn in members:
        outcomes.append(_call(attempt, fn))
        # one at a time: the group keeps their order
        count = len(outcomes)
        assert wait_until(lambda: queued(db.runtime.port) == count, 30), queued(db.runtime.port)
    release.set()
    for outcome in held + outcomes:
        assert outcome.done.wait(60), "a fenced write never returned"
    assert [(o.value, o.error) for o in held] == [("held", None)] * FLIGHTS
    assert db.notes()[-FLIGHTS:] == list(range(101, 101 + FLIGHTS))
    return outcomes, db.commits() - before


def _writer(db: Db, seen: Optional[Dict[int, Any]] = None) -> Callable[[Any], int]:
    def write(conn: Any) -> int:
        attempt = current_attempt()
        assert attempt is not None
        if seen is not None:
            seen[attempt.update_id] = (threading.get_ident(), id(conn.target))
        db.insert(conn, attempt.update_id)
        return attempt.update_id
    return write


# -- the group -----------------------------------------------------------------------------------
def test_concurrent_fenced_writes_commit_together_with_one_commit(db: Db) -> None:
    attempts = db.claimed(1, 2, 3, 4, 5)
    seen: Dict[int, Any] = {}
    outcomes, commits = _grouped(db, [(a, _writer(db, seen)) for a in attempts])
    assert [(o.value, o.error) for o in outcomes] == [(a.update_id, None) for a in attempts]
    # the holders' own commits and ONE for the five that waited behind them
    assert commits == FLIGHTS + 1
    if db.kind == "postgres":  # (sqlite3's trace starts inside the first member's block)
        assert db.savepoints() == 5
    # one thread, one connection ran every member's block (as its current attempt)
    assert len({seen[a.update_id] for a in attempts}) == 1
    assert db.members_notes() == [1, 2, 3, 4, 5]
    assert all(a.completed and not a.holds_fence and not a.in_fenced_transaction
               for a in attempts)
    assert [db.state(u) for u in range(1, 6)] == [("completed", 1)] * 5
    assert wait_until(lambda: in_flight(db.runtime.port) == 0, 10)
    assert queued(db.runtime.port) == 0


def test_one_caller_alone_takes_the_path_of_its_own_with_no_savepoint(db: Db) -> None:
    (attempt,) = db.claimed(1)
    before = db.commits()
    outcome = _call(attempt, _writer(db))
    assert outcome.done.wait(30) and outcome.error is None and outcome.value == 1
    assert db.commits() - before == 1
    assert db.savepoints() == 0
    assert attempt.completed and db.notes() == [1]


def test_a_member_that_raises_is_rolled_back_alone_and_its_error_reaches_its_caller(
    db: Db,
) -> None:
    a, bad, c = db.claimed(2, 3, 4)

    def fails(conn: Any) -> None:
        db.insert(conn, 3)  # written, then rolled back to its savepoint
        raise _Boom("the handler's mistake")

    (oa, ob, oc), commits = _grouped(db, [(a, _writer(db)), (bad, fails), (c, _writer(db))])
    assert isinstance(ob.error, _Boom) and str(ob.error) == "the handler's mistake"
    assert (oa.value, oa.error, oc.value, oc.error) == (2, None, 4, None)
    assert commits == FLIGHTS + 1  # the others still shared one commit
    assert db.members_notes() == [2, 4]
    assert db.state(3) == ("processing", 1)  # still claimed: retried as usual
    assert not bad.completed and not bad.lost and not bad.in_fenced_transaction
    assert a.completed and c.completed
    # still its own: a transaction of its own completes it now
    again = _call(bad, _writer(db))
    assert again.done.wait(30) and again.error is None
    assert db.state(3) == ("completed", 1) and db.members_notes() == [2, 3, 4]


def test_a_stale_member_gets_ownership_lost_while_the_others_commit(db: Db) -> None:
    a, stale, c = db.claimed(2, 3, 4)
    # another process takes update 3 over once its lease passed (this attempt's is stale)
    taken = db.store.claim_owned(3, now=db.clock.ms() + 120_000,
                                 lease_until=db.clock.ms() + 240_000, max_attempts=5)
    assert taken is not None and taken.attempt == 2
    (oa, os_, oc), commits = _grouped(
        db, [(a, _writer(db)), (stale, _writer(db)), (c, _writer(db))])
    assert isinstance(os_.error, OwnershipLost), os_.error
    assert stale.lost and not stale.completed
    assert (oa.value, oa.error, oc.value, oc.error) == (2, None, 4, None)
    assert commits == FLIGHTS + 1
    assert db.members_notes() == [2, 4]
    assert db.state(3) == ("processing", 2)  # the other process's claim, untouched
    assert db.store.owns(taken, db.clock.ms() + 130_000)


def test_a_failing_commit_reports_no_member_committed_and_each_runs_again_alone(
    pg_db: Db,
) -> None:
    db = pg_db
    checked = "k_" + uuid.uuid4().hex[:12]
    db.execute(f"CREATE TABLE {checked} (k INT UNIQUE DEFERRABLE INITIALLY DEFERRED)")
    try:
        a, bad, c = db.claimed(2, 3, 4)
        runs: Dict[int, int] = {}

        def counted(conn: Any) -> int:
            attempt = current_attempt()
            assert attempt is not None
            runs[attempt.update_id] = runs.get(attempt.update_id, 0) + 1
            db.insert(conn, attempt.update_id)
            if attempt.update_id == 3:  # passes every statement, fails at the COMMIT
                conn.cursor().execute(f"INSERT INTO {checked} VALUES (1), (1)")
            return attempt.update_id

        (oa, ob, oc), _ = _grouped(db, [(a, counted), (bad, counted), (c, counted)])
        assert isinstance(ob.error, psycopg2.IntegrityError), ob.error
        assert (oa.value, oa.error, oc.value, oc.error) == (2, None, 4, None)
        # each ran in the group whose commit failed, then alone
        assert runs == {2: 2, 3: 2, 4: 2}
        # once each: nothing of the failed group landed
        assert db.members_notes() == [2, 4]
        assert db.state(3) == ("processing", 1) and not bad.completed
        assert a.completed and c.completed
        assert [db.state(u)[0] for u in (2, 4)] == ["completed", "completed"]
    finally:
        db.execute(f"DROP TABLE {checked}")


def test_the_outbox_calls_of_a_member_rolled_back_never_send(db: Db) -> None:
    sent: List[Tuple[str, Dict[str, Any]]] = []
    lock = threading.Lock()

    def send(method: str, params: Dict[str, Any]) -> Any:
        with lock:
            sent.append((method, dict(params)))
        return {"message_id": 1, "date": 0, "chat": {"id": params.get("chat_id"),
                                                      "type": "private"}}

    assert db.runtime.outbox is not None
    db.runtime.outbox.start(send)
    a, bad, c = db.claimed(2, 3, 4)

    def replies(conn: Any) -> int:
        attempt = current_attempt()
        assert attempt is not None
        db.insert(conn, attempt.update_id)
        attempt.outbox.send_message(7000 + attempt.update_id, f"note {attempt.update_id}")
        if attempt.update_id == 3:
            raise _Boom("after queueing its reply")
        return attempt.update_id

    (oa, ob, oc), _ = _grouped(db, [(a, replies), (bad, replies), (c, replies)])
    assert isinstance(ob.error, _Boom)
    assert (oa.error, oc.error) == (None, None)

    def texts() -> List[str]:
        with lock:
            return sorted(str(params.get("text")) for _, params in sent)

    assert wait_until(lambda: texts() == ["note 2", "note 4"], 15), texts()
    time.sleep(0.3)  # nothing more comes
    assert texts() == ["note 2", "note 4"]
    assert sorted(call.update_id for call in db.store.list_calls()) == [2, 4]


def test_a_member_that_commits_itself_fails_and_the_members_before_it_complete_once(
    db: Db,
) -> None:
    a, bad, c = db.claimed(2, 3, 4)

    def commits_itself(conn: Any) -> int:
        db.insert(conn, 3)
        conn.cursor().execute("COMMIT")  # a cursor's COMMIT: no guard sees it
        return 3

    (oa, ob, oc), _ = _grouped(db, [(a, _writer(db)), (bad, commits_itself), (c, _writer(db))])
    assert isinstance(ob.error, TransactionEnded), ob.error
    assert (oa.value, oa.error, oc.value, oc.error) == (2, None, 4, None)
    # 2 landed with that COMMIT (done, not run again), 3's write escaped with it as it does
    # alone, 4 ran after it alone
    assert db.members_notes() == [2, 3, 4]
    assert [db.state(u) for u in (2, 3, 4)] == [("completed", 1), ("processing", 1),
                                               ("completed", 1)]
    assert a.completed and c.completed and not bad.completed


def test_a_member_refused_a_commit_or_returning_an_awaitable_fails_alone(db: Db) -> None:
    a, commits, awaits, c = db.claimed(2, 3, 5, 4)

    def commits_itself(conn: Any) -> None:
        db.insert(conn, 3)
        conn.commit()  # refused before it reaches the database

    async def later() -> None:
        return None

    def returns_awaitable(conn: Any) -> Any:
        db.insert(conn, 5)
        return later()

    (oa, ob, ow, oc), commit_count = _grouped(
        db, [(a, _writer(db)), (commits, commits_itself), (awaits, returns_awaitable),
             (c, _writer(db))])
    assert isinstance(ob.error, TransactionEnded) and "refused commit()" in str(ob.error)
    assert isinstance(ow.error, UsageError), ow.error
    assert (oa.value, oa.error, oc.value, oc.error) == (2, None, 4, None)
    assert commit_count == FLIGHTS + 1
    assert db.members_notes() == [2, 4]
    assert [db.state(u)[0] for u in (2, 3, 4, 5)] == ["completed", "processing", "completed",
                                                     "processing"]
