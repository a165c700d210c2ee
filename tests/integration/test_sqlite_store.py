"""SQLiteUpdateStore against real files: every rule and boundary, upgrades, threads, processes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from ptb_fence import (
    Abandoned,
    AttemptIdentity,
    Batch,
    ClaimTerms,
    Completed,
    Exhaustion,
    Failed,
    SchemaError,
    SQLiteUpdateStore,
    StoredUpdate,
    is_durable,
    is_fenced,
)
from ptb_fence.stores.sqlite._schema import add_claim_id_column as _add_claim_id_column
from ptb_fence.stores.sqlite._sql import statements

REPO = str(Path(__file__).resolve().parents[2])
BIG = 2**40  # ids and epoch-ms times beyond 32 bits must round-trip exactly
LEASE = 1_000


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "updates.sqlite3")


# This module tests one store class: its own ``store`` (the SQLite file at ``db``, which the
# tests also read raw) replaces conftest's, so no test here runs per store kind.
@pytest.fixture
def store(db: str) -> Iterator[SQLiteUpdateStore]:
    with SQLiteUpdateStore(db) as s:
        yield s


def fetch_row(path: str, update_id: int, table: str) -> Optional[Dict[str, Any]]:
    """Read a row with a separate, plain sqlite3 connection (what an operator would see)."""
    conn = sqlite3.connect(path)
    try:
        conn.row_factory = sqlite3.Row
        row = conn.execute(f'SELECT * FROM "{table}" WHERE update_id = ?', (update_id,)).fetchone()
        return None if row is None else dict(row)
    finally:
        conn.close()


def raw_row(path: str, update_id: int, table: str = "telegram_updates") -> Dict[str, Any]:
    """The row as stored; fails the test if it does not exist."""
    row = fetch_row(path, update_id, table)
    assert row is not None, f"row {update_id} missing"
    return row


def exists(path: str, update_id: int, table: str = "telegram_updates") -> bool:
    """Whether the row exists."""
    return fetch_row(path, update_id, table) is not None


def claimed(store: SQLiteUpdateStore, update_id: int, now: int = BIG, lease: int = LEASE,
            max_attempts: int = 5) -> AttemptIdentity:
    identity = store.claim_owned(update_id, now=now, lease_until=now + lease,
                                 max_attempts=max_attempts)
    assert identity is not None
    return identity


def thread_connection(store: SQLiteUpdateStore) -> sqlite3.Connection:
    """The calling thread's store connection (through the public transaction())."""
    with store.transaction() as conn:
        pass
    return conn


# --------------------------------------------------------------------------------------------
# capability level, schema
# --------------------------------------------------------------------------------------------
def test_capability_level(store: SQLiteUpdateStore) -> None:
    assert is_fenced(store) and is_durable(store)
    for name in ("add_many", "renew_many", "renew_owned_many", "transaction", "close"):
        assert callable(getattr(store, name))
    assert not hasattr(store, "__dict__")  # __slots__


def test_schema_created_with_wal_index_and_claim_id(db: str, store: SQLiteUpdateStore) -> None:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        columns = {row[1]: row[2] for row in conn.execute("PRAGMA table_info(telegram_updates)")}
        assert set(columns) == {
            "update_id", "body", "state", "attempts", "due_at", "received_at", "settled_at",
            "error", "claim_id", "fingerprint", "instance", "chat_key", "isolated_claim",
        }
        assert columns["claim_id"] == "TEXT" and columns["fingerprint"] == "TEXT"
        assert columns["chat_key"] == "INTEGER"
        indexed = []
        for _, name, *_ in conn.execute("PRAGMA index_list(telegram_updates)"):
            indexed.append([r[2] for r in conn.execute(f'PRAGMA index_info("{name}")')])
        assert ["state", "due_at"] in indexed
        assert ["chat_key", "update_id"] in indexed  # strict_chat_order
    finally:
        conn.close()
    # opening again is idempotent
    SQLiteUpdateStore(db).close()


def test_custom_table_names_including_keywords(db: str) -> None:
    for table in ("order", "_x", "a" * 63, "Updates_2"):
        with SQLiteUpdateStore(db, table) as s:
            assert s.add(1, "{}", 1) is True
            assert s.claim(1, now=2, lease_until=3, max_attempts=1) == 1
        assert raw_row(db, 1, table)["state"] == "processing"


@pytest.mark.parametrize(
    "table", ["x; DROP TABLE y", "1abc", "", "a" * 64, "a-b", 'a"b', " a", "ä", None, 5, b"abc"]
)
def test_bad_table_name_is_refused_before_any_file_work(tmp_path: Path, table: Any) -> None:
    path = tmp_path / "never.sqlite3"
    with pytest.raises(ValueError, match="table name"):
        SQLiteUpdateStore(path, table)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("synchronous", ["OFF", "EXTRA", "", None, 2])
def test_bad_synchronous_is_refused(tmp_path: Path, synchronous: Any) -> None:
    path = tmp_path / "never.sqlite3"
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteUpdateStore(path, synchronous=synchronous)
    assert not path.exists()


@pytest.mark.parametrize("timeout", [0, -1, "5", True, float("nan"), float("inf"), None])
def test_bad_busy_timeout_is_refused(tmp_path: Path, timeout: Any) -> None:
    path = tmp_path / "never.sqlite3"
    with pytest.raises(ValueError, match="busy_timeout"):
        SQLiteUpdateStore(path, busy_timeout=timeout)
    assert not path.exists()


@pytest.mark.parametrize("path", [":memory:", "", None, 5])
def test_bad_path_is_refused(path: Any) -> None:
    with pytest.raises(ValueError, match="path"):
        SQLiteUpdateStore(path)


def test_missing_directory_gives_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(sqlite3.OperationalError, match="directory exists"):
        SQLiteUpdateStore(tmp_path / "missing" / "db.sqlite3")


