"""The lease keeper: one batched store call per tick, owner loss, late results, scheduler."""

from __future__ import annotations

import threading
import time
from typing import Any, List

import pytest

from ptb_fence import MemoryUpdateStore, RuntimeOptions, UpdateIntake
from ptb_fence.contract import BASE_METHODS, FENCED_METHODS
from ptb_fence._values import Completed
from ptb_fence.runtime._runtime import Runtime
from runtime_support import FakeClock, Recorder, StoreDown, StoreWrapper, body, row, wait_until

N = 500


def runtime_with(store: Any, clock: Any, *, attempt_aware: bool = True, **options: Any) -> Runtime:
    return Runtime(
        store,
        RuntimeOptions(clock=clock, **options),
        attempt_aware=attempt_aware,
        handle_exhaustion=False,
    )


def claim_all(runtime: Runtime, store: Any, clock: FakeClock, count: int) -> List[Any]:
    for uid in range(1, count + 1):
        assert store.add(uid, body(uid), clock.ms())
    attempts = [runtime.claim(uid) for uid in range(1, count + 1)]
    assert all(a is not None for a in attempts)
    return attempts


@pytest.mark.parametrize(
    ("attempt_aware", "batched", "single"),
    [(True, "renew_owned_many", "renew_owned"), (False, "renew_many", "renew")],
)
def test_one_store_call_per_tick_for_500_attempts(attempt_aware, batched, single) -> None:  # noqa: ANN001
    store, clock = StoreWrapper(), FakeClock()
    runtime = runtime_with(store, clock, attempt_aware=attempt_aware, lease_seconds=10)
    attempts = claim_all(runtime, store, clock, N)
    assert len(runtime.keeper.active()) == N
    clock.advance(5)
    runtime.keeper.tick()
    assert store.count(batched) == 1
    assert store.count(single) == 0
    assert all(row(store, a.update_id).due_at == clock.ms() + 10_000 for a in attempts)
    assert not any(a.owner_lost.is_set() for a in attempts)
    runtime.keeper.tick()
    assert store.count(batched) == 2


def test_without_a_batched_method_it_renews_one_by_one() -> None:
    store, clock = StoreWrapper(methods=FENCED_METHODS), FakeClock()
    runtime = runtime_with(store, clock, lease_seconds=10)
    claim_all(runtime, store, clock, 20)
    runtime.keeper.tick()
    assert store.count("renew_owned") == 20


def test_unary_base_store_renews_with_renew() -> None:
    store, clock = StoreWrapper(methods=BASE_METHODS), FakeClock()
    runtime = runtime_with(store, clock, attempt_aware=False, lease_seconds=10)
    attempts = claim_all(runtime, store, clock, 3)
    assert not any(a.fenced for a in attempts)
    clock.advance(1)
    runtime.keeper.tick()
    assert store.count("renew") == 3
    assert row(store, 1).due_at == clock.ms() + 10_000


def test_scheduled_ticks_make_one_call_each() -> None:
    store, clock = StoreWrapper(), FakeClock()
    runtime = runtime_with(store, clock, lease_seconds=0.2)
    claim_all(runtime, store, clock, N)
    runtime.jobs.start()
    try:
        assert wait_until(lambda: runtime.keeper.ticks >= 3, 5)
    finally:
        runtime.jobs.stop()
    assert store.count("renew_owned_many") == runtime.keeper.ticks
    assert store.count("renew_owned") == 0


def test_a_refused_renewal_fires_only_that_attempts_owner_lost() -> None:
    store, clock = StoreWrapper(), FakeClock()
    runtime = runtime_with(store, clock, lease_seconds=10)
    attempts = claim_all(runtime, store, clock, 50)
    victim = attempts[17]
    # the row was settled elsewhere (e.g. taken over and completed): renewal is refused
    assert store.inner.settle_owned(victim.identity, Completed(clock.ms()))
    runtime.keeper.tick()
    assert victim.owner_lost.is_set()
    assert [a for a in attempts if a.owner_lost.is_set()] == [victim]


