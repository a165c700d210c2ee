"""PostgresUpdateStore against the real PostgreSQL server: every rule, every fault.

Each test uses its own table (``pg_table`` / ``pg_tables``); tests that kill connections give
their store a unique ``application_name`` and kill only those backends.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterator, List, Optional, Tuple

import json
import logging

import psycopg2
import psycopg2.extensions
import psycopg2.pool
import pytest

from ptb_fence import (
    Abandoned,
    AttemptIdentity,
    Batch,
    ClaimTerms,
    Completed,
    Exhaustion,
    Failed,
    MemoryUpdateStore,
    PostgresUpdateStore,
    SchemaError,
    StoreBusy,
    StoredUpdate,
    UpdateIntake,
    is_durable,
    postgres_update_store_schema,
)

pytestmark = pytest.mark.timeout(60)

T = 2**40  # epoch-ms base: BIGINT times must round-trip exactly


# -- helpers ---------------------------------------------------------------------------------
def with_app(dsn: str, app: str) -> str:
    """``dsn`` with ``application_name=app`` (URI or key=value form)."""
    if "://" in dsn:
        return dsn + ("&" if "?" in dsn else "?") + f"application_name={app}"
    return f"{dsn} application_name={app}"


def admin(dsn: str) -> Any:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    return conn


def execute(dsn: Any, sql: str, params: Any = None) -> List[Tuple[Any, ...]]:
    """Run ``sql`` in autocommit mode on a new connection (or on ``dsn`` if a connection)."""
    conn = admin(dsn) if isinstance(dsn, str) else dsn
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []
    finally:
        if conn is not dsn:
            conn.close()


def rows(dsn: Any, table: str) -> Dict[int, Tuple[Any, ...]]:
    """update_id -> (body, state, attempts, due_at, received_at, settled_at, error, claim_id)."""
    has_claim_id = execute(
        dsn,
        "SELECT count(*) FROM information_schema.columns "
        "WHERE table_name = %s AND column_name = 'claim_id'",
        (table,),
    )[0][0]
    got = execute(
        dsn,
        f'SELECT update_id, body, state, attempts, due_at, received_at, settled_at, error, '
        f'{"claim_id" if has_claim_id else "NULL"} FROM "{table}"',
    )
    return {r[0]: tuple(r[1:]) for r in got}


def row(dsn: str, table: str, update_id: int) -> Tuple[Any, ...]:
    return rows(dsn, table)[update_id]


def backends(dsn: str, app: str) -> int:
    return execute(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND application_name = %s",
        (app,),
    )[0][0]


def kill(dsn: str, app: str) -> int:
    """Terminate this store's backends (only those with ``app``) and wait until they are gone."""
    killed = execute(
        dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
        "current_database() AND pid <> pg_backend_pid() AND application_name = %s",
        (app,),
    )
    deadline = time.monotonic() + 10
    while backends(dsn, app) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert backends(dsn, app) == 0
    return len(killed)


# This module tests one store class: its own ``store`` (PostgreSQL on this test's pg_table,
# which the tests also read raw) replaces conftest's, so no test here runs per store kind.
@pytest.fixture
def store(pg_dsn: str, pg_table: str) -> Iterator[PostgresUpdateStore]:
    with PostgresUpdateStore(pg_dsn, pg_table) as s:
        yield s


def legacy_table(dsn: str, table: str, claim_id: bool = False) -> None:
    """A table as created by the original design: ``due_at NOT NULL`` (a pending row carries
    ``due_at = received_at``), and before fencing no claim_id column."""
    execute(
        dsn,
        f'CREATE TABLE "{table}" (update_id BIGINT PRIMARY KEY, body TEXT NOT NULL, '
        "state TEXT NOT NULL, attempts INT NOT NULL DEFAULT 0, due_at BIGINT NOT NULL, "
        "received_at BIGINT NOT NULL, settled_at BIGINT, error TEXT"
        + (", claim_id TEXT)" if claim_id else ")"),
    )


def claimed(s: PostgresUpdateStore, update_id: int, now: int, lease_until: int) -> AttemptIdentity:
    identity = s.claim_owned(update_id, now=now, lease_until=lease_until, max_attempts=5)
    assert identity is not None
    return identity


# -- names and schema text -------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    ["", "1abc", "a-b", 'x"; DROP TABLE y; --', "a b", "é", "a" * 64, "t\n", None, 5],
)
def test_bad_table_names_are_refused_before_any_sql(bad: Any) -> None:
    # An unreachable DSN: the ValueError must come before any connection attempt.
    with pytest.raises(ValueError, match="table name"):
        PostgresUpdateStore("postgresql://postgres@127.0.0.1:1/test", bad)
    with pytest.raises(ValueError, match="table name"):
        postgres_update_store_schema(bad)


def test_schema_text_is_idempotent_and_complete(pg_dsn: str, pg_table: str) -> None:
    text = postgres_update_store_schema(pg_table)
    words = " ".join(text.split())
    for part in ("update_id BIGINT PRIMARY KEY", "ADD COLUMN IF NOT EXISTS claim_id TEXT"):
        assert part in words
    assert postgres_update_store_schema() == postgres_update_store_schema("telegram_updates")
    for _ in range(2):
        execute(pg_dsn, text)
    columns = execute(
        pg_dsn,
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
        (pg_table,),
    )
    assert dict(columns) == {
        "update_id": "bigint",
        "body": "text",
        "state": "text",
        "attempts": "integer",
        "due_at": "bigint",
        "received_at": "bigint",
        "settled_at": "bigint",
        "error": "text",
        "claim_id": "text",
        "fingerprint": "text",
        "instance": "text",
        "chat_key": "bigint",  # strict_chat_order
        "isolated_claim": "text",  # suspect rows, isolated claims (BatchStore)
    }
    indexes = execute(pg_dsn, "SELECT indexdef FROM pg_indexes WHERE tablename = %s", (pg_table,))
    assert any("(state, due_at)" in d for (d,) in indexes)
    assert any("(chat_key, update_id)" in d and "WHERE" in d for (d,) in indexes)


def test_long_table_names_get_distinct_indexes(pg_dsn: str, pg_tables: List[str]) -> None:
    prefix = "t" + uuid.uuid4().hex[:12] + "x" * 49  # 62 characters
    for suffix in ("a", "b"):
        pg_tables.append(prefix + suffix)
        with PostgresUpdateStore(pg_dsn, prefix + suffix) as s:
            assert s.add(1, "{}", T)
    for table in pg_tables:
        indexes = execute(pg_dsn, "SELECT indexdef FROM pg_indexes WHERE tablename = %s", (table,))
        assert any("(state, due_at)" in d for (d,) in indexes), table


