"""SuspectClaims: the claims a SQL store object made on suspect rows, until the runtime asks.

A claim statement reads the row's suspicion back with the claim (``RETURNING``), so
:meth:`ptb_fence.BatchStore.claimed_suspect` is answered here, without a statement.
Suspect claims are rare (only a dead instance's rows become suspect), so this is nearly always
empty.
"""

from __future__ import annotations

import threading
from typing import Dict, Tuple

from ptb_fence._values import AttemptIdentity

__all__ = ["SuspectClaims"]

_LIMIT = 10_000
"""Claims kept unanswered at most (the oldest are forgotten: a claim the runtime never asked
about, e.g. one made outside it, must not grow the process forever)."""

# The marks in isolated_claim, written and read by the stores' statements (updates.sql,
# liveness.sql). NULL: never held by a process that died. A claim id: that claim's handler
# started on probation or alone (a crash now is charged to it). '' (given back): a dead process
# held the row, and its handler had not started there on probation or alone. '~' (probation
# over): its handler started on probation and ran past it (a later crash is not charged to it
# alone). '*' (again): given back by a dead process after its handler had started as a
# suspect: the next attempt runs alone. A claim reads back 0 for NULL, 1 for '' and '~', 2 for
# anything else.


class SuspectClaims:
    """The unanswered suspect claims of one store object (thread-safe)."""

    __slots__ = ("_claims", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: Dict[Tuple[int, int, str], int] = {}

    def note(self, identity: AttemptIdentity, suspicion: int) -> None:
        """Remember that ``identity`` took a row of this ``suspicion`` (nothing for 0)."""
        if not suspicion:
            return
        with self._lock:
            self._claims[(identity.update_id, identity.attempt, identity.claim_id)] = suspicion
            while len(self._claims) > _LIMIT:
                del self._claims[next(iter(self._claims))]

    def take(self, identity: AttemptIdentity) -> int:
        """The suspicion of the row ``identity`` took (answered once, then 0)."""
        if not self._claims:  # the usual case: no lock taken
            return 0
        key = (identity.update_id, identity.attempt, identity.claim_id)
        with self._lock:
            return self._claims.pop(key, 0)