def test_a_raising_renewal_is_reported_and_fires_owner_lost_only_after_the_proven_lease() -> None:
    store, clock = StoreWrapper(), FakeClock()
    errors = Recorder()
    runtime = runtime_with(store, clock, lease_seconds=10, on_store_error=errors)
    attempts = claim_all(runtime, store, clock, 5)
    proven = clock.ms() + 10_000
    store.fail["renew_owned_many"] = StoreDown("renewal connection lost")
    runtime.keeper.tick()
    assert [(type(e), s) for e, s in errors.snapshot()] == [(StoreDown, "renew")]
    assert not any(a.owner_lost.is_set() for a in attempts)
    clock.advance(10)  # exactly the proven deadline: still held (inclusive)
    assert clock.ms() == proven
    runtime.keeper.tick()
    assert not any(a.owner_lost.is_set() for a in attempts)
    assert len(errors.snapshot()) == 2
    clock.advance(0.001)
    runtime.keeper.tick()
    assert all(a.owner_lost.is_set() for a in attempts)
    assert len(errors.snapshot()) == 2  # nothing left to renew: no store call
    # the store recovers: a lapsed attempt is not revived
    del store.fail["renew_owned_many"]
    runtime.keeper.tick()
    assert all(not a.owns() for a in attempts)


def test_a_raising_observer_does_not_break_the_keeper() -> None:
    store, clock = StoreWrapper(), FakeClock()
    runtime = runtime_with(store, clock, lease_seconds=10, on_store_error=lambda e, s: 1 / 0)
    attempts = claim_all(runtime, store, clock, 2)
    store.fail["renew_owned_many"] = StoreDown("down")
    runtime.keeper.tick()
    clock.advance(11)
    runtime.keeper.tick()
    assert all(a.owner_lost.is_set() for a in attempts)


@pytest.mark.parametrize("late_result", [False, True])
def test_a_late_renewal_result_after_the_attempt_ended_does_nothing(late_result) -> None:  # noqa: ANN001
    store, clock = StoreWrapper(), FakeClock()
    runtime = runtime_with(store, clock, lease_seconds=10)
    (attempt,) = claim_all(runtime, store, clock, 1)
    entered, release = threading.Event(), threading.Event()

    def slow_renewal(original, identities, lease_until, now):  # noqa: ANN001, ANN202
        entered.set()
        assert release.wait(5)
        return [late_result] * len(identities)

    store.hooks["renew_owned_many"] = slow_renewal
    ticker = threading.Thread(target=runtime.keeper.tick)
    ticker.start()
    assert entered.wait(5)
    proven_before = attempt._proven_until
    assert runtime.settle_completed(attempt) == "completed"
    runtime.end(attempt)
    release.set()
    ticker.join(5)
    assert not ticker.is_alive()
    assert not attempt.owner_lost.is_set()
    assert attempt._proven_until == proven_before
    assert runtime.keeper.active() == []


def test_owner_lost_wakes_asyncio_waiters_from_the_keeper_thread() -> None:
    import asyncio

    store, clock = StoreWrapper(), FakeClock()
    runtime = runtime_with(store, clock, lease_seconds=0.2)
    (attempt,) = claim_all(runtime, store, clock, 1)
    store.hooks["renew_owned_many"] = lambda original, ids, lease_until, now: [False] * len(ids)

    async def main() -> float:
        started = time.monotonic()
        await asyncio.wait_for(attempt.wait_owner_lost(), 5)
        return time.monotonic() - started

    runtime.jobs.start()
    try:
        waited = asyncio.run(main())
    finally:
        runtime.jobs.stop()
    assert attempt.owner_lost.is_set()
    assert waited < 2


