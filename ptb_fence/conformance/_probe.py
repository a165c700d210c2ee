"""The probe a rule calls the store through, and the helpers the rule families share.

:class:`Probe` calls one store for one rule.
It checks the type of every value the store returns: real bools, int attempts,
:class:`~ptb_fence.AttemptIdentity` objects and so on.
It collects the violations as ``"<rule>: <what happened>"``.
It turns an exception the store raises into :class:`StoreRaised`, which names the method.
Times are epoch milliseconds around :data:`T`.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Dict, List, Optional, Set, Tuple, cast

from ptb_fence._values import AttemptIdentity, Exhaustion, Settlement, StoredUpdate
from ptb_fence.contract import Batch, Committed, StoreFeatures

T = 1_700_000_000_000
"""The check's time origin (epoch milliseconds)."""
L = 60_000
"""The lease length the rules use (milliseconds)."""
FAR = T + 10**9
"""A time after everything the rules do."""
THREADS = 8
"""How many threads the concurrency rules release together."""
JOIN_TIMEOUT = 30.0
"""How long (seconds) the check waits for a thread it started. It then reports a hang."""


def stamp(t: int) -> str:
    """Write an epoch-ms time relative to the check's origin, e.g. ``T+60001``."""
    delta = t - T
    return f"T{delta:+d}" if delta else "T"


def other_claim_id(claim_id: str) -> str:
    """A fresh claim id that differs from ``claim_id``, for the wrong-identity checks."""
    other = uuid.uuid4().hex
    return other if other != claim_id else other + "x"


def _claim_terms(
    now: int, lease_until: int, max_attempts: int, durable_exhaustion: Optional[bool]
) -> Dict[str, Any]:
    """The keyword arguments of ``claim``/``claim_owned``.

    ``durable_exhaustion`` is there only when the rule passes it.
    A store without the parameter is so called the way it accepts.
    """
    terms: Dict[str, Any] = {"now": now, "lease_until": lease_until, "max_attempts": max_attempts}
    if durable_exhaustion is not None:
        terms["durable_exhaustion"] = durable_exhaustion
    return terms


class Abort(Exception):
    """Stops a rule after a violation that makes the rest of it meaningless."""


class StoreRaised(Exception):
    """Carries an exception raised by a store method, with the method's name."""

    def __init__(self, method: str, error: BaseException) -> None:
        super().__init__(method, error)
        self.method = method
        self.error = error


