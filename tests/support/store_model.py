"""A small reference model of the store contract (the data model and the three capability levels),
written from the specification alone.

It imports nothing from :mod:`ptb_fence`: rows are plain dicts keyed by ``update_id``, claim ids are
model tokens (``"m1"``, ``"m2"``, …) that the model-based check maps to the store's real claim ids.
Every public method is one rule of the contract; the four boundaries of the data model are the two
predicates :meth:`StoreModel.claimable` and :meth:`StoreModel.holds` plus the literal comparisons in
:meth:`StoreModel.due` and :meth:`StoreModel.prune`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

Row = Dict[str, Any]
Identity = Tuple[int, int, object]  # (update_id, attempt, claim token)

ANY_CLAIM = object()  # "do not look at the claim id" (the unfenced base methods)


class StoreModel:
    """The contract as a pure in-memory function of its inputs.

    Args:
        base_claim_writes_claim_id: Whether the base ``claim`` (without ``durable_exhaustion``)
            writes a fresh claim id on a take. True for the memory and SQLite stores; False for
            PostgreSQL, whose base claim never references the column (a legacy rule of that store).
    """

    def __init__(self, *, base_claim_writes_claim_id: bool = True) -> None:
        self.rows: Dict[int, Row] = {}
        self.base_claim_writes_claim_id = base_claim_writes_claim_id
        self._issued = 0

    def _fresh_claim(self) -> str:
        self._issued += 1
        return f"m{self._issued}"

    # -- the data model's boundaries -------------------------------------------------------
    @staticmethod
    def claimable(row: Row, now: int) -> bool:
        """pending; failed with due_at <= now; processing with due_at < now (lease lapsed)."""
        if row["state"] == "pending":
            return True
        if row["state"] == "failed":
            return bool(row["due_at"] <= now)  # a failed row is due at its retry time
        if row["state"] == "processing":
            return bool(row["due_at"] < now)  # the lease is held while due_at >= t
        return False  # completed and abandoned rows are never claimable

    @staticmethod
    def holds(row: Optional[Row], attempt: int, at: Optional[int], claim: object) -> bool:
        """This attempt (and claim, unless ANY_CLAIM) holds a lease with due_at >= at."""
        return (
            row is not None
            and row["state"] == "processing"
            and row["attempts"] == attempt
            and (claim is ANY_CLAIM or row["claim_id"] == claim)
            and (at is None or row["due_at"] >= at)
        )

    # -- base ------------------------------------------------------------------------------
    def add(self, update_id: int, body: str, received_at: int) -> bool:
        """Insert a pending row with 0 attempts; False if the id exists in any state.

        (A different update may replace a settled row; the check's bodies carry no
        update kind, so they have no fingerprint and are always the same update.)"""
        if update_id in self.rows:
            return False  # in any state
        self.rows[update_id] = {
            "body": body, "state": "pending", "attempts": 0, "due_at": received_at,
            "received_at": received_at, "settled_at": None, "error": None, "claim_id": None,
        }
        return True

    def add_many(self, rows: Sequence[Tuple[int, str, int]]) -> List[bool]:
        return [self.add(u, body, at) for u, body, at in rows]  # a repeat in the batch: False

    def _claim(self, update_id: int, now: int, lease_until: int, max_attempts: int,
               durable: bool, write_claim_id: bool) -> Optional[Row]:
        """Claimable and attempts < max_attempts: take (returns the row). Claimable and spent:
        abandon (returns None). Live lease, final or unknown row: nothing (returns None)."""
        row = self.rows.get(update_id)
        if row is None or not self.claimable(row, now):
            return None
        if row["attempts"] < max_attempts:
            row.update(state="processing", attempts=row["attempts"] + 1,
                       due_at=lease_until, error=None)
            if write_claim_id:
                row["claim_id"] = self._fresh_claim()
            return row
        # spend: attempts are used up
        row.update(state="abandoned", due_at=now, error="attempts spent")
        if durable:
            row["settled_at"] = None  # an unacknowledged exhaustion
            if row["claim_id"] is None:
                row["claim_id"] = self._fresh_claim()
        else:
            row["settled_at"] = now
        return None

    def claim(self, update_id: int, *, now: int, lease_until: int, max_attempts: int,
              durable_exhaustion: bool = False) -> Optional[int]:
        write = durable_exhaustion or self.base_claim_writes_claim_id
        row = self._claim(update_id, now, lease_until, max_attempts, durable_exhaustion, write)
        return None if row is None else row["attempts"]

    def claim_owned(self, update_id: int, *, now: int, lease_until: int, max_attempts: int,
                    durable_exhaustion: bool = False) -> Optional[Identity]:
        row = self._claim(update_id, now, lease_until, max_attempts, durable_exhaustion, True)
        if row is None:
            return None
        return (update_id, row["attempts"], row["claim_id"])

    def _renew(self, update_id: int, attempt: int, claim: object, lease_until: int,
               now: Optional[int]) -> bool:
        row = self.rows.get(update_id)
        if not self.holds(row, attempt, now, claim):  # with now: never revive an expired lease
            return False
        assert row is not None
        row["due_at"] = max(row["due_at"], lease_until)  # never shorter
        return True

    def renew(self, update_id: int, attempt: int, lease_until: int,
              now: Optional[int] = None) -> bool:
        """True when the row matched, even if the lease stayed as it was."""
        return self._renew(update_id, attempt, ANY_CLAIM, lease_until, now)

    def renew_many(self, leases: Sequence[Tuple[int, int]], lease_until: int,
                   now: int) -> List[bool]:
        return [self.renew(u, a, lease_until, now) for u, a in leases]

    def _settle(self, update_id: int, attempt: int, claim: object, kind: str, at: int,
                retry_at: Optional[int], error: Optional[str]) -> bool:
        row = self.rows.get(update_id)
        if not self.holds(row, attempt, at, claim):
            return False
        assert row is not None
        if kind == "completed":
            row.update(state="completed", settled_at=at, error=None)
        elif kind == "failed":
            row.update(state="failed", due_at=retry_at, settled_at=None, error=error)
        else:  # abandoned: due_at stays
            row.update(state="abandoned", settled_at=at, error=error)
        return True

    def settle(self, update_id: int, attempt: int, kind: str, at: int,
               retry_at: Optional[int] = None, error: Optional[str] = None) -> None:
        """Lands only on this attempt holding its lease at ``at``; else ignored."""
        self._settle(update_id, attempt, ANY_CLAIM, kind, at, retry_at, error)

    def due(self, *, now: int, pending_before: int, limit: int) -> List[Tuple[int, str]]:
        """Pending rows received at or before pending_before, plus rows claimable at now."""
        found = [
            (u, row["body"]) for u, row in sorted(self.rows.items())
            if (self.released(row) or row["received_at"] <= pending_before
                if row["state"] == "pending" else self.claimable(row, now))
        ]
        return found[: max(limit, 0)]

    @staticmethod
    def released(row: Row) -> bool:
        """A pending row with a claim id was released (``add`` never writes one): ``due``
        lists it at once, whatever ``pending_before``."""
        return row["state"] == "pending" and row["claim_id"] is not None

    def release_many(self, identities: Sequence[Identity], at: int) -> List[bool]:
        """Each exact processing claim (lease live or not) back to pending, attempt not spent:
        attempts - 1, due_at = at, error and claim id kept; an identity repeated once."""
        result = []
        for update_id, attempt, claim in identities:
            row = self.rows.get(update_id)
            ok = self.holds(row, attempt, None, claim) and claim is not ANY_CLAIM
            if ok and row is not None:
                row["state"], row["attempts"], row["due_at"] = "pending", attempt - 1, at
            result.append(ok)
        return result

    def prune(self, before: int) -> int:
        """Delete final rows settled strictly before ``before`` (never an unacknowledged one)."""
        doomed = [u for u, row in self.rows.items()
                  if row["state"] in ("completed", "abandoned")
                  and row["settled_at"] is not None and row["settled_at"] < before]
        for u in doomed:
            del self.rows[u]
        return len(doomed)

    # -- fenced ----------------------------------------------------------------------------
    def renew_owned(self, identity: Identity, lease_until: int, now: Optional[int] = None) -> bool:
        u, attempt, claim = identity
        return self._renew(u, attempt, claim, lease_until, now)

    def renew_owned_many(self, identities: Sequence[Identity], lease_until: int,
                         now: int) -> List[bool]:
        return [self.renew_owned(i, lease_until, now) for i in identities]

    def owns(self, identity: Identity, at: int) -> bool:
        """This exact claim (update, attempt, claim id) holds an unexpired lease at ``at``."""
        u, attempt, claim = identity
        return self.holds(self.rows.get(u), attempt, at, claim)

    def settle_owned(self, identity: Identity, kind: str, at: int,
                     retry_at: Optional[int] = None, error: Optional[str] = None) -> bool:
        u, attempt, claim = identity
        return self._settle(u, attempt, claim, kind, at, retry_at, error)

    # -- durable ---------------------------------------------------------------------------
    def exhaust(self, identity: Identity, *, at: int, error: str) -> bool:
        """The exact live claim becomes an unacknowledged exhaustion (due_at = at)."""
        u, attempt, claim = identity
        row = self.rows.get(u)
        if not self.holds(row, attempt, at, claim):
            return False
        assert row is not None
        row.update(state="abandoned", due_at=at, settled_at=None, error=error)
        return True

    def due_exhaustions(self, *, limit: int,
                        after_update_id: Optional[int] = None) -> List[Tuple[Any, ...]]:
        """(update_id, attempt, claim, body, exhausted_at, error) by update_id."""
        found = [
            (u, row["attempts"], row["claim_id"], row["body"], row["due_at"], row["error"])
            for u, row in sorted(self.rows.items())
            if row["state"] == "abandoned" and row["settled_at"] is None
            and (after_update_id is None or u > after_update_id)
        ]
        return found[: max(limit, 0)]

    def acknowledge_exhaustion(self, identity: Identity, at: int) -> bool:
        """Only the exact identity of an unacknowledged exhaustion; once."""
        u, attempt, claim = identity
        row = self.rows.get(u)
        if (row is None or row["state"] != "abandoned" or row["settled_at"] is not None
                or row["attempts"] != attempt or row["claim_id"] != claim):
            return False
        row["settled_at"] = at  # now ordinary prunable history
        return True

    # -- the whole table (its layout is public) ---------------------------------------------
    def snapshot(self) -> List[Tuple[Any, ...]]:
        """(update_id, body, state, attempts, due_at, received_at, settled_at, error, claim)."""
        return [
            (u, r["body"], r["state"], r["attempts"], r["due_at"], r["received_at"],
             r["settled_at"], r["error"], r["claim_id"])
            for u, r in sorted(self.rows.items())
        ]
