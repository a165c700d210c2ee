"""The retry policy: default backoff, retry_after, permanent refusals, custom policies."""

from __future__ import annotations

import datetime as dtm
import time
import warnings

import pytest
from telegram.error import (
    BadRequest,
    Forbidden,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)

from ptb_fence import MemoryUpdateStore, UpdateIntake, default_retry
from ptb_fence.runtime import is_permanent_telegram_error
from runtime_support import FakeClock, Recorder, body, row

# PTB 22.8 warns when a RetryAfter is *constructed* (its message reads ``retry_after``); that is
# PTB's own business. Reading it in default_retry must stay silent (checked below).
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*attribute `retry_after` will be of type:DeprecationWarning"
)

PERMANENT = [
    Forbidden("Forbidden: bot was blocked by the user"),
    Forbidden("Forbidden: user is deactivated"),
    Forbidden("Forbidden: bot can't initiate conversation with a user"),
    BadRequest("Chat not found"),
    BadRequest("Bad Request: chat not found"),
    BadRequest("Can't parse entities: can't find end of the entity starting at byte offset 12"),
    BadRequest("Message is too long"),
]


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(1, 5.0), (2, 20.0), (3, 80.0), (4, 320.0), (5, 900.0), (6, 900.0), (7, 900.0), (8, 900.0)],
)
def test_default_backoff(attempt: int, expected: float) -> None:
    assert near(default_retry(RuntimeError("boom"), attempt), expected)


def test_default_backoff_stays_capped_for_huge_attempt_numbers() -> None:
    assert near(default_retry(RuntimeError("boom"), 10_000), 900.0)


def near(delay: "float | None", expected: float) -> bool:
    """Whether ``delay`` is ``expected`` give or take the default policy's ±10 %."""
    return delay is not None and 0.9 * expected <= delay <= 1.1 * expected


def test_default_backoff_is_spread_so_failures_together_are_not_retried_together() -> None:
    delays = [default_retry(RuntimeError("boom"), 2) for _ in range(400)]
    assert all(near(delay, 20.0) for delay in delays)
    # 400 draws of ±10 %: both tails are reached and hardly two updates retry together
    assert min(delays) < 18.5 and max(delays) > 21.5  # type: ignore[type-var]
    assert len(set(delays)) >= 390


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: str(e)[:40])
@pytest.mark.parametrize("attempt", [1, 3])
def test_permanent_refusals_give_up_at_once(error: Exception, attempt: int) -> None:
    assert is_permanent_telegram_error(error)
    assert default_retry(error, attempt) is None


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("boom"),
        RuntimeError("chat not found"),  # not a Telegram refusal
        TimedOut(),
        NetworkError("Bad Gateway"),
        TelegramError("Internal Server Error: restart"),
        BadRequest("Message to forward not found, please try again"),
    ],
    ids=repr,
)
def test_unknown_errors_are_retried(error: Exception) -> None:
    assert not is_permanent_telegram_error(error)
    assert near(default_retry(error, 1), 5.0)
    assert near(default_retry(error, 2), 20.0)


@pytest.mark.parametrize(
    ("retry_after", "attempt", "expected", "exact"),
    [
        (30, 1, 30.0, True),  # longer than 5 s: wins, exactly
        (30, 3, 80.0, False),  # shorter than the backoff: backoff wins (give or take 10 %)
        (dtm.timedelta(seconds=90), 2, 90.0, True),
        (dtm.timedelta(seconds=7), 3, 80.0, False),
        (22, 2, 22.0, True),  # the top of the backoff's spread (18-22 s): never before it
        (3000, 8, 3000.0, True),  # wins even beyond the 15 min cap
        (dtm.timedelta(minutes=40), 6, 2400.0, True),
    ],
)
def test_retry_after_is_honoured_when_longer(
    retry_after: "int | dtm.timedelta", attempt: int, expected: float, exact: bool
) -> None:
    error = RetryAfter(retry_after)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no PTB deprecation warning from reading it
        delays = [default_retry(error, attempt) for _ in range(200)]
    if exact:
        assert set(delays) == {expected}
    else:
        assert all(near(delay, expected) for delay in delays)
    floor = retry_after.total_seconds() if isinstance(retry_after, dtm.timedelta) else retry_after
    assert all(delay is not None and delay >= floor for delay in delays)


# -- the policy inside the pipeline -----------------------------------------------------------
def _intake(store, intakes, clock, **kwargs):  # noqa: ANN001, ANN202
    intake = UpdateIntake(store, clock=clock, **kwargs)
    intakes.append(intake)
    intake.start()
    return intake


