"""Graceful stop, store side: ``release_many`` (give claims back at once without spending the
attempt) on the three stores, and the port's fallback for a store without it."""

from __future__ import annotations

from typing import Any, List

from broken_stores import FencedOnlyStore
from store_support import fresh_table_name
from ptb_fence import AttemptIdentity, Batch, ClaimTerms, Completed, MemoryUpdateStore
from ptb_fence.runtime._port import StorePort

T = 1_700_000_000_000
L = 60_000


def claimed(store: Any, update_id: int, lease_until: int = T + L) -> AttemptIdentity:
    assert store.add(update_id, f"body-{update_id}", T)
    identity = store.claim_owned(update_id, now=T, lease_until=lease_until, max_attempts=3)
    assert identity is not None
    return identity


def test_release_gives_the_claim_back_without_spending_the_attempt(store: Any) -> None:
    a, b = claimed(store, 1), claimed(store, 2)
    assert store.release_many([a, b], at=T + 10) == [True, True]
    # refused at once: the row is no longer processing
    assert not store.owns(a, T + 10)
    assert not store.renew_owned(a, T + 2 * L, T + 10)
    assert not store.settle_owned(a, Completed(at=T + 10))
    # listed at once, whatever pending_before (received long before, pending_before earlier)
    assert [u.update_id for u in store.due(now=T + 10, pending_before=T - 1, limit=10)] == [1, 2]
    # the next claim: same attempt number, fresh claim id; then the old identity stays refused
    again = store.claim_owned(1, now=T + 11, lease_until=T + L, max_attempts=1)
    assert again is not None and again.attempt == a.attempt == 1
    assert again.claim_id != a.claim_id
    assert not store.owns(a, T + 11) and store.owns(again, T + 11)
    assert store.release_many([a], at=T + 12) == [False]
    # a second attempt released twice over: attempts never go below what was spent
    assert store.release_many([again], at=T + 12) == [True]
    third = store.claim_owned(1, now=T + 13, lease_until=T + L, max_attempts=3)
    assert third is not None and third.attempt == 1


def test_release_refuses_what_it_does_not_own(store: Any) -> None:
    a = claimed(store, 1)
    done = claimed(store, 2)
    assert store.settle_owned(done, Completed(at=T + 1))
    lapsed = claimed(store, 3, lease_until=T + 5)
    wrong = AttemptIdentity(1, a.attempt, a.claim_id + "x")
    other_attempt = AttemptIdentity(1, a.attempt + 1, a.claim_id)
    got = store.release_many(
        [wrong, other_attempt, done, AttemptIdentity(404, 1, "nope"), lapsed, a, a], at=T + 10
    )
    assert got == [False, False, False, False, True, True, False]
    assert store.owns(a, T + 9) is False  # released
    assert store.release_many([], at=T) == []
    # a fresh pending row still waits for pending_before (only released rows skip it)
    assert store.add(9, "nine", T + 100)
    listed = [u.update_id for u in store.due(now=T + 10, pending_before=T + 99, limit=10)]
    assert listed == [1, 3]


def test_error_is_kept_by_a_release(store: Any) -> None:
    from ptb_fence import Failed

    a = claimed(store, 1)
    assert store.settle_owned(a, Failed(at=T + 1, retry_at=T + 2, error="boom"))
    b = store.claim_owned(1, now=T + 3, lease_until=T + L, max_attempts=5)
    assert b is not None and b.attempt == 2
    assert store.release_many([b], at=T + 4) == [True]
    c = store.claim_owned(1, now=T + 5, lease_until=T + L, max_attempts=2)
    assert c is not None and c.attempt == 2, "the released second attempt was counted as spent"


def test_port_uses_release_many_and_reports_it() -> None:
    store = MemoryUpdateStore()
    port = StorePort(store, component="test", fenced=True)
    assert port.releases
    a = claimed(store, 1)
    assert port.release_many([a], T + 1) == [True]
    assert port.release_many([], T + 1) == []


def test_port_falls_back_for_a_store_without_release() -> None:
    store = FencedOnlyStore()
    port = StorePort(store, component="test", fenced=True)
    assert not port.releases
    assert store.add(1, "b", T)
    a = store.claim_owned(1, now=T, lease_until=T + L, max_attempts=3)
    assert a is not None
    assert port.release_many([a], T + 1) == [False]
    assert store.owns(a, T + 1), "the fallback must leave the claim as it is (lease holds)"


def test_port_liveness_fallbacks() -> None:
    port = StorePort(FencedOnlyStore(), component="test", fenced=True)
    assert not port.has_liveness
    assert port.hold_liveness() is None
    port.release_liveness()
    assert port.take_over_dead(T) == 0
    live = StorePort(MemoryUpdateStore(), component="test", fenced=True)
    assert live.has_liveness
    instance = live.hold_liveness()
    assert isinstance(instance, str) and instance and live.hold_liveness() == instance
    assert live.take_over_dead(T) == 0
    live.release_liveness()


def test_postgres_table_migrated_before_liveness_is_refused_until_migrated(
    pg_dsn: str, pg_tables: List[str]
) -> None:
    """A table with claim_id and fingerprint but without the instance column, managed with
    create_table=False, is refused at start naming the migration. Once migrated, claims,
    release and due work."""
    import psycopg2
    import pytest

    from ptb_fence import PostgresUpdateStore, SchemaError, postgres_update_store_schema

    table = fresh_table_name()
    pg_tables.append(table)
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                f'CREATE TABLE "{table}" (update_id BIGINT PRIMARY KEY, body TEXT NOT NULL, '
                "state TEXT NOT NULL, attempts INT NOT NULL DEFAULT 0, due_at BIGINT, "
                "received_at BIGINT NOT NULL, settled_at BIGINT, error TEXT, claim_id TEXT, "
                "fingerprint TEXT)"
            )
    finally:
        conn.close()
    with PostgresUpdateStore(pg_dsn, table=table, create_table=False) as store:
        with pytest.raises(SchemaError, match="lacks instance, isolated_claim, chat_key"):
            store.add(1, '{"update_id": 1}', T)
        with pytest.raises(SchemaError, match="migrate"):
            store.take_over_dead(now=T)
        conn = psycopg2.connect(pg_dsn)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(postgres_update_store_schema(table))
        finally:
            conn.close()
        a = claimed(store, 1)
        assert store.claim(2, now=T, lease_until=T + L, max_attempts=3) is None  # unknown
        got = store.commit(Batch(
            ClaimTerms(T, T + L, 3), claimed_records=((3, '{"update_id": 3}', T),)
        )).claimed_records
        assert got[0] is not None and got[0].attempt == 1
        assert store.release_many([a], at=T + 1) == [True]
        assert [u.update_id for u in store.due(now=T + 1, pending_before=T - 1, limit=9)] == [1]
        assert store.take_over_dead(now=T + 2) == 0
