"""What the log says of a store outage (StoreOutage) and how long a loop waits between its
tries (Backoff): two ERROR lines per step, the rest DEBUG, one WARNING when the store answers
again; waits of 0.1 s doubling to 0.8 s with jitter, back to 0.1 s after an answer."""

from __future__ import annotations

import logging
from typing import List

import pytest

from ptb_fence.runtime._backoff import BACKOFF_FIRST, BACKOFF_LAST, Backoff
from ptb_fence.runtime._outage import ERRORS_LOGGED, StoreOutage


def test_an_outage_logs_two_errors_per_step_and_one_line_when_the_store_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="ptb_fence.store")
    now: List[float] = [100.0]
    outage = StoreOutage(clock=lambda: now[0])
    outage.answered()  # no outage: nothing said
    assert not outage.ongoing and caplog.records == []

    levels = [outage.failed("outbox") for _ in range(1000)]
    assert levels[:ERRORS_LOGGED] == [logging.ERROR] * ERRORS_LOGGED
    assert set(levels[ERRORS_LOGGED:]) == {logging.DEBUG}
    assert outage.failed("sweep") == logging.ERROR  # its own count
    assert outage.note("sweep") == ""  # the first of two: the next one is still logged
    assert outage.failed("sweep") == logging.ERROR
    assert "logged at DEBUG" in outage.note("sweep")
    assert outage.ongoing

    now[0] = 112.5
    outage.answered()
    outage.answered()  # said once
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["the store answers again after 12.5 s of errors: 1002 store error(s) "
                     "during the outage (outbox 1000, sweep 2)"]
    assert caplog.records[0].levelno == logging.WARNING
    assert not outage.ongoing
    assert outage.failed("outbox") == logging.ERROR  # a new outage starts afresh
    outage.answered()  # a lone error, logged whole: its end is said at INFO
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]


def test_the_waits_double_to_the_last_with_jitter_and_start_over_after_an_answer() -> None:
    backoff = Backoff()
    waits = [backoff.failed() for _ in range(8)]
    bounds = [min(BACKOFF_LAST, BACKOFF_FIRST * 2 ** i) for i in range(8)]
    assert all(b / 2 <= w <= b for w, b in zip(waits, bounds)), (waits, bounds)
    assert bounds[-1] == BACKOFF_LAST
    backoff.answered()
    assert BACKOFF_FIRST / 2 <= backoff.failed() <= BACKOFF_FIRST


class _LiveStore:
    """A memory store with a liveness signal whose release answers while the database is
    down (as a store that closes its liveness connection would)."""

    def __init__(self) -> None:
        from ptb_fence import MemoryUpdateStore

        self.inner = MemoryUpdateStore()
        self.released = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def hold_liveness(self) -> str:
        return "me"

    def release_liveness(self) -> None:
        self.released += 1

    def take_over_dead(self, *, now: int) -> int:
        return 0


def test_letting_go_of_the_liveness_signal_does_not_end_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stop during an outage lets go of its liveness signal, which may need no answer from
    the database: the log must not say the store answers again."""
    from ptb_fence import RuntimeOptions
    from ptb_fence.runtime._runtime import Runtime

    caplog.set_level(logging.DEBUG, logger="ptb_fence.store")
    store = _LiveStore()
    runtime = Runtime(store, RuntimeOptions(), attempt_aware=True, handle_exhaustion=False)
    runtime.report_store_error(ConnectionError("server closed the connection"), "sweep")
    assert runtime.stats.outage.ongoing
    runtime.recovery.release_liveness()
    assert store.released == 1
    assert runtime.stats.outage.ongoing
    assert not [r for r in caplog.records if "answers again" in r.getMessage()]
