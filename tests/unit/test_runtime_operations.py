"""Recording, grouped completion and chat order are runtime
operations shared by both front ends; lease deadlines and update-id validity in one place."""

from __future__ import annotations

from typing import Any, Dict, List

from ptb_fence import Attempt, MemoryUpdateStore, RuntimeOptions, UpdateIntake
from ptb_fence.contract import DURABLE_METHODS
from ptb_fence._update_ids import MAX_UPDATE_ID, is_update_id
from ptb_fence.runtime._runtime import Outcome, Runtime

from runtime_support import FakeClock, StoreWrapper, body, row


def _runtime(store: Any, clock: FakeClock) -> Runtime:
    return Runtime(
        store,
        RuntimeOptions(clock=clock, lease_seconds=10),
        attempt_aware=True,
        handle_exhaustion=True,
    )


def test_update_ids_defined_once() -> None:
    assert is_update_id(0) and is_update_id(MAX_UPDATE_ID)
    for bad in (-1, MAX_UPDATE_ID + 1, True, 1.0, None, "5"):
        assert not is_update_id(bad)


def test_record_many_claims_at_ingest_where_the_store_can() -> None:
    clock = FakeClock()
    for store in (MemoryUpdateStore(), StoreWrapper(methods=DURABLE_METHODS)):
        runtime = _runtime(store, clock)
        assert runtime.record(1, body(1)) is True
        results = runtime.record_many([(1, body(1)), (2, body(2))], claim=True)
        assert results[0] is False
        second = results[1]
        if runtime.port.commits_batches:
            assert isinstance(second, Attempt) and second.attempt == 1
            assert second.proven_until == clock.ms() + 10_000  # options.lease_deadline
            assert runtime.keeper.active() == [second]
        else:  # a base-only store: recorded pending, claimed later in chat order
            assert second is True
            assert runtime.keeper.active() == []
        for attempt in runtime.keeper.active():
            runtime.end(attempt)


def test_complete_many_and_record_and_complete() -> None:
    clock = FakeClock()
    outcomes: List[Any] = []
    for store in (MemoryUpdateStore(), StoreWrapper(methods=DURABLE_METHODS)):
        runtime = _runtime(store, clock)
        runtime.record_many([(1, body(1)), (2, body(2))])
        first, second = runtime.claim(1), runtime.claim(2)
        assert first is not None and second is not None
        assert runtime.complete_many([first]) == [Outcome.COMPLETED]
        assert runtime.complete_many([first]) == [Outcome.LOST]  # settled already: not landed
        recorded, done = runtime.record_and_complete([(3, body(3)), (2, body(2))], [second])
        assert not isinstance(recorded, BaseException)
        assert recorded[1] is False and recorded[0] is not False
        assert done == [Outcome.COMPLETED]
        assert row(store, 2).state == "completed"
        outcomes.append((done, [type(r) for r in recorded]))
        for attempt in runtime.keeper.active():
            runtime.end(attempt)


def test_complete_many_reports_a_store_error() -> None:
    clock = FakeClock()
    store = StoreWrapper()
    runtime = _runtime(store, clock)
    runtime.record(1, body(1))
    attempt = runtime.claim(1)
    assert attempt is not None
    store.fail["commit"] = store.fail["settle_owned"] = RuntimeError("down")
    assert runtime.complete_many([attempt]) == [Outcome.LOST]
    runtime.end(attempt)


def test_intake_records_through_the_runtime() -> None:
    """UpdateIntake.accept records with Runtime.record (never the store directly): with a
    base-only store the same path works."""
    seen: List[Dict[str, Any]] = []
    store = StoreWrapper(methods=DURABLE_METHODS)
    with UpdateIntake(store, handle=seen.append) as intake:
        assert intake.accept(body(7)) == "accepted"
        assert intake.accept(body(7)) == "duplicate"
        assert intake.idle(10)
    assert [u["update_id"] for u in seen] == [7]
    assert store.count("add") == 2


def test_one_chat_key_rule_for_both_front_ends() -> None:
    import json

    from telegram import Bot, Update

    from ptb_fence.runtime._chats import chat_key, update_chat_key

    bot = Bot("123:abc")
    samples = [
        json.loads(body(1)),
        json.loads(body(2, chat=-100)),
        {"update_id": 3, "inline_query": {"id": "q", "from": {"id": 42, "is_bot": False,
                                                               "first_name": "U"},
                                         "query": "", "offset": ""}},
        {"update_id": 4},
    ]
    for data in samples:
        assert update_chat_key(Update.de_json(data, bot)) == chat_key(data)