@pytest.mark.parametrize("value,expected", [("NORMAL", 1), ("FULL", 2), ("full", 2)])
def test_synchronous_is_applied(db: str, value: str, expected: int) -> None:
    with SQLiteUpdateStore(db, synchronous=value, busy_timeout=2.5) as s:
        conn = thread_connection(s)
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == expected
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2500


def test_foreign_table_is_a_schema_error(db: str) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE telegram_updates (id INTEGER PRIMARY KEY, payload TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaError, match="lacks the columns .*state"):
        SQLiteUpdateStore(db)


# --------------------------------------------------------------------------------------------
# base: add, claim
# --------------------------------------------------------------------------------------------
def test_add_one_record_per_update_id(db: str, store: SQLiteUpdateStore) -> None:
    assert store.add(BIG, '{"update_id": 1}', BIG + 1) is True
    assert store.add(BIG, "other", BIG + 2) is False
    row = raw_row(db, BIG)
    assert row == {
        "update_id": BIG, "body": '{"update_id": 1}', "state": "pending", "attempts": 0,
        "due_at": BIG + 1, "received_at": BIG + 1, "settled_at": None, "error": None,
        "claim_id": None, "fingerprint": None,  # no update kind: no fingerprint
        "instance": None, "chat_key": None, "isolated_claim": None,
    }
    identity = claimed(store, BIG)
    assert store.add(BIG, "x", 1) is False  # processing
    assert store.settle_owned(identity, Completed(at=BIG)) is True
    assert store.add(BIG, "x", 1) is False  # completed (no fingerprint: the same update)
    assert raw_row(db, BIG)["body"] == '{"update_id": 1}'


def test_claim_takes_a_pending_row(db: str, store: SQLiteUpdateStore) -> None:
    store.add(7, "{}", 1)
    assert store.claim(7, now=BIG, lease_until=BIG + LEASE, max_attempts=3) == 1
    row = raw_row(db, 7)
    assert (row["state"], row["attempts"], row["due_at"], row["error"]) == (
        "processing", 1, BIG + LEASE, None)
    assert isinstance(row["claim_id"], str) and len(row["claim_id"]) == 32


