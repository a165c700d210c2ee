"""The rows of a MemoryUpdateStore and its recovery operations (release, liveness)."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from ptb_fence._values import AttemptIdentity

__all__ = ["Liveness", "MemoryRecovery", "Row", "new_claim_id"]


@dataclass
class Row:
    """One stored update (the columns of SPEC §3, plus the claiming instance)."""

    update_id: int
    body: str
    state: str
    attempts: int
    due_at: Optional[int]
    received_at: int
    settled_at: Optional[int] = None
    error: Optional[str] = None
    claim_id: Optional[str] = None
    fingerprint: Optional[str] = None
    instance: Optional[str] = None
    chat_key: Optional[int] = None


def new_claim_id() -> str:
    """A fresh claim id."""
    return uuid.uuid4().hex


class Liveness:
    """The instance a memory store holds (:obj:`None`: not holding liveness)."""

    __slots__ = ("instance",)

    def __init__(self) -> None:
        self.instance: Optional[str] = None


class MemoryRecovery:
    """Release and liveness for :class:`~ptb_fence.MemoryUpdateStore` (a mixin).

    Liveness is in-process only: an instance is alive from :meth:`hold_liveness` until
    :meth:`release_liveness`, so :meth:`take_over_dead` never finds a dead one.
    """

    __slots__ = ()

    _lock: "threading.RLock"
    _rows: Dict[int, Row]
    _liveness: "Liveness"

    @staticmethod
    def _released(row: Row) -> bool:
        """A pending row with a claim id was released (``add`` never writes one)."""
        return row.state == "pending" and row.claim_id is not None

    def release_many(self, identities: Sequence[AttemptIdentity], *, at: int) -> List[bool]:
        """Give the exact claims back: pending, ``attempts - 1``, ``due_at = at``, error and
        claim id kept; claimable and listed by ``due`` at once (optional capability, see
        :class:`ptb_fence.ReleasingUpdateStore`).

        Returns:
            List[:obj:`bool`]: Per input position, whether that claim was released.
        """
        at = int(at)
        result: List[bool] = []
        with self._lock:
            for identity in identities:
                row = self._rows.get(identity.update_id)
                ok = (
                    row is not None
                    and row.state == "processing"
                    and row.attempts == identity.attempt
                    and row.claim_id == identity.claim_id
                )
                if ok and row is not None:
                    row.state = "pending"
                    row.attempts -= 1
                    row.due_at = at
                    row.instance = None
                result.append(ok)
        return result

    def hold_liveness(self) -> str:
        """Start holding this store's liveness (idempotent); returns the instance id. Claims
        made through the store from now on record it (optional capability, see
        :class:`ptb_fence.LivenessStore`)."""
        with self._lock:
            if self._liveness.instance is None:
                self._liveness.instance = uuid.uuid4().hex
            return self._liveness.instance

    def release_liveness(self) -> None:
        """Stop holding liveness and forget the instance (idempotent)."""
        with self._lock:
            self._liveness.instance = None

    def take_over_dead(self, *, now: int) -> int:
        """Make the processing rows of dead instances claimable at ``now``.

        In memory every registered instance is alive until it is released, so there is never
        a dead one: returns ``0``.
        """
        int(now)
        return 0
