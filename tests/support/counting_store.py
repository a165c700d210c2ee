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


_GRANTS = ("claim_owned", "claim_owned_many", "add_claimed_many", "add_claimed_and_settle_many",
           "settle_and_claim_many")
_ENDS = ("settle_owned", "settle_owned_many", "add_claimed_and_settle_many",
         "settle_and_claim_many", "release_many", "exhaust")


class ClaimTallyStore:
    """Wraps a store (same capabilities) and tallies the claims it holds for this process, in
    commit order: the calls that grant claims (identities returned) or end them (settles that
    landed, releases) run one at a time, and after each the claims held are counted, so
    :attr:`peak` is the most claims the store held at once. :attr:`calls` counts every method;
    :attr:`claimed_per_call` lists, per call of a granting method, how many it claimed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: "Counter[str]" = Counter()
        self.claimed_per_call: "list[tuple[str, int]]" = []
        self.held = 0
        self.peak = 0
        self._lock = threading.Lock()
        self._serial = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target):
            return target
        tallied = name in _GRANTS or name in _ENDS

        @functools.wraps(target)
        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            if not tallied or kwargs.get("connection") is not None:
                return target(*args, **kwargs)
            with self._serial:
                result = target(*args, **kwargs)
                granted = _identities(result) if name in _GRANTS else 0
                ended = _ended(name, result) if name in _ENDS else 0
                self.held += granted - ended
                self.peak = max(self.peak, self.held)
                if name in _GRANTS:
                    self.claimed_per_call.append((name, granted))
            return result

        return counted


def _is_identity(value: Any) -> bool:
    return hasattr(value, "claim_id") and hasattr(value, "attempt")


def _identities(result: Any) -> int:
    if _is_identity(result):
        return 1
    if isinstance(result, tuple):  # (identities, landed) or (landed, identities)
        return sum(_identities(part) for part in result)
    if isinstance(result, list):
        return sum(1 for value in result if _is_identity(value))
    return 0


def _ended(name: str, result: Any) -> int:
    if name in ("settle_owned", "exhaust"):
        return 1 if result is True else 0
    if name == "add_claimed_and_settle_many":
        return sum(1 for flag in result[1] if flag is True)
    if name == "settle_and_claim_many":
        return sum(1 for flag in result[0] if flag is True)
    return sum(1 for flag in result if flag is True)  # settle_owned_many, release_many
