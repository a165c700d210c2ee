"""When a durable job runs: its schedule as JSON text, and its next run after a run.

A schedule is kept in the store as JSON, so any process can compute the next run after a
restart or a deploy. APScheduler's triggers, which PTB's ``JobQueue`` uses, compute the
times. Times are epoch milliseconds, as everywhere in the stores.

The catch-up rule: runs missed while no process was up run once, at the first look after
they fell due (APScheduler's ``coalesce=True``). With ``misfire_grace_time`` a run later
than that many seconds is skipped instead. The next run then follows the missed ones.
"""

from __future__ import annotations

import datetime as dtm
import json
from typing import Any, Dict, Mapping, Optional, Tuple

from ptb_fence._errors import UsageError

__all__ = ["JobSchedule", "first_run", "next_run"]

_UTC = dtm.timezone.utc

_CRON_FIELDS = ("year", "month", "day", "week", "day_of_week", "hour", "minute", "second")

_MOST_SKIPPED = 100_000
"""The most missed runs one look steps over one by one (then it computes from now)."""


def _ms(when: dtm.datetime) -> int:
    return int(when.timestamp() * 1000)


def _dt(ms: int) -> dtm.datetime:
    return dtm.datetime.fromtimestamp(ms / 1000, tz=_UTC)


def _zone(timezone: Any) -> Optional[str]:
    """A time zone's name as JSON keeps it (a ``zoneinfo`` key or UTC)."""
    if timezone is None:
        return None
    key = getattr(timezone, "key", None) or getattr(timezone, "zone", None)
    if isinstance(key, str):
        return key
    if timezone in (_UTC, dtm.timezone.utc) or str(timezone) in ("UTC", "utc"):
        return "UTC"
    if isinstance(timezone, str):
        return timezone
    raise UsageError(
        f"a durable job's time zone must have a name, not {timezone!r}: use "
        "zoneinfo.ZoneInfo('Europe/Berlin') or datetime.timezone.utc"
    )


