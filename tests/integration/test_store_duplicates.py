"""Same update_id with a different body (never silent), and one table per bot.

Every test runs on the three stores: memory, a real SQLite file and real PostgreSQL.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from typing import Any, Callable, Dict, List, Tuple

import psycopg2
import pytest
from telegram import Update

import ptb_fence
from ptb_fence import (
    Abandoned,
    AttemptIdentity,
    Batch,
    ClaimTerms,
    Completed,
    Failed,
    MemoryUpdateStore,
    PostgresUpdateStore,
    SchemaError,
    SQLiteUpdateStore,
)
from ptb_fence._fingerprint import update_fingerprint

pytestmark = pytest.mark.timeout(60)

T = 1_700_000_000_000
LEASE = 60_000


def body(update_id: int, date: int = 1_700_000_000, text: str = "hi") -> str:
    """An update; another ``date`` makes another message (another message id too)."""
    return json.dumps({"update_id": update_id, "message": {
        "message_id": date - 1_699_999_000, "date": date, "text": text,
        "chat": {"id": 5, "type": "private", "first_name": "A"},
        "from": {"id": 5, "is_bot": False, "first_name": "A"}}})


Factory = Callable[[], Any]


def row_of(store: Any, update_id: int) -> Dict[str, Any]:
    """The row through the store's public API (due/exhaustions) is not enough: read it raw."""
    if isinstance(store, MemoryUpdateStore):
        return dict(vars(store._rows[update_id]))  # the executable model's own row
    if isinstance(store, SQLiteUpdateStore):
        with store.transaction() as conn:
            cur = conn.execute(f'SELECT * FROM "{store.table}" WHERE update_id = ?', (update_id,))
            names = [d[0] for d in cur.description]
            return dict(zip(names, cur.fetchone()))
    with store.transaction() as conn:
        with conn.cursor() as cur:
            cur.execute(f'SELECT * FROM "{store.table}" WHERE update_id = %s', (update_id,))
            names = [d[0] for d in cur.description]
            return dict(zip(names, cur.fetchone()))


def claimed_records(store: Any, rows: List[Tuple[int, str, int]], lease_until: int) -> List[Any]:
    """The identities of a ``commit`` of ``rows`` as claimed records with ``lease_until``."""
    terms = ClaimTerms(T, lease_until, 5)
    return list(store.commit(Batch(terms, claimed_records=tuple(rows))).claimed_records)


def settled_states(store: Any) -> Dict[str, int]:
    """Rows 1..3: completed, ordinary abandoned, acknowledged exhaustion."""
    for update_id in (1, 2, 3):
        assert store.add(update_id, body(update_id), T)
    one = store.claim_owned(1, now=T, lease_until=T + LEASE, max_attempts=5)
    assert store.settle_owned(one, Completed(at=T + 1))
    two = store.claim_owned(2, now=T, lease_until=T + LEASE, max_attempts=5)
    assert store.settle_owned(two, Abandoned(at=T + 1, error="gave up"))
    three = store.claim_owned(3, now=T, lease_until=T + LEASE, max_attempts=5)
    assert store.exhaust(three, at=T + 1, error="boom")
    (exhaustion,) = store.due_exhaustions(limit=5)
    assert store.acknowledge_exhaustion(exhaustion.identity, T + 2)
    return {"completed": 1, "abandoned": 2, "acknowledged": 3}


def test_same_update_again_changes_nothing(shared_stores: Factory) -> None:
    store = shared_stores()
    settled_states(store)
    before = {u: row_of(store, u) for u in (1, 2, 3)}
    for update_id in (1, 2, 3):
        assert store.add(update_id, body(update_id), T + 500) is False
        # PTB's serialization of the same update is the same update
        ptb_body = Update.de_json(json.loads(body(update_id)), None).to_json()  # type: ignore
        assert ptb_body != body(update_id)
        assert store.add(update_id, ptb_body, T + 500) is False
        assert store.add_many([(update_id, ptb_body, T + 500)]) == [False]
        assert claimed_records(store, [(update_id, ptb_body, T + 500)], T + 900) == [None]
    assert {u: row_of(store, u) for u in (1, 2, 3)} == before


@pytest.mark.parametrize("path", ["add", "add_many", "claimed_records", "claimed_and_settle"])
def test_settled_row_is_replaced_by_a_different_update(shared_stores: Factory, path: str) -> None:
    store = shared_stores()
    for update_id in settled_states(store).values():
        new = body(update_id, date=1_800_000_000, text="new")
        received = T + 1000 + update_id
        if path == "add":
            assert store.add(update_id, new, received) is True
        elif path == "add_many":
            assert store.add_many([(update_id, new, received)]) == [True]
        else:
            if path == "claimed_records":
                (identity,) = claimed_records(store, [(update_id, new, received)], T + 9000)
            else:  # with a settlement that does not land
                stranger = AttemptIdentity(99, 1, "not-a-claim")
                got = store.commit(Batch(
                    ClaimTerms(T, T + 9000, 5), claimed_records=((update_id, new, received),),
                    settlements=((stranger, Completed(at=T + 1000)),),
                ))
                (identity,) = got.claimed_records
                assert got.landed == (False,)
            assert identity is not None and identity.attempt == 1
            assert store.owns(identity, T + 9000) is True
        row = row_of(store, update_id)
        assert row["body"] == new and row["received_at"] == received
        assert row["settled_at"] is None and row["error"] is None
        if path in ("add", "add_many"):
            assert (row["state"], row["attempts"], row["due_at"]) == ("pending", 0, received)
            identity = store.claim_owned(update_id, now=T + 2000, lease_until=T + 3000,
                                         max_attempts=5)
            assert identity is not None and identity.attempt == 1
        else:
            assert (row["state"], row["attempts"], row["due_at"]) == ("processing", 1, T + 9000)
        # and that new update is now a plain duplicate of itself
        assert store.add(update_id, new, T + 5000) is False