class Probe:
    """Calls the store for one rule, checks returned types and collects violations."""

    __slots__ = ("_lock", "_noted", "_out", "_rule", "store")

    def __init__(self, store: Any, rule: str, out: List[str]) -> None:
        self.store = store
        self._rule = rule
        self._out = out
        self._lock = threading.Lock()
        self._noted: Set[str] = set()

    # -- reporting -------------------------------------------------------------------------
    def fail(self, message: str) -> None:
        with self._lock:
            self._out.append(f"{self._rule}: {message}")

    def expect(self, ok: bool, message: str) -> bool:
        if not ok:
            self.fail(message)
        return ok

    def require(self, ok: bool, message: str) -> None:
        if not ok:
            self.fail(message + " (the rest of this rule was skipped)")
            raise Abort

    def check_type(self, method: str, ok: bool, expected: str, value: object) -> bool:
        if ok:
            return True
        with self._lock:
            if method in self._noted:
                return False
            self._noted.add(method)
        self.fail(f"{method} returned {type(value).__name__} {value!r}; it must return {expected}")
        return False

    def real_bool(self, method: str, value: object) -> bool:
        self.check_type(method, type(value) is bool, "a real bool (True or False)", value)
        return bool(value)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.store, method)(*args, **kwargs)
        except Exception as exc:
            raise StoreRaised(method, exc) from exc

    def check_identity(self, method: str, value: object) -> bool:
        ok = (
            isinstance(value, AttemptIdentity)
            and type(value.update_id) is int
            and type(value.attempt) is int
            and isinstance(value.claim_id, str)
            and value.claim_id != ""
        )
        self.check_type(
            method,
            ok,
            "an AttemptIdentity with int update_id and attempt and a non-empty str claim_id",
            value,
        )
        return ok

    # -- base contract ---------------------------------------------------------------------
    def add(self, update_id: int, body: str, received_at: int) -> bool:
        return self.real_bool("add", self.call("add", update_id, body, received_at))

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int = 5,
        durable_exhaustion: Optional[bool] = None,
    ) -> Optional[int]:
        kwargs = _claim_terms(now, lease_until, max_attempts, durable_exhaustion)
        value = self.call("claim", update_id, **kwargs)
        ok = value is None or type(value) is int
        self.check_type("claim", ok, "an int attempt or None", value)
        return cast(Optional[int], value)

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        if now is None:
            value = self.call("renew", update_id, attempt, lease_until)
        else:
            value = self.call("renew", update_id, attempt, lease_until, now=now)
        return self.real_bool("renew", value)

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        self.call("settle", update_id, attempt, settlement)

    def due(self, *, now: int, pending_before: int, limit: int = 100) -> List[Tuple[int, str]]:
        value = self.call("due", now=now, pending_before=pending_before, limit=limit)
        ok = isinstance(value, list) and all(
            isinstance(item, StoredUpdate)
            and type(item.update_id) is int
            and isinstance(item.body, str)
            for item in value
        )
        expected = "a list of StoredUpdate (int update_id, str body)"
        if not self.check_type("due", ok, expected, value):
            raise Abort
        return [(item.update_id, item.body) for item in value]

    def due_ids(self, *, now: int, pending_before: int, limit: int = 100) -> List[int]:
        return [u for u, _ in self.due(now=now, pending_before=pending_before, limit=limit)]

    def prune(self, before: int) -> int:
        value = self.call("prune", before)
        self.check_type("prune", type(value) is int, "an int count", value)
        return cast(int, value)

    # -- fenced contract -------------------------------------------------------------------
    def claim_owned(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int = 5,
        durable_exhaustion: Optional[bool] = None,
    ) -> Optional[AttemptIdentity]:
        kwargs = _claim_terms(now, lease_until, max_attempts, durable_exhaustion)
        value = self.call("claim_owned", update_id, **kwargs)
        if value is not None and not self.check_identity("claim_owned", value):
            raise Abort
        return cast(Optional[AttemptIdentity], value)

    def renew_owned(
        self, identity: AttemptIdentity, lease_until: int, now: Optional[int] = None
    ) -> bool:
        if not has_method(self.store, "renew_owned"):
            # The batch form always takes now. A time before every lease checks no expiry,
            # as renew_owned without now does.
            since = -(2**62) if now is None else now
            value = self.call("renew_owned_many", [identity], lease_until, since)
            ok = isinstance(value, list) and len(value) == 1 and type(value[0]) is bool
            self.check_type("renew_owned_many", ok, "a list of 1 real bool", value)
            return bool(value[0]) if ok else False
        if now is None:
            value = self.call("renew_owned", identity, lease_until)
        else:
            value = self.call("renew_owned", identity, lease_until, now=now)
        return self.real_bool("renew_owned", value)

    def owns(self, identity: AttemptIdentity, at: int, **connection: Any) -> bool:
        return self.real_bool("owns", self.call("owns", identity, at, **connection))

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, **connection: Any
    ) -> bool:
        value = self.call("settle_owned", identity, settlement, **connection)
        return self.real_bool("settle_owned", value)

    def commit(self, batch: Batch) -> Committed:
        """``store.commit(batch)``, checked to return a :class:`~ptb_fence.contract.Committed`."""
        value = self.call("commit", batch)
        ok = isinstance(value, Committed)
        self.check_type("commit", ok, "a Committed", value)
        self.require(ok, "commit did not return a Committed")
        assert isinstance(value, Committed)
        return value

    def settle_batch(self, batch: Batch) -> List[Any]:
        """The landings of ``commit(batch)``, checked to be one per settlement.

        Each is a real bool or a :class:`~ptb_fence.StateConflict`.
        """
        landed = list(self.commit(batch).landed)
        self.check_type(
            "commit", len(landed) == len(batch.settlements),
            f"Committed.landed with {len(batch.settlements)} items, one per settlement", landed,
        )
        return landed

    def release_many_one(self, identity: AttemptIdentity, at: int) -> bool:
        value = self.call("release_many", [identity], at=at)
        ok = isinstance(value, list) and len(value) == 1 and type(value[0]) is bool
        self.check_type("release_many", ok, "a list of 1 real bool", value)
        return bool(value[0]) if ok else False

    # -- durable contract ------------------------------------------------------------------
    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        return self.real_bool("exhaust", self.call("exhaust", identity, at=at, error=error))

    def due_exhaustions(
        self, *, limit: int = 100, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        if after_update_id is None:
            value = self.call("due_exhaustions", limit=limit)
        else:
            value = self.call("due_exhaustions", limit=limit, after_update_id=after_update_id)
        ok = isinstance(value, list) and all(
            isinstance(item, Exhaustion)
            and type(item.update_id) is int
            and type(item.attempt) is int
            and isinstance(item.claim_id, str)
            and item.claim_id != ""
            and isinstance(item.body, str)
            and type(item.exhausted_at) is int
            and (item.error is None or isinstance(item.error, str))
            for item in value
        )
        expected = (
            "a list of Exhaustion (int update_id/attempt/exhausted_at, non-empty str claim_id, "
            "str body)"
        )
        if not self.check_type("due_exhaustions", ok, expected, value):
            raise Abort
        return list(value)

    def exhaustion_ids(self) -> List[int]:
        return [e.update_id for e in self.due_exhaustions(limit=1000)]

    def acknowledge_exhaustion(self, identity: AttemptIdentity, at: int) -> bool:
        return self.real_bool(
            "acknowledge_exhaustion", self.call("acknowledge_exhaustion", identity, at)
        )


def is_batch_store(store: Any) -> bool:
    """Whether the store declares :class:`~ptb_fence.StoreFeatures` and has ``commit``."""
    return isinstance(getattr(store, "features", None), StoreFeatures) and has_method(
        store, "commit"
    )


def has_method(store: Any, method: str) -> bool:
    """Whether the store has the optional method (the rules for a capability need it)."""
    return callable(getattr(store, method, None))


def bool_list(p: Probe, method: str, value: object, count: int) -> List[bool]:
    """Check that a batched method returned ``count`` real bools, one per input."""
    ok = isinstance(value, list) and len(value) == count and all(type(v) is bool for v in value)
    p.check_type(method, ok, f"a list of {count} real bools, one per input", value)
    return list(value) if isinstance(value, list) else []


def identity_list(p: Probe, method: str, value: object, count: int) -> List[Any]:
    """Check that a batched claim returned ``count`` identities or :obj:`None`, one per input."""
    ok = (
        isinstance(value, list)
        and len(value) == count
        and all(v is None or isinstance(v, AttemptIdentity) for v in value)
    )
    p.check_type(method, ok, f"a list of {count} AttemptIdentity-or-None, one per input", value)
    items = list(value) if isinstance(value, list) else []
    for item in items:
        if item is not None:
            p.check_identity(method, item)
    return items


def claimed_identity(p: Probe, update_id: int, lease_until: int) -> AttemptIdentity:
    """Record ``update_id`` at ``T`` and claim it (``claim_owned``) until ``lease_until``."""
    p.require(p.add(update_id, "b", T), "add of a new update_id returned False")
    identity = p.claim_owned(update_id, now=T, lease_until=lease_until)
    p.require(identity is not None, "claim_owned of a pending update returned None")
    assert identity is not None
    return identity


class _Rollback(Exception):
    """Raised inside a ``transaction()`` block so it rolls back."""


def write_effects_in_block(p: Probe, identity: AttemptIdentity, effects: Any, at: int, *,
                           rolls_back: bool) -> bool:
    """``write_effects`` of ``effects`` inside a ``transaction()`` block that rolls back or
    ends normally. :obj:`False` when the store has no ``transaction`` or ``write_effects``."""
    if not all(has_method(p.store, m) for m in ("transaction", "write_effects")):
        return False
    try:
        with p.call("transaction") as connection:
            p.call("write_effects", identity, effects, at, connection=connection)
            if rolls_back:
                raise _Rollback
    except _Rollback:
        pass
    return True
