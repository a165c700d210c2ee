"""SuspectClaims: the claims a SQL store object made on suspect rows, until the runtime asks.

A claim statement reads the row's isolation mark back with the claim (``RETURNING``), so
:meth:`ptb_fence.IsolatingUpdateStore.claimed_suspect` is answered here, without a statement.
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


class SuspectClaims:
    """The unanswered suspect claims of one store object (thread-safe)."""

    __slots__ = ("_claims", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: Dict[Tuple[int, int, str], None] = {}

    def note(self, identity: AttemptIdentity) -> None:
        """Remember that ``identity`` took a suspect row."""
        with self._lock:
            self._claims[(identity.update_id, identity.attempt, identity.claim_id)] = None
            while len(self._claims) > _LIMIT:
                del self._claims[next(iter(self._claims))]

    def take(self, identity: AttemptIdentity) -> bool:
        """Whether ``identity`` took a suspect row (answered once, then forgotten)."""
        if not self._claims:  # the usual case: no lock taken
            return False
        key = (identity.update_id, identity.attempt, identity.claim_id)
        with self._lock:
            if key not in self._claims:
                return False
            del self._claims[key]
            return True
