"""Durable jobs in the shipped stores: declarations and fires across instances of one database,
the jobs a completion writes, and the migration of a database made before jobs.

The conformance rule ``jobs`` checks the rules on one instance. These tests check what it
cannot see: two instances (two processes) on one database, the jobs of a refused completion
and of a rolled-back transaction, and the jobs table added to an older database.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from typing import Any, Callable, List

import psycopg2
import pytest

from ptb_fence import (
    AttemptEffects,
    AttemptIdentity,
    Completed,
    MemoryUpdateStore,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    StoreFeatures,
)
from ptb_fence._values import JobFire, JobWrite, StoredJob
from ptb_fence.cli import main
from ptb_fence.contract import Batch
from ptb_fence.runtime._durable_jobs import run_update_id
from ptb_fence.stores._jobs_sql import jobs_table_name

T = 1_700_000_000_000


def job(name: str, next_run_at: Any = T + 1000, *, keyed: bool = False,
        schedule: str = '{"every": 60}', data: str = "{}") -> JobWrite:
    return JobWrite(name=name, callback="bot:remind", data=data, chat_id=7, user_id=None,
                    schedule=schedule, next_run_at=next_run_at, keyed=keyed)


def claimed(store: Any, update_id: int) -> AttemptIdentity:
    assert store.add(update_id, "{}", T)
    identity = store.claim_owned(update_id, now=T, lease_until=T + 60_000, max_attempts=5)
    assert identity is not None
    return identity  # type: ignore[no-any-return]


def fire_of(stored: StoredJob, following: Any = None, *, skip: bool = False) -> JobFire:
    assert stored.next_run_at is not None
    update_id = run_update_id(stored.job_id, stored.runs + 1)
    body = json.dumps({"update_id": update_id, "ptb_fence_job": {"job_id": stored.job_id}})
    return JobFire(stored.job_id, stored.runs, stored.next_run_at, following, update_id, body,
                   stored.chat_id, skip)


def pending_ids(store: Any) -> List[int]:
    return [row.update_id for row in store.due(now=T + 10**9, pending_before=T + 10**9,
                                               limit=100)]


def test_every_shipped_store_declares_jobs() -> None:
    for features in (MemoryUpdateStore().features, SQLiteUpdateStore.features,
                     PostgresUpdateStore.features):
        assert isinstance(features, StoreFeatures) and features.jobs


def test_concurrent_declarations_of_one_name_from_two_instances_leave_one_job(
    shared_stores: Callable[[], Any]
) -> None:
    stores = [shared_stores(), shared_stores()]
    found: List[int] = []
    errors: List[BaseException] = []
    lock = threading.Lock()
    gate = threading.Barrier(8)

    def declare(n: int) -> None:
        try:
            gate.wait()
            stored = stores[n % 2].schedule_jobs([job("digest", keyed=True)], T + n)
            with lock:
                found.append(stored[0].job_id)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=declare, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(found)) == 1
    live = stores[1].list_jobs(name="digest")
    assert [j.job_id for j in live] == found[:1]
    assert live[0].state == "scheduled" and live[0].keyed and live[0].next_run_at == T + 1000


def test_a_declaration_keeps_the_next_run_unless_the_schedule_changed(store: Any) -> None:
    (first,) = store.schedule_jobs([job("tick", T + 1000, keyed=True)], T)
    (again,) = store.schedule_jobs([job("tick", T + 5000, keyed=True, data='{"v":2}')], T + 1)
    assert again.job_id == first.job_id and again.next_run_at == T + 1000
    assert again.data == '{"v":2}' and again.created_at == T
    (moved,) = store.schedule_jobs(
        [job("tick", T + 9000, keyed=True, schedule='{"every": 90}')], T + 2)
    assert moved.job_id == first.job_id and moved.next_run_at == T + 9000
    (ended,) = store.schedule_jobs(
        [job("tick", None, keyed=True, schedule='{"every": 120}')], T + 3)
    assert ended.job_id == first.job_id and ended.state == "ended"
    assert store.list_jobs(name="tick") == []
    (fresh,) = store.schedule_jobs([job("tick", T + 1000, keyed=True)], T + 4)
    assert fresh.job_id > first.job_id
    (once,) = store.schedule_jobs([job("never", None)], T + 5)
    assert once.state == "ended" and once.next_run_at is None


def test_a_run_fired_from_two_instances_is_recorded_once(
    shared_stores: Callable[[], Any]
) -> None:
    stores = [shared_stores(), shared_stores()]
    (stored,) = stores[0].schedule_jobs([job("remind", T + 1000)], T)
    due = [s.due_jobs(T + 1000, 10) for s in stores]
    assert due[0] == due[1] == [stored]
    fire = fire_of(stored, T + 61_000)
    results: List[bool] = []
    gate = threading.Barrier(2)

    def run(n: int) -> None:
        gate.wait()
        results.extend(stores[n].fire_jobs([fire], T + 1001))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False, True]
    assert pending_ids(stores[1]) == [fire.update_id]
    moved = stores[1].get_job(stored.job_id)
    assert moved.runs == 1 and moved.next_run_at == T + 61_000 and moved.state == "scheduled"
    # the last run ends the job; a skipped run moves it on without a row
    (later,) = stores[0].due_jobs(T + 61_000, 10)
    assert stores[1].fire_jobs([fire_of(later, None, skip=True)], T + 61_001) == [True]
    assert pending_ids(stores[0]) == [fire.update_id]
    assert stores[0].get_job(stored.job_id).state == "ended"
    assert stores[0].due_jobs(T + 10**9, 10) == []


def test_cancel_and_run_now_touch_live_jobs_only(store: Any) -> None:
    a, b = store.schedule_jobs([job("a", T + 5000), job("b", T + 5000)], T)
    assert store.run_job_now(a.job_id, T + 10) is True
    assert [j.job_id for j in store.due_jobs(T + 10, 10)] == [a.job_id]
    assert store.cancel_jobs([b.job_id, b.job_id, 999_999], T + 11) == [True, False, False]
    assert store.run_job_now(b.job_id, T + 12) is False
    assert [j.job_id for j in store.list_jobs()] == [a.job_id]
    assert [j.job_id for j in store.list_jobs(include_ended=True)] == [a.job_id, b.job_id]
    assert store.get_job(b.job_id).state == "cancelled"
    assert store.get_job(999_999) is None


def test_a_landed_completion_writes_its_jobs_and_a_refused_one_none(store: Any) -> None:
    (old,) = store.schedule_jobs([job("old", T + 5000)], T)
    landed = claimed(store, 1)
    effects = AttemptEffects(jobs=(job("from-1"),), cancelled_jobs=(old.job_id,))
    stale = AttemptIdentity(2, 1, "not-the-claim")
    claimed(store, 2)
    refused = AttemptEffects(jobs=(job("from-2"),))
    committed = store.commit(Batch(
        settlements=((landed, Completed(at=T + 5)), (stale, Completed(at=T + 5))),
        effects={landed: effects, stale: refused},
    ))
    assert committed.landed == (True, False)
    assert [j.name for j in store.list_jobs()] == ["from-1"]
    assert store.get_job(old.job_id).state == "cancelled"


def test_jobs_written_in_a_transaction_land_with_it_or_not_at_all(store: Any) -> None:
    first, second = claimed(store, 1), claimed(store, 2)
    with pytest.raises(RuntimeError, match="rolled back"):
        with store.transaction() as conn:
            assert store.complete_owned(first, T + 5, connection=conn)
            store.write_effects(first, AttemptEffects(jobs=(job("lost"),)), T + 5,
                                connection=conn)
            raise RuntimeError("rolled back")
    assert store.list_jobs(include_ended=True) == []
    with store.transaction() as conn:
        assert store.complete_owned(second, T + 5, connection=conn)
        store.write_effects(second, AttemptEffects(jobs=(job("kept"),)), T + 5,
                            connection=conn)
    assert [j.name for j in store.list_jobs()] == ["kept"]


# -- the jobs table of a database made before jobs ------------------------------------------------
def test_sqlite_adds_the_jobs_table_to_a_file_made_before_jobs(tmp_path: Any) -> None:
    path = str(tmp_path / "old.db")
    SQLiteUpdateStore(path).close()
    jobs = jobs_table_name("telegram_updates")
    conn = sqlite3.connect(path)
    conn.execute(f'DROP TABLE "{jobs}"')
    conn.commit()
    conn.close()
    with SQLiteUpdateStore(path) as store:
        (stored,) = store.schedule_jobs([job("a", keyed=True)], T)
        assert store.get_job(stored.job_id) == stored
    conn = sqlite3.connect(path)
    try:
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    finally:
        conn.close()
    assert {f"{jobs}_due_idx", f"{jobs}_name_idx"} <= indexes


def drop_jobs(dsn: str, table: str) -> None:
    """Make the schema of ``table``, then drop its jobs table: a database made before jobs."""
    with PostgresUpdateStore(dsn, table) as store:
        store.prune(0)  # the schema is made on first use
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE "{jobs_table_name(table)}"')
        conn.commit()
    finally:
        conn.close()


def test_postgres_migrate_adds_the_jobs_table(pg_dsn: str, pg_table: str, capsys: Any) -> None:
    drop_jobs(pg_dsn, pg_table)
    args = ["--store", pg_dsn, "--table", pg_table, "migrate"]
    assert main([*args, "--check", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["missing_tables"] == [jobs_table_name(pg_table)]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--check"]) == 0
    assert "is up to date" in capsys.readouterr().out
    with PostgresUpdateStore(pg_dsn, pg_table, create_table=False) as store:
        (stored,) = store.schedule_jobs([job("a", keyed=True)], T)
        assert store.list_jobs() == [stored]


def test_postgres_create_table_adds_the_jobs_table(pg_dsn: str, pg_table: str) -> None:
    drop_jobs(pg_dsn, pg_table)
    with PostgresUpdateStore(pg_dsn, pg_table) as store:
        (stored,) = store.schedule_jobs([job("a", keyed=True)], T)
        assert store.get_job(stored.job_id) == stored


def test_postgres_reads_no_jobs_from_a_table_made_before_jobs(pg_dsn: str, pg_table: str) -> None:
    """The runtime reads due jobs on every sweep: an unmigrated table has none, no error."""
    drop_jobs(pg_dsn, pg_table)
    with PostgresUpdateStore(pg_dsn, pg_table, create_table=False) as store:
        assert store.due_jobs(T, 10) == [] and store.list_jobs() == []
        assert store.get_job(1) is None
