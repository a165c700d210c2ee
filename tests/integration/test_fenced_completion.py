"""A ``complete=True`` fenced transaction checks ownership and settles in ONE conditional
statement at its start: ``complete_owned`` of the SQLite and PostgreSQL
stores (:class:`ptb_fence.BatchStore`).

Boundaries of that statement on real SQLite files and real PostgreSQL tables: a lease ending
exactly at the check still holds, one past it does not; a stale claim id is refused and changes
nothing; a rollback (the handler's ``fn`` raising) restores the claim so the attempt is retried;
two connections racing for the same claim complete it once and a competing claim waits for the
row and then sees it completed. And the round trips of one fenced write on PostgreSQL, counted
by a psycopg2 ``connection_factory`` (public psycopg2 API; nothing of ptb_fence is patched).
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from ptb_fence import (
    AttemptIdentity,
    OwnershipLost,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    UpdateIntake,
)
from runtime_support import FakeClock, body

T = 1_700_000_000_000
L = 60_000


class Db:
    """A real store plus a domain table ``notes(update_id, attempt)`` in the same database."""

    def __init__(self, kind: str, store: Any, connect: Callable[[], Any], table: str,
                 notes: str) -> None:
        self.kind, self.store, self._connect, self.table, self.notes_table = (
            kind, store, connect, table, notes)
        self.mark = "?" if kind == "sqlite" else "%s"

    def query(self, sql: str, params: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
        conn = self._connect()
        try:
            cur = conn.cursor()
            cur.execute(sql.replace("?", self.mark), params)
            return list(cur.fetchall())
        finally:
            conn.close()

    def row(self, update_id: int) -> Tuple[Any, ...]:
        found = self.query(
            f"SELECT state, attempts, due_at, settled_at, claim_id FROM {self.table} "
            "WHERE update_id = ?", (update_id,))
        return tuple(found[0]) if found else ()

    def insert(self, conn: Any, update_id: int, attempt: int) -> None:
        cur = conn.cursor()
        cur.execute(f"INSERT INTO {self.notes_table} VALUES ({self.mark}, {self.mark})",
                    (update_id, attempt))

    def notes(self) -> List[Tuple[int, int]]:
        return sorted((int(u), int(a)) for u, a in
                      self.query(f"SELECT update_id, attempt FROM {self.notes_table}"))

    def claimed(self, update_id: int, lease_until: int = T + L) -> AttemptIdentity:
        assert self.store.add(update_id, "{}", T)
        identity = self.store.claim_owned(update_id, now=T, lease_until=lease_until,
                                          max_attempts=5)
        assert identity is not None
        return identity


def _sqlite_db(tmp_path: Any) -> Db:
    path = str(tmp_path / "completion.db")
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute("CREATE TABLE notes_c (update_id INTEGER NOT NULL, attempt INTEGER NOT NULL)")
    return Db("sqlite", store, lambda: sqlite3.connect(path, timeout=10), "telegram_updates",
              "notes_c")


def _pg_db(dsn: str, tables: List[str], store: Any = None) -> Db:
    import psycopg2

    table = "t_" + uuid.uuid4().hex[:16]
    notes = "n_" + uuid.uuid4().hex[:16]
    tables += [table, notes]
    setup = psycopg2.connect(dsn)
    setup.autocommit = True
    with setup.cursor() as cur:
        cur.execute(f"CREATE TABLE {notes} (update_id BIGINT NOT NULL, attempt INTEGER NOT NULL)")
    setup.close()
    made = PostgresUpdateStore(dsn if store is None else store, table)
    return Db("postgres", made, lambda: psycopg2.connect(dsn), table, notes)


# Not conftest's store: a store plus a notes table in the same database and a raw connection.
@pytest.fixture(params=["sqlite", "postgres"])
def db(request: Any, tmp_path: Any) -> Iterator[Db]:
    if request.param == "sqlite":
        made = _sqlite_db(tmp_path)
    else:
        made = _pg_db(request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_tables"))
    try:
        yield made
    finally:
        made.store.close()


class _Rollback(Exception):
    pass


# -- the statement's boundaries ------------------------------------------------------------------
def test_a_lease_ending_exactly_at_the_check_still_completes(db: Db) -> None:
    a = db.claimed(1)
    with pytest.raises(_Rollback):
        with db.store.transaction() as conn:
            assert db.store.complete_owned(a, T + L, connection=conn) is True
            raise _Rollback
    assert db.row(1)[:4] == ("processing", 1, T + L, None)  # rolled back: claim restored
    with db.store.transaction() as conn:
        assert db.store.complete_owned(a, T + L, connection=conn) is True
    assert db.row(1)[:4] == ("completed", 1, T + L, T + L)
    assert not db.store.owns(a, T + 5)
    assert db.store.claim_owned(1, now=T + 10 * L, lease_until=T + 11 * L, max_attempts=5) is None


def test_a_lease_ended_one_ms_before_the_check_is_refused_and_nothing_changes(db: Db) -> None:
    a = db.claimed(2)
    with db.store.transaction() as conn:
        assert db.store.complete_owned(a, T + L + 1, connection=conn) is False
    assert db.row(2)[:4] == ("processing", 1, T + L, None)


def test_a_stale_claim_id_is_refused_and_nothing_changes(db: Db) -> None:
    a = db.claimed(3, lease_until=T + 10)
    b = db.store.claim_owned(3, now=T + 11, lease_until=T + L, max_attempts=5)  # taken over
    assert b is not None and b.attempt == 2
    stale_id = AttemptIdentity(3, 2, a.claim_id)  # right attempt number, old claim id
    for stale in (a, stale_id):
        with db.store.transaction() as conn:
            assert db.store.complete_owned(stale, T + 20, connection=conn) is False
    assert db.row(3)[:2] == ("processing", 2)
    assert db.store.owns(b, T + 20)


def test_reopen_undoes_only_that_committed_completion(db: Db) -> None:
    a = db.claimed(4)
    with db.store.transaction() as conn:
        assert db.store.complete_owned(a, T + 7, connection=conn)
    conn = db._connect()
    try:
        assert db.store.reopen_completed(a, T + 8, connection=conn) is False  # another time
        assert db.store.reopen_completed(AttemptIdentity(4, 1, "x" + a.claim_id), T + 7,
                                         connection=conn) is False
        assert db.row(4)[0] == "completed"
        assert db.store.reopen_completed(a, T + 7, connection=conn) is True
        assert db.store.reopen_completed(a, T + 7, connection=conn) is False  # once
    finally:
        conn.close()
    assert db.row(4)[:4] == ("processing", 1, T + L, None)
    assert db.store.owns(a, T + L)


# -- two connections racing ----------------------------------------------------------------------
def test_two_connections_racing_complete_the_claim_once(db: Db) -> None:
    a = db.claimed(5)
    barrier = threading.Barrier(2)
    results: List[Any] = []

    def race(i: int) -> None:
        try:
            barrier.wait(10)
            with db.store.transaction() as conn:
                ok = db.store.complete_owned(a, T + 100 + i, connection=conn)
                if ok:
                    db.insert(conn, 5, 1)
                    time.sleep(0.3)  # hold the row while the other one arrives
                results.append(ok)
        except BaseException as exc:  # reported below
            results.append(exc)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(map(repr, results)) == ["False", "True"], results
    assert db.row(5)[0] == "completed" and db.notes() == [(5, 1)]


def test_a_competing_claim_waits_for_the_row_and_sees_it_completed(db: Db) -> None:
    a = db.claimed(6, lease_until=T + 50)
    inside = threading.Event()
    competitor: List[Any] = []

    def compete() -> None:
        inside.wait(10)
        competitor.append(db.store.claim_owned(6, now=T + 51, lease_until=T + L,
                                               max_attempts=5))

    thread = threading.Thread(target=compete)
    thread.start()
    with db.store.transaction() as conn:
        assert db.store.complete_owned(a, T + 50, connection=conn)  # the lease ends at the check
        inside.set()
        time.sleep(0.3)  # the competing claim reaches the store while the row is held
        assert not competitor, "the competing claim did not wait for the row"
        db.insert(conn, 6, 1)
    thread.join(30)
    assert competitor == [None]
    assert db.row(6)[:4] == ("completed", 1, T + 50, T + 50) and db.notes() == [(6, 1)]


# -- through the runtime: a failing fn rolls the completion back; the attempt is retried --------
def test_a_failing_fn_restores_the_claim_and_the_attempt_is_retried(
    db: Db, intakes: List[UpdateIntake]
) -> None:
    clock = FakeClock()
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        uid = update["update_id"]

        def write(conn: Any) -> None:
            db.insert(conn, uid, attempt.attempt)
            if attempt.attempt == 1:
                seen["inside"] = True
                raise RuntimeError("fn failed after its write")

        with attempt.transaction(complete=True) as conn:
            write(conn)
        seen["completed"] = attempt.completed

    intake = UpdateIntake(db.store, clock=clock, handle_attempt=handle_attempt,
                          on_failure=lambda *a: None)
    intakes.append(intake)
    intake.start()
    intake.accept(body(9))
    assert intake.idle(10)
    assert seen.get("inside") and db.notes() == []
    state, attempts = db.row(9)[:2]
    assert (state, attempts) == ("failed", 1)  # not completed: the rollback restored the claim
    clock.advance(3600)
    intake.sweep()
    assert intake.idle(10)
    assert db.row(9)[:2] == ("completed", 2) and seen["completed"] is True
    assert db.notes() == [(9, 2)]


def test_a_refused_check_writes_nothing_and_raises_ownership_lost(
    db: Db, intakes: List[UpdateIntake]
) -> None:
    clock = FakeClock()
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        uid = update["update_id"]
        if attempt.attempt == 1:
            # another process takes the update over meanwhile (the lease lapsed)
            clock.advance(3600)
            taken = db.store.claim_owned(uid, now=clock.ms(), lease_until=clock.ms() + L,
                                         max_attempts=5)
            seen["taken"] = taken
            try:
                with attempt.transaction(complete=True) as conn:
                    db.insert(conn, uid, 1)
            except OwnershipLost as exc:
                seen["error"] = exc
            seen["lost"] = attempt.owner_lost.is_set()

    intake = UpdateIntake(db.store, clock=clock, handle_attempt=handle_attempt)
    intakes.append(intake)
    intake.start()
    intake.accept(body(11))
    assert intake.idle(10)
    assert isinstance(seen.get("error"), OwnershipLost) and seen["lost"] is True
    assert seen["taken"] is not None and seen["taken"].attempt == 2
    assert db.notes() == []
    assert db.row(11)[:2] == ("processing", 2)


# -- round trips on PostgreSQL -------------------------------------------------------------------
def _counting_pool(dsn: str, log: List[Tuple[int, str]]) -> Any:
    import psycopg2.extensions
    import psycopg2.pool

    class CountingCursor(psycopg2.extensions.cursor):
        def execute(self, query: Any, vars: Any = None) -> Any:  # noqa: A002
            log.append((id(self.connection), " ".join(str(query).split())[:60]))
            try:
                return super().execute(query, vars)
            finally:
                if self.connection.autocommit:  # a read in autocommit is its own transaction
                    log.append((id(self.connection), "COMMIT"))

    class CountingConnection(psycopg2.extensions.connection):
        def cursor(self, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("cursor_factory", CountingCursor)
            return super().cursor(*args, **kwargs)

        def commit(self) -> None:
            log.append((id(self), "COMMIT"))
            super().commit()

        def rollback(self) -> None:
            log.append((id(self), "ROLLBACK"))
            super().rollback()

    return psycopg2.pool.ThreadedConnectionPool(1, 4, dsn, connection_factory=CountingConnection)


def test_a_complete_fenced_write_on_postgres_is_four_round_trips(
    pg_dsn: str, pg_tables: List[str], intakes: List[UpdateIntake]
) -> None:
    log: List[Tuple[int, str]] = []
    pool = _counting_pool(pg_dsn, log)
    db = _pg_db(pg_dsn, pg_tables, store=pool)
    marker = "INSERT INTO " + db.notes_table
    clock = FakeClock()

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        with attempt.transaction(complete=True) as conn:
            db.insert(conn, update["update_id"], attempt.attempt)

    try:
        intake = UpdateIntake(db.store, clock=clock, handle_attempt=handle_attempt)
        intakes.append(intake)
        intake.start()
        intake.accept(body(21))
        assert intake.idle(10)
        assert db.row(21)[0] == "completed" and db.notes() == [(21, 1)]
        write = next(i for i, (_, sql) in enumerate(log) if sql.startswith(marker))
        conn_id = log[write][0]
        mine = [sql for c, sql in log if c == conn_id]
        at = mine.index(log[write][1])
        ends = [i for i, sql in enumerate(mine[:at]) if sql in ("COMMIT", "ROLLBACK")]
        before, after = mine[(ends[-1] + 1 if ends else 0):at], mine[at + 1:]
        # the ownership check and the settle: one UPDATE before the write (psycopg2 sends
        # BEGIN with it: no liveness probe on a pooled connection that is not suspect), nothing
        # after the write but the COMMIT: BEGIN, UPDATE, INSERT, COMMIT: 4 round trips
        assert len(before) == 1 and before[0].startswith("UPDATE"), before
        assert after[:1] == ["COMMIT"], after
    finally:
        db.store.close()
        pool.closeall()


def test_a_pooled_connection_terminated_while_idle_is_replaced_before_the_transaction(
    pg_dsn: str, pg_tables: List[str]
) -> None:
    import psycopg2
    import psycopg2.extensions

    app = "ptbf_" + uuid.uuid4().hex[:12]
    db = _pg_db(pg_dsn, pg_tables,
                store=psycopg2.extensions.make_dsn(pg_dsn, application_name=app))
    try:
        a = db.claimed(31)
        with db.store.transaction(), db.store.transaction():
            pass  # two pooled connections, now idle
        killer = psycopg2.connect(pg_dsn)
        killer.autocommit = True
        with killer.cursor() as cur:  # only this store's connections (its application_name)
            cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = %s", (app,))
            assert cur.fetchone()[0] >= 2
        killer.close()
        time.sleep(0.2)
        with db.store.transaction() as conn:
            assert db.store.complete_owned(a, T + 5, connection=conn)
            db.insert(conn, 31, 1)
        assert db.row(31)[0] == "completed" and db.notes() == [(31, 1)]
    finally:
        db.store.close()
