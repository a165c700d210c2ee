"""The runtime through UpdateIntake on the memory store: retries, exhaustion, fenced writes.

Real worker threads and the real lease keeper; time that matters is a :class:`FakeClock`.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any, List

import pytest

from ptb_fence import (
    Attempt,
    AttemptFinished,
    MemoryUpdateStore,
    OwnershipLost,
    UpdateIntake,
    current_attempt,
)
from ptb_fence.contract import BASE_METHODS
from ptb_fence.contract import DURABLE_METHODS
from runtime_support import (
    FakeClock,
    Recorder,
    StoreDown,
    StoreWrapper,
    body,
    row,
    wait_until,
)

HUGE = 2**62


def make(store: Any, intakes: List[UpdateIntake], clock: Any = None, **kwargs: Any) -> UpdateIntake:
    intake = UpdateIntake(store, clock=clock or FakeClock(), **kwargs)
    intakes.append(intake)
    intake.start()
    return intake


def run_due(intake: UpdateIntake, clock: FakeClock, seconds: float) -> int:
    """Advance the clock, sweep once, wait until the intake is idle."""
    assert intake.idle(5)
    clock.advance(seconds)
    handed = intake.sweep()
    assert intake.idle(5)
    return handed


# -- retries ----------------------------------------------------------------------------------
def test_flaky_handler_succeeds_on_attempt_3(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    seen: List[Attempt] = []
    failures = Recorder()

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        seen.append(attempt)
        if attempt.attempt < 3:
            raise ConnectionError(f"flaky {attempt.attempt}")

    intake = make(store, intakes, clock, handle_attempt=handle_attempt, on_failure=failures)
    assert intake.accept(body(10)) == "accepted"
    assert intake.idle(5)
    r = row(store, 10)
    # the default backoff: 5 s, then 20 s, each give or take 10 %
    wait_ms = r.due_at - clock.ms()
    assert (r.state, r.attempts) == ("failed", 1) and 4_500 <= wait_ms <= 5_500
    assert r.error == "ConnectionError: flaky 1"
    # not due before the backoff passed
    assert run_due(intake, clock, (wait_ms - 100) / 1000) == 0
    assert run_due(intake, clock, 0.2) == 1
    r = row(store, 10)
    wait_ms = r.due_at - clock.ms()
    assert (r.state, r.attempts) == ("failed", 2) and 18_000 <= wait_ms <= 22_000
    assert run_due(intake, clock, wait_ms / 1000 + 0.001) == 1
    r = row(store, 10)
    assert (r.state, r.attempts, r.error) == ("completed", 3, None)
    assert [a.attempt for a in seen] == [1, 2, 3]
    assert len({a.claim_id for a in seen}) == 3
    assert all(a.identity.update_id == 10 for a in seen)
    assert [(f[1].attempt, f[2]) for f in failures.snapshot()] == [(1, True), (2, True)]
    assert store.due(now=HUGE, pending_before=HUGE, limit=10) == []
    assert run_due(intake, clock, 3600) == 0
    assert len(seen) == 3
    assert not any(a.owner_lost.is_set() for a in seen)


def test_unary_handler_on_a_base_only_store(intakes) -> None:
    store, clock = StoreWrapper(methods=BASE_METHODS), FakeClock()
    runs: List[int] = []
    seen_attempt: List[Any] = []

    def handle(update):  # noqa: ANN001, ANN202
        runs.append(update["update_id"])
        seen_attempt.append(current_attempt())
        if len(runs) == 1:
            raise RuntimeError("once")

    intake = make(store, intakes, clock, handle=handle, max_attempts=2)
    intake.accept(body(1))
    assert intake.idle(5)
    assert row(store, 1).state == "failed"
    assert run_due(intake, clock, 5.5) == 1  # the default backoff: 5 s give or take 10 %
    assert row(store, 1).state == "completed"
    assert runs == [1, 1] and seen_attempt == [None, None]
    assert store.count("claim") == 2 and store.count("settle") == 2


# -- exhaustion -------------------------------------------------------------------------------
def test_always_failing_handler_runs_max_attempts_then_one_exhaustion(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    seen: List[Attempt] = []
    delivered = Recorder()
    failures = Recorder()

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        seen.append(attempt)
        raise ValueError(f"always {attempt.attempt}")

    intake = make(
        store,
        intakes,
        clock,
        handle_attempt=handle_attempt,
        handle_exhaustion=delivered,
        on_failure=failures,
        max_attempts=4,
    )
    intake.accept(body(20))
    for _ in range(10):
        run_due(intake, clock, 1000)
    assert [a.attempt for a in seen] == [1, 2, 3, 4]
    (exhaustion,), = delivered.snapshot()
    assert exhaustion.identity == seen[-1].identity
    assert exhaustion.error == "ValueError: always 4"
    assert exhaustion.body == body(20)
    assert [f[2] for f in failures.snapshot()] == [True, True, True, False]
    assert store.due_exhaustions(limit=10) == []  # acknowledged
    r = row(store, 20)
    assert r.state == "abandoned" and r.settled_at is not None
    assert store.prune(HUGE) == 1  # acknowledged history is prunable


def test_failing_exhaustion_handler_stays_due_survives_restart_and_is_never_pruned(
    intakes,
) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    calls: List[Any] = []
    exhaustion_failures = Recorder()

    def handle(update):  # noqa: ANN001, ANN202
        raise ValueError("no")

    def broken_exhaustion_handler(exhaustion):  # noqa: ANN001, ANN202
        calls.append(exhaustion)
        raise OSError("alerting is down")

    def raising_observer(*args):  # noqa: ANN002, ANN202
        exhaustion_failures(*args)
        raise RuntimeError("observer bug")

    intake = make(
        store,
        intakes,
        clock,
        handle=handle,
        handle_exhaustion=broken_exhaustion_handler,
        on_exhaustion_failure=raising_observer,
        on_failure=lambda *a: 1 / 0,
        max_attempts=1,
    )
    intake.accept(body(30))
    assert intake.idle(5)
    assert len(calls) == 1
    assert [type(e[0]) for e in exhaustion_failures.snapshot()] == [OSError]
    assert exhaustion_failures.snapshot()[0][1] == calls[0]
    (due,) = store.due_exhaustions(limit=10)
    assert due.identity == calls[0].identity and due.error == "ValueError: no"
    assert store.prune(HUGE) == 0
    assert store.due_exhaustions(limit=10) == [due]
    # later sweeps retry the delivery (far beyond retain_seconds: still never pruned)
    for _ in range(3):
        run_due(intake, clock, 2 * 86400)
    assert len(calls) == 4 and len(exhaustion_failures.snapshot()) == 4
    assert {c.identity for c in calls} == {due.identity}
    assert store.due_exhaustions(limit=10) == [due]
    assert store.prune(HUGE) == 0
    # "restart": a new intake on the same store delivers it at start and acknowledges it
    intake.close()
    delivered = Recorder()
    handled: List[int] = []
    make(store, intakes, clock, handle=lambda u: handled.append(u), handle_exhaustion=delivered)
    (again,), = delivered.snapshot()
    assert again == due
    assert handled == []  # the update itself is not run again
    assert store.due_exhaustions(limit=10) == []
    assert not store.acknowledge_exhaustion(due.identity, clock.ms())  # already acknowledged
    assert store.prune(HUGE) == 1


def test_spent_attempts_after_a_crash_become_a_delivered_exhaustion(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    store.add(40, body(40), clock.ms())
    # another process claimed the last attempt and died
    dead = store.claim_owned(40, now=clock.ms(), lease_until=clock.ms() + 1000, max_attempts=1)
    assert dead is not None
    runs: List[Any] = []
    delivered = Recorder()
    intake = make(
        store, intakes, clock, handle=runs.append, handle_exhaustion=delivered, max_attempts=1
    )
    assert intake.idle(5)
    assert run_due(intake, clock, 1.001) == 1  # lease lapsed: handed over, spent on claim
    run_due(intake, clock, 0)
    (exhaustion,), = delivered.snapshot()
    assert exhaustion.update_id == 40 and exhaustion.error == "attempts spent"
    assert exhaustion.identity == dead  # the last claim's identity
    assert runs == []
    assert store.due_exhaustions(limit=10) == []


def test_attempt_exhaust_stops_retries_and_delivers_the_reason(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    runs: List[int] = []
    delivered = Recorder()

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        runs.append(attempt.attempt)
        with pytest.raises(ValueError):
            attempt.exhaust("")
        attempt.exhaust("unsupported command")
        assert attempt.exhausted
        if update["update_id"] == 51:
            raise RuntimeError("and then it raised")

    intake = make(
        store, intakes, clock, handle_attempt=handle_attempt, handle_exhaustion=delivered
    )
    intake.accept(body(50))
    intake.accept(body(51))
    assert intake.idle(5)
    for _ in range(3):
        run_due(intake, clock, 1000)
    assert runs == [1, 1]
    got = sorted((e[0].update_id, e[0].attempt, e[0].error) for e in delivered.snapshot())
    assert got == [(50, 1, "unsupported command"), (51, 1, "unsupported command")]
    assert store.due_exhaustions(limit=10) == []


def test_attempt_exhaust_without_exhaustion_handler_abandons(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    runs: List[int] = []

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        runs.append(attempt.attempt)
        attempt.exhaust("bad input")

    intake = make(store, intakes, clock, handle_attempt=handle_attempt)
    intake.accept(body(60))
    assert intake.idle(5)
    run_due(intake, clock, 1000)
    r = row(store, 60)
    assert (r.state, r.error, r.settled_at is not None) == ("abandoned", "bad input", True)
    assert runs == [1]


# -- owner loss -------------------------------------------------------------------------------
def test_owner_loss_after_the_lease_passed_and_a_takeover(intakes) -> None:
    """A handler blocked past its lease: owner_lost fires, its fenced writes are refused."""
    store, clock = MemoryUpdateStore(), FakeClock()
    entered, taken_over = threading.Event(), threading.Event()
    results: dict = {}
    writes: List[str] = []

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        results["attempt"] = attempt
        entered.set()
        assert taken_over.wait(5)
        results["event"] = attempt.owner_lost.wait(5)

        async def on_loop() -> bool:
            await asyncio.wait_for(attempt.wait_owner_lost(), 5)
            return True

        results["async"] = asyncio.run(on_loop())
        results["owns"] = attempt.owns()
        try:
            with attempt.transaction():
                writes.append("late write")
        except OwnershipLost as exc:
            results["tx"] = exc
        try:
            attempt.raise_if_lost()
        except OwnershipLost as exc:
            results["raise_if_lost"] = exc

    intake = make(store, intakes, clock, handle_attempt=handle_attempt, lease_seconds=0.2)
    intake.accept(body(70))
    assert entered.wait(5)
    attempt = results["attempt"]
    assert not attempt.owner_lost.is_set()
    clock.advance(1)  # the handler is now far past its lease
    other = store.claim_owned(70, now=clock.ms(), lease_until=clock.ms() + 60_000, max_attempts=5)
    assert other is not None and other.attempt == 2
    taken_over.set()
    assert intake.idle(5)
    assert results["event"] is True and results["async"] is True
    assert results["owns"] is False
    assert isinstance(results["tx"], OwnershipLost)
    assert results["tx"].identity == attempt.identity
    assert writes == []
    assert results["raise_if_lost"].identity == attempt.identity
    r = row(store, 70)  # the late settle did not land: the takeover still holds the row
    assert (r.state, r.attempts, r.claim_id) == ("processing", 2, other.claim_id)


def test_owner_loss_in_real_time_when_renewals_fail(intakes) -> None:
    """Real time: renewals raise, so the last proven lease (0.2 s) passes and owner_lost fires."""
    store = StoreWrapper()
    store_errors = Recorder()
    entered, done = threading.Event(), threading.Event()
    results: dict = {}

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        results["attempt"] = attempt
        entered.set()
        results["lost"] = attempt.owner_lost.wait(5)
        assert done.wait(5)
        try:
            with attempt.transaction():
                results["wrote"] = True
        except OwnershipLost as exc:
            results["tx"] = exc

    store.fail["renew_owned_many"] = StoreDown("renewal connection down")
    intake = make(
        store,
        intakes,
        clock=__import__("time").time,
        handle_attempt=handle_attempt,
        lease_seconds=0.2,
        on_store_error=store_errors,
    )
    intake.accept(body(80))
    assert entered.wait(5)
    assert wait_until(lambda: "lost" in results, 5)
    assert results["lost"] is True
    errors = store_errors.snapshot()
    assert errors and all(step == "renew" and isinstance(e, StoreDown) for e, step in errors)
    # a second process takes the expired update over
    import time

    now = int(time.time() * 1000)
    other = store.inner.claim_owned(80, now=now, lease_until=now + 60_000, max_attempts=5)
    assert other is not None
    done.set()
    assert intake.idle(5)
    assert "wrote" not in results and results["tx"].identity == results["attempt"].identity


# -- fenced transactions ----------------------------------------------------------------------
def test_transaction_complete_settles_in_the_same_commit(intakes) -> None:
    store, clock = StoreWrapper(), FakeClock()
    runs: List[Attempt] = []
    writes: List[Any] = []

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        runs.append(attempt)
        with attempt.transaction(complete=True) as conn:
            writes.append(conn)
        assert attempt.completed
        assert not attempt.owns()  # completed: no longer a live claim
        if update["update_id"] == 91:
            raise RuntimeError("after the commit")

    failures = Recorder()
    intake = make(store, intakes, clock, handle_attempt=handle_attempt, on_failure=failures)
    intake.accept(body(90))
    intake.accept(body(91))
    assert intake.idle(5)
    for uid in (90, 91):
        assert row(store, uid).state == "completed"
    # only the two inside the transactions, each completed at its start
    assert store.count("complete_owned") == 2 and store.count("settle_owned") == 0
    assert writes == [None, None]
    assert not any(a.owner_lost.is_set() for a in runs)
    assert run_due(intake, clock, 3600) == 0
    assert len(runs) == 2


def test_transaction_body_error_rolls_back_and_propagates(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    results: dict = {}

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        try:
            with attempt.transaction(complete=True):
                raise KeyError("domain failure")
        except KeyError as exc:
            results["error"] = exc
        results["completed"] = attempt.completed
        results["owns"] = attempt.owns()
        results["state_inside"] = row(store, 100).state

    intake = make(store, intakes, clock, handle_attempt=handle_attempt)
    intake.accept(body(100))
    assert intake.idle(5)
    assert isinstance(results["error"], KeyError)
    assert results["completed"] is False and results["owns"] is True
    assert results["state_inside"] == "processing"
    assert row(store, 100).state == "completed"  # settled by the runtime afterwards


def test_current_attempt_in_handler_and_copied_context_threads(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    results: dict = {}

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        results["handler"] = current_attempt() is attempt
        ctx = contextvars.copy_context()
        copied = threading.Thread(target=ctx.run, args=(lambda: results.update(copied=current_attempt()),))
        plain = threading.Thread(target=lambda: results.update(plain=current_attempt()))
        copied.start(), plain.start()
        copied.join(5), plain.join(5)
        results["attempt"] = attempt

    assert current_attempt() is None
    intake = make(store, intakes, clock, handle_attempt=handle_attempt)
    intake.accept(body(110))
    assert intake.idle(5)
    assert results["handler"] is True
    assert results["copied"] is results["attempt"]
    assert results["plain"] is None
    assert current_attempt() is None


def test_run_in_transaction_from_asyncio(intakes) -> None:
    store, clock = StoreWrapper(), FakeClock()
    results: dict = {}

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        loop_thread = threading.get_ident()

        def fn(conn):  # noqa: ANN001, ANN202
            results["conn"] = conn
            results["other_thread"] = threading.get_ident() != loop_thread
            results["current"] = current_attempt() is attempt
            return "done"

        async def main() -> Any:
            first = await attempt.run_in_transaction(fn)
            second = await attempt.run_in_transaction(fn, complete=True)
            try:
                await attempt.run_in_transaction(fn)
            except AttemptFinished as exc:  # completed: a mistake, not a lost lease
                results["after"] = exc
            return first, second

        results["value"] = asyncio.run(main())
        results["completed"] = attempt.completed

    intake = make(store, intakes, clock, handle_attempt=handle_attempt)
    intake.accept(body(120))
    assert intake.idle(5)
    assert results["value"] == ("done", "done")
    assert results["conn"] is None and results["other_thread"] and results["current"]
    assert isinstance(results["after"], AttemptFinished)
    assert results["completed"] is True
    assert row(store, 120).state == "completed"
    assert store.count("complete_owned") == 1  # the complete=True transaction, at its start


# -- store errors -----------------------------------------------------------------------------
def test_claim_error_is_reported_and_the_update_is_handled_after_recovery(intakes) -> None:
    store, clock = StoreWrapper(), FakeClock()
    errors = Recorder()
    runs: List[int] = []
    store.fail["claim_owned"] = StoreDown("claim down")
    intake = make(
        store,
        intakes,
        clock,
        handle_attempt=lambda u, a: runs.append(u["update_id"]),
        on_store_error=errors,
    )
    assert intake.accept(body(130)) == "accepted"
    assert intake.idle(5)
    assert [(type(e), s) for e, s in errors.snapshot()] == [(StoreDown, "claim")]
    assert row(store, 130).state == "pending" and runs == []
    del store.fail["claim_owned"]
    assert run_due(intake, clock, 30) == 0  # still inside the pending grace
    assert run_due(intake, clock, 31) == 1
    assert runs == [130] and row(store, 130).state == "completed"


def test_settle_error_after_success_is_reported_and_the_update_runs_again(intakes) -> None:
    store, clock = StoreWrapper(methods=DURABLE_METHODS), FakeClock()  # settles one by one
    errors = Recorder()
    runs: List[int] = []
    store.fail["settle_owned"] = StoreDown("settle down")
    intake = make(
        store,
        intakes,
        clock,
        handle_attempt=lambda u, a: runs.append(a.attempt),
        on_store_error=errors,
        lease_seconds=10,
    )
    intake.accept(body(140))
    assert intake.idle(5)
    assert [(type(e), s) for e, s in errors.snapshot()] == [(StoreDown, "settle")]
    assert row(store, 140).state == "processing"
    del store.fail["settle_owned"]
    assert run_due(intake, clock, 10) == 0  # the lease is inclusive
    assert run_due(intake, clock, 0.001) == 1
    assert runs == [1, 2] and row(store, 140).state == "completed"


@pytest.mark.parametrize("durable", [False, True])
def test_settle_error_after_failure_is_reported_and_nothing_is_lost(intakes, durable) -> None:
    store, clock = StoreWrapper(), FakeClock()
    errors, failures = Recorder(), Recorder()
    runs: List[Attempt] = []
    delivered = Recorder()

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        runs.append(attempt)
        if len(runs) == 1:
            raise ValueError("first")

    store.fail["settle_owned"] = StoreDown("settle down")
    store.fail["exhaust"] = StoreDown("exhaust down")
    kwargs = {"handle_exhaustion": delivered, "max_attempts": 1} if durable else {}
    intake = make(
        store,
        intakes,
        clock,
        handle_attempt=handle_attempt,
        on_store_error=errors,
        on_failure=failures,
        lease_seconds=10,
        **kwargs,
    )
    intake.accept(body(150))
    assert intake.idle(5)
    assert [(type(e), s) for e, s in errors.snapshot()] == [(StoreDown, "settle")]
    (failure,) = failures.snapshot()
    assert failure[1] is runs[0] and failure[2] is True  # it will run again (lease + sweep)
    assert runs[0].owner_lost.is_set()
    assert row(store, 150).state == "processing"
    store.fail.clear()
    run_due(intake, clock, 10.001)
    if durable:  # the last attempt was spent: the sweep records the exhaustion
        run_due(intake, clock, 0)
        (exhaustion,), = delivered.snapshot()
        assert exhaustion.update_id == 150 and len(runs) == 1
    else:
        assert len(runs) == 2 and row(store, 150).state == "completed"


def test_sweep_errors_are_reported_and_nothing_is_lost(intakes) -> None:
    store, clock = StoreWrapper(), FakeClock()
    errors = Recorder()
    delivered: List[Any] = []
    runs: List[int] = []

    def handle(update):  # noqa: ANN001, ANN202
        runs.append(update["update_id"])
        if update["update_id"] == 161:
            raise ValueError("terminal")

    for name in ("due", "due_exhaustions", "prune"):
        store.fail[name] = StoreDown(name)
    intake = make(
        store,
        intakes,
        clock,
        handle=handle,
        handle_exhaustion=delivered.append,
        on_store_error=lambda e, s: (errors(e, s), 1 / 0),  # a raising observer
        max_attempts=1,
    )
    assert [s for _, s in errors.snapshot()] == ["sweep", "sweep", "sweep"]  # start's sweep
    store.add(160, body(160), clock.ms())  # recorded by another process
    store.fail["acknowledge_exhaustion"] = StoreDown("ack down")
    intake.accept(body(161))  # fails, exhaustion delivered, acknowledgement fails
    assert intake.idle(5)
    assert len(delivered) == 1
    assert [s for _, s in errors.snapshot()][-1] == "sweep"
    assert run_due(intake, clock, 3600) == 0
    assert runs == [161]
    store.fail.clear()
    assert run_due(intake, clock, 1) == 1
    assert runs == [161, 160]
    assert len(delivered) == 2  # redelivered because it was not acknowledged
    assert store.due_exhaustions(limit=10) == []
    assert row(store, 160).state == "completed"


def test_start_sweep_failure_does_not_stop_start(intakes) -> None:
    store, clock = StoreWrapper(), FakeClock()
    errors = Recorder()
    store.add(170, body(170), clock.ms())
    store.fail["due"] = StoreDown("down at start")
    runs: List[int] = []
    intake = make(store, intakes, clock, handle=lambda u: runs.append(u["update_id"]), on_store_error=errors)
    assert [s for _, s in errors.snapshot()] == ["sweep"]
    assert intake.runtime.jobs.running
    del store.fail["due"]
    assert run_due(intake, clock, 61) == 1
    assert runs == [170]


# -- intake lifecycle -------------------------------------------------------------------------
def test_updates_accepted_before_start_are_handled_at_start(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    runs: List[int] = []
    intake = UpdateIntake(store, handle=lambda u: runs.append(u["update_id"]), clock=clock)
    intakes.append(intake)
    for uid in (3, 1, 2):
        assert intake.accept(body(uid)) == "accepted"
    assert intake.accept(body(2)) == "duplicate"
    assert runs == [] and row(store, 1).state == "pending"
    intake.start()
    assert intake.idle(5)
    assert sorted(runs) == [1, 2, 3]
    assert all(row(store, u).state == "completed" for u in (1, 2, 3))


def test_close_waits_for_running_attempts_and_accept_still_records(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    entered, release = threading.Event(), threading.Event()

    def handle(update):  # noqa: ANN001, ANN202
        entered.set()
        assert release.wait(5)

    intake = make(store, intakes, clock, handle=handle)
    intake.accept(body(1))
    assert entered.wait(5)
    closer = threading.Thread(target=intake.close)
    closer.start()
    closer.join(0.1)
    assert closer.is_alive()  # waits for the running attempt
    release.set()
    closer.join(5)
    assert not closer.is_alive()
    assert row(store, 1).state == "completed"
    assert not intake.runtime.jobs.running
    assert intake.accept(body(2)) == "accepted"  # still recorded after close
    assert row(store, 2).state == "pending"
    with pytest.raises(RuntimeError, match="closed"):
        intake.start()


def test_close_leaves_waiting_updates_in_the_store_and_ends_idle(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    release, entered = threading.Event(), threading.Event()
    runs: List[int] = []

    def handle(update):  # noqa: ANN001, ANN202
        runs.append(update["update_id"])
        entered.set()
        assert release.wait(5)

    intake = make(store, intakes, clock, handle=handle, max_concurrent=1)
    intake.accept(body(1, chat=1))
    assert entered.wait(5)
    intake.accept(body(2, chat=2))  # queued for the only worker
    intake.accept(body(3, chat=1))  # waiting for its chat's turn
    closer = threading.Thread(target=intake.close)
    closer.start()
    release.set()
    closer.join(5)
    assert not closer.is_alive()
    assert runs == [1]
    assert intake.idle(1)  # nothing is left queued or running here
    assert [row(store, u).state for u in (1, 2, 3)] == ["completed", "pending", "pending"]
    # the next start (another intake on the same store) takes them
    again: List[int] = []
    make(store, intakes, clock, handle=lambda u: again.append(u["update_id"]))
    assert intakes[-1].idle(5)
    assert sorted(again) == [2, 3]


@pytest.mark.parametrize(
    "error", [SystemExit(3), asyncio.CancelledError(), KeyboardInterrupt()], ids=repr
)
def test_a_handler_raising_a_base_exception_is_a_failed_attempt(intakes, error) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    runs: List[int] = []
    failures = Recorder()

    def handle(update):  # noqa: ANN001, ANN202
        runs.append(update["update_id"])
        if len(runs) == 1:
            raise error

    intake = make(store, intakes, clock, handle=handle, on_failure=failures)
    intake.accept(body(1))
    assert intake.idle(5)
    assert intake.runtime.keeper.active() == []  # not renewed forever
    r = row(store, 1)
    assert (r.state, r.attempts) == ("failed", 1)
    assert failures.snapshot()[0][0] is error
    assert run_due(intake, clock, 5.5) == 1  # the default backoff: 5 s give or take 10 %
    assert row(store, 1).state == "completed" and runs == [1, 1]


def test_exhaustions_are_delivered_in_rotating_pages(intakes) -> None:
    """A failing first page cannot starve later exhaustions: 100 per sweep (at most 8 at once),
    rotating cursor."""
    store, clock = MemoryUpdateStore(), FakeClock()
    now = clock.ms()
    for uid in range(1, 251):
        store.add(uid, body(uid), now)
        identity = store.claim_owned(uid, now=now, lease_until=now + 1000, max_attempts=5)
        assert store.exhaust(identity, at=now, error="boom")
    pages: List[List[int]] = []
    current: List[int] = []

    def handle_exhaustion(exhaustion):  # noqa: ANN001, ANN202
        current.append(exhaustion.update_id)
        if exhaustion.update_id <= 100:
            raise RuntimeError("the first page always fails")

    intake = make(store, intakes, clock, handle=lambda u: None, handle_exhaustion=handle_exhaustion)
    assert intake.idle(5)  # at most 8 at once: the start's sweep goes on as deliveries end
    pages.append(sorted(current))
    for _ in range(4):
        current.clear()
        run_due(intake, clock, 1)
        pages.append(sorted(current))
    assert pages[0] == list(range(1, 101))  # start's sweep
    assert pages[1] == list(range(101, 201))
    assert pages[2] == list(range(201, 251))  # short page: the cursor starts over
    assert pages[3] == list(range(1, 101))
    assert pages[4] == []  # cursor after 100; everything after it was acknowledged
    assert [e.update_id for e in store.due_exhaustions(limit=500)] == list(range(1, 101))


def test_a_store_error_in_attempt_exhaust_is_reported(intakes) -> None:
    store, clock = StoreWrapper(), FakeClock()
    errors = Recorder()
    results: dict = {}

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        try:
            attempt.exhaust("give up")
        except StoreDown as exc:
            results["error"] = exc

    store.fail["exhaust"] = StoreDown("exhaust down")
    intake = make(
        store,
        intakes,
        clock,
        handle_attempt=handle_attempt,
        handle_exhaustion=lambda e: None,
        on_store_error=errors,
    )
    intake.accept(body(1))
    assert intake.idle(5)
    assert isinstance(results["error"], StoreDown)  # the handler learns it did not land
    assert (StoreDown, "settle") in [(type(e), s) for e, s in errors.snapshot()]


def test_a_second_intake_takes_over_a_handler_blocked_past_its_lease(intakes) -> None:
    """Two intakes ("processes") on one store: only the owner's fenced write lands."""
    store, clock = MemoryUpdateStore(), FakeClock()
    entered, taken_over = threading.Event(), threading.Event()
    writes: List[Any] = []
    results: dict = {}

    def slow(update, attempt):  # noqa: ANN001, ANN202
        entered.set()
        assert taken_over.wait(5)
        results["lost"] = attempt.owner_lost.wait(5)
        try:
            with attempt.transaction():
                writes.append(("slow", attempt.attempt))
        except OwnershipLost:
            results["refused"] = True

    def fast(update, attempt):  # noqa: ANN001, ANN202
        with attempt.transaction(complete=True):
            writes.append(("fast", attempt.attempt))

    first = make(store, intakes, clock, handle_attempt=slow, lease_seconds=0.2)
    first.accept(body(1))
    assert entered.wait(5)
    clock.advance(1)
    second = make(store, intakes, clock, handle_attempt=fast, lease_seconds=0.2)  # start sweeps
    assert second.idle(5)
    taken_over.set()
    assert first.idle(5)
    assert results == {"lost": True, "refused": True}
    assert writes == [("fast", 2)]
    r = row(store, 1)
    assert (r.state, r.attempts) == ("completed", 2)


