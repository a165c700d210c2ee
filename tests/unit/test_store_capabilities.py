"""The store contract: the seed's three levels, a batch store and its declared parts."""

from __future__ import annotations

import inspect

import ptb_fence
import ptb_fence.contract as contract
from ptb_fence import BatchStore, MemoryUpdateStore, OutboxStore, StateStore, StoreFeatures
from ptb_fence.contract import BATCH_STORE_METHODS, FEATURE_METHODS


def test_the_contract_has_at_most_six_protocols() -> None:
    protocols = [
        name for name, value in vars(contract).items()
        if inspect.isclass(value) and value.__module__ == contract.__name__
        and getattr(value, "_is_protocol", False)
    ]
    assert sorted(protocols) == sorted([
        "UpdateStore", "FencedUpdateStore", "DurableUpdateStore", "BatchStore", "OutboxStore",
        "StateStore",
    ])


def test_every_method_of_the_contract_is_exported_and_documented() -> None:
    for name in ("BatchStore", "OutboxStore", "StateStore", "StoreFeatures", "Batch", "Committed"):
        assert name in ptb_fence.__all__
    for name in BATCH_STORE_METHODS:
        assert inspect.getdoc(getattr(BatchStore, name)), name
    owners = {"outbox": OutboxStore, "state": StateStore}
    for part, names in FEATURE_METHODS.items():
        for name in names:
            assert inspect.getdoc(getattr(owners.get(part, BatchStore), name)), (part, name)


def test_a_batch_store_takes_the_caller_s_connection() -> None:
    for name in ("owns", "settle_owned"):
        parameters = inspect.signature(getattr(BatchStore, name)).parameters
        assert parameters["connection"].kind is inspect.Parameter.KEYWORD_ONLY


def test_the_memory_store_is_a_batch_store_with_the_methods_it_declares() -> None:
    store = MemoryUpdateStore()
    # not isinstance: a store need not have the methods of a part it does not declare
    assert isinstance(store.features, StoreFeatures)
    assert not store.features.isolation  # one process: no crash to isolate
    for name in BATCH_STORE_METHODS + store.features.methods:
        assert callable(getattr(store, name)), name


def test_a_state_part_needs_the_outbox() -> None:
    try:
        StoreFeatures(state=True)
    except ValueError as exc:
        assert "outbox=True" in str(exc)
    else:  # pragma: no cover - the assertion below names it
        raise AssertionError("StoreFeatures(state=True) without the outbox was accepted")
