"""One meaning per word, one verb per transition, a trimmed runtime surface."""

from __future__ import annotations

from enum import Enum

import ptb_fence.runtime
from ptb_fence import MemoryUpdateStore, RuntimeOptions
from ptb_fence.runtime._core import Outcome, Runtime


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
            "UpdateIntake",
            "current_attempt",
            "default_retry",
            "is_permanent_telegram_error",
            "webhook_app",
        ]
    )
    for name in ptb_fence.runtime.__all__:
        assert getattr(ptb_fence.runtime, name) is not None
