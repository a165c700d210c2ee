"""Recorded steps in the shipped stores: the fence, the schema and the migration of the table.

The conformance rule ``steps`` checks the rules. These tests check what it cannot see: the
steps table of a database made before steps, a key outside the alphabet, and a PostgreSQL
record that holds off a takeover until it commits.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from typing import Any, Callable, List, Optional

import psycopg2
import pytest

from ptb_fence import (
    AttemptIdentity,
    Completed,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    StepRecord,
    StoreFeatures,
)
from ptb_fence.cli import main
from ptb_fence.stores._steps_sql import steps_table_name

T = 1_700_000_000_000


def claimed(store: Any, update_id: int, lease_until: int) -> AttemptIdentity:
    assert store.add(update_id, "{}", T)
    identity = store.claim_owned(update_id, now=T, lease_until=lease_until, max_attempts=5)
    assert identity is not None
    return identity  # type: ignore[no-any-return]


def step(identity: AttemptIdentity, name: str, at: int, result: str = '{"ok": 1}') -> StepRecord:
    return StepRecord(f"k-{identity.update_id}-{name}", identity.update_id, name, result,
                      identity.attempt, identity.claim_id, at)


def test_every_shipped_store_declares_steps() -> None:
    from ptb_fence import MemoryUpdateStore

    for cls in (MemoryUpdateStore, SQLiteUpdateStore, PostgresUpdateStore):
        features = MemoryUpdateStore().features if cls is MemoryUpdateStore else cls.features
        assert isinstance(features, StoreFeatures) and features.steps, cls


@pytest.mark.parametrize("key", ["", "Upper", "under_score", "x" * 65, "sp ace"])
def test_a_key_outside_the_alphabet_is_refused(fresh_stores: Callable[[], Any], key: str) -> None:
    store = fresh_stores()
    identity = claimed(store, 1, T + 60_000)
    record = StepRecord(key, 1, "n", "1", identity.attempt, identity.claim_id, T + 1)
    with pytest.raises(ValueError, match="step key"):
        store.record_step(record)
    assert store.steps_of(1) == []


def test_a_record_survives_failure_and_the_next_attempt_reads_it(
    fresh_stores: Callable[[], Any],
) -> None:
    """The effect happened: the retry reads the record and cannot write its own."""
    store = fresh_stores()
    first = claimed(store, 7, T + 100)
    record = step(first, "charge", T + 10, json.dumps({"charge": "ch-1"}))
    assert store.record_step(record) is True
    second = store.claim_owned(7, now=T + 101, lease_until=T + 60_000, max_attempts=5)
    assert second is not None and second.attempt == first.attempt + 1
    assert store.read_step(record.key) == record
    # the lapsed attempt is fenced out, the next one keeps the first record
    assert store.record_step(step(first, "late", T + 102)) is False
    again = step(second, "charge", T + 103, json.dumps({"charge": "ch-2"}))
    assert store.record_step(again) is True
    assert store.read_step(record.key) == record
    assert store.settle_owned(second, Completed(at=T + 200))
    assert store.steps_of(7) == [record]


# -- SQLite: the table of a file made before steps ------------------------------------------------
def test_sqlite_adds_the_steps_table_to_a_file_made_before_steps(tmp_path: Any) -> None:
    path = str(tmp_path / "old.db")
    SQLiteUpdateStore(path).close()
    steps = steps_table_name("telegram_updates")
    conn = sqlite3.connect(path)
    conn.execute(f'DROP TABLE "{steps}"')
    conn.commit()
    conn.close()
    with SQLiteUpdateStore(path) as store:
        identity = claimed(store, 1, T + 60_000)
        record = step(identity, "a", T + 1)
        assert store.record_step(record) is True
        assert store.read_step(record.key) == record
    conn = sqlite3.connect(path)
    try:
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    finally:
        conn.close()
    assert f"{steps}_update_idx" in indexes


# -- PostgreSQL: migrate and create_table ---------------------------------------------------------
def drop_steps(dsn: str, table: str) -> None:
    """Make the schema of ``table``, then drop its steps table: a database made before steps."""
    with PostgresUpdateStore(dsn, table) as store:
        store.prune(0)  # the schema is made on first use
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE "{steps_table_name(table)}"')
        conn.commit()
    finally:
        conn.close()


def test_postgres_migrate_adds_the_steps_table(
    pg_dsn: str, pg_table: str, capsys: Any
) -> None:
    drop_steps(pg_dsn, pg_table)
    args = ["--store", pg_dsn, "--table", pg_table, "migrate"]
    assert main([*args, "--check", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["missing_tables"] == [steps_table_name(pg_table)]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--check"]) == 0
    assert "is up to date" in capsys.readouterr().out
    with PostgresUpdateStore(pg_dsn, pg_table, create_table=False) as store:
        identity = claimed(store, 1, T + 60_000)
        assert store.record_step(step(identity, "a", T + 1)) is True


def test_postgres_create_table_adds_the_steps_table(pg_dsn: str, pg_table: str) -> None:
    drop_steps(pg_dsn, pg_table)
    with PostgresUpdateStore(pg_dsn, pg_table) as store:
        identity = claimed(store, 1, T + 60_000)
        record = step(identity, "a", T + 1)
        assert store.record_step(record) is True
        assert store.steps_of(1) == [record]


def test_postgres_prune_without_a_steps_table_prunes_as_before(
    pg_dsn: str, pg_table: str
) -> None:
    """A table managed with create_table=False may have no steps table yet."""
    drop_steps(pg_dsn, pg_table)
    with PostgresUpdateStore(pg_dsn, pg_table, create_table=False) as store:
        identity = claimed(store, 1, T + 60_000)
        assert store.settle_owned(identity, Completed(at=T + 5))
        assert store.prune(T + 10) == 1


def test_postgres_record_holds_off_a_takeover_until_it_commits(
    pg_dsn: str, pg_table: str
) -> None:
    """The record locks the owned row: a claim after the lease waits, then sees the record."""
    with PostgresUpdateStore(pg_dsn, pg_table) as store:
        identity = claimed(store, 1, T + 100)
        record = step(identity, "charge", T + 100)
        taken: List[Optional[AttemptIdentity]] = []
        seen: List[Optional[StepRecord]] = []

        def take_over() -> None:
            taken.append(store.claim_owned(1, now=T + 200, lease_until=T + 60_000,
                                           max_attempts=5))
            seen.append(store.read_step(record.key))

        with store.transaction() as conn:
            assert store.record_step(record, connection=conn) is True
            thief = threading.Thread(target=take_over)
            thief.start()
            time.sleep(0.3)
            assert taken == [], "the claim did not wait for the record's transaction"
        thief.join(10)
        assert taken and taken[0] is not None and taken[0].attempt == identity.attempt + 1
        assert seen == [record]
