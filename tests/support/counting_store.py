"""CountingStore: a store wrapper that counts the calls of its methods (test support)."""

from __future__ import annotations

import functools
import threading
from collections import Counter
from typing import Any


def batch_kind(batch: Any) -> str:
    """The kind of a :class:`~ptb_fence.Batch` commit, by the parts it holds (the tests count
    commits by these names).

    ``commit_claimed_settle``: claimed records and settlements (records may ride along).
    ``commit_claimed``: claimed records (records may ride along). ``commit_records``: records
    only. ``commit_settle_claim``: settlements and claims. ``commit_settle``: settlements.
    ``commit_claims``: claims.
    """
    if batch.claimed_records:
        return "commit_claimed_settle" if batch.settlements else "commit_claimed"
    if batch.records:
        return "commit_records"
    if batch.settlements:
        return "commit_settle_claim" if batch.claims else "commit_settle"
    return "commit_claims"


def committed_parts(batch: Any, committed: Any) -> Any:
    """A commit's result as the parts :func:`batch_kind` names: the claims it granted and the
    settlements it landed."""
    kind = batch_kind(batch)
    if kind == "commit_claimed_settle":
        return list(committed.claimed_records), list(committed.landed)
    if kind == "commit_claimed":
        return list(committed.claimed_records)
    if kind == "commit_records":
        return list(committed.recorded)
    if kind == "commit_settle_claim":
        return list(committed.landed), list(committed.claims)
    if kind == "commit_settle":
        return list(committed.landed)
    return list(committed.claims)


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
                if name == "commit":  # counted under its kind too (batch_kind)
                    self.calls[batch_kind(args[0])] += 1
            return target(*args, **kwargs)

        return counted


_GRANTS = ("claim_owned", "commit_claims", "commit_claimed", "commit_claimed_settle",
           "commit_settle_claim")
_ENDS = ("settle_owned", "commit_settle", "commit_claimed_settle", "commit_settle_claim",
         "release_many", "exhaust")


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
        tallied = name in _GRANTS or name in _ENDS or name == "commit"

        @functools.wraps(target)
        def counted(*args: Any, **kwargs: Any) -> Any:
            kind = batch_kind(args[0]) if name == "commit" else name
            with self._lock:
                self.calls[name] += 1
                if name == "commit":
                    self.calls[kind] += 1
            if not tallied or kwargs.get("connection") is not None:
                return target(*args, **kwargs)
            with self._serial:
                committed = target(*args, **kwargs)
                result = committed_parts(args[0], committed) if name == "commit" else committed
                granted = _identities(result) if kind in _GRANTS else 0
                ended = _ended(kind, result) if kind in _ENDS else 0
                self.held += granted - ended
                self.peak = max(self.peak, self.held)
                if kind in _GRANTS:
                    self.claimed_per_call.append((kind, granted))
            return committed

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
    if name == "commit_claimed_settle":
        return sum(1 for flag in result[1] if flag is True)
    if name == "commit_settle_claim":
        return sum(1 for flag in result[0] if flag is True)
    return sum(1 for flag in result if flag is True)  # commit_settle, release_many
