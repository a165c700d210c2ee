"""The port's claim of several rows (:class:`~ptb_fence.ClaimingUpdateStore`), with its
per-row fallback; a mixin of :class:`~ptb_fence.runtime._port.StorePort`, which probes the
store for the capability (the one place that does)."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Set

from ptb_fence._values import AttemptIdentity

__all__ = ["ClaimsPort"]


class ClaimsPort:
    """``claim_owned_many`` of the port; missing in the store → the loop of ``claim_owned``
    (an id repeated in the input is claimed at its first position only)."""

    __slots__ = ()

    if False:  # pragma: no cover - set by StorePort
        _claim_owned_many: Optional[Callable[..., Any]]

        def claim_owned(
            self,
            update_id: int,
            *,
            now: int,
            lease_until: int,
            max_attempts: int,
            durable_exhaustion: bool = False,
        ) -> Optional[AttemptIdentity]: ...

    @property
    def claims_many_at_once(self) -> bool:
        """:obj:`bool`: ``claim_owned_many`` is one statement (one commit) in the store."""
        return self._claim_owned_many is not None

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
