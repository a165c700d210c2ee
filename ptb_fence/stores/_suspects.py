"""SuspectClaims: the claims a SQL store object made on suspect rows, until the runtime asks.

A claim statement reads the row's suspicion back with the claim (``RETURNING``), so
:meth:`ptb_fence.IsolatingUpdateStore.claimed_suspect` is answered here, without a statement.
Suspect claims are rare (only a dead instance's rows become suspect), so this is nearly always
empty. The marks in ``isolated_claim`` and the suspicion they mean are defined here once.
"""

from __future__ import annotations

import threading
from typing import Dict, Tuple

from ptb_fence._values import AttemptIdentity

__all__ = ["SuspectClaims", "suspicion_sql", "taken_over_mark_sql"]

_LIMIT = 10_000
"""Claims kept unanswered at most (the oldest are forgotten: a claim the runtime never asked
about, e.g. one made outside it, must not grow the process forever)."""

# The marks in isolated_claim. NULL: never held by a process that died. A claim id: that
# claim's handler started on probation or alone (a crash now is charged to it). GIVEN_BACK: a
# dead process held the row, and its handler had not started there on probation or alone.
# PROBATION_OVER: its handler started on probation and ran past it (a later crash is not
# charged to it alone). AGAIN: given back by a dead process after its handler had started as a
# suspect: the next attempt runs alone.
GIVEN_BACK = ""
PROBATION_OVER = "~"
AGAIN = "*"


def suspicion_sql(column: str = "isolated_claim") -> str:
    """The SQL expression of a row's suspicion read back by a claim: 0 not suspect, 1 suspect
    (its handler starts on probation), 2 suspect again (its handler runs alone)."""
    return (
        f"CASE WHEN {column} IS NULL THEN 0 "
        f"WHEN {column} IN ('{GIVEN_BACK}', '{PROBATION_OVER}') THEN 1 ELSE 2 END"
    )


def taken_over_mark_sql(column: str = "isolated_claim") -> str:
    """The SQL expression of the new mark of a dead instance's row that was not charged (its
    claim was not marked): a row whose handler never started as a suspect there stays (or
    becomes) given back; one whose handler had started as a suspect is suspect again."""
    return f"CASE WHEN {column} IS NULL OR {column} = '{GIVEN_BACK}' THEN '{GIVEN_BACK}' ELSE '{AGAIN}' END"


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
