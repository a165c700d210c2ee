"""IntakeJobQueue: durable jobs for a blocking bot, as ``UpdateIntake.jobs``.

The same jobs as :class:`~ptb_fence.ptb.FencedJobQueue`, without PTB. A callback is
``callback(job, attempt)``: the :class:`IntakeJob` and the run's
:class:`~ptb_fence.Attempt`. A job scheduled inside ``handle_attempt`` commits with its
attempt. The intake fires the due runs and handles each as an update, on its workers.
"""

from __future__ import annotations

import datetime as dtm
import re
from typing import Any, Callable, Dict, Optional, Tuple, Union

from ptb_fence._errors import UsageError
from ptb_fence._state_codec import decode_state
from ptb_fence._values import StoredJob
from ptb_fence.runtime._durable_jobs import DurableJobs, JobRun, job_options
from ptb_fence.runtime._job_callbacks import resolve_callback
from ptb_fence.runtime._job_schedule import JobSchedule

__all__ = ["IntakeJob", "IntakeJobQueue"]

When = Union[float, dtm.timedelta, dtm.datetime, dtm.time]

_UTC = dtm.timezone.utc
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _time_of(ms: Optional[int]) -> Optional[dtm.datetime]:
    return None if ms is None else dtm.datetime.fromtimestamp(ms / 1000, tz=_UTC)


def _at(when: When, now: dtm.datetime) -> dtm.datetime:
    """``when`` as an aware datetime: seconds or a timedelta from now, a datetime (naive:
    UTC), or the next such time of day (naive: UTC)."""
    if isinstance(when, bool):
        raise TypeError(f"a job's time cannot be {when!r}")
    if isinstance(when, (int, float)):
        return now + dtm.timedelta(seconds=float(when))
    if isinstance(when, dtm.timedelta):
        return now + when
    if isinstance(when, dtm.datetime):
        return when if when.tzinfo is not None else when.replace(tzinfo=_UTC)
    if isinstance(when, dtm.time):
        zone = when.tzinfo or _UTC
        at = dtm.datetime.combine(now.astimezone(zone).date(), when.replace(tzinfo=None),
                                  tzinfo=zone)
        return at if at > now else at + dtm.timedelta(days=1)
    raise TypeError(f"a job's time must be seconds, a timedelta, a datetime or a time, "
                    f"not {when!r}")


class IntakeJob:
    """A durable job of an :class:`~ptb_fence.UpdateIntake`, as its callback receives it.

    Attributes:
        job_id (:obj:`int` | :obj:`None`): The store's id (:obj:`None` while the attempt that
            scheduled it has not completed).
        name (:obj:`str`): The job's name.
        data: The job's ``data``.
        chat_id (:obj:`int` | :obj:`None`): The job's chat.
        user_id (:obj:`int` | :obj:`None`): The job's user.
        run_number (:obj:`int` | :obj:`None`): In a run: which run this is (from 1).
        next_t (:class:`datetime.datetime` | :obj:`None`): The next run, as known here.
    """

    __slots__ = ("_queue", "callback", "chat_id", "data", "job_id", "name", "next_t",
                 "run_number", "user_id")

    def __init__(self, queue: "IntakeJobQueue", callback: Any, name: str, data: object,
                 chat_id: Optional[int], user_id: Optional[int], *,
                 job_id: Optional[int] = None, next_t: Optional[dtm.datetime] = None,
                 run_number: Optional[int] = None) -> None:
        self._queue = queue
        self.callback = callback
        self.name = name
        self.data = data
        self.chat_id = chat_id
        self.user_id = user_id
        self.job_id = job_id
        self.next_t = next_t
        self.run_number = run_number

    def __repr__(self) -> str:
        return f"IntakeJob[id={self.job_id}, name={self.name!r}]"

    def schedule_removal(self) -> None:
        """Remove this job: it runs no more (inside ``handle_attempt``: with its attempt)."""
        self._queue.remove(self)


