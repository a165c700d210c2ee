"""A renewal never waits on a row lock (a fenced transaction holding its row must not stall the
lease keeper), on real PostgreSQL and SQLite."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List

import psycopg2
import pytest

import ptb_fence
from ptb_fence import AttemptIdentity, Completed, PostgresUpdateStore, SQLiteUpdateStore

pytestmark = pytest.mark.timeout(60)

T = 2**40
BOUND = 2.0  # seconds a renewal may take while another transaction holds a row lock


def bounded(call: Callable[[], Any], on_timeout: Callable[[], None]) -> Any:
    """Run ``call`` in a thread; if it is still running after 8 s, ``on_timeout`` unblocks it
    and the test fails (so that a renewal that waits on the lock cannot hang the test)."""
    out: List[Any] = []

    def run() -> None:
        try:
            out.append(("ok", call()))
        except BaseException as exc:
            out.append(("raised", exc))

    thread = threading.Thread(target=run)
    started = time.monotonic()
    thread.start()
    thread.join(8)
    if thread.is_alive():
        on_timeout()
        thread.join(10)
        pytest.fail("the renewal waited on the row lock held by another transaction")
    out.append(("elapsed", time.monotonic() - started))
    return out


# PostgreSQL only, on this test's pg_table (the tests lock its rows from their own connections).
@pytest.fixture
def pg(pg_dsn: str, pg_table: str) -> Iterator[PostgresUpdateStore]:
    with PostgresUpdateStore(pg_dsn, pg_table) as store:
        yield store


def claim(store: Any, update_id: int, lease: int = 60_000) -> AttemptIdentity:
    assert store.add(update_id, "{}", T) is True
    identity = store.claim_owned(update_id, now=T, lease_until=T + lease, max_attempts=5)
    assert identity is not None
    return identity


def test_pg_batch_renewal_skips_a_row_locked_by_a_fenced_transaction(
    pg: PostgresUpdateStore, pg_dsn: str
) -> None:
    locked, free = claim(pg, 1), claim(pg, 2)
    holder = psycopg2.connect(pg_dsn)
    try:
        assert pg.owns(locked, T + 10, connection=holder) is True  # FOR UPDATE, left open
        stranger = AttemptIdentity(1, locked.attempt, "not-the-claim")
        out = bounded(
            lambda: pg.renew_owned_many([locked, free, stranger], T + 120_000, T + 20),
            holder.rollback,
        )
        assert out[0] == ("ok", [None, True, False]), out
        assert out[1][1] < BOUND
        out = bounded(lambda: pg.renew_many([(1, 1), (2, 1), (1, 7)], T + 130_000, T + 20),
                      holder.rollback)
        assert out[0] == ("ok", [None, True, False]), out
        # a single renewal waits at most a short bound and then says why
        out = bounded(lambda: pg.renew_owned(locked, T + 120_000, T + 20), holder.rollback)
        kind, error = out[0]
        assert kind == "raised" and isinstance(error, ptb_fence.RowLocked), out
        assert "open transaction" in str(error) and out[1][1] < BOUND
        out = bounded(lambda: pg.renew(1, 1, T + 120_000, T + 20), holder.rollback)
        assert out[0][0] == "raised" and isinstance(out[0][1], ptb_fence.RowLocked), out
        # the holder settles inside its transaction and commits
        assert pg.settle_owned(locked, Completed(at=T + 30), connection=holder) is True
        holder.commit()
    finally:
        holder.close()
    assert pg.renew_owned_many([locked, free], T + 200_000, T + 40) == [False, True]
    assert pg.owns(free, T + 200_000) is True


def test_pg_batch_renewal_works_again_after_the_holder_commits(
    pg: PostgresUpdateStore, pg_dsn: str
) -> None:
    first, second = claim(pg, 1, lease=100), claim(pg, 2)
    holder = psycopg2.connect(pg_dsn)
    try:
        assert pg.owns(first, T + 10, connection=holder) is True
        out = bounded(lambda: pg.renew_owned_many([first, second], T + 50_000, T + 20),
                      holder.rollback)
        assert out[0] == ("ok", [None, True]), out
        holder.commit()
    finally:
        holder.close()
    assert pg.renew_owned_many([first, second], T + 50_000, T + 30) == [True, True]
    assert pg.owns(first, T + 50_000) is True
    # an expired lease is refused (False), locked or not
    assert pg.renew_owned_many([first], T + 90_000, T + 50_001) == [False]


def test_pg_expired_row_locked_by_another_transaction_is_refused(
    pg: PostgresUpdateStore, pg_dsn: str
) -> None:
    identity = claim(pg, 1, lease=100)
    holder = psycopg2.connect(pg_dsn)
    try:
        with holder.cursor() as cur:
            cur.execute(f'SELECT 1 FROM "{pg.table}" WHERE update_id = 1 FOR UPDATE')
        out = bounded(lambda: pg.renew_owned_many([identity], T + 9_000, T + 101),
                      holder.rollback)
        assert out[0] == ("ok", [False]), out
    finally:
        holder.rollback()
        holder.close()


def test_sqlite_long_transaction_gives_a_clear_busy_timeout_error(tmp_path: Path) -> None:
    path = str(tmp_path / "db.sqlite3")
    with SQLiteUpdateStore(path, busy_timeout=0.3) as store:
        identity = claim(store, 1)
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            assert store.owns(identity, T + 10, connection=holder) is True  # BEGIN IMMEDIATE
            out = bounded(lambda: store.renew_owned_many([identity], T + 90_000, T + 20),
                          lambda: holder.execute("ROLLBACK"))
            kind, error = out[0]
            assert kind == "raised" and isinstance(error, sqlite3.OperationalError), out
            message = str(error)
            assert "busy_timeout (0.3 s)" in message and "fenced transaction" in message
            assert path in message
        finally:
            if holder.in_transaction:
                holder.execute("ROLLBACK")
            holder.close()
        assert store.renew_owned_many([identity], T + 90_000, T + 20) == [True]


def test_pg_close_under_load_never_closes_a_connection_in_use(pg_dsn: str, pg_table: str) -> None:
    """PostgreSQL: close() while threads run statements and renewals: every call
    either completes or raises the store's clear 'closed' error, never a closed-connection
    error from psycopg2."""
    for round_ in range(3):
        store = PostgresUpdateStore(pg_dsn, pg_table, pool_size=4)
        errors: List[BaseException] = []
        stop = threading.Event()

        def load(seed: int) -> None:
            update_id = (round_ * 100 + seed) * 10**6
            try:
                while not stop.is_set():
                    update_id += 1
                    store.add(update_id, "{}", T)
                    identity = store.claim_owned(update_id, now=T, lease_until=T + 10**6,
                                                 max_attempts=5)
                    assert identity is not None
                    store.renew_owned_many([identity], T + 10**6, T)
                    with store.transaction() as conn:
                        assert store.owns(identity, T, connection=conn)
                    store.settle_owned(identity, Completed(at=T + 1))
            except RuntimeError as exc:
                if "closed" not in str(exc):
                    errors.append(exc)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=load, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        store.close()
        stop.set()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive()
        assert not errors, errors[:3]
        with pytest.raises(RuntimeError, match="closed"):
            store.add(1, "{}", T)
