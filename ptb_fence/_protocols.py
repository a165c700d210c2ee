"""The store contract: three capability levels, detected by duck typing.

Every method is blocking and each rule is one conditional statement on one row. The methods'
docstrings below state the rules; :func:`ptb_fence.conformance.check_update_store` checks them,
boundaries included (a lease is held while ``due_at >= now``; a failed row is due when
``due_at <= now``; ``prune`` deletes only when ``settled_at < before``). Times are integer
milliseconds since the epoch.
"""

from __future__ import annotations

from typing import Any, List, Optional, Protocol, runtime_checkable

from ptb_fence._values import AttemptIdentity, Exhaustion, Settlement, StoredUpdate

__all__ = [
    "BASE_METHODS",
    "DURABLE_METHODS",
    "DurableUpdateStore",
    "FENCED_METHODS",
    "FencedUpdateStore",
    "UpdateStore",
    "is_durable",
    "is_fenced",
    "missing_methods",
]

BASE_METHODS = ("add", "claim", "renew", "settle", "due", "prune")
"""The six methods of the base contract, :class:`UpdateStore`. This contract never grows."""

FENCED_METHODS = BASE_METHODS + ("claim_owned", "renew_owned", "owns", "settle_owned")
"""The methods of :class:`FencedUpdateStore`: the base six plus four."""

DURABLE_METHODS = FENCED_METHODS + ("exhaust", "due_exhaustions", "acknowledge_exhaustion")
"""The methods of :class:`DurableUpdateStore`: the fenced ten plus three."""


@runtime_checkable
class UpdateStore(Protocol):
    """The base store contract: the original six methods.

    Times are integer milliseconds since the epoch.
    """

    def add(self, update_id: int, body: str, received_at: int) -> bool:
        """Insert a pending row; :obj:`False` if ``update_id`` exists in any state."""

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[int]:
        """Take a claimable row for a new attempt and return the attempt number.

        If the row is claimable but its attempts are spent, abandon it (an unacknowledged
        exhaustion when ``durable_exhaustion``) and return :obj:`None`. Return :obj:`None` as well
        for a live lease, a final row or an unknown id.
        """

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """Extend the lease of ``attempt`` to at least ``lease_until``; never shortens it and,
        with ``now``, never revives an expired one. :obj:`True` when the row matched."""

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Record the result of ``attempt`` if it still holds an unexpired lease at
        ``settlement.at``; otherwise do nothing."""

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """Rows to hand over: pending with ``received_at <= pending_before``, failed with
        ``due_at <= now``, processing with ``due_at < now``; by ``update_id``; at most
        ``limit``."""

    def prune(self, before: int) -> int:
        """Delete completed and abandoned rows with ``settled_at < before``; return the count."""


@runtime_checkable
class FencedUpdateStore(UpdateStore, Protocol):
    """The fenced contract: the base six plus claims with a persisted, unique claim id."""

    def claim_owned(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """As :meth:`claim`, returning the identity with the claim id read back from the row."""

    def renew_owned(
        self, identity: AttemptIdentity, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """As :meth:`renew`, and the claim id must match."""

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """:obj:`True` only while this exact claim holds a lease unexpired at ``at``.

        With ``connection`` (the caller's DB-API connection or cursor), the check runs on it,
        inside the caller's transaction (PostgreSQL: ``SELECT … FOR UPDATE``).
        """

    def settle_owned(self, identity: AttemptIdentity, settlement: Settlement) -> bool:
        """As :meth:`settle`, and the claim id must match; returns whether it landed."""


@runtime_checkable
class DurableUpdateStore(FencedUpdateStore, Protocol):
    """The durable contract: fenced, plus terminal failures kept until acknowledged."""

    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        """Turn the exact live claim into an unacknowledged exhaustion."""

    def due_exhaustions(
        self, *, limit: int, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        """Unacknowledged exhaustions with ``update_id > after_update_id``, by ``update_id``."""

    def acknowledge_exhaustion(self, identity: AttemptIdentity, at: int) -> bool:
        """Acknowledge the exhaustion with exactly this identity; it becomes prunable."""


def missing_methods(store: object, names: "tuple[str, ...]") -> List[str]:
    """Return the names in ``names`` that ``store`` lacks or that are not callable."""
    return [name for name in names if not callable(getattr(store, name, None))]


def is_fenced(store: object) -> bool:
    """Return :obj:`True` if ``store`` has every method of :class:`FencedUpdateStore`."""
    return not missing_methods(store, FENCED_METHODS)


def is_durable(store: object) -> bool:
    """Return :obj:`True` if ``store`` has every method of :class:`DurableUpdateStore`."""
    return not missing_methods(store, DURABLE_METHODS)
