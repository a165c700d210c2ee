"""Value types the ``ptb-fence`` command line reads from the update table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, NamedTuple, Optional

from ptb_fence.cli._format import iso_time

__all__ = ["HealthFigures", "Oldest", "OldestCall", "StatusReport", "UpdateRow"]


@dataclass(frozen=True)
class UpdateRow:
    """One row of the update table (its public layout, README "Stores").

    Times are epoch milliseconds."""

    update_id: int
    state: str
    attempts: int
    due_at: Optional[int]
    received_at: Optional[int]
    settled_at: Optional[int]
    error: Optional[str]
    claim_id: Optional[str]
    body: Optional[str] = None

    @classmethod
    def from_db(cls, values: Any) -> "UpdateRow":
        """Build from ``SELECT update_id, state, attempts, due_at, received_at, settled_at,
        error, claim_id[, body]``."""
        values = tuple(values)
        body = values[8] if len(values) > 8 else None

        def opt_int(value: Any) -> Optional[int]:
            return None if value is None else int(value)

        return cls(
            update_id=int(values[0]),
            state=str(values[1]),
            attempts=int(values[2]),
            due_at=opt_int(values[3]),
            received_at=opt_int(values[4]),
            settled_at=opt_int(values[5]),
            error=values[6],
            claim_id=values[7],
            body=body,
        )

    @property
    def unacknowledged_exhaustion(self) -> bool:
        """:obj:`bool`: Abandoned and not settled: an exhaustion waiting for acknowledgement."""
        return self.state == "abandoned" and self.settled_at is None

    def as_json(self, *, body: bool = False) -> Dict[str, Any]:
        """The row as a JSON-ready dict (times as epoch ms and as ISO 8601 UTC)."""
        data: Dict[str, Any] = {
            "update_id": self.update_id,
            "state": self.state,
            "attempts": self.attempts,
            "claim_id": self.claim_id,
            "received_at": self.received_at,
            "received_at_utc": iso_time(self.received_at),
            "due_at": self.due_at,
            "due_at_utc": iso_time(self.due_at),
            "settled_at": self.settled_at,
            "settled_at_utc": iso_time(self.settled_at),
            "error": self.error,
            "unacknowledged_exhaustion": self.unacknowledged_exhaustion,
        }
        if body:
            data["body"] = self.body
        return data


@dataclass(frozen=True)
class StatusReport:
    """What ``ptb-fence status`` shows, read in one consistent snapshot."""

    now: int
    counts: Dict[str, int] = field(default_factory=dict)
    oldest_pending_update_id: Optional[int] = None
    oldest_pending_received_at: Optional[int] = None
    retries_due: int = 0
    leases_lapsed: int = 0
    unacknowledged_exhaustions: int = 0

    @property
    def total(self) -> int:
        """:obj:`int`: All rows."""
        return sum(self.counts.values())

    @property
    def oldest_pending_age_ms(self) -> Optional[int]:
        """:obj:`int` | :obj:`None`: How long the oldest pending row has waited."""
        if self.oldest_pending_received_at is None:
            return None
        return max(self.now - self.oldest_pending_received_at, 0)


class Oldest(NamedTuple):
    """The oldest row of one kind: its ``update_id`` and the time its age counts from (epoch
    milliseconds)."""

    update_id: int
    since: int


class OldestCall(NamedTuple):
    """The oldest unsent outbox call: its ``call_id``, the update whose attempt queued it, and
    when it was committed (``created_at``, epoch milliseconds)."""

    call_id: int
    update_id: int
    since: int


@dataclass(frozen=True)
class HealthFigures:
    """What ``ptb-fence health`` judges, read in one consistent snapshot at ``now``.

    Each ``Oldest`` is :obj:`None` when no row is of that kind.
    """

    now: int
    oldest_pending: Optional[Oldest] = None
    """The pending row received longest ago (``since``: ``received_at``)."""
    oldest_failed_due: Optional[Oldest] = None
    """The failed row whose retry has been due longest (``since``: ``due_at``)."""
    oldest_lapsed_lease: Optional[Oldest] = None
    """The processing row whose lease lapsed longest ago (``since``: ``due_at``)."""
    oldest_exhaustion: Optional[Oldest] = None
    """The oldest unacknowledged exhaustion (``since``: ``due_at``, when it was exhausted)."""
    unacknowledged_exhaustions: int = 0
    has_outbox: bool = False
    """Whether the table has an outbox table (the two outbox figures below are read only
    then)."""
    oldest_unsent_call: Optional["OldestCall"] = None
    """The pending or sending outbox call committed longest ago (``since``: ``created_at``)."""
    unacknowledged_failed_calls: int = 0
    """Outbox calls that failed and were not acknowledged."""