def test_sweep_prunes_settled_rows_after_retain_seconds(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    intake = make(store, intakes, clock, handle=lambda u: None, retain_seconds=100)
    intake.accept(body(1))
    assert intake.idle(5)
    assert row(store, 1).state == "completed"
    run_due(intake, clock, 100)
    assert row(store, 1) is not None  # exactly retain_seconds: kept (strict bound)
    run_due(intake, clock, 0.001)
    assert row(store, 1) is None
    assert intake.accept(body(1)) == "accepted"  # the id can be recorded again


def test_transaction_on_a_given_connection_commits_or_rolls_back(intakes, tmp_path) -> None:  # noqa: ANN001
    import sqlite3

    path = str(tmp_path / "domain.db")
    setup = sqlite3.connect(path)
    setup.execute("CREATE TABLE notes (update_id INTEGER, attempt INTEGER)")
    setup.commit()
    setup.close()
    store, clock = MemoryUpdateStore(), FakeClock()
    results: dict = {}

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        conn = sqlite3.connect(path)
        try:
            uid = update["update_id"]
            if uid == 1:  # committed
                with attempt.transaction(connection=conn) as c:
                    c.execute("INSERT INTO notes VALUES (?, ?)", (uid, attempt.attempt))
            elif uid == 2:  # the body raises: rolled back, propagates
                try:
                    with attempt.transaction(connection=conn.cursor()) as cur:
                        cur.execute("INSERT INTO notes VALUES (?, ?)", (uid, attempt.attempt))
                        raise LookupError("domain")
                except LookupError:
                    results[2] = "propagated"
            elif uid == 3:  # lost ownership before the transaction: nothing written
                clock.advance(10)
                assert attempt.owner_lost.wait(5)
                try:
                    with attempt.transaction(connection=conn) as c:
                        c.execute("INSERT INTO notes VALUES (?, ?)", (uid, attempt.attempt))
                except OwnershipLost:
                    results[3] = "refused"
        finally:
            conn.close()

    intake = make(store, intakes, clock, handle_attempt=handle_attempt, lease_seconds=1)
    for uid in (1, 2, 3):
        intake.accept(body(uid))
        assert intake.idle(5)
    check = sqlite3.connect(path)
    assert check.execute("SELECT update_id, attempt FROM notes").fetchall() == [(1, 1)]
    check.close()
    assert results == {2: "propagated", 3: "refused"}


def test_unary_attempt_has_no_identity() -> None:
    from ptb_fence import RuntimeOptions
    from ptb_fence.runtime._runtime import Runtime

    store = StoreWrapper(methods=BASE_METHODS)
    runtime = Runtime(store, RuntimeOptions(clock=FakeClock()), attempt_aware=False, handle_exhaustion=False)
    store.add(1, body(1), 0)
    attempt = runtime.claim(1)
    assert attempt is not None and not attempt.fenced and attempt.claim_id == ""
    with pytest.raises(TypeError, match="fenced store") as raised:
        attempt.identity
    assert "FencedUpdateProcessor" in str(raised.value)
    runtime.end(attempt)


def test_outbox_of_a_durable_unary_attempt_names_the_front_end_to_use() -> None:
    """A unary runtime with handle_exhaustion claims with claim ids (its attempts are fenced)
    on an outbox store, yet has no sender: the refusal names FencedUpdateProcessor."""
    from ptb_fence import RuntimeOptions, UsageError
    from ptb_fence.runtime._runtime import Runtime

    store = MemoryUpdateStore()
    runtime = Runtime(store, RuntimeOptions(clock=FakeClock()), attempt_aware=False,
                      handle_exhaustion=True)
    store.add(1, body(1), 0)
    attempt = runtime.claim(1)
    assert attempt is not None and attempt.fenced
    with pytest.raises(UsageError) as raised:
        attempt.outbox
    assert "FencedUpdateProcessor" in str(raised.value), raised.value
    runtime.end(attempt)


def test_a_backlog_larger_than_a_sweep_page_is_handled_at_start(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    store.add_many([(uid, body(uid, chat=uid % 50), clock.ms()) for uid in range(1, 1201)])
    seen: List[int] = []
    lock = threading.Lock()

    def handle(update):  # noqa: ANN001, ANN202
        with lock:
            seen.append(update["update_id"])

    intake = make(store, intakes, clock, handle=handle)
    assert wait_until(lambda: len(seen) == 1200 and intake.idle(0), 20)
    assert sorted(seen) == list(range(1, 1201))
    assert store.due(now=HUGE, pending_before=HUGE, limit=10) == []


def test_a_completion_that_does_not_land_fires_owner_lost_and_runs_again(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    seen: List[Attempt] = []

    def handle_attempt(update, attempt):  # noqa: ANN001, ANN202
        seen.append(attempt)
        if len(seen) == 1:
            clock.advance(5)  # paused past its lease; nobody took it over yet

    intake = make(store, intakes, clock, handle_attempt=handle_attempt, lease_seconds=1)
    intake.accept(body(1))
    assert intake.idle(5)
    assert seen[0].owner_lost.is_set()
    assert row(store, 1).state == "processing"  # the late completion did not land
    assert run_due(intake, clock, 0) == 1
    assert [a.attempt for a in seen] == [1, 2]
    assert row(store, 1).state == "completed" and not seen[1].owner_lost.is_set()
