"""PostgresUpdateStore on an application's connections: a SQLAlchemy Engine (the store borrows
its pooled connections, opens no pool of its own) or a connection factory, against the real
PostgreSQL server."""

from __future__ import annotations

import time
import uuid
from typing import Any, Dict, List

import psycopg2
import pytest
import sqlalchemy

from ptb_fence import Completed, PostgresUpdateStore, UsageError

T = 1_700_000_000_000


def backends(dsn: str, name: str) -> List[str]:
    """The states of the server's backends whose application_name is ``name``."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT state FROM pg_stat_activity WHERE application_name = %s",
                        (name,))
            return [str(row[0]) for row in cur.fetchall()]
    finally:
        conn.close()


def settled_backends(dsn: str, name: str, expected: int, timeout: float = 10.0) -> List[str]:
    """``backends`` once their number is ``expected`` (a closed connection's backend leaves
    the server's list a moment after the client closed it), or as they are at the deadline."""
    deadline = time.monotonic() + timeout
    found = backends(dsn, name)
    while len(found) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
        found = backends(dsn, name)
    return found


def exercise(store: PostgresUpdateStore) -> None:
    """Pooled work, the renewal connection and the liveness connection."""
    assert store.add(1, '{"update_id": 1}', T)
    assert store.add(2, '{"update_id": 2}', T)
    identity = store.claim_owned(1, now=T, lease_until=T + 60_000, max_attempts=3)
    assert identity is not None
    assert store.renew_many([(1, 1)], T + 120_000, T + 1) == [True]
    assert store.settle_owned(identity, Completed(T + 2))
    assert [u.update_id for u in store.due(now=T + 3, pending_before=T + 3, limit=10)] == [2]
    assert store.hold_liveness()


def engine_url(dsn: str) -> str:
    return dsn.replace("postgresql://", "postgresql+psycopg2://", 1)


def test_an_engine_lends_its_pool_and_the_store_opens_none(pg_dsn: str, pg_table: str) -> None:
    name = "ptb-engine-" + uuid.uuid4().hex[:8]
    engine = sqlalchemy.create_engine(
        engine_url(pg_dsn), pool_size=2, max_overflow=0,
        connect_args={"application_name": name},
    )
    opened: List[Any] = []
    sqlalchemy.event.listen(engine, "connect", lambda conn, record: opened.append(conn))
    store = PostgresUpdateStore(engine, pg_table)
    try:
        exercise(store)
        # every connection the store used was made by the engine (its events ran): the
        # renewal and liveness connections are detached from its pool (an idle pooled one
        # may become one), the rest were given back
        assert len(opened) >= 2, len(opened)
        assert engine.pool.checkedout() == 0
        assert engine.pool.checkedin() <= 2
        states = backends(pg_dsn, name)
        assert len(states) == len(opened) and "idle in transaction" not in states, states
        # the application keeps using the same pool meanwhile
        with engine.connect() as conn:
            assert conn.execute(sqlalchemy.text(f'SELECT count(*) FROM "{pg_table}"')).scalar() == 2
    finally:
        store.close()
    # closing the store gives the dedicated connections up and leaves the engine working
    pooled = engine.pool.checkedin()
    assert len(settled_backends(pg_dsn, name, pooled)) == pooled
    with engine.connect() as conn:
        assert conn.execute(sqlalchemy.text("SELECT 1")).scalar() == 1
    engine.dispose()
    assert settled_backends(pg_dsn, name, 0) == []


def test_a_store_on_a_busy_engine_waits_then_reports_busy(pg_dsn: str, pg_table: str) -> None:
    engine = sqlalchemy.create_engine(engine_url(pg_dsn), pool_size=1, max_overflow=0,
                                      pool_timeout=0.5)
    store = PostgresUpdateStore(engine, pg_table, pool_timeout=0.5)
    try:
        assert store.add(1, '{"update_id": 1}', T)
        held = engine.connect()  # the application holds the engine's only connection
        try:
            with pytest.raises(Exception) as caught:
                store.add(2, '{"update_id": 2}', T)
            assert type(caught.value).__name__ == "StoreBusy", caught.value
        finally:
            held.close()
        assert store.add(2, '{"update_id": 2}', T)
    finally:
        store.close()
        engine.dispose()


def test_a_connection_factory_opens_the_stores_connections(pg_dsn: str, pg_table: str) -> None:
    name = "ptb-factory-" + uuid.uuid4().hex[:8]
    calls: Dict[str, int] = {"n": 0}

    def factory() -> Any:
        calls["n"] += 1
        return psycopg2.connect(pg_dsn, application_name=name)

    store = PostgresUpdateStore(factory, pg_table, pool_size=2)
    try:
        exercise(store)
        assert 3 <= calls["n"] <= 4
        assert len(backends(pg_dsn, name)) == calls["n"]
    finally:
        store.close()
    assert settled_backends(pg_dsn, name, 0) == []


def test_engines_and_factories_the_store_cannot_use_are_refused(
    pg_dsn: str, pg_table: str
) -> None:
    with pytest.raises(UsageError, match="postgresql\\+psycopg2://"):
        PostgresUpdateStore(sqlalchemy.create_engine("sqlite://"), pg_table)
    psycopg3 = sqlalchemy.create_engine(pg_dsn.replace("postgresql://", "postgresql+psycopg://"))
    with pytest.raises(UsageError, match="runs psycopg2"):
        PostgresUpdateStore(psycopg3, pg_table)
    store = PostgresUpdateStore(lambda: object(), pg_table)
    try:
        with pytest.raises(TypeError, match="must return a new psycopg2 connection"):
            store.add(1, "{}", T)
    finally:
        store.close()
