"""The port's claims of several rows (:class:`~ptb_fence.ClaimingUpdateStore`), with their
per-row fallbacks; a mixin of :class:`~ptb_fence.runtime._port.StorePort`, which probes the
store for the capability (the one place that does)."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Set, Tuple

from ptb_fence._values import AttemptIdentity, StoredUpdate

__all__ = ["ClaimsPort"]


class ClaimsPort:
    """``claim_owned_many`` and ``claim_due_many`` of the port:

    - ``claim_owned_many`` missing → the loop of ``claim_owned`` (an id repeated in the input
      is claimed at its first position only);
    - ``claim_due_many`` missing → ``due`` then ``claim_owned`` per listed row (one commit per
      row; a row another process took in between is skipped).
    """

    __slots__ = ()

    if False:  # pragma: no cover - set by StorePort
        _claim_owned_many: Optional[Callable[..., Any]]
        _claim_due_many: Optional[Callable[..., Any]]

        def claim_owned(
            self,
            update_id: int,
            *,
            now: int,
            lease_until: int,
            max_attempts: int,
            durable_exhaustion: bool = False,
        ) -> Optional[AttemptIdentity]: ...

        def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]: ...

    @property
    def claims_many_at_once(self) -> bool:
        """:obj:`bool`: ``claim_owned_many`` is one statement (one commit) in the store."""
        return self._claim_owned_many is not None

    @property
    def claims_pages_at_once(self) -> bool:
        """:obj:`bool`: ``claim_due_many`` is one statement (one commit) in the store."""
        return self._claim_due_many is not None

    def claim_owned_many(
        self,
        update_ids: Sequence[int],
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> List[Optional[AttemptIdentity]]:
        """``store.claim_owned_many`` (one commit) or the loop of ``claim_owned``: per
        position the identity or :obj:`None`."""
        ids = list(update_ids)
        if self._claim_owned_many is not None and len(ids) > 1:
            got = self._claim_owned_many(
                ids,
                now=now,
                lease_until=lease_until,
                max_attempts=max_attempts,
                durable_exhaustion=durable_exhaustion,
            )
            return list(got)
        seen: Set[int] = set()
        result: List[Optional[AttemptIdentity]] = []
        for update_id in ids:
            identity = None
            if update_id not in seen:
                seen.add(update_id)
                identity = self.claim_owned(
                    update_id,
                    now=now,
                    lease_until=lease_until,
                    max_attempts=max_attempts,
                    durable_exhaustion=durable_exhaustion,
                )
            result.append(identity)
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
        """``store.claim_due_many`` (one statement and commit for the page) or ``due`` then
        ``claim_owned`` per row: ``(identity, body)`` of each row taken, by ``update_id``.
        The fallback ignores ``after_update_id`` (it starts at the lowest due row)."""
        if limit <= 0:
            return []
        if self._claim_due_many is not None:
            got = self._claim_due_many(
                now=now,
                pending_before=pending_before,
                lease_until=lease_until,
                max_attempts=max_attempts,
                limit=limit,
                durable_exhaustion=durable_exhaustion,
                after_update_id=after_update_id,
            )
            return [(identity, str(body)) for identity, body in got]
        taken: List[Tuple[AttemptIdentity, str]] = []
        for row in self.due(now=now, pending_before=pending_before, limit=limit):
            identity = self.claim_owned(
                row.update_id,
                now=now,
                lease_until=lease_until,
                max_attempts=max_attempts,
                durable_exhaustion=durable_exhaustion,
            )
            if identity is not None:
                taken.append((identity, row.body))
        return taken