def test_constructor_checks_arguments(pg_dsn: str) -> None:
    with pytest.raises(TypeError, match="DSN string, a psycopg2 connection pool"):
        PostgresUpdateStore(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pool_size"):
        PostgresUpdateStore(pg_dsn, pool_size=0)
    with pytest.raises(ValueError, match="pool_timeout"):
        PostgresUpdateStore(pg_dsn, pool_timeout=0)


def test_store_is_durable_and_reprs_without_secrets(pg_dsn: str, pg_table: str) -> None:
    with PostgresUpdateStore(pg_dsn, pg_table) as s:
        assert is_durable(s)
        assert s.table == pg_table
        assert pg_table in repr(s)
        assert not hasattr(s, "__dict__")


# -- base rules of the store contract, their boundaries --------------------------------------
def test_add_records_once_in_every_state(store: PostgresUpdateStore, pg_dsn: str) -> None:
    t = store.table
    assert store.add(T, '{"update_id": 1}', T) is True
    assert store.add(T, "other", T + 1) is False
    assert row(pg_dsn, t, T)[:6] == ('{"update_id": 1}', "pending", 0, T, T, None)
    assert store.claim(T, now=T, lease_until=T + 10, max_attempts=3) == 1
    assert store.add(T, "other", T) is False
    store.settle(T, 1, Completed(T + 5))
    assert store.add(T, '{"update_id": 1}', T) is False  # completed: the same update again
    assert row(pg_dsn, t, T)[0] == '{"update_id": 1}'
    # a body without an update kind has no fingerprint: never a different update
    assert store.add(T, "other", T + 9) is False
    assert row(pg_dsn, t, T)[0] == '{"update_id": 1}'


def test_claim_lease_boundaries(store: PostgresUpdateStore, pg_dsn: str) -> None:
    t = store.table
    store.add(1, "b", T)
    assert store.claim(1, now=T, lease_until=T + 100, max_attempts=5) == 1
    assert row(pg_dsn, t, 1)[1:4] == ("processing", 1, T + 100)
    # a lease is held while due_at >= now: not at due_at, only after it
    assert store.claim(1, now=T + 100, lease_until=T + 200, max_attempts=5) is None
    assert store.due(now=T + 100, pending_before=T + 100, limit=10) == []
    assert store.due(now=T + 101, pending_before=0, limit=10) == [StoredUpdate(1, "b")]
    assert store.claim(1, now=T + 101, lease_until=T + 300, max_attempts=5) == 2
    assert row(pg_dsn, t, 1)[1:4] == ("processing", 2, T + 300)
    # unknown ids and final rows are never claimed
    assert store.claim(999, now=T, lease_until=T + 1, max_attempts=5) is None
    store.settle(1, 2, Completed(T + 300))
    assert store.claim(1, now=T + 10**6, lease_until=T + 10**7, max_attempts=5) is None


def test_base_claim_leaves_claim_id_alone(store: PostgresUpdateStore, pg_dsn: str) -> None:
    store.add(1, "b", T)
    identity = claimed(store, 1, T, T + 10)
    assert store.claim(1, now=T + 11, lease_until=T + 20, max_attempts=5) == 2
    assert row(pg_dsn, store.table, 1)[7] == identity.claim_id  # legacy rule: untouched
    assert not store.owns(identity, T + 11)


def test_renew_never_shortens_and_never_revives(store: PostgresUpdateStore, pg_dsn: str) -> None:
    t = store.table
    store.add(1, "b", T)
    store.claim(1, now=T, lease_until=T + 100, max_attempts=5)
    assert store.renew(1, 1, T + 50, T) is True  # matched, lease kept
    assert row(pg_dsn, t, 1)[3] == T + 100
    assert store.renew(1, 1, T + 50) is True
    assert row(pg_dsn, t, 1)[3] == T + 100
    assert store.renew(1, 1, T + 200, T + 100) is True  # inclusive bound
    assert row(pg_dsn, t, 1)[3] == T + 200
    assert store.renew(1, 2, T + 300, T) is False  # another attempt
    assert store.renew(2, 1, T + 300, T) is False  # unknown
    assert store.renew(1, 1, T + 400, T + 201) is False  # expired: never revived
    assert row(pg_dsn, t, 1)[3] == T + 200
    assert store.renew(1, 1, T + 400) is True  # without now the runtime's guard is off
    assert row(pg_dsn, t, 1)[3] == T + 400


def test_settlements(store: PostgresUpdateStore, pg_dsn: str) -> None:
    t = store.table
    for u in (1, 2, 3, 4):
        store.add(u, f"b{u}", T)
        assert store.claim(u, now=T, lease_until=T + 100, max_attempts=5) == 1
    store.settle(1, 1, Completed(T + 100))  # at == due_at lands
    assert row(pg_dsn, t, 1)[1:7] == ("completed", 1, T + 100, T, T + 100, None)
    store.settle(2, 1, Failed(T + 50, T + 500, "boom"))
    assert row(pg_dsn, t, 2)[1:7] == ("failed", 1, T + 500, T, None, "boom")
    store.settle(3, 1, Abandoned(T + 60, "gave up"))
    assert row(pg_dsn, t, 3)[1:7] == ("abandoned", 1, T + 100, T, T + 60, "gave up")
    before = row(pg_dsn, t, 4)
    store.settle(4, 1, Completed(T + 101))  # lease expired at T+100: ignored
    store.settle(4, 2, Completed(T + 1))  # wrong attempt: ignored
    assert row(pg_dsn, t, 4) == before
    with pytest.raises(TypeError):
        store.settle(4, 1, "done")  # type: ignore[arg-type]
    # a failed row is due exactly at its retry time
    assert store.claim(2, now=T + 499, lease_until=T + 900, max_attempts=5) is None
    assert [u.update_id for u in store.due(now=T + 499, pending_before=0, limit=9)] == [4]
    assert [u.update_id for u in store.due(now=T + 500, pending_before=0, limit=9)] == [2, 4]
    assert store.claim(2, now=T + 500, lease_until=T + 900, max_attempts=5) == 2
    assert row(pg_dsn, t, 2)[1:7] == ("processing", 2, T + 900, T, None, None)  # error cleared


def test_spend_abandons(store: PostgresUpdateStore, pg_dsn: str) -> None:
    t = store.table
    store.add(1, "b", T)
    assert store.claim(1, now=T, lease_until=T + 10, max_attempts=1) == 1
    assert store.claim(1, now=T + 5, lease_until=T + 20, max_attempts=1) is None  # live: no spend
    assert row(pg_dsn, t, 1)[1] == "processing"
    assert store.claim(1, now=T + 11, lease_until=T + 20, max_attempts=1) is None
    assert row(pg_dsn, t, 1)[1:8] == (
        "abandoned", 1, T + 11, T, T + 11, "attempts spent", None
    )
    assert store.due(now=T + 10**6, pending_before=T + 10**6, limit=10) == []
    assert store.due_exhaustions(limit=10) == []
    assert store.prune(T + 11) == 0
    assert store.prune(T + 12) == 1


def test_durable_spend_keeps_or_makes_claim_id(store: PostgresUpdateStore, pg_dsn: str) -> None:
    t = store.table
    store.add(1, "one", T)
    identity = claimed(store, 1, T, T + 10)
    store.settle_owned(identity, Failed(T + 1, T + 20, "x"))
    assert store.claim(1, now=T + 20, lease_until=T + 30, max_attempts=1, durable_exhaustion=True) is None
    assert row(pg_dsn, t, 1)[1:8] == (
        "abandoned", 1, T + 20, T, None, "attempts spent", identity.claim_id
    )
    store.add(2, "two", T)  # no claim id yet: a spend writes a fresh one
    assert store.claim_owned(2, now=T, lease_until=T, max_attempts=0, durable_exhaustion=True) is None
    fresh = row(pg_dsn, t, 2)[7]
    assert isinstance(fresh, str) and fresh
    assert store.due_exhaustions(limit=10) == [
        Exhaustion(1, 1, identity.claim_id, "one", T + 20, "attempts spent"),
        Exhaustion(2, 0, fresh, "two", T, "attempts spent"),
    ]
    assert store.prune(T + 10**9) == 0  # unacknowledged exhaustions are never pruned
    # a base claim with durable_exhaustion writes a claim id when it takes
    store.add(3, "three", T)
    assert store.claim(3, now=T, lease_until=T + 5, max_attempts=2, durable_exhaustion=True) == 1
    assert row(pg_dsn, t, 3)[7]


def test_due_order_limit_and_pending_bound(store: PostgresUpdateStore) -> None:
    for u, at in ((T, T + 5), (3, T + 10), (2**40 + 7, T + 11), (1, T + 20)):
        store.add(u, f"b{u}", at)
    assert [u.update_id for u in store.due(now=0, pending_before=T + 10, limit=9)] == [3, T]
    assert [u.update_id for u in store.due(now=0, pending_before=T + 11, limit=9)] == [
        3,
        T,
        2**40 + 7,
    ]
    assert [u.update_id for u in store.due(now=0, pending_before=T + 99, limit=2)] == [1, 3]
    assert store.due(now=0, pending_before=T + 99, limit=0) == []
    assert store.due(now=0, pending_before=T + 99, limit=1) == [StoredUpdate(1, "b1")]


def test_prune_is_strict_and_readd_restarts(store: PostgresUpdateStore, pg_dsn: str) -> None:
    for u in (1, 2, 3, 4):
        store.add(u, "b", T)
    one = claimed(store, 1, T, T + 10)
    store.settle_owned(one, Completed(T + 5))
    store.claim(2, now=T, lease_until=T + 10, max_attempts=5)
    store.settle(2, 1, Failed(T, T + 1, "x"))
    store.claim(3, now=T, lease_until=T + 10, max_attempts=5)  # processing, lapses
    assert store.prune(T + 5) == 0
    assert store.prune(T + 10**9) == 1
    assert set(rows(pg_dsn, store.table)) == {2, 3, 4}
    assert store.add(1, "again", T + 100) is True
    again = claimed(store, 1, T + 100, T + 200)
    assert again.attempt == 1 and again.claim_id != one.claim_id
    assert not store.owns(one, T + 100)
    assert store.renew_owned(one, T + 300, T + 100) is False
    assert store.settle_owned(one, Completed(T + 101)) is False
    assert store.owns(again, T + 200)


# -- fenced and durable rules ----------------------------------------------------------------
def test_fenced_methods(store: PostgresUpdateStore, pg_dsn: str) -> None:
    t = store.table
    store.add(1, "b", T)
    identity = claimed(store, 1, T, T + 100)
    assert identity.update_id == 1 and identity.attempt == 1
    assert row(pg_dsn, t, 1)[7] == identity.claim_id  # read back from the row
    wrong_claim = AttemptIdentity(1, 1, uuid.uuid4().hex)
    wrong_attempt = AttemptIdentity(1, 2, identity.claim_id)
    assert store.owns(identity, T + 100) is True
    assert store.owns(identity, T + 101) is False
    assert store.owns(wrong_claim, T) is False
    assert store.owns(wrong_attempt, T) is False
    assert store.renew_owned(wrong_claim, T + 500, T) is False
    assert store.renew_owned(identity, T + 50, T + 100) is True
    assert row(pg_dsn, t, 1)[3] == T + 100
    assert store.renew_owned(identity, T + 200, T + 100) is True
    assert store.renew_owned(identity, T + 300, T + 201) is False
    assert store.renew_owned(identity, T + 300) is True
    assert store.settle_owned(wrong_claim, Completed(T)) is False
    assert store.settle_owned(identity, Completed(T + 301)) is False  # expired
    assert store.settle_owned(identity, Failed(T + 300, T + 400, "e")) is True
    assert store.settle_owned(identity, Failed(T + 300, T + 400, "e")) is False
    second = claimed(store, 1, T + 400, T + 500)
    assert second.attempt == 2 and second.claim_id != identity.claim_id
    assert store.owns(identity, T + 400) is False
    assert store.settle_owned(second, Abandoned(T + 450, "no")) is True
    assert row(pg_dsn, t, 1)[1:7] == ("abandoned", 2, T + 500, T, T + 450, "no")
    # claim_owned spends like claim
    store.add(2, "b", T)
    assert store.claim_owned(2, now=T, lease_until=T + 1, max_attempts=0) is None
    assert row(pg_dsn, t, 2)[1:6] == ("abandoned", 0, T, T, T)


def test_durable_methods(store: PostgresUpdateStore, pg_dsn: str) -> None:
    t = store.table
    ids = [5, 1, 2**40 + 3, 4, 3]
    identities = {}
    for u in ids:
        store.add(u, f"b{u}", T)
        identities[u] = claimed(store, u, T, T + 100)
    wrong = AttemptIdentity(5, 1, uuid.uuid4().hex)
    assert store.exhaust(wrong, at=T, error="x") is False
    assert store.exhaust(identities[5], at=T + 101, error="late") is False  # expired
    for u in ids:
        assert store.exhaust(identities[u], at=T + 100, error=f"e{u}") is True
    assert store.exhaust(identities[5], at=T + 100, error="again") is False
    assert row(pg_dsn, t, 5)[1:8] == ("abandoned", 1, T + 100, T, None, "e5", identities[5].claim_id)
    pages: List[List[int]] = []
    cursor: Optional[int] = None
    while True:
        page = store.due_exhaustions(limit=2, after_update_id=cursor)
        if not page:
            break
        pages.append([e.update_id for e in page])
        cursor = page[-1].update_id
    assert pages == [[1, 3], [4, 5], [2**40 + 3]]
    first = store.due_exhaustions(limit=1)[0]
    assert first == Exhaustion(1, 1, identities[1].claim_id, "b1", T + 100, "e1")
    assert first.identity == identities[1]
    assert store.due_exhaustions(limit=0) == []
    assert store.prune(T + 10**9) == 0
    assert store.acknowledge_exhaustion(wrong, T + 200) is False
    assert store.acknowledge_exhaustion(AttemptIdentity(5, 2, identities[5].claim_id), T) is False
    assert store.acknowledge_exhaustion(identities[5], T + 200) is True
    assert store.acknowledge_exhaustion(identities[5], T + 300) is False
    assert row(pg_dsn, t, 5)[5] == T + 200
    assert [e.update_id for e in store.due_exhaustions(limit=10)] == [1, 3, 4, 2**40 + 3]
    assert store.prune(T + 200) == 0
    assert store.prune(T + 201) == 1


def test_expired_attempt_cannot_exhaust_and_does_not_block_reclaim(
    store: PostgresUpdateStore,
) -> None:
    store.add(1, "b", T)
    old = claimed(store, 1, T, T + 10)
    new = claimed(store, 1, T + 11, T + 50)
    assert store.exhaust(old, at=T + 5, error="x") is False
    assert store.owns(new, T + 50)
    assert store.due_exhaustions(limit=5) == []


# -- differential check against the memory store ---------------------------------------------
def test_behaves_like_memory_store(pg_dsn: str, pg_table: str) -> None:
    """Random operations on both stores: same answers, same rows."""
    rng = random.Random(20240611)
    mem = MemoryUpdateStore()
    reader = admin(pg_dsn)
    with PostgresUpdateStore(pg_dsn, pg_table) as pg:
        ids = [1, 2, 3, 2**40]
        legacy_id = 3  # the only id base claims without durable_exhaustion touch
        pairs: List[Tuple[AttemptIdentity, AttemptIdentity]] = []
        claim_map: Dict[str, str] = {}

        def when() -> int:
            return T + rng.randint(0, 40)

        def pair() -> Tuple[AttemptIdentity, AttemptIdentity]:
            m, p = rng.choice(pairs)
            roll = rng.random()
            if roll < 0.1:
                other = uuid.uuid4().hex
                return AttemptIdentity(m.update_id, m.attempt, other), AttemptIdentity(
                    p.update_id, p.attempt, other
                )
            if roll < 0.2:
                return (
                    AttemptIdentity(m.update_id, m.attempt + 1, m.claim_id),
                    AttemptIdentity(p.update_id, p.attempt + 1, p.claim_id),
                )
            return m, p

        def settlement() -> Any:
            at = when()
            kind = rng.randrange(3)
            if kind == 0:
                return Completed(at)
            if kind == 1:
                return Failed(at, at + rng.randint(-3, 10), f"err{rng.randrange(5)}")
            return Abandoned(at, f"gone{rng.randrange(5)}")

        def compare_rows() -> None:
            got = rows(reader, pg_table)
            assert set(got) == set(mem._rows)
            for u, r in mem._rows.items():
                body, state, attempts, due_at, received_at, settled_at, error, claim_id = got[u]
                assert (body, state, attempts, due_at, received_at, settled_at, error) == (
                    r.body, r.state, r.attempts, r.due_at, r.received_at, r.settled_at, r.error
                ), u
                if u == legacy_id:
                    continue
                assert (claim_id is None) == (r.claim_id is None), u
                if r.claim_id is not None:
                    if r.claim_id in claim_map:
                        assert claim_map[r.claim_id] == claim_id, u
                    else:
                        claim_map[r.claim_id] = claim_id

        for step in range(500):
            u = rng.choice(ids)
            op = rng.randrange(15)
            now = when()
            if op == 0:
                a = b = (u, f"body{step}", now)
                assert mem.add(*a) == pg.add(*b)
            elif op == 1:
                batch = [(rng.choice(ids), f"m{step}.{i}", when()) for i in range(rng.randint(1, 4))]
                assert mem.add_many(batch) == pg.add_many(batch)
            elif op == 2:
                durable = rng.random() < 0.5 or u != legacy_id
                kw = dict(
                    now=now,
                    lease_until=now + rng.randint(-2, 12),
                    max_attempts=rng.randint(1, 3),
                    durable_exhaustion=durable,
                )
                assert mem.claim(u, **kw) == pg.claim(u, **kw)
            elif op in (3, 4):
                kw = dict(
                    now=now,
                    lease_until=now + rng.randint(-2, 12),
                    max_attempts=rng.randint(1, 3),
                    durable_exhaustion=rng.random() < 0.5,
                )
                m = mem.claim_owned(u, **kw)
                p = pg.claim_owned(u, **kw)
                assert (m is None) == (p is None), step
                if m is not None and p is not None:
                    assert (m.update_id, m.attempt) == (p.update_id, p.attempt)
                    pairs.append((m, p))
            elif op == 5:
                args = (u, rng.randint(0, 3), now + rng.randint(-5, 10))
                at = rng.choice([None, now])
                assert mem.renew(*args, at) == pg.renew(*args, at)
            elif op == 6:
                leases = [(rng.choice(ids), rng.randint(0, 3)) for _ in range(rng.randint(1, 4))]
                lease_until = now + rng.randint(-5, 10)
                assert mem.renew_many(leases, lease_until, now) == pg.renew_many(
                    leases, lease_until, now
                )
            elif op == 7:
                s = settlement()
                attempt = rng.randint(0, 3)
                mem.settle(u, attempt, s)
                pg.settle(u, attempt, s)
            elif op == 8:
                pb, limit = when(), rng.randint(1, 5)
                assert mem.due(now=now, pending_before=pb, limit=limit) == pg.due(
                    now=now, pending_before=pb, limit=limit
                )
            elif op == 9:
                before = when()
                assert mem.prune(before) == pg.prune(before)
            elif op == 10 and pairs:
                m, p = pair()
                lease_until, at = now + rng.randint(-5, 10), rng.choice([None, now])
                assert mem.renew_owned(m, lease_until, at) == pg.renew_owned(p, lease_until, at)
                chosen = [pair() for _ in range(rng.randint(1, 3))]
                assert mem.renew_owned_many([c[0] for c in chosen], lease_until, now) == (
                    pg.renew_owned_many([c[1] for c in chosen], lease_until, now)
                )
            elif op == 11 and pairs:
                m, p = pair()
                assert mem.owns(m, now) == pg.owns(p, now)
                s = settlement()
                assert mem.settle_owned(m, s) == pg.settle_owned(p, s)
            elif op == 12 and pairs:
                m, p = pair()
                error = f"x{step}"
                assert mem.exhaust(m, at=now, error=error) == pg.exhaust(p, at=now, error=error)
            elif op == 13:
                after = rng.choice([None, 0, 1, 2, 3])
                limit = rng.randint(1, 5)
                me = mem.due_exhaustions(limit=limit, after_update_id=after)
                pe = pg.due_exhaustions(limit=limit, after_update_id=after)
                assert [
                    (e.update_id, e.attempt, e.body, e.exhausted_at, e.error) for e in me
                ] == [(e.update_id, e.attempt, e.body, e.exhausted_at, e.error) for e in pe]
                pairs.extend((a.identity, b.identity) for a, b in zip(me, pe))
            elif op == 14 and pairs:
                m, p = pair()
                assert mem.acknowledge_exhaustion(m, now) == pg.acknowledge_exhaustion(p, now)
            compare_rows()
    reader.close()


# -- optional capabilities -------------------------------------------------------------------
def test_add_many(store: PostgresUpdateStore, pg_dsn: str) -> None:
    assert store.add_many([]) == []
    store.add(2, "old", T)
    got = store.add_many([(1, "a", T), (2, "b", T), (1, "c", T + 1), (2**40, "d", T + 2)])
    assert got == [True, False, False, True]
    assert {u: r[0] for u, r in rows(pg_dsn, store.table).items()} == {
        1: "a",
        2: "old",
        2**40: "d",
    }


def test_renew_many_maps_positions(store: PostgresUpdateStore, pg_dsn: str) -> None:
    assert store.renew_many([], T, T) == []
    assert store.renew_owned_many([], T, T) == []
    for u in (1, 2, 3):
        store.add(u, "b", T)
    one = claimed(store, 1, T, T + 100)
    two = claimed(store, 2, T, T + 10)
    leases = [(2, 1), (1, 1), (3, 1), (1, 2), (1, 1), (99, 1)]
    assert store.renew_many(leases, T + 200, T + 10) == [True, True, False, False, True, False]
    assert row(pg_dsn, store.table, 1)[3] == T + 200
    assert store.renew_many([(1, 1), (2, 1)], T + 300, T + 201) == [False, False]  # expired
    assert store.renew_many([(1, 1)], T + 50, T) == [True]  # never shortens
    assert row(pg_dsn, store.table, 1)[3] == T + 200
    bad = AttemptIdentity(1, 1, uuid.uuid4().hex)
    result = store.renew_owned_many([bad, two, one, one], T + 400, T + 200)
    assert result == [False, True, True, True]
    assert row(pg_dsn, store.table, 2)[3] == T + 400
    assert store.renew_owned_many([one, two], T + 500, T + 401) == [False, False]


def test_transaction_commits_and_rolls_back(store: PostgresUpdateStore, pg_dsn: str) -> None:
    store.add(1, "b", T)
    identity = claimed(store, 1, T, T + 100)
    execute(pg_dsn, f'CREATE TABLE "{store.table}_side" (v INT)')
    try:
        with pytest.raises(RuntimeError, match="boom"):
            with store.transaction() as conn:
                assert store.owns(identity, T + 50, connection=conn)
                with conn.cursor() as cur:
                    cur.execute(f'INSERT INTO "{store.table}_side" VALUES (1)')
                assert store.settle_owned(identity, Completed(T + 50), connection=conn)
                raise RuntimeError("boom")
        assert execute(pg_dsn, f'SELECT count(*) FROM "{store.table}_side"') == [(0,)]
        assert row(pg_dsn, store.table, 1)[1] == "processing"
        with store.transaction() as conn:
            cur = conn.cursor()
            assert store.owns(identity, T + 50, connection=cur)  # a cursor works too
            cur.execute(f'INSERT INTO "{store.table}_side" VALUES (2)')
            assert store.settle_owned(identity, Completed(T + 50), connection=cur)
            # not committed yet: other connections do not see it
            assert row(pg_dsn, store.table, 1)[1] == "processing"
        assert execute(pg_dsn, f'SELECT v FROM "{store.table}_side"') == [(2,)]
        assert row(pg_dsn, store.table, 1)[1] == "completed"
        with store.transaction() as conn:
            assert store.owns(identity, T + 50, connection=conn) is False
            assert store.settle_owned(identity, Completed(T + 50), connection=conn) is False
    finally:
        execute(pg_dsn, f'DROP TABLE IF EXISTS "{store.table}_side"')


def test_owns_refuses_an_autocommit_connection(store: PostgresUpdateStore, pg_dsn: str) -> None:
    store.add(1, "b", T)
    identity = claimed(store, 1, T, T + 100)
    conn = admin(pg_dsn)
    try:
        with pytest.raises(ValueError, match="autocommit"):
            store.owns(identity, T, connection=conn)
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            assert store.owns(identity, T, connection=cur) is True
            cur.execute("COMMIT")
    finally:
        conn.close()


def test_owns_for_update_blocks_a_competing_claim(store: PostgresUpdateStore, pg_dsn: str) -> None:
    store.add(1, "b", T)
    first = claimed(store, 1, T, T + 100)
    conn_a = psycopg2.connect(pg_dsn)
    try:
        assert store.owns(first, T + 100, connection=conn_a) is True  # FOR UPDATE, open
        result: List[Optional[AttemptIdentity]] = []

        def compete() -> None:
            result.append(
                store.claim_owned(1, now=T + 101, lease_until=T + 500, max_attempts=5)
            )

        thread = threading.Thread(target=compete, daemon=True)
        thread.start()
        thread.join(0.7)
        assert thread.is_alive() and result == []  # blocked by A's row lock
        # A's domain write and settle are still authoritative inside its transaction
        assert store.settle_owned(first, Failed(T + 100, T + 100, "x"), connection=conn_a)
        conn_a.commit()
        thread.join(10)
        assert not thread.is_alive()
        assert result[0] is not None and result[0].attempt == 2
        assert store.owns(result[0], T + 500)
        assert not store.owns(first, T + 100)
    finally:
        conn_a.close()


def test_owns_waits_for_a_claim_in_flight_then_sees_it(
    store: PostgresUpdateStore, pg_dsn: str
) -> None:
    store.add(1, "b", T)
    first = claimed(store, 1, T, T + 100)
    conn_b = psycopg2.connect(pg_dsn)  # a competing claim, not yet committed
    conn_a = psycopg2.connect(pg_dsn)
    try:
        with conn_b.cursor() as cur:
            cur.execute(
                f'UPDATE "{store.table}" SET attempts = attempts + 1, due_at = %s, claim_id = %s '
                "WHERE update_id = 1",
                (T + 500, "other"),
            )
        answer: List[bool] = []
        thread = threading.Thread(
            target=lambda: answer.append(store.owns(first, T + 50, connection=conn_a)),
            daemon=True,
        )
        thread.start()
        thread.join(0.5)
        assert thread.is_alive()
        conn_b.commit()
        thread.join(10)
        assert answer == [False]
        conn_a.rollback()
    finally:
        conn_a.close()
        conn_b.close()


# -- legacy tables and missing schema --------------------------------------------------------
def test_legacy_table_without_claim_id(pg_dsn: str, pg_table: str) -> None:
    legacy_table(pg_dsn, pg_table)
    with PostgresUpdateStore(pg_dsn, pg_table, create_table=False) as s:
        # the base methods (and the legacy-safe batches) work
        assert s.add(2**40, "b", T) is True
        assert s.add_many([(1, "x", T), (2**40, "y", T)]) == [True, False]
        assert s.claim(2**40, now=T, lease_until=T + 100, max_attempts=2) == 1
        assert s.renew(2**40, 1, T + 200, T + 100) is True
        assert s.renew_many([(2**40, 1), (1, 1)], T + 300, T) == [True, False]
        s.settle(2**40, 1, Failed(T + 300, T + 400, "x"))
        assert [u.update_id for u in s.due(now=T + 400, pending_before=T, limit=5)] == [1, 2**40]
        assert s.claim(2**40, now=T + 400, lease_until=T + 500, max_attempts=2) == 2
        s.settle(2**40, 2, Completed(T + 450))
        assert s.prune(T + 451) == 1
        assert s.claim(1, now=T, lease_until=T, max_attempts=0) is None  # spend, not durable
        assert rows(pg_dsn, pg_table)[1][1:5] == ("abandoned", 0, T, T)
        # everything that needs claim_id names the migration
        s.add(7, "b", T)
        identity = AttemptIdentity(7, 1, "c")
        calls = [
            lambda: s.claim(7, now=T, lease_until=T + 1, max_attempts=2, durable_exhaustion=True),
            lambda: s.claim_owned(7, now=T, lease_until=T + 1, max_attempts=2),
            lambda: s.renew_owned(identity, T + 5, T),
            lambda: s.renew_owned_many([identity], T + 5, T),
            lambda: s.owns(identity, T),
            lambda: s.settle_owned(identity, Completed(T)),
            lambda: s.exhaust(identity, at=T, error="x"),
            lambda: s.due_exhaustions(limit=5),
            lambda: s.acknowledge_exhaustion(identity, T),
        ]
        for call in calls:
            with pytest.raises(SchemaError, match="postgres_update_store_schema"):
                call()
        with s.transaction() as conn:
            with pytest.raises(SchemaError, match="postgres_update_store_schema"):
                s.owns(identity, T, connection=conn)
        assert rows(pg_dsn, pg_table)[7][1] == "pending"  # nothing was claimed
        for _ in range(2):
            execute(pg_dsn, postgres_update_store_schema(pg_table))
        claimed_7 = s.claim_owned(7, now=T, lease_until=T + 10, max_attempts=2)
        assert claimed_7 is not None and s.owns(claimed_7, T + 10)
        assert s.exhaust(claimed_7, at=T + 10, error="e")
        assert s.due_exhaustions(limit=5)[0].identity == claimed_7
        assert s.acknowledge_exhaustion(claimed_7, T + 20)
        got = rows(pg_dsn, pg_table)[7]
        assert got[3:6] == (T + 10, T, T + 20)
        assert all(type(v) is int for v in got[3:6])


def test_unary_handling_on_a_legacy_table_claims_with_the_base_claim(
    pg_dsn: str, pg_table: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Unary handling claims with claim ids where the store isolates suspects; a table
    without ``claim_id`` (``create_table=False``) refuses that, once, and the runtime claims
    with the base ``claim`` from then on: every update is handled, no store error."""
    from ptb_fence.testing import make_message_update

    legacy_table(pg_dsn, pg_table)
    handled: List[int] = []
    errors: List[Tuple[str, BaseException]] = []
    with PostgresUpdateStore(pg_dsn, pg_table, create_table=False) as s:
        intake = UpdateIntake(
            s,
            handle=lambda update: handled.append(update["update_id"]),
            on_store_error=lambda error, step: errors.append((step, error)),
        )
        with caplog.at_level(logging.INFO, logger="ptb_fence"):
            intake.start()
            try:
                for update_id in (1, 2, 3):
                    intake.accept(json.dumps(make_message_update(update_id, 1, "x")))
                deadline = time.monotonic() + 20
                while len(handled) < 3 and time.monotonic() < deadline:
                    time.sleep(0.02)
            finally:
                intake.close()
    assert sorted(handled) == [1, 2, 3]
    assert errors == []
    assert {u: r[1:3] for u, r in rows(pg_dsn, pg_table).items()} == {
        u: ("completed", 1) for u in (1, 2, 3)
    }
    assert "the table has no claim_id column" in caplog.text


def test_original_table_with_claim_id_and_due_at_not_null(pg_dsn: str, pg_table: str) -> None:
    """A table migrated halfway (claim_id, not the later columns) is refused at start with
    the fix named. Once migrated (due_at stays NOT NULL) every insert path writes due_at =
    received_at for a pending row."""
    legacy_table(pg_dsn, pg_table, claim_id=True)
    with PostgresUpdateStore(pg_dsn, pg_table, create_table=False) as s:
        for call in (lambda: s.add(1, "a", T + 1), lambda: s.due(now=T, pending_before=T, limit=1)):
            with pytest.raises(SchemaError, match="lacks fingerprint") as info:
                call()
            assert "ptb-fence" in str(info.value) and "create_table=True" in str(info.value)
    assert rows(pg_dsn, pg_table) == {}
    execute(pg_dsn, postgres_update_store_schema(pg_table))
    with PostgresUpdateStore(pg_dsn, pg_table, create_table=False) as s:
        assert s.add(1, "a", T + 1) is True
        assert s.add_many([(2, "b", T + 2), (3, "c", T + 3)]) == [True, True]
        terms = ClaimTerms(T, T + 900, 5)
        (identity,) = s.commit(Batch(terms, claimed_records=((4, "d", T + 4),))).claimed_records
        assert identity is not None
        got_back = s.commit(Batch(
            terms, claimed_records=((5, "e", T + 5),),
            settlements=((identity, Completed(T + 450)),),
        ))
        assert got_back.claimed_records[0] is not None and got_back.landed == (True,)
        got = rows(pg_dsn, pg_table)
        assert [got[u][3] for u in (1, 2, 3)] == [T + 1, T + 2, T + 3]
        assert got[4][3] == T + 900 and got[5][3] == T + 900
        due = s.due(now=T + 800, pending_before=T + 2, limit=10)
        assert [u.update_id for u in due] == [1, 2]
        assert s.claim(1, now=T + 1000, lease_until=T + 2000, max_attempts=5) == 1


def test_create_table_upgrades_a_legacy_table(pg_dsn: str, pg_table: str) -> None:
    legacy_table(pg_dsn, pg_table)
    execute(
        pg_dsn,
        f"INSERT INTO \"{pg_table}\" VALUES (1, 'b', 'pending', 0, {T}, {T}, NULL, NULL)",
    )
    with PostgresUpdateStore(pg_dsn, pg_table) as s:
        identity = s.claim_owned(1, now=T, lease_until=T + 5, max_attempts=3)
        assert identity is not None and identity.attempt == 1


def test_table_without_isolated_claim_is_refused_until_migrated(
    pg_dsn: str, pg_table: str
) -> None:
    """A table migrated before ``isolated_claim`` existed, managed with create_table=False, is
    refused at start (no reduced statements) until the migration adds the column."""
    execute(pg_dsn, postgres_update_store_schema(pg_table))
    execute(pg_dsn, f'ALTER TABLE "{pg_table}" DROP COLUMN isolated_claim')
    with PostgresUpdateStore(pg_dsn, pg_table, create_table=False) as s:
        with pytest.raises(SchemaError, match="lacks isolated_claim"):
            s.add_many([(1, "a", T)])
        with pytest.raises(SchemaError, match="lacks isolated_claim"):
            s.hold_liveness()
        execute(pg_dsn, postgres_update_store_schema(pg_table))
        s.hold_liveness()
        assert s.add_many([(1, "a", T), (2, "b", T)]) == [True, True]
        identity = claimed(s, 1, T, T + 900)
        assert s.claimed_suspect(identity) == 0
        assert s.mark_isolated(identity, at=T + 30) is True
        assert s.settle_owned(identity, Completed(T + 40)) is True


def test_missing_table_without_create_table(pg_dsn: str, pg_table: str) -> None:
    with PostgresUpdateStore(pg_dsn, pg_table, create_table=False) as s:
        with pytest.raises(SchemaError, match="create_table") as info:
            s.add(1, "b", T)
        assert "postgres_update_store_schema" in str(info.value)
        with pytest.raises(SchemaError):
            s.renew(1, 1, T)
    assert execute(pg_dsn, "SELECT to_regclass(%s)", (f'"{pg_table}"',)) == [(None,)]


def test_schema_is_retried_after_a_failure(pg_dsn: str, pg_table: str) -> None:
    # A view squats the name: ensuring the schema fails, then works once the view is gone.
    execute(pg_dsn, f'CREATE VIEW "{pg_table}" AS SELECT 1 AS a')
    try:
        with PostgresUpdateStore(pg_dsn, pg_table) as s:
            with pytest.raises(psycopg2.Error):
                s.add(1, "b", T)
            execute(pg_dsn, f'DROP VIEW "{pg_table}"')
            assert s.add(1, "b", T) is True
    finally:
        kind = execute(pg_dsn, "SELECT relkind FROM pg_class WHERE relname = %s", (pg_table,))
        if kind == [("v",)]:
            execute(pg_dsn, f'DROP VIEW "{pg_table}"')


def test_concurrent_schema_creation(pg_dsn: str, pg_table: str) -> None:
    stores = [PostgresUpdateStore(pg_dsn, pg_table) for _ in range(8)]
    barrier = threading.Barrier(len(stores))

    def first_use(index: int) -> bool:
        barrier.wait(10)
        return stores[index].add(index, "b", T)

    try:
        with ThreadPoolExecutor(len(stores)) as pool:
            assert list(pool.map(first_use, range(len(stores)))) == [True] * len(stores)
    finally:
        for s in stores:
            s.close()


# -- pool, renewal connection, faults --------------------------------------------------------
def test_small_pool_makes_callers_wait(pg_dsn: str, pg_table: str) -> None:
    with PostgresUpdateStore(pg_dsn, pg_table, pool_size=2, pool_timeout=20) as s:

        def work(index: int) -> int:
            done = 0
            for k in range(5):
                u = index * 100 + k
                assert s.add(u, "b", T)
                identity = claimed(s, u, T, T + 100)
                with s.transaction() as conn:
                    assert s.owns(identity, T + 1, connection=conn)
                    assert s.settle_owned(identity, Completed(T + 1), connection=conn)
                done += 1
            return done

        with ThreadPoolExecutor(16) as pool:
            assert sum(pool.map(work, range(16))) == 80
        states = [r[1] for r in rows(pg_dsn, pg_table).values()]
        assert states == ["completed"] * 80


def test_store_busy_and_renewal_while_pool_is_exhausted(pg_dsn: str, pg_table: str) -> None:
    with PostgresUpdateStore(pg_dsn, pg_table, pool_size=2, pool_timeout=0.3) as s:
        s.add(1, "b", T)
        s.add(2, "b", T)
        identity = claimed(s, 1, T, T + 100)
        assert s.claim(2, now=T, lease_until=T + 100, max_attempts=5) == 1
        with s.transaction(), s.transaction():
            started = time.monotonic()
            with pytest.raises(StoreBusy, match="pool_timeout"):
                s.add(3, "b", T)
            assert 0.25 <= time.monotonic() - started < 5
            # renewals use their own connection
            assert s.renew_owned(identity, T + 200, T + 50) is True
            assert s.renew(2, 1, T + 200, T + 50) is True
            assert s.renew_many([(2, 1)], T + 300, T + 50) == [True]
            assert s.renew_owned_many([identity], T + 300, T + 50) == [True]
        assert s.add(3, "b", T) is True
        assert rows(pg_dsn, pg_table)[1][3] == T + 300


def test_terminated_connections_are_replaced(pg_dsn: str, pg_table: str) -> None:
    app = "ptbf_" + uuid.uuid4().hex[:12]
    with PostgresUpdateStore(with_app(pg_dsn, app), pg_table, pool_size=4) as s:
        with s.transaction(), s.transaction(), s.transaction():
            pass  # three pooled connections, now idle
        s.add(1, "b", T)
        identity = claimed(s, 1, T, T + 100)
        assert s.renew_owned(identity, T + 200, T)  # the renewal connection
        assert kill(pg_dsn, app) >= 4
        # every idle connection is dead: the next calls discard them and reconnect
        assert s.add(2, "c", T) is True
        assert s.renew_owned(identity, T + 300, T) is True
        assert s.owns(identity, T + 300) is True
        assert [u.update_id for u in s.due(now=T, pending_before=T, limit=9)] == [2]
        # killed inside a transaction: the write does not happen, and is not reported
        with pytest.raises(psycopg2.OperationalError):
            with s.transaction() as conn:
                assert s.owns(identity, T + 1, connection=conn)
                kill(pg_dsn, app)
                s.settle_owned(identity, Completed(T + 1), connection=conn)
        assert rows(pg_dsn, pg_table)[1][1] == "processing"
        assert s.settle_owned(identity, Completed(T + 1)) is True
        kill(pg_dsn, app)
        assert s.renew_many([(2, 1)], T, T) == [False]
        assert s.add_many([(3, "d", T)]) == [True]
        assert set(rows(pg_dsn, pg_table)) == {1, 2, 3}


def test_connections_killed_under_load_lose_nothing(pg_dsn: str, pg_table: str) -> None:
    app = "ptbf_" + uuid.uuid4().hex[:12]
    with PostgresUpdateStore(with_app(pg_dsn, app), pg_table, pool_size=3) as s:
        s.add(0, "warm", T)
        stop = threading.Event()
        reported: Dict[int, bool] = {}
        lock = threading.Lock()

        def producer(index: int) -> None:
            for k in range(60):
                u = 1 + index * 1000 + k
                while True:  # redelivery until the store answers
                    try:
                        inserted = s.add(u, "b", T)
                    except psycopg2.Error:
                        continue
                    with lock:
                        reported[u] = reported.get(u, False) or inserted
                    break

        def killer() -> None:
            while not stop.is_set():
                execute(
                    pg_dsn,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                    "datname = current_database() AND application_name = %s",
                    (app,),
                )
                time.sleep(0.03)

        k = threading.Thread(target=killer, daemon=True)
        k.start()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(producer, range(4)))
        stop.set()
        k.join(5)
        stored = set(rows(pg_dsn, pg_table))
        assert set(reported) <= stored  # nothing lost
        assert len(reported) == 240
        # each id is reported inserted exactly once unless a commit broke (outcome unknown)
        assert s.add(0, "again", T) is False


def test_concurrent_claims_have_one_winner(store: PostgresUpdateStore) -> None:
    for round_ in range(4):
        u = 10 + round_
        store.add(u, "b", T)
        barrier = threading.Barrier(12)

        def race(_: int, u: int = u) -> Any:
            barrier.wait(10)
            if round_ % 2:
                return store.claim(u, now=T, lease_until=T + 100, max_attempts=5)
            return store.claim_owned(u, now=T, lease_until=T + 100, max_attempts=5)

        with ThreadPoolExecutor(12) as pool:
            results = list(pool.map(race, range(12)))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
    # a lapsed lease is taken over by exactly one as well
    barrier = threading.Barrier(12)

    def takeover(_: int) -> Optional[AttemptIdentity]:
        barrier.wait(10)
        return store.claim_owned(10, now=T + 101, lease_until=T + 200, max_attempts=5)

    with ThreadPoolExecutor(12) as pool:
        results2 = [r for r in pool.map(takeover, range(12)) if r is not None]
    assert len(results2) == 1 and results2[0].attempt == 2


# -- secrets, user pools, lifecycle ----------------------------------------------------------
SECRET = "S3cr3tPassw0rd"


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://postgres:{SECRET}@127.0.0.1:1/test",
        f"host=127.0.0.1 port=1 dbname=test user=postgres password={SECRET}",
        f"postgresql://postgres@127.0.0.1:1/test?password={SECRET}",
        "REAL_SERVER",  # the server itself refuses: an unknown role
    ],
)
def test_errors_never_show_the_password(dsn: str, pg_dsn: str, pg_table: str) -> None:
    if dsn == "REAL_SERVER":
        params = psycopg2.extensions.parse_dsn(pg_dsn)
        params.update(user="no_such_role_" + uuid.uuid4().hex[:8], password=SECRET)
        dsn = " ".join(f"{k}={v}" for k, v in params.items())
    s = PostgresUpdateStore(dsn, pg_table, pool_timeout=2)
    assert SECRET not in repr(s) and SECRET not in str(s)
    for call in (lambda: s.add(1, "b", T), lambda: s.renew(1, 1, T, T)):
        with pytest.raises(psycopg2.OperationalError) as info:
            call()
        text = "".join(traceback.format_exception(info.value))
        assert SECRET not in text and SECRET not in repr(info.value)
        assert "could not connect" in str(info.value)
    s.close()


@pytest.mark.parametrize(
    "dsn",
    [f"host=127.0.0.1 password={SECRET} {SECRET}x", f"host=127.0.0.1 password='{SECRET}"],
)
def test_malformed_dsn_is_refused_without_the_password(dsn: str) -> None:
    with pytest.raises(ValueError, match="invalid PostgreSQL DSN") as info:
        PostgresUpdateStore(dsn)
    assert SECRET not in "".join(traceback.format_exception(info.value))


def test_user_pool_errors_never_show_the_password(pg_table: str) -> None:
    pool = psycopg2.pool.ThreadedConnectionPool(
        0, 2, host="127.0.0.1", port=1, dbname="test", user="postgres", password=SECRET
    )
    s = PostgresUpdateStore(pool, pg_table)
    for call in (lambda: s.add(1, "b", T), lambda: s.renew(1, 1, T, T)):
        with pytest.raises(psycopg2.OperationalError) as info:
            call()
        assert SECRET not in "".join(traceback.format_exception(info.value))
    s.close()


def test_user_pool(pg_dsn: str, pg_table: str) -> None:
    app = "ptbf_" + uuid.uuid4().hex[:12]
    pool = psycopg2.pool.ThreadedConnectionPool(1, 2, with_app(pg_dsn, app))
    try:
        s = PostgresUpdateStore(pool, pg_table, pool_timeout=0.3)
        assert "pool_size=2" in repr(s)
        s.add(1, "b", T)
        identity = claimed(s, 1, T, T + 100)
        held = pool.getconn()  # someone else uses the same pool
        with s.transaction():
            with pytest.raises(StoreBusy):
                s.add(2, "b", T)
            assert s.renew_owned(identity, T + 200, T)  # own connection, same arguments
        pool.putconn(held)
        assert s.settle_owned(identity, Completed(T + 5)) is True
        kill(pg_dsn, app)
        assert s.add(2, "b", T) is True  # a dead pooled connection is replaced
        s.close()
        assert not pool.closed  # the caller's pool stays open
        conn = pool.getconn()
        pool.putconn(conn)
    finally:
        pool.closeall()


def test_close(pg_dsn: str, pg_table: str) -> None:
    app = "ptbf_" + uuid.uuid4().hex[:12]
    s = PostgresUpdateStore(with_app(pg_dsn, app), pg_table)
    s.add(1, "b", T)
    s.renew(1, 1, T)
    assert backends(pg_dsn, app) == 2
    with s.transaction() as conn:
        s.close()
        s.close()
    assert conn.closed
    # a backend leaves pg_stat_activity a moment after its client closed the connection
    deadline = time.monotonic() + 5
    while backends(pg_dsn, app) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert backends(pg_dsn, app) == 0
    with pytest.raises(RuntimeError, match="closed"):
        s.add(2, "b", T)
    with pytest.raises(RuntimeError, match="closed"):
        s.renew(1, 1, T)
