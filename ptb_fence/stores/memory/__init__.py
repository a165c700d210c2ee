"""The in-memory store: the executable statement of the store rules."""

from ptb_fence.stores.memory._store import MemoryUpdateStore

__all__ = ["MemoryUpdateStore"]
