"""Claims of several rows in one statement in a PostgresUpdateStore (``claim_owned_many``); the
SQL is in ``_pg_claims_sql``."""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ptb_fence._values import AttemptIdentity
from ptb_fence.stores._names import validate_update_id
from ptb_fence.stores._pg_claims_sql import ClaimStatements
from ptb_fence.stores._pg_executor import PgExecutor
from ptb_fence.stores._suspects import SuspectClaims

__all__ = ["PostgresClaims"]


class PostgresClaims:
    """``claim_owned_many`` of :class:`ptb_fence.PostgresUpdateStore` (a mixin; an optional
    capability, see :class:`ptb_fence.ClaimingUpdateStore`). It needs the ``claim_id``
    column."""

    __slots__ = ()

    _db: PgExecutor
    _liveness: Any
    _suspects: SuspectClaims

    def _claims_params(
        self, now: int, lease_until: int, max_attempts: int, durable_exhaustion: bool
    ) -> Dict[str, Any]:
        return {
            "now": int(now),
            "lease_until": int(lease_until),
            "max_attempts": int(max_attempts),
            "durable": bool(durable_exhaustion),
            "instance": self._liveness.mine(),
        }

    def claim_owned_many(
        self,
        update_ids: Sequence[int],
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> List[Optional[AttemptIdentity]]:
        """:meth:`claim_owned` for each id in one statement and commit (the rows are locked
        in ``update_id`` order; a row held by an open transaction is waited for, as
        ``claim_owned`` waits).

        Returns:
            List[:class:`~ptb_fence.AttemptIdentity` | :obj:`None`]: Per input position, the
            identity the row was claimed with, or :obj:`None` where ``claim_owned`` gives
            :obj:`None` (not claimable, attempts spent, unknown) and at the later positions of
            an id repeated in ``update_ids``.
        """
        ids = [validate_update_id(update_id) for update_id in update_ids]
        distinct = list(dict.fromkeys(ids))
        if not distinct:
            return []
        params = self._claims_params(now, lease_until, max_attempts, durable_exhaustion)
        params["update_ids"] = distinct
        params["claim_ids"] = [uuid.uuid4().hex for _ in distinct]
        instance = self._db.has_column("instance")
        suspect = instance and self._db.has_column("isolated_claim")
        sql = ClaimStatements(self._db.table).claim_owned_many(instance, suspect)

        def work(cur: Any) -> List[Tuple[Any, ...]]:
            cur.execute(sql, params)
            return list(cur.fetchall())

        taken: Dict[int, AttemptIdentity] = {}
        for row in self._db.run(work):
            if row[1] == "processing":
                identity = AttemptIdentity(int(row[0]), int(row[2]), str(row[3]))
                taken[identity.update_id] = identity
                if suspect and row[4]:
                    self._suspects.note(identity)
        return [taken.pop(update_id, None) for update_id in ids]