class IntakeJobQueue:
    """Durable jobs of a blocking bot (``UpdateIntake(..., handle_attempt=...).jobs``).

    The methods take the arguments of PTB's ``JobQueue`` methods. The callback is
    ``callback(job, attempt)``, a module-level function or one registered with
    :func:`~ptb_fence.ptb.register_job_callback`. What :class:`~ptb_fence.ptb.FencedJobQueue`
    says about keyed jobs, missed runs and ``job_kwargs`` holds here too. Times without a
    time zone are UTC.
    """

    __slots__ = ("_durable", "_now")

    def __init__(self, durable: DurableJobs, now: Callable[[], float]) -> None:
        self._durable = durable
        self._now = now

    def _today(self) -> dtm.datetime:
        return dtm.datetime.fromtimestamp(self._now(), tz=_UTC)

    def _schedule(self, callback: Any, schedule: JobSchedule, data: object,
                  name: Optional[str], chat_id: Optional[int], user_id: Optional[int],
                  keyed: bool, job_kwargs: Optional[Dict[str, Any]]) -> IntakeJob:
        job = IntakeJob(self, callback, str(name or getattr(callback, "__name__", "job")), data,
                        chat_id, user_id)
        write, stored = self._durable.schedule(
            callback=callback, data=data, name=name, chat_id=chat_id, user_id=user_id,
            schedule=schedule, keyed=keyed, options=job_options(job_kwargs), handle=job)
        job.name = write.name
        job.next_t = _time_of(write.next_run_at if stored is None else stored.next_run_at)
        if stored is not None:
            job.job_id = stored.job_id
        return job

    def run_once(self, callback: Any, when: When, data: object = None,
                 name: Optional[str] = None, chat_id: Optional[int] = None,
                 user_id: Optional[int] = None,
                 job_kwargs: Optional[Dict[str, Any]] = None) -> IntakeJob:
        """One run at ``when``. Each call adds a job."""
        return self._schedule(callback, JobSchedule.once(_at(when, self._today())), data, name,
                              chat_id, user_id, False, job_kwargs)

    def run_repeating(self, callback: Any, interval: Union[float, dtm.timedelta],
                      first: Optional[When] = None, last: Optional[When] = None,
                      data: object = None, name: Optional[str] = None,
                      chat_id: Optional[int] = None, user_id: Optional[int] = None,
                      job_kwargs: Optional[Dict[str, Any]] = None) -> IntakeJob:
        """Runs every ``interval``, declared by its name."""
        seconds = interval.total_seconds() if isinstance(interval, dtm.timedelta) else interval
        now = self._today()
        start = _at(first, now) if first is not None else now + dtm.timedelta(
            seconds=float(seconds))
        end = _at(last, now) if last is not None else None
        if end is not None and end < start:
            raise ValueError("'last' must not be before 'first'!")
        return self._schedule(callback, JobSchedule.interval(float(seconds), start, end), data,
                              name, chat_id, user_id, True, job_kwargs)

    def run_daily(self, callback: Any, time: dtm.time, days: Tuple[int, ...] = tuple(range(7)),
                  data: object = None, name: Optional[str] = None,
                  chat_id: Optional[int] = None, user_id: Optional[int] = None,
                  job_kwargs: Optional[Dict[str, Any]] = None) -> IntakeJob:
        """On ``days`` (0 is Sunday) at ``time``, declared by its name."""
        fields = {"day_of_week": ",".join(_DAYS[d] for d in days), "hour": time.hour,
                  "minute": time.minute, "second": time.second}
        return self._schedule(callback, JobSchedule.cron(fields, time.tzinfo or _UTC), data,
                              name, chat_id, user_id, True, job_kwargs)

    def run_monthly(self, callback: Any, when: dtm.time, day: int, data: object = None,
                    name: Optional[str] = None, chat_id: Optional[int] = None,
                    user_id: Optional[int] = None,
                    job_kwargs: Optional[Dict[str, Any]] = None) -> IntakeJob:
        """On ``day`` of every month (``-1``: its last day), declared by its name."""
        fields = {"day": "last" if day == -1 else day, "hour": when.hour,
                  "minute": when.minute, "second": when.second}
        return self._schedule(callback, JobSchedule.cron(fields, when.tzinfo or _UTC), data,
                              name, chat_id, user_id, True, job_kwargs)

    def run_custom(self, callback: Any, job_kwargs: Dict[str, Any], data: object = None,
                   name: Optional[str] = None, chat_id: Optional[int] = None,
                   user_id: Optional[int] = None) -> IntakeJob:
        """``job_kwargs`` names the trigger (``"date"``, ``"interval"`` or ``"cron"``)."""
        schedule = JobSchedule.from_trigger_kwargs(job_kwargs, self._today())
        kept = {key: value for key, value in job_kwargs.items() if key == "misfire_grace_time"}
        return self._schedule(callback, schedule, data, name, chat_id, user_id,
                              schedule.repeats, kept)

    def remove(self, job: IntakeJob) -> None:
        """Remove ``job`` (see :meth:`IntakeJob.schedule_removal`)."""
        self._durable.remove(job, job.job_id)

    def _job_of(self, stored: StoredJob) -> IntakeJob:
        try:
            callback: Any = resolve_callback(stored.callback)
        except LookupError:
            callback = None
        return IntakeJob(self, callback, stored.name, decode_state(stored.data), stored.chat_id,
                         stored.user_id, job_id=stored.job_id,
                         next_t=_time_of(stored.next_run_at))

    def jobs(self, pattern: "Union[str, re.Pattern[str], None]" = None
             ) -> Tuple[IntakeJob, ...]:
        """The scheduled jobs, read from the store (whose name matches ``pattern``)."""
        found = [self._job_of(job) for job in self._durable.list()]
        if pattern is None:
            return tuple(found)
        compiled = re.compile(pattern)
        return tuple(job for job in found if compiled.search(job.name))

    def get_jobs_by_name(self, name: str) -> Tuple[IntakeJob, ...]:
        """The scheduled jobs called ``name``, read from the store."""
        return tuple(self._job_of(job) for job in self._durable.list(name=name))

    def run(self, run: JobRun, attempt: Any) -> None:
        """Handle one run: call its callback with the job and the attempt."""
        try:
            callback = resolve_callback(run.callback)
        except LookupError as exc:
            raise UsageError(f"{exc}: deploy it again, or cancel the job (ptb-fence jobs "
                             "cancel)") from None
        job = IntakeJob(self, callback, run.name, decode_state(run.data), run.chat_id,
                        run.user_id, job_id=run.job_id, run_number=run.run)
        callback(job, attempt)
