"""The runtime tests' helpers (tests/support/runtime_support.py) do what the tests rely on."""

from __future__ import annotations

import pytest
from runtime_support import T0, FakeClock, StoreDown, StoreWrapper, body, row

from ptb_fence import is_durable, is_fenced
from ptb_fence.contract import BASE_METHODS, FENCED_METHODS


def test_wrapper_exposes_only_the_named_methods() -> None:
    base = StoreWrapper(methods=BASE_METHODS)
    assert not is_fenced(base)
    assert not hasattr(base, "claim_owned")
    fenced = StoreWrapper(methods=FENCED_METHODS)
    assert is_fenced(fenced) and not is_durable(fenced)
    full = StoreWrapper()
    assert is_durable(full)


def test_wrapper_counts_fails_and_hooks() -> None:
    store = StoreWrapper()
    assert store.add(1, body(1), 0) is True
    assert store.count("add") == 1
    store.fail["add"] = StoreDown("down")
    with pytest.raises(StoreDown):
        store.add(2, body(2), 0)
    del store.fail["add"]
    store.hooks["add"] = lambda original, *a, **k: "hooked"
    assert store.add(3, body(3), 0) == "hooked"
    assert store.count("add") == 3
    assert row(store, 1).state == "pending" and row(store, 2) is None and row(store, 3) is None


def test_fake_clock() -> None:
    clock = FakeClock()
    assert clock() == T0
    clock.advance(1.5)
    assert clock.ms() == int((T0 + 1.5) * 1000)
