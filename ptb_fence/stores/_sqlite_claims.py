"""Claims of several rows in one statement in a SQLiteUpdateStore (``claim_owned_many``); the
SQL is in ``_sqlite_sql``."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

from ptb_fence._values import AttemptIdentity
from ptb_fence.stores._names import validate_update_id
from ptb_fence.stores._sqlite_connections import SQLiteConnections
from ptb_fence.stores._sqlite_sql import SQLiteStatements
from ptb_fence.stores._sqlite_writes import int_arg
from ptb_fence.stores._suspects import SuspectClaims

__all__ = ["SQLiteClaims"]


def _claim_params(
    now: int,
    lease_until: int,
    max_attempts: int,
    durable_exhaustion: bool,
    instance: Optional[str],
) -> Dict[str, Any]:
    return {
        "now": int_arg("now", now),
        "lease_until": int_arg("lease_until", lease_until),
        "max_attempts": int_arg("max_attempts", max_attempts),
        "durable": 1 if durable_exhaustion else 0,
        "instance": instance,
    }


class SQLiteClaims:
    """``claim_owned_many`` of :class:`ptb_fence.SQLiteUpdateStore` (a mixin; an optional
    capability, see :class:`ptb_fence.ClaimingUpdateStore`)."""

    __slots__ = ()

    _conns: SQLiteConnections
    _sql: SQLiteStatements
    _liveness: Any
    _suspects: SuspectClaims

    def claim_owned_many(
        self,
        update_ids: Sequence[int],
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> List[Optional[AttemptIdentity]]:
        """:meth:`claim_owned` for each id in one statement (one transaction).

        Returns:
            List[:class:`~ptb_fence.AttemptIdentity` | :obj:`None`]: Per input position, the
            identity the row was claimed with, or :obj:`None` where ``claim_owned`` gives
            :obj:`None` (not claimable, attempts spent, unknown) and at the later positions of
            an id repeated in ``update_ids``.
        """
        ids = [validate_update_id(update_id) for update_id in update_ids]
        params = _claim_params(
            now, lease_until, max_attempts, durable_exhaustion, self._liveness.mine()
        )
        distinct = list(dict.fromkeys(ids))
        if not distinct:
            return []
        params["ids"] = json.dumps(distinct)
        with self._conns.immediate() as conn:
            rows = conn.execute(self._sql.claim_owned_many, params).fetchall()
        taken: Dict[int, AttemptIdentity] = {}
        for update_id, state, attempts, claim_id, suspect in rows:
            if state == "processing":
                identity = AttemptIdentity(int(update_id), int(attempts), str(claim_id))
                taken[identity.update_id] = identity
                if suspect:
                    self._suspects.note(identity)
        result: List[Optional[AttemptIdentity]] = []
        for update_id in ids:
            result.append(taken.pop(update_id, None))
        return result
