"""Claims of several rows in one statement in a SQLiteUpdateStore: the given ids
(``claim_owned_many``) and the next page of due rows (``claim_due_many``); the SQL is in
``_sqlite_sql``."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ptb_fence._values import AttemptIdentity
from ptb_fence.stores._names import validate_update_id
from ptb_fence.stores._sqlite_connections import SQLiteConnections
from ptb_fence.stores._sqlite_sql import SQLiteStatements
from ptb_fence.stores._sqlite_writes import int_arg

__all__ = ["SQLiteClaims"]

_NO_CURSOR = -(2**63)  # below every update_id: the page starts at the lowest


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
    """``claim_owned_many`` and ``claim_due_many`` of :class:`ptb_fence.SQLiteUpdateStore`
    (a mixin; optional capabilities, see :class:`ptb_fence.ClaimingUpdateStore`)."""

    __slots__ = ()

    _conns: SQLiteConnections
    _sql: SQLiteStatements
    _liveness: Any

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
        taken = {
            int(update_id): AttemptIdentity(int(update_id), int(attempts), str(claim_id))
            for update_id, state, attempts, claim_id in rows
            if state == "processing"
        }
        result: List[Optional[AttemptIdentity]] = []
        for update_id in ids:
            result.append(taken.pop(update_id, None))
        return result

    def claim_due_many(
        self,
        *,
        now: int,
        pending_before: int,
        lease_until: int,
        max_attempts: int,
        limit: int,
        durable_exhaustion: bool = False,
        after_update_id: Optional[int] = None,
    ) -> List[Tuple[AttemptIdentity, str]]:
        """Claim the page of rows ``due(now=now, pending_before=pending_before, limit=limit)``
        lists, each as :meth:`claim_owned` would, in one statement (one transaction); with
        ``after_update_id`` only rows with a greater id.

        Returns:
            List[Tuple[:class:`~ptb_fence.AttemptIdentity`, :obj:`str`]]: The identity and
            body of each row taken, by ``update_id`` (a row whose attempts are spent is
            abandoned and not returned).
        """
        params = _claim_params(
            now, lease_until, max_attempts, durable_exhaustion, self._liveness.mine()
        )
        params["pending_before"] = int_arg("pending_before", pending_before)
        params["limit"] = max(int_arg("limit", limit), 0)
        params["after"] = _NO_CURSOR if after_update_id is None else int(after_update_id)
        if params["limit"] == 0:
            return []
        with self._conns.immediate() as conn:
            rows = conn.execute(self._sql.claim_due_many, params).fetchall()
        return sorted(
            (
                (AttemptIdentity(int(update_id), int(attempts), str(claim_id)), str(body))
                for update_id, state, attempts, claim_id, body in rows
                if state == "processing"
            ),
            key=lambda taken: taken[0].update_id,
        )