def test_retry_after_sets_the_retry_time_in_the_store(intakes) -> None:  # noqa: ANN001
    store, clock = MemoryUpdateStore(), FakeClock()
    failures = Recorder()

    def handle(update):  # noqa: ANN001, ANN202
        raise RetryAfter(dtm.timedelta(seconds=60))

    intake = _intake(store, intakes, clock, handle=handle, on_failure=failures)
    assert intake.accept(body(1)) == "accepted"
    assert intake.idle(5)
    r = row(store, 1)
    assert (r.state, r.attempts) == ("failed", 1)
    assert r.due_at == clock.ms() + 60_000
    assert "RetryAfter" in r.error
    (error, attempt, retrying), = failures.snapshot()
    assert isinstance(error, RetryAfter) and attempt.attempt == 1 and retrying is True


def test_custom_retry_is_used(intakes) -> None:  # noqa: ANN001
    store, clock = MemoryUpdateStore(), FakeClock()
    seen = Recorder()
    runs = []

    def retry(error, attempt):  # noqa: ANN001, ANN202
        seen(type(error).__name__, attempt)
        return 2.5 if attempt < 2 else None

    def handle(update):  # noqa: ANN001, ANN202
        runs.append(update["update_id"])
        raise KeyError("nope")

    intake = _intake(store, intakes, clock, handle=handle, retry=retry)
    intake.accept(body(7))
    assert intake.idle(5)
    r = row(store, 7)
    assert (r.state, r.due_at) == ("failed", clock.ms() + 2500)
    clock.advance(2.4)
    assert intake.sweep() == 0  # not due yet
    clock.advance(0.1)
    assert intake.sweep() == 1
    assert intake.idle(5)
    assert runs == [7, 7]
    assert seen.snapshot() == [("KeyError", 1), ("KeyError", 2)]
    r = row(store, 7)
    assert (r.state, r.attempts) == ("abandoned", 2)  # the policy gave up; no exhaustion handler
    assert r.settled_at is not None


def test_permanent_refusal_in_the_pipeline_exhausts_after_one_attempt(intakes) -> None:  # noqa: ANN001
    store, clock = MemoryUpdateStore(), FakeClock()
    delivered = Recorder()

    def handle(update):  # noqa: ANN001, ANN202
        raise Forbidden("Forbidden: bot was blocked by the user")

    intake = _intake(store, intakes, clock, handle=handle, handle_exhaustion=delivered)
    intake.accept(body(3))
    assert intake.idle(5)
    (exhaustion,), = delivered.snapshot()
    assert exhaustion.update_id == 3 and exhaustion.attempt == 1
    assert "bot was blocked by the user" in exhaustion.error
    assert store.due_exhaustions(limit=10) == []  # acknowledged


@pytest.mark.parametrize(
    ("bad_policy", "at_once"),
    [
        pytest.param(lambda e, n: 1 / 0, False, id="raises"),
        pytest.param(lambda e, n: "soon", False, id="returns-a-string"),
        pytest.param(lambda e, n: float("nan"), False, id="returns-nan"),
        pytest.param(lambda e, n: float("inf"), False, id="returns-inf"),
        pytest.param(lambda e, n: -3, True, id="returns-negative"),
    ],
)
def test_a_broken_retry_policy_does_not_break_the_pipeline(intakes, bad_policy, at_once) -> None:  # noqa: ANN001
    store, clock = MemoryUpdateStore(), FakeClock()
    failures, store_errors = Recorder(), Recorder()
    runs = []

    def handle(update):  # noqa: ANN001, ANN202
        runs.append(update["update_id"])
        if len(runs) == 1:
            raise ValueError("first try fails")

    intake = _intake(
        store,
        intakes,
        clock,
        handle=handle,
        retry=bad_policy,
        on_failure=failures,
        on_store_error=store_errors,
    )
    intake.accept(body(5))
    assert intake.idle(5)
    assert len(failures.snapshot()) == 1 and failures.snapshot()[0][2] is True
    assert store_errors.snapshot() == []  # a bad policy is not a store error
    if at_once:
        # negative means "now": the retry is due at once, and the intake's retry timer hands it
        # back without a sweep (it may already have run by now; CI saw both orders)
        deadline = time.monotonic() + 5
        while row(store, 5).state != "completed" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert intake.idle(5)
        assert runs == [5, 5]
        assert row(store, 5).state == "completed"
        return
    r = row(store, 5)
    assert r.state == "failed", r  # settled as a retry, not left processing
    assert r.due_at > clock.ms()  # not due yet: the clock does not move by itself here
    clock.advance(367 * 86400)  # inf is clamped to a year
    assert intake.sweep() == 1
    assert intake.idle(5)
    assert runs == [5, 5]
    assert row(store, 5).state == "completed"
