"""What operators see in-process: ``stats()``, ``healthy()``, the alarms in the log and the
Prometheus text of ``ptb_fence.metrics``, on real stores and a real UpdateIntake.

The store failures are injected by a store wrapper (tests/support/runtime_support.py), the way a
database that stops answering looks to the runtime.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Dict, List

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ptb_fence import (
    AlarmThresholds,
    Health,
    MemoryUpdateStore,
    RuntimeOptions,
    Stats,
    UpdateIntake,
)
from ptb_fence.contract import DURABLE_METHODS, FIGURES_METHODS
from ptb_fence.metrics import register
from runtime_support import ALL_METHODS, FakeClock, StoreDown, StoreWrapper, body


def _update(update_id: int, date: int) -> str:
    return json.dumps(
        {
            "update_id": update_id,
            "message": {
                "message_id": update_id,
                "date": date,
                "chat": {"id": update_id, "type": "private"},
                "text": "hi",
            },
        }
    )


def _alarms(caplog: pytest.LogCaptureFixture, name: str) -> List[logging.LogRecord]:
    return [
        r for r in caplog.records
        if r.name == "ptb_fence.alarms" and getattr(r, "alarm", None) == name
        and r.levelno == logging.WARNING
    ]


# -- stats() ----------------------------------------------------------------------------------
def test_stats_count_what_an_intake_did(store: Any) -> None:
    def handle(update: Dict[str, Any], attempt: Any) -> None:
        if update["update_id"] == 3:
            raise RuntimeError("boom")

    intake = UpdateIntake(store, handle_attempt=handle, handle_exhaustion=lambda e: None,
                          max_attempts=1, sweep_every_seconds=60)
    before = intake.stats()
    assert isinstance(before, Stats) and before.updates_recorded == 0
    assert dict(before.attempts_ended) == dict.fromkeys(
        ("completed", "failed", "timed_out", "exhausted", "abandoned", "lost", "released",
         "conflicted"), 0
    )
    intake.start()
    try:
        for update_id in range(1, 6):
            assert intake.accept(body(update_id)) == "accepted"
        assert intake.accept(body(2)) == "duplicate"
        assert intake.accept(b"{not json") == "invalid"
        assert intake.idle(10)
        intake.sweep()  # reads the store's figures
        stats = intake.stats()
    finally:
        intake.close()
    assert (stats.updates_recorded, stats.updates_duplicate, stats.updates_invalid) == (5, 1, 1)
    assert stats.attempts_started == 5
    assert stats.attempts_ended["completed"] == 4
    assert stats.attempts_ended["exhausted"] == 1  # max_attempts=1: update 3's only attempt
    assert sum(stats.attempts_ended.values()) == 5
    assert (stats.attempts_running, stats.claims_held) == (0, 0)
    assert stats.handler_seconds.count == 5
    assert stats.handler_seconds.buckets[-1] == (float("inf"), 5)
    assert {"record", "claim", "settle", "sweep"} <= set(stats.store_seconds)
    assert stats.store_seconds["record"].count >= 1
    assert stats.ingest_errors == 0 and dict(stats.store_errors) == {}
    # the shipped stores count for operators: read by the sweep
    assert stats.unsettled == 0 and stats.oldest_unsettled_age_seconds is None
    assert stats.exhaustions_waiting == 0  # delivered and acknowledged
    assert stats.figures_read_at is not None and stats.last_sweep_at is not None
    with pytest.raises(AttributeError):
        stats.updates_recorded = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        stats.attempts_ended["completed"] = 0  # type: ignore[index]


def test_a_store_without_figures_leaves_the_store_gauges_unknown() -> None:
    store = StoreWrapper(methods=ALL_METHODS)  # no figures()
    intake = UpdateIntake(store, handle=lambda update: None, sweep_every_seconds=60)
    intake.start()
    try:
        intake.accept(body(1))
        assert intake.idle(10)
        intake.sweep()
        stats = intake.stats()
    finally:
        intake.close()
    assert stats.attempts_ended["completed"] == 1
    assert stats.unsettled is None and stats.exhaustions_waiting is None
    assert stats.figures_read_at is None


# -- healthy() --------------------------------------------------------------------------------
def test_health_follows_the_store_and_the_lifecycle() -> None:
    store = StoreWrapper(methods=DURABLE_METHODS + FIGURES_METHODS)
    intake = UpdateIntake(store, handle=lambda update: None, sweep_every_seconds=60)
    health = intake.healthy()
    assert isinstance(health, Health) and not health
    assert health.problems == ("not running (not started, or stopped)",)
    intake.start()
    try:
        assert intake.healthy(), intake.healthy().problems
        methods = DURABLE_METHODS + FIGURES_METHODS
        for name in methods:  # the database is down: every call fails
            store.fail[name] = StoreDown("connection refused")
        intake.sweep()
        health = intake.healthy()
        assert not health.healthy
        assert any("store has not answered" in p for p in health.problems), health
        store.fail.clear()
        intake.sweep()  # the store answers again
        assert intake.healthy(), intake.healthy().problems
        store.fail["add"] = StoreDown("disk full")
        with pytest.raises(StoreDown):
            intake.accept(body(7))
        assert any("recording updates fails" in p for p in intake.healthy().problems)
        del store.fail["add"]
        assert intake.accept(body(8)) == "accepted"
        assert intake.healthy(), intake.healthy().problems
    finally:
        intake.close()
    assert not intake.healthy()


# -- alarms -----------------------------------------------------------------------------------
def test_the_ingest_failing_alarm_is_said_once_per_interval_and_cleared(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ptb_fence.alarms")
    store = StoreWrapper(methods=DURABLE_METHODS)
    thresholds = AlarmThresholds(ingest_failing_seconds=0.2, interval_seconds=1.0)
    intake = UpdateIntake(store, handle=lambda update: None, alarms=thresholds)
    store.fail["add"] = StoreDown("server closed the connection")
    sent = int(time.time()) - 3600  # Telegram received it an hour ago
    started = time.monotonic()
    attempts = 0
    while time.monotonic() - started < 2.6:
        with pytest.raises(StoreDown):
            intake.accept(_update(100 + attempts, sent))
        attempts += 1
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    said = _alarms(caplog, "ingest_failing")
    assert attempts > 50  # many failures...
    assert 2 <= len(said) <= int((elapsed - 0.2) / 1.0) + 1, [r.getMessage() for r in said]
    message = said[0].getMessage()
    assert "recording updates has failed for" in message
    assert "dropped by Telegram in 22h" in message or "dropped by Telegram in 23h" in message
    del store.fail["add"]
    assert intake.accept(_update(999, sent)) == "accepted"
    intake.runtime.alarms.check()
    cleared = [r for r in caplog.records if r.name == "ptb_fence.alarms"
               and r.levelno == logging.INFO and "cleared" in r.getMessage()]
    assert [getattr(r, "alarm", None) for r in cleared] == ["ingest_failing"]
    intake.close()


def test_store_figures_raise_the_backlog_the_held_chat_and_the_exhaustion_alarms(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="ptb_fence.alarms")
    clock = FakeClock()
    store = MemoryUpdateStore()
    now = clock.ms()
    store.add_many_in_chats([(1, body(1, chat=5), now - 1_200_000, 5),
                             (2, body(2, chat=5), now - 1_100_000, 5)])
    store.add(3, body(3), now - 7_300_000)
    identity = store.claim_owned(3, now=now - 7_300_000, lease_until=now - 7_200_000,
                                 max_attempts=5)
    assert identity is not None
    assert store.exhaust(identity, at=now - 7_200_000, error="gave up")
    intake = UpdateIntake(store, handle=lambda update: None, clock=clock,
                          strict_chat_order=True, handle_exhaustion=lambda e: 1 / 0)
    intake.runtime.sweep_done(0)  # the end of a sweep: reads the figures, checks the alarms
    backlog = _alarms(caplog, "oldest_unsettled")
    held = _alarms(caplog, "chat_held")
    waiting = _alarms(caplog, "exhaustion_unacknowledged")
    assert len(backlog) == len(held) == len(waiting) == 1
    assert "received 20m 00s ago" in backlog[0].getMessage(), backlog[0].getMessage()
    assert "chat 5 is held by an update received 20m 00s ago" in held[0].getMessage()
    assert "1 exhaustion(s) unacknowledged, the oldest for 2h 00m" in waiting[0].getMessage()
    intake.runtime.sweep_done(0)  # again at once: within the interval, nothing more is said
    assert len(_alarms(caplog, "oldest_unsettled")) == 1
    stats = intake.stats()
    assert stats.unsettled == 2 and stats.exhaustions_waiting == 1
    assert stats.oldest_unsettled_age_seconds == pytest.approx(1200.0)
    intake.close()


def test_alarms_none_turns_them_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ptb_fence.alarms")
    clock = FakeClock()
    store = MemoryUpdateStore()
    store.add(1, body(1), clock.ms() - 86_400_000)
    intake = UpdateIntake(store, handle=lambda update: None, clock=clock, alarms=None)
    intake.runtime.sweep_done(0)
    assert not [r for r in caplog.records if r.name == "ptb_fence.alarms"]
    assert intake.stats().unsettled == 1  # still counted, only not said
    intake.close()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"interval_seconds": -1}, ValueError),
        ({"chat_held_seconds": float("nan")}, ValueError),
        ({"ingest_failing_seconds": "60"}, ValueError),
    ],
)
def test_bad_thresholds_are_refused_naming_the_field(kwargs: Dict[str, Any], error: type) -> None:
    with pytest.raises(error, match=f"AlarmThresholds.{next(iter(kwargs))}"):
        AlarmThresholds(**kwargs)
    with pytest.raises(TypeError, match="alarms must be an AlarmThresholds"):
        RuntimeOptions(alarms={"interval_seconds": 5})  # type: ignore[arg-type]


# -- ptb_fence.metrics ------------------------------------------------------------------------
def test_metrics_follow_prometheus_naming_and_match_stats(store: Any) -> None:
    intake = UpdateIntake(store, handle=lambda update: None, sweep_every_seconds=60)
    registry = CollectorRegistry()
    register(intake, registry, labels={"bot": "shop"})
    intake.start()
    try:
        for update_id in range(1, 4):
            intake.accept(body(update_id))
        assert intake.idle(10)
        intake.sweep()
        text = generate_latest(registry).decode()
        stats = intake.stats()
    finally:
        intake.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, family in families.items():
        assert name.startswith("ptb_fence_"), name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), name
        if family.type == "histogram":
            assert name.endswith("_seconds"), name
        assert family.documentation, name
        for sample in family.samples:
            assert sample.labels.get("bot") == "shop", sample
    assert families["ptb_fence_attempts_ended"].type == "counter"
    completed = [s for s in families["ptb_fence_attempts_ended"].samples
                 if s.labels.get("outcome") == "completed"]
    assert completed[0].value == stats.attempts_ended["completed"] == 3
    assert families["ptb_fence_store_call_duration_seconds"].type == "histogram"
    operations = {s.labels["operation"] for s in families["ptb_fence_store_call_duration_seconds"].samples}
    assert {"record", "claim", "settle", "sweep"} <= operations
    assert families["ptb_fence_unsettled_updates"].samples[0].value == 0
    # a second registration of the same bot is refused, another bot is fine
    with pytest.raises(ValueError, match="Duplicated"):
        register(intake, registry, labels={"bot": "shop"})


def test_register_names_what_it_needs() -> None:
    with pytest.raises(TypeError, match="processor, an UpdateIntake"):
        register(object(), CollectorRegistry())
    # a callable returning Stats works too (e.g. a custom aggregation)
    intake = UpdateIntake(MemoryUpdateStore(), handle=lambda update: None)
    registry = CollectorRegistry()
    register(intake.stats, registry)
    assert "ptb_fence_updates_recorded_total 0.0" in generate_latest(registry).decode()
    intake.close()


def test_counting_is_thread_safe_under_concurrent_accepts() -> None:
    intake = UpdateIntake(MemoryUpdateStore(), handle=lambda update: None)
    barrier = threading.Barrier(8)

    def post(n: int) -> None:
        barrier.wait()
        for i in range(50):
            intake.accept(body(1 + n * 50 + i))
            intake.accept(body(1 + n * 50 + i))  # its duplicate

    threads = [threading.Thread(target=post, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    stats = intake.stats()
    assert (stats.updates_recorded, stats.updates_duplicate) == (400, 400)
    intake.close()


def test_the_reference_metrics_table_names_every_metric() -> None:
    """Every family a scrape can show is in the reference's table, and it names nothing else.

    The table is in docs/reference/metrics.rst.
    """
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "reference" / "metrics.rst"
    # the list-table's rows: a name, then its type
    documented = set(re.findall(
        r"^\s+\* - ``(ptb_fence_[a-z_]+)``\s*\n\s+- (?:counter|gauge|histogram|info|summary)\b",
        page.read_text(encoding="utf-8"), re.M))
    clock = FakeClock()
    store = MemoryUpdateStore()
    store.add(1, body(1), clock.ms() - 5_000)  # so the store gauges show too
    # attempt-aware on an outbox store: the sweep reads the outbox counts too
    intake = UpdateIntake(store, handle_attempt=lambda update, attempt: None, clock=clock)
    intake.runtime.sweep_done(0)
    intake.runtime.sweep_page(include_fresh=False)  # the sweep's and the lease keeper's times
    intake.runtime.keeper.tick()
    registry = CollectorRegistry()
    register(intake, registry)
    exposed = set()
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        exposed.add(family.name + ("_total" if family.type == "counter" else ""))
    intake.close()
    assert "ptb_fence_oldest_unsettled_update_age_seconds" in exposed
    assert exposed == documented