def test_live_row_keeps_the_first_and_warns(shared_stores: Factory, caplog: Any) -> None:
    store = shared_stores()
    for update_id in (1, 2, 3, 4):
        assert store.add(update_id, body(update_id), T)
    # 1 pending; 2 processing; 3 failed; 4 unacknowledged exhaustion
    two = store.claim_owned(2, now=T, lease_until=T + LEASE, max_attempts=5)
    three = store.claim_owned(3, now=T, lease_until=T + LEASE, max_attempts=5)
    assert store.settle_owned(three, Failed(at=T + 1, retry_at=T + 99, error="x"))
    four = store.claim_owned(4, now=T, lease_until=T + LEASE, max_attempts=5)
    assert store.exhaust(four, at=T + 1, error="boom")
    before = {u: row_of(store, u) for u in (1, 2, 3, 4)}
    caplog.set_level(logging.WARNING, logger="ptb_fence.store")
    for update_id in (1, 2, 3, 4):
        new = body(update_id, date=1_800_000_000)
        caplog.clear()
        assert store.add(update_id, new, T + 500) is False
        assert store.add_many([(update_id, new, T + 500)]) == [False]
        assert claimed_records(store, [(update_id, new, T + 500)], T + 900) == [None]
        records = [r for r in caplog.records if r.name == "ptb_fence.store"]
        assert len(records) == 3, [r.getMessage() for r in caplog.records]
        message = records[0].getMessage()
        assert records[0].levelno == logging.WARNING
        assert str(update_id) in message
        assert update_fingerprint(body(update_id)) in message
        assert update_fingerprint(new) in message
    assert {u: row_of(store, u) for u in (1, 2, 3, 4)} == before
    assert store.owns(two, T + 1)


# -- one table per bot ------------------------------------------------------------------------
def test_bind_bot_first_binder_wins(shared_stores: Factory) -> None:
    store = shared_stores()
    store.bind_bot(111)
    store.bind_bot(111)  # the same bot again: a no-op
    other = shared_stores()
    other.bind_bot(111)
    with pytest.raises(ptb_fence.TableBotMismatch) as info:
        other.bind_bot(222)
    assert isinstance(info.value, RuntimeError)
    message = str(info.value)
    assert "111" in message and "222" in message and "one table per bot" in message
    assert "table=" in message
    store.bind_bot(111)


@pytest.mark.parametrize("same", [True, False])
def test_bind_bot_race(shared_stores: Factory, same: bool) -> None:
    stores = [shared_stores() for _ in range(6)]
    barrier = threading.Barrier(len(stores))
    outcome: List[Any] = [None] * len(stores)

    def bind(index: int) -> None:
        barrier.wait(10)
        try:
            stores[index].bind_bot(500 if same else 500 + index)
            outcome[index] = "ok"
        except ptb_fence.TableBotMismatch:
            outcome[index] = "mismatch"
        except BaseException as exc:  # pragma: no cover - reported below
            outcome[index] = exc

    threads = [threading.Thread(target=bind, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    if same:
        assert outcome == ["ok"] * len(stores)
    else:
        assert outcome.count("ok") == 1 and outcome.count("mismatch") == len(stores) - 1, outcome


def test_postgres_table_with_claim_id_but_no_fingerprint_is_refused(
    pg_dsn: str, pg_table: str
) -> None:
    """A table migrated halfway (claim_id, no fingerprint) managed with create_table=False is
    refused at start, naming the migration. Nothing is written."""
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                f'CREATE TABLE "{pg_table}" (update_id BIGINT PRIMARY KEY, body TEXT NOT NULL, '
                "state TEXT NOT NULL, attempts INT NOT NULL DEFAULT 0, due_at BIGINT NOT NULL, "
                "received_at BIGINT NOT NULL, settled_at BIGINT, error TEXT, claim_id TEXT)"
            )
        conn.commit()
    finally:
        conn.close()
    with PostgresUpdateStore(pg_dsn, pg_table, create_table=False) as store:
        for call in (
            lambda: store.add(1, body(1), T),
            lambda: store.add_many([(2, body(2), T)]),
            lambda: claimed_records(store, [(3, body(3), T)], T + 10),
        ):
            with pytest.raises(SchemaError, match="lacks fingerprint") as info:
                call()
            assert "migrate" in str(info.value) and "create_table=True" in str(info.value)
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'SELECT count(*) FROM "{pg_table}"')
            assert cur.fetchone()[0] == 0
    finally:
        conn.close()
