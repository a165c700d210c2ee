"""Claims of several updates at once: the budget that bounds the claims a process holds,
claiming given updates together (a front end starting one update claims the next ones it has
queued with it) and claiming the next page of due updates (the sweeps).

A mixin of :class:`~ptb_fence.runtime._core.Runtime`; every store call goes through its port
(``claim_owned_many``/``claim_due_many``: one statement and one commit where the store can).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

from ptb_fence._values import AttemptIdentity

if TYPE_CHECKING:
    from ptb_fence.runtime._attempt import Attempt
    from ptb_fence.runtime._lease_keeper import LeaseKeeper
    from ptb_fence.runtime._options import RuntimeOptions
    from ptb_fence.runtime._port import StorePort
    from ptb_fence.runtime._reservations import Reservations

__all__ = ["ClaimingOps"]


class ClaimingOps:
    """``claim_budget``, ``reserve_claims``, ``claim_many`` and ``claim_page``."""

    __slots__ = ()

    if TYPE_CHECKING:
        port: StorePort
        options: RuntimeOptions
        delivers_exhaustions: bool
        keeper: LeaseKeeper
        reservations: Reservations

        @property
        def uses_claim_ids(self) -> bool: ...

        def adopt(
            self, identity: AttemptIdentity, lease_until: int, body: Optional[str] = None
        ) -> Attempt: ...

        def claim(self, update_id: int, body: Optional[str] = None) -> Optional[Attempt]: ...

        def take_over_dead(self) -> int: ...

        def report_store_error(
            self, error: BaseException, step: str, *, ids: "Optional[dict[str, Any]]" = None
        ) -> None: ...

    @property
    def claims_ahead(self) -> bool:
        """:obj:`bool`: Updates are claimed in pages and ahead of their start (claim ids and
        not ``strict_chat_order``, under which an update is claimed alone at its chat's turn
        and sweeps list in chat order)."""
        return self.uses_claim_ids and not self.options.strict_chat_order

    def claim_budget(self) -> int:
        """How many more claims this process may take now: ``max_concurrent +
        ingest_claim_buffer`` minus the claims it holds (being renewed).

        Every claim at ingest, at the start of an update and by a sweep stays within it, so
        a process never holds more than ``max_concurrent + ingest_claim_buffer`` claims (a
        crash strands at most that many for a lease), and claims beyond the free slots —
        waiting for a slot — never exceed the buffer.
        """
        held = len(self.keeper.active()) + self.reservations.count
        return max(0, self.options.max_concurrent + self.options.ingest_claim_buffer - held)

    def ahead_budget(self, running: Optional[int] = None) -> int:
        """How many claims may be taken ahead of the updates that will start (at ingest, by
        a sweep, with a starting update): the claims waiting to start (held minus
        ``running``, the updates holding a slot) stay within the buffer, so the own claim of
        an update that takes a slot never needs budget and never exceeds the bound.
        ``running`` defaults to the count the front end keeps in :attr:`reservations`
        (without one: the :meth:`claim_budget`)."""
        if running is None:
            if not self.reservations.tracks_running:
                return self.claim_budget()
            running = self.reservations.running
        waiting = len(self.keeper.active()) + self.reservations.count - running
        return max(0, min(self.claim_budget(), self.options.ingest_claim_buffer - waiting))

    def reserve_claims(self, wanted: int, *, own: int = 0) -> int:
        """Reserve ``own`` claims of updates holding a slot (no budget needed) and up to
        ``wanted`` claims ahead within :meth:`ahead_budget`, atomically (thread-safe:
        recorders, starting updates and sweeps claim at the same time); returns how many of
        ``wanted``. End the reservation (``own`` included) with :meth:`unreserve_claims`
        once the claims taken are registered with the lease keeper (or failed)."""
        return self.reservations.take(wanted, self.ahead_budget, own=own)

    def unreserve_claims(self, count: int) -> None:
        """End a reservation of ``count`` (:meth:`reserve_claims`)."""
        self.reservations.give_back(count)

    def claim_many(self, update_ids: Sequence[int]) -> List[Optional[Attempt]]:
        """Claim ``update_ids`` for their next attempt together (one commit where the store
        can, ``claim_owned_many``), each registered with the lease keeper; per position the
        attempt or :obj:`None` (not taken, as :meth:`claim`). A store error is reported as
        step ``"claim"`` and nothing is taken. Without claim ids: :meth:`claim` per id."""
        ids = list(update_ids)
        if not self.claims_ahead or len(ids) < 2:
            return [self.claim(update_id) for update_id in ids]
        options = self.options
        now = options.now_ms()
        lease_until = options.lease_deadline(now)
        try:
            identities = self.port.claim_owned_many(
                ids,
                now=now,
                lease_until=lease_until,
                max_attempts=options.max_attempts,
                durable_exhaustion=self.delivers_exhaustions,
            )
        except Exception as exc:
            self.report_store_error(exc, "claim", ids={"update_id": ids[0]})
            return [None] * len(ids)
        return [None if i is None else self.adopt(i, lease_until) for i in identities]

    def claim_page(
        self,
        *,
        limit: int,
        include_fresh: bool = False,
        take_over: bool = True,
        after: Optional[int] = None,
    ) -> List[Tuple[Attempt, str]]:
        """Claim the next page of due updates (the rows ``due_page`` lists, at most
        ``limit``) for their next attempt: one statement and one commit where the store can
        (``claim_due_many``), else ``claim_owned`` per row. Returns ``(attempt, body)`` by
        ``update_id``, each attempt registered with the lease keeper.

        With ``take_over`` first makes the claims of provably dead processes claimable; with
        ``after`` only updates with a greater ``update_id`` (the next page of a backlog).
        Needs claim ids (:attr:`uses_claim_ids`). A store error propagates.
        """
        if take_over:
            self.take_over_dead()
        options = self.options
        now = options.now_ms()
        grace = 0 if include_fresh else int(options.pending_grace_seconds * 1000)
        lease_until = options.lease_deadline(now)
        page = self.port.claim_due_many(
            now=now,
            pending_before=now - grace,
            lease_until=lease_until,
            max_attempts=options.max_attempts,
            limit=limit,
            durable_exhaustion=self.delivers_exhaustions,
            after_update_id=after,
        )
        return [(self.adopt(identity, lease_until, body), body) for identity, body in page]
