"""UpdateIntake construction checks and accept() body validation."""

from __future__ import annotations

import json
import math
from typing import Any, List

import pytest

from ptb_fence import MemoryUpdateStore, UpdateIntake
from ptb_fence.contract import BASE_METHODS, FENCED_METHODS
from ptb_fence.contract import DURABLE_METHODS
from runtime_support import FakeClock, StoreDown, StoreWrapper, body, row

NUMERIC = (
    "max_attempts",
    "lease_seconds",
    "sweep_every_seconds",
    "pending_grace_seconds",
    "retain_seconds",
    "max_concurrent",
)


def noop(*args: Any) -> None:
    return None


# -- construction -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"handle": noop, "handle_attempt": noop}, {"handle_exhaustion": noop}],
    ids=["neither", "both", "only-exhaustion"],
)
def test_exactly_one_of_handle_and_handle_attempt(kwargs: Any) -> None:
    with pytest.raises(TypeError, match="exactly one of handle= or handle_attempt="):
        UpdateIntake(MemoryUpdateStore(), **kwargs)


@pytest.mark.parametrize("name", ["handle", "handle_attempt", "handle_exhaustion"])
def test_handlers_must_be_callable(name: str) -> None:
    kwargs = {"handle": noop, name: "not callable"} if name != "handle" else {name: 42}
    with pytest.raises(TypeError, match=name):
        UpdateIntake(MemoryUpdateStore(), **kwargs)


def test_not_a_store_names_the_base_methods() -> None:
    with pytest.raises(TypeError) as info:
        UpdateIntake(object(), handle=noop)
    for name in BASE_METHODS:
        assert name in str(info.value)


def test_handle_attempt_on_an_unfenced_store_names_the_missing_methods() -> None:
    store = StoreWrapper(methods=BASE_METHODS)
    UpdateIntake(store, handle=noop)  # unary handling works on the base six
    with pytest.raises(TypeError) as info:
        UpdateIntake(store, handle_attempt=noop)
    message = str(info.value)
    assert "fenced" in message.lower()
    for name in ("claim_owned", "renew_owned", "owns", "settle_owned"):
        assert name in message
    assert "exhaust" not in message


@pytest.mark.parametrize("handler", ["handle", "handle_attempt"])
def test_handle_exhaustion_on_a_fenced_only_store_names_the_missing_methods(handler: str) -> None:
    store = StoreWrapper(methods=FENCED_METHODS)
    UpdateIntake(store, **{handler: noop})
    with pytest.raises(TypeError) as info:
        UpdateIntake(store, **{handler: noop}, handle_exhaustion=noop)
    message = str(info.value)
    assert "durable" in message.lower()
    for name in ("exhaust", "due_exhaustions", "acknowledge_exhaustion"):
        assert name in message
    assert "claim_owned" not in message


def test_handle_exhaustion_on_a_base_store_is_refused() -> None:
    with pytest.raises(TypeError, match="claim_owned"):
        UpdateIntake(StoreWrapper(methods=BASE_METHODS), handle=noop, handle_exhaustion=noop)


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.parametrize(
    "value",
    [0, -1, -0.5, math.nan, math.inf, True, False, None, "5"],
    ids=["0", "-1", "-0.5", "nan", "inf", "True", "False", "None", "str"],
)
def test_bad_numeric_options_are_a_value_error_naming_the_option(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=name):
        UpdateIntake(MemoryUpdateStore(), handle=noop, **{name: value})


