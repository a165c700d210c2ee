"""The bulk ``retry`` and ``ack`` of the command line: which rows they pick, one conditional
change per row.

Each row is changed in its own short transaction by the same rule as the single command.
That rule is the conditional ``UPDATE`` of ``retry``, or the exact identity of
``acknowledge_exhaustion``. So a row that changed between the pick and its change is skipped,
never forced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ptb_fence._values import AttemptIdentity
from ptb_fence.cli._format import iso_time
from ptb_fence.cli._inspect import TableInspector
from ptb_fence.cli._rows import UpdateRow

__all__ = [
    "BulkOutcome",
    "acknowledge_each",
    "exhaustion_json",
    "pick_exhaustions",
    "pick_retries",
    "retry_each",
]

_PAGE = 500


@dataclass(frozen=True)
class BulkOutcome:
    """What a bulk command did: the ids it changed and those it skipped, with why."""

    dry_run: bool
    picked: Tuple[Dict[str, Any], ...]
    changed: Tuple[int, ...] = ()
    skipped: Tuple[Tuple[int, str], ...] = field(default=())

    def as_json(self) -> Dict[str, Any]:
        """The outcome as a JSON-ready dict."""
        return {
            "dry_run": self.dry_run,
            "matched": len(self.picked),
            "rows": list(self.picked),
            "changed": list(self.changed),
            "skipped": [{"update_id": uid, "reason": why} for uid, why in self.skipped],
        }


def pick_retries(
    inspector: TableInspector, state: str, received_before: Optional[int], limit: Optional[int]
) -> List[UpdateRow]:
    """The rows in ``state`` received before ``received_before`` (all when :obj:`None`), by
    ``update_id``, at most ``limit``."""
    picked: List[UpdateRow] = []
    after: Optional[int] = None
    while limit is None or len(picked) < limit:
        page = inspector.rows(state=state, limit=_PAGE, after=after)
        for row in page:
            if received_before is None or (
                row.received_at is not None and row.received_at < received_before
            ):
                picked.append(row)
        if len(page) < _PAGE:
            break
        after = page[-1].update_id
    return picked[:limit] if limit is not None else picked


def pick_exhaustions(
    store: Any, exhausted_before: Optional[int], limit: Optional[int]
) -> List[Any]:
    """The unacknowledged exhaustions (``store.due_exhaustions``) exhausted before
    ``exhausted_before`` (all when :obj:`None`), by ``update_id``, at most ``limit``."""
    picked: List[Any] = []
    after: Optional[int] = None
    while limit is None or len(picked) < limit:
        page = list(store.due_exhaustions(limit=_PAGE, after_update_id=after))
        for exhaustion in page:
            if exhausted_before is None or exhaustion.exhausted_at < exhausted_before:
                picked.append(exhaustion)
        if len(page) < _PAGE:
            break
        after = page[-1].update_id
    return picked[:limit] if limit is not None else picked


def exhaustion_json(exhaustion: Any) -> Dict[str, Any]:
    """An exhaustion as a JSON-ready dict."""
    return {
        "update_id": exhaustion.update_id,
        "attempt": exhaustion.attempt,
        "claim_id": exhaustion.claim_id,
        "exhausted_at": exhaustion.exhausted_at,
        "exhausted_at_utc": iso_time(exhaustion.exhausted_at),
        "error": exhaustion.error,
    }


def acknowledge_each(
    store: Any, picked: List[Any], at: int, step: Callable[[], None]
) -> Tuple[List[int], List[Tuple[int, str]]]:
    """Acknowledge each picked exhaustion by its exact identity, with ``step()`` after each."""
    changed: List[int] = []
    skipped: List[Tuple[int, str]] = []
    for exhaustion in picked:
        identity = AttemptIdentity(exhaustion.update_id, exhaustion.attempt, exhaustion.claim_id)
        if store.acknowledge_exhaustion(identity, at):
            changed.append(exhaustion.update_id)
        else:
            skipped.append((exhaustion.update_id, "changed meanwhile (retried or acknowledged)"))
        step()
    return changed, skipped


def retry_each(
    inspector: TableInspector, picked: List[UpdateRow], step: Callable[[], None]
) -> Tuple[List[int], List[Tuple[int, str]]]:
    """Retry each picked row with the single ``retry``'s conditional change.

    ``step()`` runs after each."""
    changed: List[int] = []
    skipped: List[Tuple[int, str]] = []
    for row in picked:
        before, done = inspector.retry(row.update_id)
        if done:
            changed.append(row.update_id)
        else:
            now = "gone" if before is None else before.state
            skipped.append((row.update_id, f"changed meanwhile (now {now})"))
        step()
    return changed, skipped
