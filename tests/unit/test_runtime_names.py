"""One meaning per word, one verb per transition, a trimmed runtime surface."""

from __future__ import annotations

from enum import Enum

import ptb_fence.runtime
from ptb_fence import MemoryUpdateStore, RuntimeOptions
from ptb_fence.runtime._runtime import Outcome, Runtime


def test_outcome_is_a_str_enum() -> None:
    assert issubclass(Outcome, Enum)
    assert Outcome.COMPLETED == "completed"
    assert str(Outcome.RETRYING) == "retrying"
    assert f"{Outcome.LOST}" == "lost"
    assert Outcome("exhausted") is Outcome.EXHAUSTED


def test_runtime_words() -> None:
    runtime = Runtime(
        MemoryUpdateStore(),
        RuntimeOptions(),
        attempt_aware=True,
        handle_exhaustion=True,
    )
    assert runtime.delivers_exhaustions is True
    assert not hasattr(runtime, "durable")  # "durable" means a store level, nothing else
    for verb in ("settle", "settle_completed", "settle_failed", "settle_exhausted", "end"):
        assert callable(getattr(runtime, verb))
    for gone in ("succeed", "fail", "exhaust_attempt"):
        assert not hasattr(runtime, gone)


def test_runtime_all_is_what_a_user_needs() -> None:
    assert sorted(ptb_fence.runtime.__all__) == sorted(
        [
            "Attempt",
            "AttemptTimeout",
            "RuntimeOptions",
            "current_attempt",
            "default_retry",
            "is_permanent_telegram_error",
        ]
    )
    for name in ptb_fence.runtime.__all__:
        assert getattr(ptb_fence.runtime, name) is not None


def test_the_blocking_front_end_is_its_own_package() -> None:
    """The core (``ptb_fence.runtime``) knows no front end; the blocking one lives in
    ``ptb_fence.blocking`` and is exported from ``ptb_fence`` as before."""
    import ptb_fence
    import ptb_fence.blocking

    assert sorted(ptb_fence.blocking.__all__) == ["IntakeJob", "IntakeJobQueue", "UpdateIntake",
                                                  "webhook_app"]
    assert ptb_fence.UpdateIntake is ptb_fence.blocking.UpdateIntake
    assert ptb_fence.webhook_app is ptb_fence.blocking.webhook_app
