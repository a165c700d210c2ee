"""The optional store capabilities the runtime uses are declared Protocols."""

from __future__ import annotations

import inspect

import ptb_fence
from ptb_fence import (
    BatchUpdateStore,
    BotBoundStore,
    MemoryUpdateStore,
    TransactionalUpdateStore,
)
from ptb_fence.contract import BATCH_METHODS


def test_capabilities_are_exported_and_documented() -> None:
    for name in ("BatchUpdateStore", "TransactionalUpdateStore", "BotBoundStore"):
        assert name in ptb_fence.__all__
    for name in BATCH_METHODS:
        method = getattr(BatchUpdateStore, name)
        assert inspect.getdoc(method), name
    for cls, names in (
        (TransactionalUpdateStore, ("transaction", "owns", "settle_owned")),
        (BotBoundStore, ("bind_bot",)),
    ):
        for name in names:
            assert inspect.getdoc(getattr(cls, name)), name


def test_connection_keyword_is_declared() -> None:
    for name in ("owns", "settle_owned"):
        parameters = inspect.signature(getattr(TransactionalUpdateStore, name)).parameters
        assert parameters["connection"].kind is inspect.Parameter.KEYWORD_ONLY


def test_the_memory_store_offers_them() -> None:
    store = MemoryUpdateStore()
    assert isinstance(store, TransactionalUpdateStore)
    for name in BATCH_METHODS:
        assert callable(getattr(store, name)), name
