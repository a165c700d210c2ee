"""Deliberately broken MemoryUpdateStore variants: the model-based check must find each one.

Each variant changes exactly one rule (by overriding the memory store's private helpers, which
is acceptable for a test double) and names, in ``DISAGREEMENT``, a regular expression for the
operation(s) whose answer can first disagree with the model (the failure message starts with
the operation).
"""

from __future__ import annotations

from typing import Any, List, Optional

from ptb_fence import AttemptIdentity, MemoryUpdateStore, Settlement


class EagerTakeoverStore(MemoryUpdateStore):
    """Takes a lease over when ``due_at <= now`` (the lease is still held at ``now``)."""

    __slots__ = ()
    DISAGREEMENT = r"^(claim|claim_owned|due)\("

    @staticmethod
    def _claimable(row: Any, now: int) -> bool:
        if row.state == "processing":
            return row.due_at is not None and row.due_at <= now
        return MemoryUpdateStore._claimable(row, now)


class SettleOwnedIgnoresClaimIdStore(MemoryUpdateStore):
    """``settle_owned`` checks update id, attempt and lease, but not the claim id."""

    __slots__ = ()
    DISAGREEMENT = r"^(with transaction\(\) as conn[^:]*: )?settle_owned\("

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(row, identity.attempt, settlement.at, None):
                return False
            self._apply(row, settlement)
            return True


class InclusivePruneStore(MemoryUpdateStore):
    """``prune`` deletes rows with ``settled_at <= before`` (the bound must be strict)."""

    __slots__ = ()
    DISAGREEMENT = r"^prune\("

    def prune(self, before: int) -> int:
        with self._lock:
            doomed: List[int] = [
                u for u, r in self._rows.items()
                if r.state in ("completed", "abandoned")
                and r.settled_at is not None and r.settled_at <= before
            ]
            for u in doomed:
                del self._rows[u]
            return len(doomed)


class RenewOwnedRevivesStore(MemoryUpdateStore):
    """``renew_owned`` ignores ``now``, so it revives a lease that already expired."""

    __slots__ = ()
    DISAGREEMENT = r"^renew_owned(_many)?\("

    def renew_owned(
        self, identity: AttemptIdentity, lease_until: int, now: Optional[int] = None
    ) -> bool:
        return super().renew_owned(identity, lease_until, None)


class DurableSpendSettlesStore(MemoryUpdateStore):
    """A spend with ``durable_exhaustion`` settles the row (the exhaustion is lost)."""

    __slots__ = ()
    DISAGREEMENT = r"^due_exhaustions\("

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[int]:
        return super().claim(
            update_id, now=now, lease_until=lease_until, max_attempts=max_attempts
        )


class ExhaustIgnoresLeaseStore(MemoryUpdateStore):
    """``exhaust`` lets an expired attempt exhaust the update (its lease must hold at ``at``)."""

    __slots__ = ()
    DISAGREEMENT = r"^exhaust\("

    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(row, identity.attempt, None, identity.claim_id):
                return False
            row.state, row.due_at, row.settled_at, row.error = "abandoned", at, None, error
            return True


class ReleaseSpendsAttemptStore(MemoryUpdateStore):
    """``release_many`` gives the row back but keeps its attempt counted as spent."""

    __slots__ = ()
    DISAGREEMENT = r"^(claim|claim_owned|release_many)\("

    def release_many(self, identities: Any, *, at: int) -> List[bool]:
        with self._lock:
            result = super().release_many(identities, at=at)
            for identity, ok in zip(identities, result):
                if ok:
                    self._rows[identity.update_id].attempts += 1
            return result


VARIANTS = [
    ReleaseSpendsAttemptStore,
    EagerTakeoverStore,
    SettleOwnedIgnoresClaimIdStore,
    InclusivePruneStore,
    RenewOwnedRevivesStore,
    DurableSpendSettlesStore,
    ExhaustIgnoresLeaseStore,
]