@pytest.mark.parametrize("name", ["max_attempts", "max_concurrent"])
def test_integer_options_refuse_fractions(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        UpdateIntake(MemoryUpdateStore(), handle=noop, **{name: 2.5})


def test_good_options_are_kept() -> None:
    intake = UpdateIntake(
        MemoryUpdateStore(),
        handle=noop,
        max_attempts=1,
        lease_seconds=0.05,
        sweep_every_seconds=1,
        pending_grace_seconds=0.001,
        retain_seconds=1,
        max_concurrent=1,
    )
    assert intake.options.lease_seconds == 0.05 and intake.options.lease_ms == 50
    assert intake.options.max_attempts == 1


@pytest.mark.parametrize("name", ["retry", "on_failure", "on_exhaustion_failure", "on_store_error", "clock"])
def test_callbacks_must_be_callable(name: str) -> None:
    with pytest.raises(TypeError, match=name):
        UpdateIntake(MemoryUpdateStore(), handle=noop, **{name: 5})


def test_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        UpdateIntake(MemoryUpdateStore(), handle=noop, lease=5)


# -- accept -----------------------------------------------------------------------------------
INVALID = [
    b"not json",
    b"",
    b"\xff\xfe{}",  # not UTF-8
    b'{"update_id": 1, "x": "\xe9"}',  # latin-1, not UTF-8
    b"[]",
    b"[1]",
    b"1",
    b'"text"',
    b"null",
    b"{}",
    b'{"message": {}}',
    b'{"update_id": -1}',
    b'{"update_id": "5"}',
    b'{"update_id": 5.0}',
    b'{"update_id": 5.5}',
    b'{"update_id": true}',
    b'{"update_id": false}',
    b'{"update_id": null}',
    b'{"update_id": [5]}',
    b'{"update_id": 9223372036854775808}',  # beyond BIGINT
    b"[" * 100_000 + b"]" * 100_000,  # too deep to parse
    '{"update_id": "7"}',  # str bodies too
    "nope",
]


@pytest.fixture
def wrapped(intakes) -> Any:  # noqa: ANN001
    store = StoreWrapper(methods=DURABLE_METHODS)  # the seed's levels: one add per update
    runs: List[Any] = []
    intake = UpdateIntake(store, handle=runs.append, clock=FakeClock())
    intakes.append(intake)
    intake.start()
    return store, intake, runs


@pytest.mark.parametrize("text", INVALID, ids=lambda t: repr(t)[:30])
def test_invalid_bodies_are_refused_and_nothing_is_stored(wrapped: Any, text: Any) -> None:
    store, intake, runs = wrapped
    assert intake.accept(text) == "invalid"
    assert store.count("add") == 0 and store.count("add_many") == 0
    assert store.due(now=2**62, pending_before=2**62, limit=10) == []


def test_a_non_text_body_is_invalid(wrapped: Any) -> None:
    store, intake, _ = wrapped
    assert intake.accept({"update_id": 1}) == "invalid"  # type: ignore[arg-type]
    assert store.count("add") == 0


@pytest.mark.parametrize("as_bytes", [True, False])
def test_accepted_then_duplicate(wrapped: Any, as_bytes: bool) -> None:
    store, intake, runs = wrapped
    text = body(5, text="héllo ✓")
    payload = text.encode("utf-8") if as_bytes else text
    assert intake.accept(payload) == "accepted"
    assert row(store, 5).body == text  # recorded as received
    assert intake.accept(payload) == "duplicate"
    assert intake.idle(5)
    assert intake.accept(payload) == "duplicate"  # also after it completed
    assert store.count("add") == 3
    assert [u["update_id"] for u in runs] == [5]


@pytest.mark.parametrize("update_id", [0, 2**40, 2**63 - 1])
def test_edge_update_ids_are_valid(wrapped: Any, update_id: int) -> None:
    store, intake, runs = wrapped
    text = json.dumps({"update_id": update_id})
    assert intake.accept(text) == "accepted"
    assert intake.idle(5)
    assert runs == [{"update_id": update_id}]
    assert row(store, update_id).state == "completed"


def test_a_store_error_in_add_propagates_and_nothing_is_stored(wrapped: Any) -> None:
    store, intake, runs = wrapped
    store.fail["add"] = StoreDown("disk full")
    with pytest.raises(StoreDown, match="disk full"):
        intake.accept(body(9))
    assert row(store, 9) is None
    del store.fail["add"]
    assert intake.accept(body(9)) == "accepted"  # the redelivery is recorded
    assert intake.idle(5)
    assert [u["update_id"] for u in runs] == [9]


def test_accept_before_start_records_and_start_handles(intakes) -> None:
    store, runs = MemoryUpdateStore(), []
    intake = UpdateIntake(store, handle=runs.append, clock=FakeClock())
    intakes.append(intake)
    assert intake.accept(body(1)) == "accepted"
    assert intake.accept(b"junk") == "invalid"
    assert intake.idle(0.05) and runs == []
    intake.start()
    intake.start()  # idempotent
    assert intake.idle(5)
    assert [u["update_id"] for u in runs] == [1]
