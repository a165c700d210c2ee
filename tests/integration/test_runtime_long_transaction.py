"""A long fenced transaction abandons nothing (the runtime's side of a renewal that meets a
locked row; the stores' side is in test_store_renew_locks.py).

* A renewal result ``None`` (PostgreSQL ``SKIP LOCKED``: the row is locked right now) is
  undecided: neither renewed nor refused.
* An attempt inside its own fenced transaction (ownership checked; it holds the row lock) is
  never reported lost by the keeper, is not renewed meanwhile (its lock would make the renewal
  wait), and ``transaction(complete=True)`` completes even when it stayed open past the lease.
* One long ``transaction(complete=True)`` among healthy handlers (real time), on PostgreSQL
  (real connections) and the SQLite analogue: no update is abandoned.

Nothing of ptb_fence is patched; the undecided case uses a test double of the store.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

import psycopg2
import pytest

from ptb_fence import (
    OwnershipLost,
    PostgresUpdateStore,
    RuntimeOptions,
    SQLiteUpdateStore,
    UpdateIntake,
)
from ptb_fence.runtime._runtime import Runtime
from runtime_support import FakeClock, Recorder, StoreWrapper, body, row


def _runtime(store: Any, clock: Any, **options: Any) -> Runtime:
    return Runtime(
        store, RuntimeOptions(clock=clock, **options), attempt_aware=True, handle_exhaustion=False
    )


def _tick_elsewhere(runtime: Runtime, timeout: float = 3.0) -> None:
    """One keeper tick on another thread; it must not wait on a row lock."""
    thread = threading.Thread(target=runtime.keeper.tick, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the lease keeper waited on the attempt's own row lock"


# -- None: undecided -------------------------------------------------------------------------------
def test_an_undecided_renewal_neither_renews_nor_fires_owner_lost() -> None:
    store, clock = StoreWrapper(), FakeClock()
    locked: set = set()

    def renew_owned_many(original: Any, identities: Any, lease_until: int, now: int) -> List[Any]:
        identities = list(identities)
        free = [i for i in identities if i.update_id not in locked]
        results = dict(zip(free, original(free, lease_until, now)))
        return [None if i.update_id in locked else results[i] for i in identities]

    store.hooks["renew_owned_many"] = renew_owned_many
    runtime = _runtime(store, clock, lease_seconds=10)
    for uid in (1, 2):
        assert store.add(uid, body(uid), clock.ms())
    first, second = runtime.claim(1), runtime.claim(2)
    assert first is not None and second is not None
    claimed_lease = row(store, 1).due_at
    locked.add(1)
    clock.advance(5)
    runtime.keeper.tick()
    assert not first.owner_lost.is_set()  # undecided: not refused
    assert not second.owner_lost.is_set()
    assert row(store, 1).due_at == claimed_lease  # not renewed
    assert row(store, 2).due_at == clock.ms() + 10_000
    # still undecided after the last proven lease passed: the deadline decides (not holding)
    clock.advance(6)
    runtime.keeper.tick()
    assert first.owner_lost.is_set()
    assert not second.owner_lost.is_set()


# -- an attempt holding its own fenced transaction --------------------------------------------------
def _postgres(dsn: str, tables: List[str]) -> Any:
    table = "t_" + uuid.uuid4().hex[:16]
    tables.append(table)
    return PostgresUpdateStore(dsn, table)


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_complete_true_held_past_the_lease_completes_and_is_never_reported_lost(
    store: Any,
) -> None:
    clock = FakeClock()
    runtime = _runtime(store, clock, lease_seconds=10)
    assert store.add(1, body(1), clock.ms())
    attempt = runtime.claim(1)
    assert attempt is not None
    checked_at = clock.ms()
    with attempt.transaction(complete=True):
        assert attempt.holds_fence
        for _ in range(3):  # far past the lease, with keeper ticks meanwhile
            clock.advance(10)
            _tick_elsewhere(runtime)
            assert not attempt.owner_lost.is_set()
    assert not attempt.holds_fence
    assert attempt.completed and not attempt.owner_lost.is_set()
    # settled at the time of its ownership check: the row lock was held from then on
    completed = store.due(now=clock.ms() + 10**9, pending_before=clock.ms() + 10**9, limit=5)
    assert completed == []
    runtime.end(attempt)
    assert _settled_at(store, 1) == checked_at


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_plain_transaction_held_past_the_lease_is_lost_after_it_commits(store: Any) -> None:
    clock = FakeClock()
    runtime = _runtime(store, clock, lease_seconds=10)
    assert store.add(1, body(1), clock.ms())
    attempt = runtime.claim(1)
    assert attempt is not None
    with attempt.transaction():
        clock.advance(15)
        _tick_elsewhere(runtime)
        assert not attempt.owner_lost.is_set()  # holding the row lock: still owned
    _tick_elsewhere(runtime)  # committed: its lease passed, the renewal is refused
    assert attempt.owner_lost.is_set()
    with pytest.raises(OwnershipLost):
        with attempt.transaction():
            pass
    runtime.end(attempt)


def _settled_at(store: Any, update_id: int) -> Optional[int]:
    if isinstance(store, SQLiteUpdateStore):
        with store.transaction() as conn:
            found = conn.execute(
                "SELECT settled_at FROM telegram_updates WHERE update_id = ?", (update_id,)
            ).fetchone()
        return None if found is None else found[0]
    with store.transaction() as conn:
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT settled_at FROM {store.table} WHERE update_id = %s", (update_id,)
            )
            found = cur.fetchone()
    return None if found is None else int(found[0])


# -- one long transaction among healthy handlers (real time) ----------------------------------------
class Scenario:
    """One long ``transaction(complete=True)`` and healthy handlers sleeping outside one."""

    def __init__(self, long_hold: float, healthy_sleep: float, long_delay: float = 0.0) -> None:
        self.long_delay = long_delay
        self.long_hold = long_hold
        self.healthy_sleep = healthy_sleep
        self.lock = threading.Lock()
        self.events: List[Dict[str, Any]] = []

    def handle_attempt(self, update: Dict[str, Any], attempt: Any) -> None:
        uid = update["update_id"]
        try:
            if uid == 1:
                time.sleep(self.long_delay)
                with attempt.transaction(complete=True):
                    time.sleep(self.long_hold)
            else:
                time.sleep(self.healthy_sleep)
                with attempt.transaction(complete=True):
                    pass
        finally:
            with self.lock:
                self.events.append(
                    {"uid": uid, "attempt": attempt.attempt, "lost": attempt.owner_lost.is_set(),
                     "completed": attempt.completed}
                )

    def snapshot(self) -> List[Dict[str, Any]]:
        with self.lock:
            return list(self.events)


def _pg_states(dsn: str, table: str) -> Dict[int, tuple]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT update_id, state, attempts FROM {table}")
            return {int(u): (s, int(a)) for u, s, a in cur.fetchall()}
    finally:
        conn.close()


def test_postgres_a_long_fenced_transaction_abandons_no_other_update(
    pg_dsn: str, pg_tables: List[str], caplog: Any
) -> None:
    caplog.set_level(logging.WARNING)
    store = _postgres(pg_dsn, pg_tables)
    scenario = Scenario(long_hold=5.0, healthy_sleep=4.0)
    errors = Recorder()
    intake = UpdateIntake(
        store,
        handle_attempt=scenario.handle_attempt,
        lease_seconds=2.0,
        sweep_every_seconds=0.5,
        pending_grace_seconds=0.5,
        max_concurrent=8,
        on_store_error=errors,
    )
    try:
        intake.start()
        for uid in range(1, 6):
            assert intake.accept(body(uid)) == "accepted"
        deadline = time.monotonic() + 30
        while len(scenario.snapshot()) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert intake.idle(10)
    finally:
        intake.close(timeout=10)
        store.close()
    events = scenario.snapshot()
    assert sorted(e["uid"] for e in events) == [1, 2, 3, 4, 5], events
    assert all(e["attempt"] == 1 and e["completed"] and not e["lost"] for e in events), events
    states = _pg_states(pg_dsn, pg_tables[-1])
    assert states == {uid: ("completed", 1) for uid in range(1, 6)}
    assert not [r for r in caplog.records if "owner lost" in r.getMessage()]


def test_sqlite_a_long_fenced_transaction_has_a_clear_bounded_outcome(
    tmp_path: Any, caplog: Any
) -> None:
    caplog.set_level(logging.WARNING)
    store = SQLiteUpdateStore(str(tmp_path / "long.db"), busy_timeout=0.3)
    # SQLite has one writer: the long transaction starts once the others were claimed
    scenario = Scenario(long_hold=3.0, healthy_sleep=4.0, long_delay=0.5)
    errors = Recorder()
    intake = UpdateIntake(
        store,
        handle_attempt=scenario.handle_attempt,
        lease_seconds=2.0,
        sweep_every_seconds=0.5,
        pending_grace_seconds=0.5,
        max_concurrent=8,
        on_store_error=errors,
        retry=lambda error, attempt: 0.0,
    )
    started = time.monotonic()
    try:
        intake.start()
        for uid in (2, 3, 1):
            assert intake.accept(body(uid)) == "accepted"
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            done = {e["uid"] for e in scenario.snapshot() if e["completed"]}
            if done == {1, 2, 3}:
                break
            time.sleep(0.05)
        assert intake.idle(15)
    finally:
        intake.close(timeout=10)
        store.close()
    assert time.monotonic() - started < 40
    events = scenario.snapshot()
    long_runs = [e for e in events if e["uid"] == 1]
    # the long transaction's own attempt: never reported lost, completed on attempt 1
    assert long_runs == [{"uid": 1, "attempt": 1, "lost": False, "completed": True}], events
    assert {e["uid"] for e in events if e["completed"]} == {1, 2, 3}, events
    # the other attempts' renewals failed while the write lock was held: reported, and named
    renew_errors = [e for e in errors.snapshot() if e[1] == "renew"]
    assert renew_errors and all("locked" in str(e[0]) for e in renew_errors), renew_errors
    hints = [r.getMessage() for r in caplog.records if "fenced transaction of update 1" in r.getMessage()]
    assert hints, [r.getMessage() for r in caplog.records]
