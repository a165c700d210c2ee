"""The event keys of the log lines an operator matches (a dashboard, an alert, a log query).

Each of those records carries ``ptb_fence_event`` (:data:`EVENT_KEY`) in its ``extra``: a
short name that stays the same when the message's wording changes. A JSON formatter indexes
it as any other attribute.
"""

from __future__ import annotations

from typing import Dict

__all__ = ["EVENTS", "EVENT_KEY", "event"]

EVENT_KEY = "ptb_fence_event"
"""The attribute of a log record that names its event."""

EVENTS: Dict[str, str] = {
    "store_error": "a store call failed (``step`` names what it was doing)",
    "store_answers_again": "the first store call that answered after store errors",
    "recording_again": "a getUpdates answer could not be recorded; it is recorded again",
    "attempt_failed": "a handler's attempt failed (``outcome``: retrying, exhausted, abandoned)",
    "update_exhausted": "a handler exhausted its update (``attempt.exhaust``)",
    "claim_lost": "a claim was lost: another process owns the update now",
    "outbox_send_retried": "an outbox call was not sent and is retried",
    "outbox_call_failed": "an outbox call failed for good",
    "alarm": "an alarm condition holds (``alarm`` names it)",
    "alarm_cleared": "an alarm condition cleared (``alarm`` names it)",
    "probes_started": "the probe server listens (``probe_port``)",
}
"""Every event, with what it means (the monitoring how-to's *Logs* section lists the same)."""


def event(name: str, **fields: object) -> "dict[str, object]":
    """The ``extra`` of a log record of event ``name``, with ``fields``.

    Raises:
        KeyError: ``name`` is not one of :data:`EVENTS` (add it there and to docs/howto/monitoring.rst).
    """
    if name not in EVENTS:
        raise KeyError(f"unknown log event {name!r}: add it to ptb_fence._events.EVENTS")
    return {EVENT_KEY: name, **fields}