# -- the scheduler ----------------------------------------------------------------------------
def test_scheduler_job_config_and_a_fresh_scheduler_per_start() -> None:
    store, clock = StoreWrapper(), FakeClock()
    runtime = runtime_with(store, clock, lease_seconds=2, sweep_every_seconds=7)
    runtime.jobs.start(lambda: None)
    try:
        first = runtime.jobs._scheduler
        assert runtime.jobs.running and first.running
        assert str(first.timezone) == "UTC"
        assert first._daemon is True
        keeper = first.get_job("ptb_fence_lease_keeper")
        sweep = first.get_job("ptb_fence_sweep")
        assert keeper is not None and sweep is not None
        assert keeper.misfire_grace_time is None and sweep.misfire_grace_time is None
        assert keeper.max_instances > 1  # a slow tick must not make the next one vanish
        assert keeper.trigger.interval.total_seconds() == 0.5  # lease / 4
        assert sweep.trigger.interval.total_seconds() == 7
        assert str(keeper.trigger.timezone) == "UTC"
        runtime.jobs.start(lambda: None)  # idempotent
        assert runtime.jobs._scheduler is first
    finally:
        runtime.jobs.stop()
    assert not runtime.jobs.running and not first.running
    runtime.jobs.start(lambda: None)
    try:
        second = runtime.jobs._scheduler
        assert second is not first and second.running
        assert second.get_job("ptb_fence_lease_keeper") is not None
        assert second.get_job("ptb_fence_sweep") is not None
    finally:
        runtime.jobs.stop()


def test_intake_close_stops_the_scheduler() -> None:
    intake = UpdateIntake(MemoryUpdateStore(), handle=lambda u: None, clock=FakeClock())
    intake.start()
    scheduler = intake.runtime.jobs._scheduler
    assert scheduler.running
    intake.close()
    assert not scheduler.running and not intake.runtime.jobs.running


@pytest.mark.parametrize("error", [None, ValueError("handler failed")])
def test_a_refusal_racing_the_runtimes_own_settle_does_not_fire_owner_lost(error) -> None:  # noqa: ANN001
    """A renewal in flight while the runtime settles the attempt is refused by the store
    (the row is no longer processing): that is not an owner loss."""
    store, clock = StoreWrapper(), FakeClock()
    runtime = runtime_with(store, clock, lease_seconds=10)
    (attempt,) = claim_all(runtime, store, clock, 1)
    entered, release = threading.Event(), threading.Event()

    def slow_renewal(original, identities, lease_until, now):  # noqa: ANN001, ANN202
        entered.set()
        assert release.wait(5)
        return original(identities, lease_until, now)  # the real answer, after the settle

    store.hooks["renew_owned_many"] = slow_renewal
    ticker = threading.Thread(target=runtime.keeper.tick)
    ticker.start()
    assert entered.wait(5)
    outcome, _ = runtime.settle(attempt, error)
    assert outcome == ("completed" if error is None else "retrying")
    release.set()  # the refusal arrives before runtime.end(attempt)
    ticker.join(5)
    runtime.end(attempt)
    assert not attempt.owner_lost.is_set()


def test_a_failed_commit_of_a_completing_transaction_keeps_the_lease_renewed() -> None:
    """If the commit of transaction(complete=True) fails, the attempt is not complete: the
    keeper must keep renewing it (and may still declare it lost)."""
    from contextlib import contextmanager

    store, clock = StoreWrapper(), FakeClock()
    runtime = runtime_with(store, clock, lease_seconds=10)
    (attempt,) = claim_all(runtime, store, clock, 1)

    @contextmanager
    def failing_commit(original):  # noqa: ANN001, ANN202
        with original() as conn:
            yield conn
        raise OSError("commit failed: connection reset")

    store.hooks["transaction"] = failing_commit
    # the completion at the start of the transaction is rolled back by the failed commit
    store.hooks["complete_owned"] = lambda original, *a, **k: True
    with pytest.raises(OSError, match="commit failed"):
        with attempt.transaction(complete=True):
            pass
    assert not attempt.completed
    clock.advance(5)
    runtime.keeper.tick()
    assert row(store, 1).due_at == clock.ms() + 10_000  # still renewed
    clock.advance(30)  # ... and a lapse is still noticed
    runtime.keeper.tick()
    assert attempt.owner_lost.is_set()