class JobSchedule:
    """A job's schedule: one run, runs at an interval, or calendar runs (cron fields).

    Args:
        kind: ``"once"``, ``"interval"`` or ``"cron"``.
        spec: The schedule's settings (JSON values only).
    """

    __slots__ = ("kind", "spec")

    def __init__(self, kind: str, spec: Mapping[str, Any]) -> None:
        if kind not in ("once", "interval", "cron"):
            raise ValueError(f"unknown schedule kind {kind!r}")
        self.kind = kind
        self.spec: Dict[str, Any] = dict(spec)

    def __repr__(self) -> str:
        return f"JobSchedule({self.kind!r}, {self.spec!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobSchedule) and self.text() == other.text()

    def __hash__(self) -> int:
        return hash(self.text())

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def once(cls, at: dtm.datetime) -> "JobSchedule":
        """One run at ``at`` (an aware datetime)."""
        return cls("once", {"at": _ms(at)})

    @classmethod
    def interval(cls, seconds: float, first: dtm.datetime,
                 last: Optional[dtm.datetime] = None) -> "JobSchedule":
        """Runs every ``seconds`` from ``first`` (until ``last`` when given)."""
        if not seconds > 0:
            raise ValueError(f"a repeating job's interval must be positive, not {seconds!r}")
        return cls("interval", {"seconds": float(seconds), "first": _ms(first),
                                "last": None if last is None else _ms(last)})

    @classmethod
    def cron(cls, fields: Mapping[str, Any], timezone: Any,
             start: Optional[dtm.datetime] = None,
             end: Optional[dtm.datetime] = None) -> "JobSchedule":
        """Calendar runs: APScheduler's cron ``fields`` in ``timezone``."""
        unknown = sorted(set(fields) - set(_CRON_FIELDS))
        if unknown:
            raise UsageError(f"unknown cron fields {unknown}: use {', '.join(_CRON_FIELDS)}")
        kept = {name: value for name, value in fields.items() if value is not None}
        for name, value in kept.items():
            if not isinstance(value, (int, str)):
                raise UsageError(f"cron field {name}={value!r}: give an int or a str")
        schedule = cls("cron", {"fields": kept, "timezone": _zone(timezone) or "UTC",
                                "start": None if start is None else _ms(start),
                                "end": None if end is None else _ms(end)})
        schedule._trigger()  # a bad field fails here, at the call, not at the first run
        return schedule

    @classmethod
    def from_trigger_kwargs(cls, kwargs: Mapping[str, Any], now: dtm.datetime) -> "JobSchedule":
        """The schedule of ``run_custom``'s ``job_kwargs`` (a trigger given by name).

        Raises:
            UsageError: The trigger is not ``"date"``, ``"interval"`` or ``"cron"`` given by
                name, or has settings a durable job cannot keep.
        """
        trigger = kwargs.get("trigger")
        args = {key: value for key, value in kwargs.items()
                if key not in ("trigger", "misfire_grace_time", "coalesce", "max_instances")}
        if trigger == "date":
            at = args.pop("run_date", None) or now
            _no_more(args, "date")
            return cls.once(_aware(at))
        if trigger == "interval":
            seconds = (float(args.pop("weeks", 0)) * 604800 + float(args.pop("days", 0)) * 86400
                       + float(args.pop("hours", 0)) * 3600 + float(args.pop("minutes", 0)) * 60
                       + float(args.pop("seconds", 0)))
            first = args.pop("start_date", None)
            last = args.pop("end_date", None)
            args.pop("timezone", None)
            _no_more(args, "interval")
            return cls.interval(seconds, _aware(first) if first else now + dtm.timedelta(
                seconds=seconds), _aware(last) if last else None)
        if trigger == "cron":
            timezone = args.pop("timezone", None) or _UTC
            start = args.pop("start_date", None)
            end = args.pop("end_date", None)
            fields = {name: args.pop(name) for name in list(args) if name in _CRON_FIELDS}
            _no_more(args, "cron")
            return cls.cron(fields, timezone, _aware(start) if start else None,
                            _aware(end) if end else None)
        raise UsageError(
            f"run_custom with trigger={trigger!r} cannot be a durable job: give the trigger by "
            "name, 'date', 'interval' or 'cron', with its settings in job_kwargs"
        )

    # -- text -----------------------------------------------------------------------------
    def text(self) -> str:
        """The JSON text the store keeps."""
        return json.dumps({"kind": self.kind, **self.spec}, sort_keys=True,
                          separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> "JobSchedule":
        """The schedule a store kept (:meth:`text`)."""
        data = json.loads(text)
        kind = data.pop("kind")
        return cls(kind, data)

    @property
    def repeats(self) -> bool:
        """:obj:`bool`: The schedule has more than one run."""
        return self.kind != "once"

    # -- times ----------------------------------------------------------------------------
    def _trigger(self) -> Any:
        from apscheduler.triggers.cron import CronTrigger

        start, end = self.spec.get("start"), self.spec.get("end")
        return CronTrigger(
            **self.spec["fields"], timezone=self.spec["timezone"],
            start_date=None if start is None else _dt(start),
            end_date=None if end is None else _dt(end),
        )

    def first(self, now: int) -> Optional[int]:
        """The first run at or after ``now`` (interval and once: as given, even if past)."""
        if self.kind == "once":
            return int(self.spec["at"])
        if self.kind == "interval":
            first = int(self.spec["first"])
            last = self.spec.get("last")
            return None if last is not None and first > last else first
        fire = self._trigger().get_next_fire_time(None, _dt(now))
        return None if fire is None else _ms(fire)

    def after(self, previous: int, now: int) -> Tuple[Optional[int], int]:
        """The next run after the run due at ``previous``, looked at ``now``.

        Returns the next run (:obj:`None`: no more) and how many due runs were skipped
        (coalesced into the one that fires now).
        """
        if self.kind == "once":
            return None, 0
        if self.kind == "interval":
            step = int(round(float(self.spec["seconds"]) * 1000))
            due = previous + step
            skipped = 0
            if due <= now:  # coalesce the runs missed meanwhile into this one
                skipped = (now - due) // step + 1
                due += skipped * step
            last = self.spec.get("last")
            return (None if last is not None and due > int(last) else due), int(skipped)
        trigger = self._trigger()
        fire = trigger.get_next_fire_time(_dt(previous), _dt(previous))
        skipped = 0
        while fire is not None and _ms(fire) <= now and skipped < _MOST_SKIPPED:
            skipped += 1
            fire = trigger.get_next_fire_time(fire, fire)
        if fire is not None and _ms(fire) <= now:
            fire = trigger.get_next_fire_time(None, _dt(now))
        return (None if fire is None else _ms(fire)), skipped


def first_run(schedule: JobSchedule, now: int) -> Optional[int]:
    """The first run of a new job (see :meth:`JobSchedule.first`)."""
    return schedule.first(now)


def next_run(schedule: JobSchedule, due: int, now: int) -> Optional[int]:
    """The run after the one due at ``due`` that fires now (the missed ones coalesced)."""
    return schedule.after(due, now)[0]


def _aware(when: Any) -> dtm.datetime:
    if isinstance(when, str):
        when = dtm.datetime.fromisoformat(when)
    if not isinstance(when, dtm.datetime):
        raise UsageError(f"a durable job needs a datetime here, not {when!r}")
    return when if when.tzinfo is not None else when.replace(tzinfo=_UTC)


def _no_more(args: Mapping[str, Any], trigger: str) -> None:
    if args:
        raise UsageError(
            f"run_custom(trigger={trigger!r}) settings {sorted(args)} cannot be kept by a "
            "durable job: leave them out, or use PTB's in-memory JobQueue for this job"
        )
