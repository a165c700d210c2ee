"""attempt.effect_key and attempt.step: work outside Telegram and the database, done once.

Real stores (memory, SQLite file, PostgreSQL table) behind a real ``UpdateIntake`` and a real
PTB ``Application``. A fake payment function counts its calls per effect key.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from typing import Any, Dict, List

import pytest

from ptb_fence import (
    MemoryUpdateStore,
    OwnershipLost,
    StepRecord,
    UpdateIntake,
    UsageError,
)
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import build, polling, run, wait_for
from runtime_support import ALL_METHODS, FakeClock, StoreWrapper, body, wait_until

KEY = re.compile(r"^ptbf-[0-9a-f]{40}$")


def _intake(store: Any, intakes: List[UpdateIntake], handle: Any, **options: Any) -> UpdateIntake:
    options.setdefault("retry", lambda error, attempt: 0.01)
    intake = UpdateIntake(store, handle_attempt=handle, bot_token="123456:TEST", **options)
    intakes.append(intake)
    intake.start()
    return intake


class Payments:
    """A payment function keyed by the effect key: what it was asked, how often."""

    def __init__(self) -> None:
        self.calls: Counter = Counter()
        self._lock = threading.Lock()

    def charge(self, key: str) -> Dict[str, Any]:
        with self._lock:
            self.calls[key] += 1
            return {"charge": f"ch_{len(self.calls)}", "key": key}


def test_the_effect_key_is_the_same_in_every_attempt_and_differs_elsewhere(
    store: Any, intakes: List[UpdateIntake]
) -> None:
    keys: Dict[int, List[str]] = {}
    names: Dict[int, str] = {}

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        keys.setdefault(update["update_id"], []).append(attempt.effect_key("charge"))
        names[update["update_id"]] = attempt.effect_key("refund")
        if attempt.attempt == 1:
            raise RuntimeError("the first attempt fails")

    intake = _intake(store, intakes, handle)
    intake.accept(body(1))
    intake.accept(body(2))
    assert wait_until(lambda: intake.idle(0.05) and all(len(keys.get(u, [])) == 2
                                                         for u in (1, 2)), 15)
    assert keys[1][0] == keys[1][1] and keys[2][0] == keys[2][1]
    every = {keys[1][0], keys[2][0], names[1], names[2]}
    assert len(every) == 4
    assert all(KEY.match(key) for key in every), every


def test_the_key_changes_with_the_bot_and_with_a_reused_update_id(
    intakes: List[UpdateIntake]
) -> None:
    seen: List[str] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        seen.append(attempt.effect_key("charge"))

    for token in ("111:A", "222:B"):
        store = MemoryUpdateStore()
        intake = UpdateIntake(store, handle_attempt=handle, bot_token=token)
        intakes.append(intake)
        intake.start()
        intake.accept(body(7, text="first"))
        assert wait_until(lambda: intake.idle(0.05) and len(seen) in (1, 3), 10)
        if token == "111:A":
            # the same update id again after pruning: Telegram reused it for another update
            assert store.prune(10**15) >= 1
            intake.accept(body(7, chat=99, text="second"))
            assert wait_until(lambda: intake.idle(0.05) and len(seen) == 2, 10)
    assert len(set(seen)) == 3, seen


def test_a_recorded_step_is_returned_to_the_retry_without_calling_again(
    store: Any, intakes: List[UpdateIntake]
) -> None:
    pay = Payments()
    got: List[Any] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        got.append(attempt.step_blocking("charge", pay.charge))
        if attempt.attempt == 1:
            raise RuntimeError("fails after the charge")

    intake = _intake(store, intakes, handle)
    intake.accept(body(1))
    assert wait_until(lambda: intake.idle(0.05) and len(got) == 2, 15)
    assert sum(pay.calls.values()) == 1
    assert got[0] == got[1] == {"charge": "ch_1", "key": got[0]["key"]}
    (record,) = store.steps_of(1)
    assert isinstance(record, StepRecord)
    assert (record.name, record.attempt, record.key) == ("charge", 1, got[0]["key"])


def test_a_stale_attempts_step_record_is_refused(store: Any, intakes: List[UpdateIntake]) -> None:
    clock = FakeClock()
    pay = Payments()
    taken = threading.Event()
    started = threading.Event()
    errors: List[BaseException] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        started.set()
        assert taken.wait(10)
        try:
            attempt.step_blocking("charge", pay.charge)
        except OwnershipLost as exc:
            errors.append(exc)

    intake = _intake(store, intakes, handle, clock=clock, lease_seconds=60, max_attempts=1)
    intake.accept(body(1))
    assert started.wait(10)
    clock.advance(120)  # past the lease: another process takes the update over
    other = store.claim_owned(1, now=clock.ms(), lease_until=clock.ms() + 60_000, max_attempts=5)
    assert other is not None and other.attempt == 2
    taken.set()
    assert wait_until(lambda: intake.idle(0.05), 10)
    assert len(errors) == 1
    assert sum(pay.calls.values()) == 1  # the work ran: its record was refused
    assert store.steps_of(1) == []


def test_step_misuse_is_refused_with_the_fix(store: Any, intakes: List[UpdateIntake]) -> None:
    problems: List[str] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        for name, fn in (("bad", lambda key: object()), ("", lambda key: 1)):
            try:
                attempt.step_blocking(name, fn)
            except UsageError as exc:
                problems.append(str(exc))
        with attempt.transaction():
            try:
                attempt.step_blocking("inside", lambda key: 1)
            except UsageError as exc:
                problems.append(str(exc))

    intake = _intake(store, intakes, handle)
    intake.accept(body(1))
    assert wait_until(lambda: intake.idle(0.05) and len(problems) == 3, 15)
    assert "not JSON" in problems[0] and "same effect key" in problems[0]
    assert "non-empty str" in problems[1]
    assert "inside attempt.transaction()" in problems[2]
    assert [r.name for r in store.steps_of(1)] == []


def test_a_store_without_steps_refuses_a_step_and_still_gives_keys(
    intakes: List[UpdateIntake]
) -> None:
    store = StoreWrapper(methods=ALL_METHODS)  # a durable batch store without steps
    problems: List[str] = []
    keys: List[str] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        keys.append(attempt.effect_key("charge"))
        try:
            attempt.step_blocking("charge", lambda key: 1)
        except UsageError as exc:
            problems.append(str(exc))

    intake = _intake(store, intakes, handle)
    intake.accept(body(1))
    assert wait_until(lambda: intake.idle(0.05) and problems, 10)
    assert "StoreFeatures(steps=True)" in problems[0]
    assert KEY.match(keys[0])


def test_async_steps_in_a_ptb_application_share_commits_and_replay(
    store: Any
) -> None:
    pay = Payments()
    results: Dict[int, List[Any]] = {}
    calls: Dict[str, int] = {}

    async def charge(key: str) -> Dict[str, Any]:
        await asyncio.sleep(0.01)  # an async payment API
        return pay.charge(key)

    async def on_message(update: Any, context: Any) -> None:
        attempt = context.attempt
        first = await attempt.step("charge", charge)
        second = await attempt.step("receipt", lambda key: {"receipt": key[-6:]})
        results.setdefault(update.update_id, []).append((attempt.attempt, first, second))
        if attempt.attempt == 1 and update.update_id % 2:
            raise RuntimeError("odd updates fail once after their steps")

    from telegram.ext import MessageHandler, filters

    async def scenario() -> None:
        with FakeBotApi() as fake:
            processor = FencedUpdateProcessor(store, max_concurrent=16,
                                              retry=lambda error, attempt: 0.01)
            app = build(processor, fake)
            app.add_handler(MessageHandler(filters.ALL, on_message))
            ids = [fake.inject_message(chat_id=100 + i, text="pay") for i in range(20)]
            async with polling(app):
                await wait_for("every update handled", lambda: all(
                    len(results.get(u, [])) == (2 if u % 2 else 1) for u in ids), 30)
            for update_id in ids:
                runs = results[update_id]
                assert len({repr(run[1:]) for run in runs}) == 1, runs  # replayed as recorded
                calls[str(update_id)] = len(store.steps_of(update_id))

    run(scenario(), 60)
    assert sum(pay.calls.values()) == 20 and set(pay.calls.values()) == {1}
    assert set(calls.values()) == {2}
