"""CountingStore: a store wrapper that counts the calls of its methods (test support)."""

from __future__ import annotations

import functools
import threading
from collections import Counter
from typing import Any


class CountingStore:
    """Wraps a store (same capabilities: every attribute is the wrapped store's) and counts
    the calls of its methods (each write method is one transaction, one commit, in the
    shipped SQL stores)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: "Counter[str]" = Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target):
            return target

        @functools.wraps(target)
        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            return target(*args, **kwargs)

        return counted