def test_claim_refuses_non_integer_arguments(db: str, store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    with pytest.raises(TypeError, match="max_attempts"):
        store.claim(1, now=10, lease_until=20, max_attempts=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="now"):
        store.claim_owned(1, now=None, lease_until=20, max_attempts=5)  # type: ignore[arg-type]
    assert raw_row(db, 1)["state"] == "pending"  # NULL never reached the conditional UPDATE


def test_claim_unknown_or_final_rows(store: SQLiteUpdateStore) -> None:
    assert store.claim(404, now=1, lease_until=2, max_attempts=5) is None
    assert store.claim_owned(404, now=1, lease_until=2, max_attempts=5) is None
    store.add(1, "{}", 0)
    store.add(2, "{}", 0)
    a, b = claimed(store, 1, now=10), claimed(store, 2, now=10)
    store.settle_owned(a, Completed(at=11))
    store.settle_owned(b, Abandoned(at=11, error="no"))
    for update_id in (1, 2):
        assert store.claim(update_id, now=10**9, lease_until=10**9 + 1, max_attempts=5) is None


def test_live_lease_held_inclusive_taken_over_only_after(
    db: str, store: SQLiteUpdateStore
) -> None:
    store.add(1, "{}", 0)
    first = claimed(store, 1, now=100, lease=50)  # due_at = 150
    assert store.claim(1, now=149, lease_until=500, max_attempts=5) is None
    assert store.claim(1, now=150, lease_until=500, max_attempts=5) is None  # due_at >= now
    assert store.claim_owned(1, now=150, lease_until=500, max_attempts=5) is None
    assert raw_row(db, 1)["claim_id"] == first.claim_id
    second = store.claim_owned(1, now=151, lease_until=500, max_attempts=5)
    assert second is not None and second.attempt == 2 and second.claim_id != first.claim_id
    assert raw_row(db, 1)["due_at"] == 500


def test_failed_row_due_at_its_retry_time(db: str, store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100)
    assert store.settle_owned(identity, Failed(at=101, retry_at=200, error="boom")) is True
    row = raw_row(db, 1)
    assert (row["state"], row["due_at"], row["settled_at"], row["error"]) == (
        "failed", 200, None, "boom")
    assert store.due(now=199, pending_before=10**9, limit=10) == []
    assert store.claim(1, now=199, lease_until=300, max_attempts=5) is None
    assert store.due(now=200, pending_before=0, limit=10) == [StoredUpdate(1, "{}")]
    assert store.claim(1, now=200, lease_until=300, max_attempts=5) == 2
    assert raw_row(db, 1)["error"] is None  # a claim clears the error


def test_spend_abandons_and_keeps_claim_id(db: str, store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100, max_attempts=1)
    # live lease: not a spend yet
    assert store.claim(1, now=100 + LEASE, lease_until=10**6, max_attempts=1) is None
    assert raw_row(db, 1)["state"] == "processing"
    assert store.claim(1, now=5000, lease_until=10**6, max_attempts=1) is None
    row = raw_row(db, 1)
    assert (row["state"], row["attempts"], row["due_at"], row["settled_at"], row["error"]) == (
        "abandoned", 1, 5000, 5000, "attempts spent")
    assert row["claim_id"] == identity.claim_id
    assert store.due_exhaustions(limit=10) == []  # ordinary history
    assert store.prune(5001) == 1


def test_durable_spend_is_an_unacknowledged_exhaustion(db: str, store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100, max_attempts=1)
    assert store.claim_owned(1, now=5000, lease_until=10**6, max_attempts=1,
                             durable_exhaustion=True) is None
    row = raw_row(db, 1)
    assert (row["state"], row["due_at"], row["settled_at"], row["claim_id"]) == (
        "abandoned", 5000, None, identity.claim_id)
    assert store.due_exhaustions(limit=10) == [
        Exhaustion(update_id=1, attempt=1, claim_id=identity.claim_id, body="{}",
                   exhausted_at=5000, error="attempts spent")
    ]
    assert store.prune(10**12) == 0
    assert exists(db, 1)


def test_base_claim_durable_spend_without_claim_id_writes_one(db: str,
                                                             store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    assert store.claim(1, now=10, lease_until=20, max_attempts=0, durable_exhaustion=True) is None
    (exhaustion,) = store.due_exhaustions(limit=5)
    assert exhaustion.attempt == 0 and exhaustion.exhausted_at == 10
    assert isinstance(exhaustion.claim_id, str) and exhaustion.claim_id
    assert raw_row(db, 1)["claim_id"] == exhaustion.claim_id
    assert store.acknowledge_exhaustion(exhaustion.identity, 11) is True


# --------------------------------------------------------------------------------------------
# base: renew, settle
# --------------------------------------------------------------------------------------------
def test_renew_extends_never_shortens_never_revives(db: str, store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    claimed(store, 1, now=100, lease=100)  # due_at 200
    assert store.renew(1, 1, 300, now=150) is True
    assert raw_row(db, 1)["due_at"] == 300
    assert store.renew(1, 1, 250, now=160) is True  # matched, lease kept
    assert raw_row(db, 1)["due_at"] == 300
    assert store.renew(1, 2, 400, now=160) is False  # other attempt
    assert store.renew(1, 1, 400, now=300) is True  # inclusive bound
    assert store.renew(1, 1, 900, now=401) is False  # expired: never revived
    assert raw_row(db, 1)["due_at"] == 400
    assert store.renew(1, 1, 900) is True  # without now: as the memory store
    assert store.renew(404, 1, 900, now=1) is False


def test_settle_completed_lands_only_for_the_live_attempt(
    db: str, store: SQLiteUpdateStore
) -> None:
    store.add(1, "{}", 0)
    claimed(store, 1, now=100, lease=100)  # due_at 200
    store.settle(1, 2, Completed(at=150))  # wrong attempt: ignored
    assert raw_row(db, 1)["state"] == "processing"
    store.settle(1, 1, Completed(at=201))  # lease expired: ignored
    assert raw_row(db, 1)["state"] == "processing"
    store.settle(1, 1, Completed(at=200))  # inclusive: lands
    row = raw_row(db, 1)
    assert (row["state"], row["settled_at"], row["error"], row["due_at"]) == (
        "completed", 200, None, 200)
    store.settle(1, 1, Failed(at=200, retry_at=300, error="late"))  # final: ignored
    assert raw_row(db, 1)["state"] == "completed"


def test_settle_abandoned_keeps_due_at(db: str, store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    claimed(store, 1, now=100, lease=100)
    store.settle(1, 1, Abandoned(at=150, error="bad"))
    row = raw_row(db, 1)
    assert (row["state"], row["due_at"], row["settled_at"], row["error"]) == (
        "abandoned", 200, 150, "bad")


def test_settle_failed_then_reclaim(db: str, store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    claimed(store, 1, now=100, lease=100)
    store.settle(1, 1, Failed(at=120, retry_at=BIG, error="x"))
    row = raw_row(db, 1)
    assert (row["state"], row["due_at"], row["settled_at"]) == ("failed", BIG, None)
    assert store.claim(1, now=BIG, lease_until=BIG + 1, max_attempts=5) == 2


def test_settle_rejects_non_settlements(store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1)
    with pytest.raises(TypeError, match="settlement"):
        store.settle(1, 1, "done")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="settlement"):
        store.settle_owned(identity, None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# base: due, prune
# --------------------------------------------------------------------------------------------
def test_due_boundaries_order_and_limit(store: SQLiteUpdateStore) -> None:
    store.add(5, "p5", 1000)  # pending, received at 1000
    store.add(3, "p3", 1001)  # pending, received later
    store.add(9, "x9", 0)
    store.add(1, "x1", 0)
    store.add(BIG, "big", 0)
    claimed(store, 9, now=100, lease=100)  # processing, due_at 200
    one = claimed(store, 1, now=100, lease=100)
    store.settle_owned(one, Failed(at=101, retry_at=200, error="e"))  # failed, due_at 200
    claimed(store, BIG, now=100, lease=10**6)  # live lease
    ids = lambda now, pb, limit=100: [u.update_id for u in store.due(  # noqa: E731
        now=now, pending_before=pb, limit=limit)]
    assert ids(199, 999) == []
    assert ids(199, 1000) == [5]  # received_at <= pending_before (inclusive)
    assert ids(200, 1000) == [1, 5]  # failed due at due_at <= now; processing still held
    assert ids(201, 1001) == [1, 3, 5, 9]  # processing lapsed only when due_at < now
    assert ids(201, 1001, limit=2) == [1, 3]
    assert ids(201, 1001, limit=0) == []
    assert store.due(now=201, pending_before=1001, limit=1) == [StoredUpdate(1, "x1")]


def test_due_excludes_final_rows(store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    store.settle_owned(claimed(store, 1, now=10), Completed(at=11))
    assert store.due(now=BIG, pending_before=BIG, limit=10) == []


def test_prune_strict_bound_and_never_live_rows(db: str, store: SQLiteUpdateStore) -> None:
    for update_id in range(1, 7):
        store.add(update_id, "{}", 0)
    store.settle_owned(claimed(store, 1, now=10), Completed(at=100))
    store.settle_owned(claimed(store, 2, now=10), Abandoned(at=100, error="x"))
    store.settle_owned(claimed(store, 3, now=10), Failed(at=11, retry_at=12, error="x"))
    claimed(store, 4, now=10)  # processing
    five = claimed(store, 5, now=10)
    assert store.exhaust(five, at=11, error="terminal") is True  # unacknowledged exhaustion
    # 6 stays pending
    assert store.prune(100) == 0  # settled_at < before, strictly
    assert store.prune(101) == 2
    assert [u for u in range(1, 7) if exists(db, u)] == [3, 4, 5, 6]
    assert store.prune(BIG) == 0


def test_prune_then_add_again_restarts_attempts_and_refuses_old_identity(
    store: SQLiteUpdateStore,
) -> None:
    store.add(1, "old", 0)
    old = claimed(store, 1, now=10)
    assert store.settle_owned(old, Completed(at=11)) is True
    assert store.prune(12) == 1
    assert store.add(1, "new", 20) is True
    new = claimed(store, 1, now=30)
    assert new.attempt == 1 == old.attempt and new.claim_id != old.claim_id
    assert store.owns(old, 31) is False
    assert store.renew_owned(old, 10**6, 31) is False
    assert store.settle_owned(old, Completed(at=31)) is False
    assert store.exhaust(old, at=31, error="x") is False
    assert store.owns(new, 31) is True


# --------------------------------------------------------------------------------------------
# fenced
# --------------------------------------------------------------------------------------------
def test_claim_owned_reads_the_claim_id_back_from_the_row(
    db: str, store: SQLiteUpdateStore
) -> None:
    store.add(BIG, "{}", BIG)
    identity = claimed(store, BIG, now=BIG)
    assert identity.update_id == BIG and identity.attempt == 1
    assert raw_row(db, BIG)["claim_id"] == identity.claim_id
    assert type(identity.attempt) is int and type(identity.update_id) is int


def test_claim_ids_are_unique(store: SQLiteUpdateStore) -> None:
    ids = set()
    for update_id in range(50):
        store.add(update_id, "{}", 0)
        ids.add(claimed(store, update_id).claim_id)
    assert len(ids) == 50


def test_renew_owned_needs_the_claim_id(db: str, store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100, lease=100)
    wrong = AttemptIdentity(1, 1, "not-the-claim")
    assert store.renew_owned(wrong, 500, now=150) is False
    assert raw_row(db, 1)["due_at"] == 200
    assert store.renew_owned(identity, 500, now=200) is True  # inclusive
    assert store.renew_owned(identity, 400, now=200) is True  # never shortens
    assert raw_row(db, 1)["due_at"] == 500
    assert store.renew_owned(identity, 900, now=501) is False  # never revives
    assert store.renew_owned(identity, 900) is True  # without now


def test_owns_boundaries(store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100, lease=100)
    assert store.owns(identity, 200) is True
    assert store.owns(identity, 201) is False
    assert store.owns(AttemptIdentity(1, 1, "other"), 150) is False
    assert store.owns(AttemptIdentity(1, 2, identity.claim_id), 150) is False
    assert store.owns(AttemptIdentity(2, 1, identity.claim_id), 150) is False
    second = store.claim_owned(1, now=201, lease_until=400, max_attempts=5)
    assert second is not None
    assert store.owns(identity, 150) is False  # never adopts a later claim
    assert store.owns(second, 400) is True
    assert store.settle_owned(second, Completed(at=300)) is True
    assert store.owns(second, 300) is False


def test_settle_owned_needs_the_exact_live_claim(db: str, store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100, lease=100)
    assert store.settle_owned(AttemptIdentity(1, 1, "x"), Completed(at=150)) is False
    assert store.settle_owned(identity, Completed(at=201)) is False  # expired
    assert raw_row(db, 1)["state"] == "processing"
    assert store.settle_owned(identity, Failed(at=200, retry_at=300, error="e")) is True
    assert store.settle_owned(identity, Completed(at=200)) is False  # no longer processing


# --------------------------------------------------------------------------------------------
# durable
# --------------------------------------------------------------------------------------------
def test_exhaust_needs_the_live_claim_and_keeps_the_error(
    db: str, store: SQLiteUpdateStore
) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100, lease=100)
    assert store.exhaust(AttemptIdentity(1, 1, "x"), at=150, error="e") is False
    assert store.exhaust(identity, at=201, error="e") is False  # expired
    assert store.exhaust(identity, at=200, error="handler gave up") is True
    row = raw_row(db, 1)
    assert (row["state"], row["due_at"], row["settled_at"], row["error"]) == (
        "abandoned", 200, None, "handler gave up")
    assert store.exhaust(identity, at=200, error="again") is False
    assert store.due_exhaustions(limit=5)[0].error == "handler gave up"


def test_expired_attempt_cannot_exhaust_and_does_not_block_reclaim(
    store: SQLiteUpdateStore,
) -> None:
    store.add(1, "{}", 0)
    old = claimed(store, 1, now=100, lease=100)
    assert store.exhaust(old, at=300, error="late") is False
    new = store.claim_owned(1, now=300, lease_until=400, max_attempts=5)
    assert new is not None and new.attempt == 2
    assert store.due_exhaustions(limit=5) == []


def test_due_exhaustions_paging_and_acknowledgement(db: str, store: SQLiteUpdateStore) -> None:
    identities = {}
    for update_id in (BIG + 3, 1, 2, 5):
        store.add(update_id, f"b{update_id}", 0)
        identity = claimed(store, update_id, now=100)
        assert store.exhaust(identity, at=100 + update_id % 7, error=f"e{update_id}")
        identities[update_id] = identity
    store.add(4, "{}", 0)  # not exhausted
    page = store.due_exhaustions(limit=2)
    assert [e.update_id for e in page] == [1, 2]
    assert page[0] == Exhaustion(update_id=1, attempt=1, claim_id=identities[1].claim_id,
                                 body="b1", exhausted_at=101, error="e1")
    assert page[0].identity == identities[1]
    assert [e.update_id for e in store.due_exhaustions(limit=2, after_update_id=2)] == [5, BIG + 3]
    assert store.due_exhaustions(limit=10, after_update_id=BIG + 3) == []
    assert store.due_exhaustions(limit=0) == []
    # acknowledgement: exact identity only, once
    target = identities[2]
    assert store.acknowledge_exhaustion(AttemptIdentity(2, 1, "x"), 500) is False
    assert store.acknowledge_exhaustion(AttemptIdentity(2, 2, target.claim_id), 500) is False
    assert store.acknowledge_exhaustion(target, 500) is True
    assert store.acknowledge_exhaustion(target, 600) is False
    assert raw_row(db, 2)["settled_at"] == 500
    assert [e.update_id for e in store.due_exhaustions(limit=10)] == [1, 5, BIG + 3]
    assert store.prune(501) == 1  # now ordinary history
    assert not exists(db, 2)


def test_acknowledge_refuses_non_exhaustions(store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=10)
    assert store.acknowledge_exhaustion(identity, 11) is False  # processing
    store.settle_owned(identity, Abandoned(at=11, error="x"))
    assert store.acknowledge_exhaustion(identity, 12) is False  # already settled


# --------------------------------------------------------------------------------------------
# optional capabilities
# --------------------------------------------------------------------------------------------
def test_add_many_in_one_commit(db: str, store: SQLiteUpdateStore) -> None:
    store.add(2, "existing", 0)
    statements: List[str] = []
    conn = thread_connection(store)
    conn.set_trace_callback(statements.append)
    try:
        result = store.add_many([(1, "a", 10), (2, "b", 10), (3, "c", BIG), (1, "again", 10)])
    finally:
        conn.set_trace_callback(None)
    assert result == [True, False, True, False]
    assert all(type(x) is bool for x in result)
    assert [s for s in statements if s.strip().upper() in ("BEGIN IMMEDIATE", "COMMIT")] == [
        "BEGIN IMMEDIATE", "COMMIT"]
    assert raw_row(db, 3)["received_at"] == BIG
    assert raw_row(db, 2)["body"] == "existing"
    assert store.add_many([]) == []


def test_add_many_is_atomic(db: str, store: SQLiteUpdateStore) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        store.add_many([(1, "a", 10), (2, None, 10)])  # type: ignore[list-item]
    assert not exists(db, 1)


def test_renew_many_one_statement_per_position(db: str, store: SQLiteUpdateStore) -> None:
    for update_id in (1, 2, 3, BIG):
        store.add(update_id, "{}", 0)
    claimed(store, 1, now=100, lease=100)  # due 200
    claimed(store, 2, now=100, lease=10)  # due 110: expired at 150
    claimed(store, BIG, now=100, lease=1000)  # due 1100
    statements: List[str] = []
    conn = thread_connection(store)
    conn.set_trace_callback(statements.append)
    try:
        result = store.renew_many(
            [(1, 1), (2, 1), (3, 1), (1, 2), (BIG, 1), (1, 1), (404, 1)], 500, 150
        )
    finally:
        conn.set_trace_callback(None)
    assert result == [True, False, False, False, True, True, False]
    assert all(type(x) is bool for x in result)
    assert len([s for s in statements if s.lstrip().upper().startswith("UPDATE")]) == 1
    assert raw_row(db, 1)["due_at"] == 500
    assert raw_row(db, 2)["due_at"] == 110  # not revived
    assert raw_row(db, BIG)["due_at"] == 1100  # not shortened
    assert store.renew_many([], 1, 1) == []


def test_renew_owned_many_one_statement_per_position(db: str, store: SQLiteUpdateStore) -> None:
    for update_id in (1, 2, 3):
        store.add(update_id, "{}", 0)
    a = claimed(store, 1, now=100, lease=100)
    b = claimed(store, 2, now=100, lease=10)
    c = claimed(store, 3, now=100, lease=1000)
    statements: List[str] = []
    conn = thread_connection(store)
    conn.set_trace_callback(statements.append)
    try:
        result = store.renew_owned_many(
            [a, b, AttemptIdentity(3, 1, a.claim_id), c, AttemptIdentity(3, 2, c.claim_id), a],
            500, 150,
        )
    finally:
        conn.set_trace_callback(None)
    assert result == [True, False, False, True, False, True]
    assert len([s for s in statements if s.lstrip().upper().startswith("UPDATE")]) == 1
    assert [raw_row(db, u)["due_at"] for u in (1, 2, 3)] == [500, 110, 1100]
    assert store.renew_owned_many([], 1, 1) == []


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="sqlite3.Connection.setlimit is new in Python 3.11"
)
def test_batched_renewals_are_one_statement_whatever_the_variable_limit(
    db: str, store: SQLiteUpdateStore
) -> None:
    """A batch goes as one JSON parameter: one UPDATE even under a limit of 12 variables."""
    identities = []
    for update_id in range(50):
        store.add(update_id, "{}", 0)
        identities.append(claimed(store, update_id, now=100, lease=100))
    conn = thread_connection(store)
    conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 12)
    statements: List[str] = []
    conn.set_trace_callback(statements.append)
    try:
        leases = [(i.update_id, 1 if i.update_id % 2 else 2) for i in identities]
        assert store.renew_many(leases, 300, 150) == [u % 2 == 1 for u in range(50)]
        updates = [s for s in statements if s.lstrip().upper().startswith("UPDATE")]
        assert len(updates) == 1
        statements.clear()
        owned = [i if i.update_id % 3 else AttemptIdentity(i.update_id, 1, "x")
                 for i in identities]
        assert store.renew_owned_many(owned, 400, 150) == [u % 3 != 0 for u in range(50)]
        updates = [s for s in statements if s.lstrip().upper().startswith("UPDATE")]
        assert len(updates) == 1
        begins = [s for s in statements if s.strip().upper() == "BEGIN IMMEDIATE"]
        assert len(begins) == 1
    finally:
        conn.set_trace_callback(None)
    assert raw_row(db, 1)["due_at"] == 400
    assert raw_row(db, 2)["due_at"] == 400  # renew_many skipped, owned hit
    assert raw_row(db, 3)["due_at"] == 300
    assert raw_row(db, 0)["due_at"] == 200


def test_transaction_commits_and_rolls_back(db: str, store: SQLiteUpdateStore) -> None:
    with store.transaction() as conn:
        assert isinstance(conn, sqlite3.Connection) and conn.in_transaction
        conn.execute("CREATE TABLE replies (update_id INTEGER PRIMARY KEY, text TEXT)")
        conn.execute("INSERT INTO replies VALUES (?, ?)", (1, "hi"))
    with pytest.raises(ZeroDivisionError):
        with store.transaction() as conn:
            conn.execute("INSERT INTO replies VALUES (?, ?)", (2, "lost"))
            1 / 0
    assert not conn.in_transaction
    other = sqlite3.connect(db)
    assert other.execute("SELECT update_id FROM replies").fetchall() == [(1,)]
    other.close()


def test_transaction_rules_on_its_own_thread(store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100, lease=100)
    with store.transaction() as conn:
        with pytest.raises(RuntimeError, match="already open"):
            with store.transaction():
                pass
        with pytest.raises(RuntimeError, match="connection="):
            store.add(2, "{}", 0)
        assert store.owns(identity, 150) is True  # reads work
        assert store.owns(identity, 150, connection=conn) is True
        assert store.settle_owned(identity, Completed(at=150), connection=conn) is True
    assert store.owns(identity, 150) is False
    assert store.add(2, "{}", 0) is True


def test_settle_owned_on_callers_connection_lands_with_its_commit(
    db: str, store: SQLiteUpdateStore
) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100, lease=100)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        assert store.settle_owned(identity, Completed(at=150), connection=conn) is True
        assert conn.in_transaction  # joined/started, not committed
        assert raw_row(db, 1)["state"] == "processing"
        conn.execute("ROLLBACK")
        assert raw_row(db, 1)["state"] == "processing"
        assert store.settle_owned(identity, Completed(at=150), connection=conn.cursor()) is True
        conn.execute("COMMIT")
        assert raw_row(db, 1)["state"] == "completed"
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# owns(connection=...) inside the caller's transaction
# --------------------------------------------------------------------------------------------
def _domain(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS replies (update_id INTEGER PRIMARY KEY, text TEXT)")


def test_owns_on_callers_connection_blocks_a_competing_claim(
    db: str, store: SQLiteUpdateStore
) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100, lease=100)  # due 200
    conn = sqlite3.connect(db, isolation_level=None)
    _domain(conn)
    result: Dict[str, Any] = {}

    def competitor() -> None:  # lease lapsed at 201: it would take the update over
        result["claim"] = store.claim_owned(1, now=201, lease_until=900, max_attempts=5)

    try:
        assert not conn.in_transaction
        assert store.owns(identity, 200, connection=conn) is True
        assert conn.in_transaction  # BEGIN IMMEDIATE: the check holds until commit
        thread = threading.Thread(target=competitor)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive(), "the claim must wait for the caller's transaction"
        conn.execute("INSERT INTO replies VALUES (1, 'written under the fence')")
        conn.execute("COMMIT")
        thread.join(10)
        assert not thread.is_alive()
    finally:
        conn.close()
    assert result["claim"] is not None and result["claim"].attempt == 2
    assert store.owns(identity, 150) is False


def test_owns_in_callers_deferred_transaction_takes_the_write_lock(
    db: str, store: SQLiteUpdateStore
) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100, lease=100)
    conn = sqlite3.connect(db, isolation_level=None)
    done = threading.Event()

    def competitor() -> None:
        store.claim_owned(1, now=201, lease_until=900, max_attempts=5)
        done.set()

    try:
        conn.execute("BEGIN")  # deferred: has only read so far
        assert conn.execute("SELECT COUNT(*) FROM telegram_updates").fetchone() == (1,)
        assert store.owns(identity, 150, connection=conn) is True
        thread = threading.Thread(target=competitor)
        thread.start()
        assert not done.wait(0.5), "the claim must wait for the caller's transaction"
        conn.execute("COMMIT")
        assert done.wait(10)
        thread.join(10)
    finally:
        conn.close()
    assert store.owns(identity, 150) is False


def test_owns_refuses_a_stale_read_transaction(db: str, store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    store.add(2, "{}", 0)
    identity = claimed(store, 1, now=100, lease=100)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("SELECT COUNT(*) FROM telegram_updates").fetchone()  # snapshot taken
        claimed(store, 2, now=100)  # another connection writes after the snapshot
        with pytest.raises(sqlite3.OperationalError):
            store.owns(identity, 150, connection=conn)
        conn.execute("ROLLBACK")
        assert store.owns(identity, 150, connection=conn) is True  # a fresh transaction works
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_owns_on_callers_connection_makes_a_short_timeout_claim_fail(
    db: str, store: SQLiteUpdateStore
) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100, lease=100)
    impatient = SQLiteUpdateStore(db, busy_timeout=0.2)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        assert store.owns(identity, 150, connection=conn.cursor()) is True  # a cursor works too
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            impatient.claim_owned(1, now=201, lease_until=900, max_attempts=5)
        conn.execute("COMMIT")
        assert impatient.claim_owned(1, now=201, lease_until=900, max_attempts=5) is not None
    finally:
        conn.close()
        impatient.close()


def test_rollback_of_the_caller_leaves_no_domain_row(db: str, store: SQLiteUpdateStore) -> None:
    store.add(1, "{}", 0)
    identity = claimed(store, 1, now=100, lease=100)
    setup = sqlite3.connect(db, isolation_level=None)
    _domain(setup)
    setup.close()
    conn = sqlite3.connect(db)  # Python's default (legacy) transaction handling
    try:
        assert store.owns(identity, 150, connection=conn) is True
        conn.execute("INSERT INTO replies VALUES (1, 'x')")
        conn.rollback()
        assert conn.execute("SELECT COUNT(*) FROM replies").fetchone()[0] == 0
        # a lost fence: the caller sees False inside its transaction and writes nothing
        assert store.owns(identity, 201, connection=conn) is False
        conn.rollback()
        # and a commit after a true check lands
        assert store.owns(identity, 150, connection=conn) is True
        conn.execute("INSERT INTO replies VALUES (2, 'y')")
        conn.commit()
    finally:
        conn.close()
    check = sqlite3.connect(db)
    assert check.execute("SELECT update_id FROM replies").fetchall() == [(2,)]
    check.close()


def test_owns_refuses_foreign_connections(tmp_path: Path, store: SQLiteUpdateStore) -> None:
    identity = AttemptIdentity(1, 1, "x")
    other = sqlite3.connect(str(tmp_path / "other.sqlite3"))
    try:
        with pytest.raises(ValueError, match="same file"):
            store.owns(identity, 1, connection=other)
        with pytest.raises(ValueError, match="same file"):
            store.settle_owned(identity, Completed(at=1), connection=other)
    finally:
        other.close()
    with pytest.raises(TypeError, match="sqlite3.Connection"):
        store.owns(identity, 1, connection=object())


# --------------------------------------------------------------------------------------------
# older tables
# --------------------------------------------------------------------------------------------
OLD_SCHEMA = """
    CREATE TABLE {table} (
        update_id INTEGER PRIMARY KEY, body TEXT NOT NULL, state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0, due_at INTEGER NOT NULL,
        received_at INTEGER NOT NULL, settled_at INTEGER, error TEXT
    )"""


def make_old_file(path: str, table: str = "telegram_updates", rows: int = 3) -> None:
    conn = sqlite3.connect(path)
    conn.execute(OLD_SCHEMA.format(table=table))
    conn.execute(f"INSERT INTO {table} VALUES (1, 'a', 'pending', 0, 10, 10, NULL, NULL)")
    conn.execute(f"INSERT INTO {table} VALUES (2, 'b', 'abandoned', 5, 77, 10, NULL, 'spent')")
    conn.execute(f"INSERT INTO {table} VALUES (3, 'c', 'completed', 1, 50, 10, 60, NULL)")
    for update_id in range(100, 100 + rows - 3):
        conn.execute(f"INSERT INTO {table} VALUES (?, 'x', 'pending', 0, 10, 10, NULL, NULL)",
                     (update_id,))
    conn.commit()
    conn.close()


def test_older_table_gets_claim_id_and_keeps_its_rows(db: str) -> None:
    make_old_file(db)
    with SQLiteUpdateStore(db) as store:
        conn = sqlite3.connect(db)
        columns = [row[1] for row in conn.execute("PRAGMA table_info(telegram_updates)")]
        conn.close()
        assert columns.count("claim_id") == 1
        assert columns.count("isolated_claim") == 1  # suspect rows (BatchStore)
        assert raw_row(db, 1)["body"] == "a"
        assert raw_row(db, 3)["settled_at"] == 60
        # the old pending row works with fenced claims
        identity = claimed(store, 1, now=100)
        assert identity.attempt == 1 and store.owns(identity, 100)
        # an old unacknowledged exhaustion got a claim id and can be acknowledged exactly
        (exhaustion,) = store.due_exhaustions(limit=10)
        assert exhaustion.update_id == 2 and exhaustion.claim_id and exhaustion.exhausted_at == 77
        assert store.acknowledge_exhaustion(exhaustion.identity, 100) is True
        assert store.prune(61) == 1  # row 3
    with SQLiteUpdateStore(db) as again:  # opening the upgraded file again is a no-op
        assert again.owns(identity, 100) is True


@pytest.mark.parametrize("with_claim_id", [False, True])
def test_older_table_with_due_at_not_null_accepts_every_insert_path(
    db: str, with_claim_id: bool
) -> None:
    """A pending row carries due_at = received_at (older tables say NOT NULL)."""
    conn = sqlite3.connect(db)
    conn.execute(OLD_SCHEMA.format(table="telegram_updates"))
    if with_claim_id:
        conn.execute("ALTER TABLE telegram_updates ADD COLUMN claim_id TEXT")
    conn.commit()
    conn.close()
    with SQLiteUpdateStore(db) as store:
        assert store.add(1, "a", 100) is True
        assert raw_row(db, 1)["due_at"] == 100
        assert store.add_many([(2, "b", 200), (3, "c", 300)]) == [True, True]
        assert raw_row(db, 3)["due_at"] == 300
        terms = ClaimTerms(0, 900, 5)
        (identity,) = store.commit(Batch(terms, claimed_records=((4, "d", 400),))).claimed_records
        assert identity is not None and raw_row(db, 4)["due_at"] == 900
        got = store.commit(Batch(
            terms, claimed_records=((5, "e", 500),), settlements=((identity, Completed(at=450)),)
        ))
        assert got.claimed_records[0] is not None and got.landed == (True,)
        # pending rows are found by their state, as before
        due = store.due(now=800, pending_before=250, limit=10)
        assert [u.update_id for u in due] == [1, 2]
        assert store.claim(1, now=1000, lease_until=2000, max_attempts=5) == 1


def test_claim_id_upgrade_tolerates_a_lost_race(db: str) -> None:
    """If the ALTER fails because the column already exists, the table is re-read, no error."""
    sql = statements("telegram_updates")
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(OLD_SCHEMA.format(table="telegram_updates"))
        _add_claim_id_column(conn, sql)  # wins
        _add_claim_id_column(conn, sql)  # "duplicate column" → re-read → column present → ok
        columns = [row[1] for row in conn.execute("PRAGMA table_info(telegram_updates)")]
        assert columns.count("claim_id") == 1
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            _add_claim_id_column(conn, statements("missing"))  # still missing: re-raised
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# several processes
# --------------------------------------------------------------------------------------------
WORKER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from ptb_fence.stores import SQLiteUpdateStore
mode, path, count = sys.argv[2], sys.argv[3], int(sys.argv[4])
print("ready", flush=True)
sys.stdin.readline()  # start line: every process opens the file at the same moment
store = SQLiteUpdateStore(path)
won = []
if mode == "claim":
    ids = range(count) if int(sys.argv[5]) % 2 == 0 else reversed(range(count))
    for update_id in ids:
        identity = store.claim_owned(update_id, now=1000, lease_until=10**12, max_attempts=5)
        if identity is not None:
            won.append([identity.update_id, identity.attempt, identity.claim_id])
elif mode == "open":
    store.add(10**6 + int(sys.argv[5]), "{}", 0)
store.close()
print(json.dumps(won), flush=True)
"""


def run_processes(mode: str, path: str, count: int, processes: int = 4) -> List[Any]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, REPO, mode, path, str(count), str(n)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for n in range(processes)
    ]
    try:
        for proc in procs:  # wait until every interpreter is up and imported
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_processes_open_and_upgrade_an_older_file_at_once(db: str) -> None:
    make_old_file(db, rows=50)
    run_processes("open", db, 0)
    conn = sqlite3.connect(db)
    try:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(telegram_updates)")]
        assert columns.count("claim_id") == 1
        assert conn.execute("SELECT COUNT(*) FROM telegram_updates").fetchone()[0] == 54
        body = conn.execute("SELECT body FROM telegram_updates WHERE update_id = 1").fetchone()
        assert body == ("a",)
    finally:
        conn.close()


def test_processes_create_a_new_file_at_once(db: str) -> None:
    run_processes("open", db, 0)
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT COUNT(*) FROM telegram_updates").fetchone()[0] == 4
    finally:
        conn.close()


def test_processes_racing_claims_take_each_update_exactly_once(db: str) -> None:
    with SQLiteUpdateStore(db) as store:
        assert all(store.add_many([(u, "{}", 0) for u in range(200)]))
    results = run_processes("claim", db, 200)
    won = [tuple(item) for result in results for item in result]
    assert sorted(u for u, _, _ in won) == list(range(200))
    assert {attempt for _, attempt, _ in won} == {1}
    assert sum(1 for result in results if result) >= 1
    conn = sqlite3.connect(db)
    try:
        rows = dict(conn.execute("SELECT update_id, claim_id FROM telegram_updates WHERE "
                                 "state = 'processing' AND attempts = 1").fetchall())
    finally:
        conn.close()
    assert rows == {u: claim_id for u, _, claim_id in won}


# --------------------------------------------------------------------------------------------
# threads
# --------------------------------------------------------------------------------------------
def test_threads_racing_claim_owned_exactly_one_wins(store: SQLiteUpdateStore) -> None:
    threads, rounds = 12, 15
    for update_id in range(rounds):
        store.add(update_id, "{}", 0)
    barrier = threading.Barrier(threads)
    wins: List[List[AttemptIdentity]] = [[] for _ in range(rounds)]
    errors: List[BaseException] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            for update_id in range(rounds):
                barrier.wait(timeout=30)
                identity = store.claim_owned(update_id, now=100, lease_until=10**6,
                                             max_attempts=5)
                if identity is not None:
                    with lock:
                        wins[update_id].append(identity)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(60)
    assert not errors
    assert [len(w) for w in wins] == [1] * rounds
    assert all(w[0].attempt == 1 and store.owns(w[0], 100) for w in wins)


def test_connections_per_thread_closed_on_close(db: str) -> None:
    store = SQLiteUpdateStore(db)
    connections: List[sqlite3.Connection] = []

    def worker() -> None:
        connections.append(thread_connection(store))
        store.add(threading.get_ident() % 10**6, "{}", 0)

    pool = [threading.Thread(target=worker) for _ in range(4)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(10)
    assert len({id(c) for c in connections}) == 4
    main = thread_connection(store)
    assert main not in connections
    store.close()
    store.close()  # idempotent
    for conn in connections + [main]:
        with pytest.raises(sqlite3.ProgrammingError):
            conn.execute("SELECT 1")
    with pytest.raises(RuntimeError, match="closed"):
        store.add(1, "{}", 0)


def test_connections_of_finished_threads_are_reaped(store: SQLiteUpdateStore) -> None:
    connections: List[sqlite3.Connection] = []
    thread = threading.Thread(target=lambda: connections.append(thread_connection(store)))
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    second = threading.Thread(target=lambda: connections.append(thread_connection(store)))
    second.start()  # opening a new connection closes the dead thread's
    second.join(10)
    with pytest.raises(sqlite3.ProgrammingError):
        connections[0].execute("SELECT 1")


def test_context_manager_and_repr(db: str) -> None:
    with SQLiteUpdateStore(db, "t1") as store:
        assert store.path == os.path.abspath(db) and store.table == "t1"
        assert "t1" in repr(store)
    with pytest.raises(RuntimeError, match="closed"):
        store.due(now=1, pending_before=1, limit=1)


def test_busy_writer_waits_then_times_out_with_a_clear_sqlite_error(db: str) -> None:
    with SQLiteUpdateStore(db, busy_timeout=0.3) as store:
        blocker = sqlite3.connect(db, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                store.add(1, "{}", 0)
            assert time.monotonic() - started >= 0.25
            blocker.execute("ROLLBACK")
            assert store.add(1, "{}", 0) is True  # the failed write left no open transaction
        finally:
            blocker.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_opens_its_own_connection(db: str, store: SQLiteUpdateStore) -> None:
    assert store.add(1, "{}", 0) is True  # the parent's connection exists before the fork
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            code = 0 if store.add(2, "{}", 0) is True and store.claim(
                1, now=10, lease_until=20, max_attempts=5) == 1 else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.add(3, "{}", 0) is True  # the parent's connection still works
    assert raw_row(db, 1)["state"] == "processing"
    assert [exists(db, u) for u in (1, 2, 3)] == [True, True, True]
