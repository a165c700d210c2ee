"""Alarms and health: what an operator must hear about, said once per interval, and whether
this process is ready for a probe.

The sweep (and a failed recording) asks :meth:`Alarms.check`. Each condition that holds logs
one WARNING under ``ptb_fence.alarms``, then stays quiet for ``interval_seconds`` while it keeps
holding (never a flood), and logs once more (INFO) when it clears. The conditions read only what
the runtime already counted (:class:`~ptb_fence.runtime._stats.RuntimeStats`) and the store's
figures as the sweep last read them: no store call of their own.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple

from ptb_fence._events import event
from ptb_fence._durations import format_duration

from ptb_fence.runtime._options import AlarmThresholds, RuntimeOptions

if TYPE_CHECKING:
    from ptb_fence.runtime._stats import RuntimeStats

__all__ = ["Alarms", "Health", "TELEGRAM_KEEPS_SECONDS", "oldest_date"]

_LOGGER = logging.getLogger("ptb_fence.alarms")

TELEGRAM_KEEPS_SECONDS = 24 * 3600
"""Telegram keeps an update it could not deliver (webhook) or that was not confirmed
(``getUpdates``) for 24 hours after it arrived, then drops it."""

_DATED = (
    "message",
    "edited_message",
    "channel_post",
    "edited_channel_post",
    "business_message",
    "edited_business_message",
    "message_reaction",
    "message_reaction_count",
    "chat_member",
    "my_chat_member",
    "chat_join_request",
    "chat_boost",
    "removed_chat_boost",
)


def oldest_date(bodies: Iterable[str]) -> Optional[int]:
    """The oldest Telegram ``date`` (epoch seconds) among update bodies, or :obj:`None`.

    The bodies that carry one are a message, a post, a member change and a callback query's
    message."""
    oldest: Optional[int] = None
    for body in bodies:
        try:
            update = json.loads(body)
        except ValueError:
            continue
        if not isinstance(update, dict):
            continue
        candidates: List[Any] = [update.get(key) for key in _DATED]
        callback = update.get("callback_query")
        if isinstance(callback, dict):
            candidates.append(callback.get("message"))
        for part in candidates:
            date = part.get("date") if isinstance(part, dict) else None
            if isinstance(date, int) and not isinstance(date, bool) and date > 0:
                oldest = date if oldest is None else min(oldest, date)
    return oldest


@dataclass(frozen=True)
class Health:
    """Whether a processor or :class:`~ptb_fence.UpdateIntake` is healthy now (for a
    readiness endpoint): true when :attr:`problems` is empty.

    Args:
        healthy (:obj:`bool`): Running, the store answering, the lease keeper on time, a sweep
            recent, recording not failing.
        problems (:obj:`tuple` of :obj:`str`): One sentence per problem (empty when healthy).
    """

    healthy: bool
    problems: Tuple[str, ...]

    def __bool__(self) -> bool:
        return self.healthy


class Alarms:
    """The alarms and the health of one runtime (thread-safe).

    Args:
        stats: What the runtime counted.
        options: The runtime's options (``alarms``, ``lease_seconds``, ``sweep_every_seconds``,
            the clock).
    """

    __slots__ = ("_last", "_lock", "_options", "_started_at", "_stats")

    def __init__(self, stats: "RuntimeStats", options: "RuntimeOptions") -> None:
        self._stats = stats
        self._options = options
        self._lock = threading.Lock()
        self._last: Dict[str, float] = {}  # condition -> when it was last logged (monotonic)
        self._started_at: Optional[float] = None

    def started(self) -> None:
        """The front end started (health counts the lease keeper and the sweep from now)."""
        self._started_at = time.monotonic()

    def stopped(self) -> None:
        """The front end stopped."""
        self._started_at = None

    # -- alarms ----------------------------------------------------------------------------
    def check(self) -> None:
        """Log each alarm condition that holds and is due (never raises)."""
        thresholds = self._options.alarms
        if thresholds is None:
            return
        try:
            for name, message in self._conditions(thresholds):
                self._say(name, message, thresholds.interval_seconds)
        except Exception:  # an alarm must never break a sweep or a recording
            _LOGGER.exception("checking the alarms failed")

    def _say(self, name: str, message: Optional[str], interval: float) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(name)
            if message is None:
                if last is not None:
                    del self._last[name]
                    cleared = True
                else:
                    cleared = False
            elif last is None or now - last >= interval:
                self._last[name] = now
                cleared = False
            else:
                return
        if message is not None:
            _LOGGER.warning("%s", message, extra=event("alarm", alarm=name))
        elif cleared:
            _LOGGER.info("cleared: %s", name.replace("_", " "),
                         extra=event("alarm_cleared", alarm=name))

    def _conditions(self, limits: AlarmThresholds) -> List[Tuple[str, Optional[str]]]:
        stats = self._stats
        conditions: List[Tuple[str, Optional[str]]] = []
        # recording (wall clock: Telegram's dates are real time)
        since = stats.ingest_failing_since
        message = None
        if since is not None and time.time() - since >= limits.ingest_failing_seconds:
            message = (
                f"recording updates has failed for {format_duration(time.time() - since)} "
                "(store errors): those updates are not acknowledged, so Telegram sends them "
                "again, but it keeps an update only 24 h"
            )
            oldest = stats.oldest_unrecorded_date
            if oldest is not None:
                left = oldest + TELEGRAM_KEEPS_SECONDS - time.time()
                message += (
                    f"; the oldest one not recorded is dropped by Telegram in "
                    f"{format_duration(max(0.0, left))}"
                    if left > 0
                    else "; the oldest one not recorded is older than that: it may be lost"
                )
        conditions.append(("ingest_failing", message))
        # what the sweep read from the store (the runtime's clock, as the store's times)
        figures = stats.last_figures
        now_ms = self._options.now_ms()
        message = None
        if figures is not None and figures.oldest_unsettled_received_at is not None:
            age = (now_ms - figures.oldest_unsettled_received_at) / 1000.0
            if age >= limits.oldest_unsettled_seconds:
                message = (
                    f"the oldest unsettled update was received {format_duration(age)} ago "
                    f"({figures.unsettled} unsettled): updates pile up or one keeps failing; "
                    "see 'ptb-fence status' and 'ptb-fence list'"
                )
        conditions.append(("oldest_unsettled", message))
        message = None
        if (
            self._options.strict_chat_order
            and figures is not None
            and figures.held_chat is not None
            and figures.held_chat_since is not None
        ):
            age = (now_ms - figures.held_chat_since) / 1000.0
            if age >= limits.chat_held_seconds:
                message = (
                    f"chat {figures.held_chat} is held by an update received "
                    f"{format_duration(age)} ago: its later updates wait behind it "
                    "(strict_chat_order); see 'ptb-fence list'"
                )
        conditions.append(("chat_held", message))
        message = None
        if figures is not None and figures.oldest_exhaustion_at is not None:
            age = (now_ms - figures.oldest_exhaustion_at) / 1000.0
            if age >= limits.exhaustion_unacknowledged_seconds:
                message = (
                    f"{figures.exhaustions_waiting} exhaustion(s) unacknowledged, the oldest "
                    f"for {format_duration(age)}: is handle_exhaustion failing? see "
                    "'ptb-fence exhaustions'"
                )
        conditions.append(("exhaustion_unacknowledged", message))
        conditions.append(("jobs_late", self._jobs_late(limits)))
        return conditions

    def _jobs_late(self, limits: AlarmThresholds) -> Optional[str]:
        """What the jobs-late alarm says, or :obj:`None` while no due job is that late."""
        late = self._stats.jobs_late_seconds
        due = self._stats.jobs_due_count
        if late is None or not due or late < limits.jobs_late_seconds:
            return None
        return (
            f"{due} durable job(s) due and not fired, the most overdue late by "
            f"{format_duration(late)}: is a process with durable jobs running and its store "
            "answering? see 'ptb-fence jobs list'"
        )

    # -- health -----------------------------------------------------------------------------
    def health(self, *, running: bool) -> Health:
        """Whether the front end is healthy now: started and not stopped, the store answering
        (its last call did not fail), the lease keeper on time, a sweep read the store
        recently, recording not failing, no durable job late past
        :attr:`AlarmThresholds.jobs_late_seconds` (while the alarms are on)."""
        return self._verdict(
            running,
            lambda up: (
                self._store_problems()
                + self._loop_problems(up, self._stats.last_sweep_at, "read the store")
                + self._ingest_problems()
                + self._jobs_problems()
            ),
        )

    def liveness(self, *, running: bool) -> Health:
        """Whether this process's loops tick (a liveness probe): started, the lease keeper on
        time, a sweep ran recently. A store that does not answer is no problem here: the
        sweep still runs (and backs off), and restarting the process would not help."""
        return self._verdict(
            running, lambda up: self._loop_problems(up, self._stats.last_sweep_run_at, "ran")
        )

    def readiness(self, *, running: bool) -> Health:
        """Whether this process can do its work (a readiness probe): started, the store
        answering (its last call did not fail), recording not failing."""
        return self._verdict(running, lambda up: self._store_problems() + self._ingest_problems())

    def _verdict(self, running: bool, problems: Callable[[float], List[str]]) -> Health:
        started = self._started_at
        if not running or started is None:
            return Health(False, ("not running (not started, or stopped)",))
        found = problems(time.monotonic() - started)
        return Health(not found, tuple(found))

    def _store_problems(self) -> List[str]:
        failing = self._stats.store_failing_since
        if failing is None:
            return []
        return [
            f"the store has not answered for {format_duration(time.time() - failing)} "
            "(its last calls failed)"
        ]

    def _jobs_problems(self) -> List[str]:
        """Durable jobs late past the alarm's threshold. Readiness leaves them out: the
        lateness is the same in every process sharing the store, so it would take them all
        out of service."""
        thresholds = self._options.alarms
        if thresholds is None:
            return []
        late = self._jobs_late(thresholds)
        return [] if late is None else [late.split(": is ", 1)[0]]

    def _ingest_problems(self) -> List[str]:
        ingest = self._stats.ingest_failing_since
        if ingest is None:
            return []
        return [f"recording updates fails since {format_duration(time.time() - ingest)} ago"]

    def _loop_problems(self, up: float, swept: Optional[float], did: str) -> List[str]:
        """The lease keeper's tick and the sweep (``swept``: when it last ran, or read the
        store, as ``did`` says) against their intervals, ``up`` seconds after the start."""
        problems: List[str] = []
        now_wall = time.time()
        tick_every = self._options.lease_seconds / 4.0
        late_after = 3 * tick_every + 5.0
        tick = self._stats.last_renewal_tick_at
        if (tick is None and up > late_after) or (
            tick is not None and now_wall - tick > late_after
        ):
            problems.append(
                "the lease keeper is late (it renews leases every "
                f"{format_duration(tick_every)}): leases may lapse"
            )
        sweep_late = 2 * self._options.sweep_every_seconds + 10.0
        if (swept is None and up > sweep_late) or (
            swept is not None and now_wall - swept > sweep_late
        ):
            problems.append(f"no sweep {did} in the last {format_duration(sweep_late)}")
        return problems
