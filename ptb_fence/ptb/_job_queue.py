"""FencedJobQueue: PTB's ``JobQueue`` whose jobs live in the store and run as fenced updates.

``FencedUpdateProcessor(store, durable_jobs=True)`` installs it. Its ``run_*`` methods take
PTB's arguments and return :class:`FencedJob` objects. A job scheduled inside a handler is
held by the handler's attempt and written by its completion. A due run is an update row: it
is claimed under a lease, handled once across processes, retried and exhausted like any
update. :class:`JobRunHandler` calls the job's callback for it, with ``context.job`` and
``context.attempt`` set.
"""

from __future__ import annotations

import datetime as dtm
import json
import logging
import re
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple, Union

from telegram import Update
from telegram.ext import ApplicationHandlerStop, BaseHandler, Job, JobQueue

from ptb_fence._errors import UsageError
from ptb_fence._state_codec import decode_state, encode_state
from ptb_fence._values import StoredJob
from ptb_fence.ptb._bodies import parse_update
from ptb_fence.ptb._ptb_internals import (
    conversation_states,
    set_context_chat_and_user,
    timed_out_conversation,
)
from ptb_fence.runtime._durable_jobs import (
    KEPT_OPTIONS,
    DurableJobs,
    JobRun,
    job_options,
    job_run_of,
)
from ptb_fence.runtime._job_callbacks import resolve_callback
from ptb_fence.runtime._job_schedule import JobSchedule

if TYPE_CHECKING:
    from telegram.ext import Application

__all__ = ["FencedJob", "FencedJobQueue", "JOB_RUN_GROUP", "JobRunHandler"]

_LOGGER = logging.getLogger("ptb_fence.jobs")

JOB_RUN_GROUP = -(2**31)
"""The handler group of :class:`JobRunHandler`: before every group of yours. A job run is
seen by no other handler."""

CONVERSATION_TIMEOUT = "conversation-timeout:"
"""The callback reference of a ``ConversationHandler``'s timeout: this prefix and its name."""


When = Union[float, dtm.timedelta, dtm.datetime, dtm.time]


class FencedJob(Job):  # type: ignore[type-arg]
    """A durable job, as :class:`FencedJobQueue` returns it and ``context.job`` holds it.

    It has PTB's ``callback``, ``data``, ``name``, ``chat_id`` and ``user_id``. It has no
    APScheduler job. A job scheduled inside a handler gets its :attr:`job_id` only once the
    handler's attempt completed.
    """

    __slots__ = ("_job_id", "_next_t", "_queue", "_run_number")

    def __init__(self, callback: Any, data: object = None, name: Optional[str] = None,
                 chat_id: Optional[int] = None, user_id: Optional[int] = None, *,
                 queue: "FencedJobQueue", job_id: Optional[int] = None,
                 next_t: Optional[dtm.datetime] = None, run: Optional[int] = None) -> None:
        super().__init__(callback, data=data, name=name, chat_id=chat_id, user_id=user_id)
        self._queue = queue
        self._job_id = job_id
        self._next_t = next_t
        self._run_number = run
        self._enabled = True

    @property
    def job_id(self) -> Optional[int]:
        """:obj:`int` | :obj:`None`: The store's id of the job (:obj:`None` while the attempt
        that scheduled it has not completed)."""
        return self._job_id

    @property
    def run_number(self) -> Optional[int]:
        """:obj:`int` | :obj:`None`: In ``context.job`` of a run: which run this is (from 1)."""
        return self._run_number

    @property
    def job(self) -> Any:
        """:obj:`None`: A durable job has no APScheduler job."""
        return None

    @property
    def next_t(self) -> Optional[dtm.datetime]:
        """:class:`datetime.datetime` | :obj:`None`: The next run, as read when this object was
        made. :obj:`None`: no more runs, or not known yet."""
        return self._next_t

    @property
    def enabled(self) -> bool:
        """:obj:`bool`: Whether the job runs when due (durable jobs cannot be paused)."""
        return self._enabled and not self._removed

    @enabled.setter
    def enabled(self, status: bool) -> None:
        raise UsageError(
            "a durable job cannot be paused: call job.schedule_removal() and schedule it again"
        )

    def stored(self, job_id: int, next_run_at: Optional[int]) -> None:
        """The store wrote this job: its id and its next run (epoch milliseconds)."""
        self._job_id = job_id
        self._next_t = _time_of(next_run_at)

    def stored_later(self, next_run_at: Optional[int]) -> None:
        """The attempt holds this job: its first run (its id comes with the commit)."""
        self._next_t = _time_of(next_run_at)

    def schedule_removal(self) -> None:
        """Remove this job: it runs no more.

        Inside a handler the removal commits with the handler's attempt. Outside one it is
        written at once.
        """
        self._queue.remove(self)
        self._removed = True

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FencedJob) and self._job_id is not None:
            return self._job_id == other.job_id
        return self is other

    def __hash__(self) -> int:
        return hash(self._job_id) if self._job_id is not None else id(self)

    def __repr__(self) -> str:
        return (f"FencedJob[id={self._job_id}, name={self.name!r}, "
                f"callback={getattr(self.callback, '__qualname__', self.callback)!r}]")


class FencedJobQueue(JobQueue):  # type: ignore[type-arg]
    """PTB's ``JobQueue`` with durable, fenced jobs.

    :class:`~ptb_fence.ptb.FencedUpdateProcessor` with ``durable_jobs=True`` sets it on the
    builder. The ``run_*`` methods take PTB's arguments. What differs:

    - The callback is kept by name: a module-level function, or one registered with
      :func:`~ptb_fence.ptb.register_job_callback`. ``data`` is kept as persisted state is
      (pickled). A lambda, a closure or data that cannot be pickled is refused at the call.
    - Inside a handler the job is written by the commit that completes the update. A failed
      or stale attempt schedules nothing.
    - ``run_repeating``, ``run_daily``, ``run_monthly`` and ``run_custom`` declare a job by
      its name. Declaring it again (another process, a restart) keeps the one job and its
      next run.
    - Runs missed while no process was up run once at the next look. ``job_kwargs`` may
      hold ``misfire_grace_time`` (a later run is skipped). Other APScheduler options are
      refused.
    - :meth:`jobs` and :meth:`get_jobs_by_name` read the store (a short blocking read).
    """

    __slots__ = ("_durable",)

    def __init__(self) -> None:
        super().__init__()
        self._durable: Optional[DurableJobs] = None

    def bind(self, durable: DurableJobs) -> None:
        """Give the queue its store (the processor does this when it is attached)."""
        self._durable = durable

    def _jobs_or_raise(self) -> DurableJobs:
        if self._durable is None:
            raise RuntimeError(
                "this FencedJobQueue has no store yet: build the Application with "
                "FencedUpdateProcessor(store, durable_jobs=True).install(builder)"
            )
        return self._durable

    # -- scheduling -------------------------------------------------------------------------
    def _schedule(self, callback: Any, schedule: JobSchedule, data: object,
                  name: Optional[str], chat_id: Optional[int], user_id: Optional[int],
                  keyed: bool, options: Mapping[str, Any]) -> FencedJob:
        durable = self._jobs_or_raise()
        job = FencedJob(callback, data=data, name=name, chat_id=chat_id, user_id=user_id,
                        queue=self)
        write, stored = durable.schedule(
            callback=callback, data=data, name=name, chat_id=chat_id, user_id=user_id,
            schedule=schedule, keyed=keyed, options=options, handle=job)
        job.name = write.name
        if stored is not None:
            job.stored(stored.job_id, stored.next_run_at)
        else:
            job.stored_later(write.next_run_at)
        return job

    def run_once(self, callback: Any, when: When, data: object = None,
                 name: Optional[str] = None, chat_id: Optional[int] = None,
                 user_id: Optional[int] = None,
                 job_kwargs: Optional[Dict[str, Any]] = None) -> FencedJob:
        """PTB's ``run_once``: one run at ``when``. Not keyed: each call adds a job.

        A ``ConversationHandler``'s ``conversation_timeout`` is kept as a job keyed by the
        handler's name and the conversation's key. Each update of the conversation declares
        it again with the new time. It needs a named, persistent ``ConversationHandler`` and
        :class:`~ptb_fence.ptb.FencedPersistence`.
        """
        at = self._aware(self._parse_time_input(when, shift_day=True))
        conversation = timed_out_conversation(callback)
        if conversation is not None:
            return self._conversation_timeout(conversation, callback, at, data)
        return self._schedule(callback, JobSchedule.once(at), data, name, chat_id, user_id,
                              False, job_options(job_kwargs))

    def _conversation_timeout(self, handler: Any, callback: Any, at: dtm.datetime,
                              context: Any) -> FencedJob:
        """Keep a conversation's timeout: keyed by the handler's name and the conversation."""
        if not handler.name or not handler.persistent:
            raise UsageError(
                "a durable conversation_timeout needs ConversationHandler(name=..., "
                "persistent=True) and FencedPersistence: another process or a restart finds "
                "the conversation by its name"
            )
        durable = self._jobs_or_raise()
        key = [value for value in context.conversation_key]
        update = context.update
        chat, user = update.effective_chat, update.effective_user
        data = {"key": key, "update": update.to_json()}
        name = f"{CONVERSATION_TIMEOUT}{handler.name}:{json.dumps(key)}"
        chat_id = None if chat is None else chat.id
        user_id = None if user is None else user.id
        job = FencedJob(callback, data=context, name=name, chat_id=chat_id, user_id=user_id,
                        queue=self, next_t=at)
        # PTB schedules it once the callback returned: after a transaction(complete=True) it
        # is written right after that commit, as FencedPersistence writes the state then
        _, stored = durable.schedule(
            callback=callback, data=None, name=name, chat_id=chat_id, user_id=user_id,
            schedule=JobSchedule.once(at), keyed=True, options=None, handle=job,
            reference=CONVERSATION_TIMEOUT + handler.name, encoded=encode_state(data),
            quiet=True)
        if stored is not None:
            job.stored(stored.job_id, stored.next_run_at)
        return job

    def run_repeating(self, callback: Any, interval: Union[float, dtm.timedelta],
                      first: Optional[When] = None, last: Optional[When] = None,
                      data: object = None, name: Optional[str] = None,
                      chat_id: Optional[int] = None, user_id: Optional[int] = None,
                      job_kwargs: Optional[Dict[str, Any]] = None) -> FencedJob:
        """PTB's ``run_repeating``: runs every ``interval``, declared by its name."""
        seconds = interval.total_seconds() if isinstance(interval, dtm.timedelta) else interval
        start = self._aware(self._parse_time_input(first)) if first is not None else (
            self._tz_now() + dtm.timedelta(seconds=float(seconds)))
        end = self._parse_time_input(last)
        end = None if end is None else self._aware(end)
        if end is not None and end < start:
            raise ValueError("'last' must not be before 'first'!")
        return self._schedule(callback, JobSchedule.interval(float(seconds), start, end), data,
                              name, chat_id, user_id, True, job_options(job_kwargs))

    def run_monthly(self, callback: Any, when: dtm.time, day: int, data: object = None,
                    name: Optional[str] = None, chat_id: Optional[int] = None,
                    user_id: Optional[int] = None,
                    job_kwargs: Optional[Dict[str, Any]] = None) -> FencedJob:
        """PTB's ``run_monthly``: on ``day`` of every month (``-1``: its last day), declared
        by its name."""
        fields = {"day": "last" if day == -1 else day, "hour": when.hour,
                  "minute": when.minute, "second": when.second}
        schedule = JobSchedule.cron(fields, when.tzinfo or self.scheduler.timezone)
        return self._schedule(callback, schedule, data, name, chat_id, user_id, True,
                              job_options(job_kwargs))

    def run_daily(self, callback: Any, time: dtm.time, days: Tuple[int, ...] = tuple(range(7)),
                  data: object = None, name: Optional[str] = None,
                  chat_id: Optional[int] = None, user_id: Optional[int] = None,
                  job_kwargs: Optional[Dict[str, Any]] = None) -> FencedJob:
        """PTB's ``run_daily``: on ``days`` (0 is Sunday) at ``time``, declared by its name."""
        fields = {"day_of_week": ",".join(self._CRON_MAPPING[d] for d in days),
                  "hour": time.hour, "minute": time.minute, "second": time.second}
        schedule = JobSchedule.cron(fields, time.tzinfo or self.scheduler.timezone)
        return self._schedule(callback, schedule, data, name, chat_id, user_id, True,
                              job_options(job_kwargs))

    def run_custom(self, callback: Any, job_kwargs: Dict[str, Any], data: object = None,
                   name: Optional[str] = None, chat_id: Optional[int] = None,
                   user_id: Optional[int] = None) -> FencedJob:
        """PTB's ``run_custom``: ``job_kwargs`` names the trigger (``"date"``, ``"interval"``
        or ``"cron"``) and its settings. Declared by its name."""
        schedule = JobSchedule.from_trigger_kwargs(job_kwargs, self._tz_now())
        return self._schedule(callback, schedule, data, name, chat_id, user_id,
                              schedule.repeats, job_options(
                                  {key: value for key, value in job_kwargs.items()
                                   if key in KEPT_OPTIONS}))

    def _aware(self, when: dtm.datetime) -> dtm.datetime:
        """A naive datetime in the scheduler's time zone, as PTB's APScheduler reads it."""
        if when.tzinfo is not None:
            return when
        zone = self.scheduler.timezone
        localize = getattr(zone, "localize", None)  # a pytz zone
        return localize(when) if callable(localize) else when.replace(tzinfo=zone)

    def remove(self, job: FencedJob) -> None:
        """Remove ``job`` (see :meth:`FencedJob.schedule_removal`)."""
        self._jobs_or_raise().remove(job, job.job_id)

    # -- reading ----------------------------------------------------------------------------
    def _job_of(self, stored: StoredJob) -> FencedJob:
        try:
            callback: Any = resolve_callback(stored.callback)
        except LookupError:
            callback = _missing(stored.callback)
        return FencedJob(callback, data=decode_state(stored.data), name=stored.name,
                         chat_id=stored.chat_id, user_id=stored.user_id, queue=self,
                         job_id=stored.job_id, next_t=_time_of(stored.next_run_at))

    def jobs(self, pattern: "Union[str, re.Pattern[str], None]" = None
             ) -> Tuple[FencedJob, ...]:
        """The scheduled jobs, read from the store (whose name matches ``pattern``)."""
        found = [self._job_of(job) for job in self._jobs_or_raise().list()]
        if pattern is None:
            return tuple(found)
        compiled = re.compile(pattern)
        return tuple(job for job in found if job.name and compiled.search(job.name))

    def get_jobs_by_name(self, name: str) -> Tuple[FencedJob, ...]:
        """The scheduled jobs called ``name``, read from the store."""
        return tuple(self._job_of(job) for job in self._jobs_or_raise().list(name=name))

    # -- running: the processor's sweep fires the runs, not APScheduler ---------------------
    async def start(self) -> None:
        """Start the idle APScheduler PTB checks before it schedules a conversation timeout.
        The processor's job pump fires the due runs."""
        await super().start()

    async def stop(self, wait: bool = True) -> None:
        """Stop the idle APScheduler. Runs in flight are updates, stopped with the processor."""
        await super().stop(wait=False)


def _time_of(ms: Optional[int]) -> Optional[dtm.datetime]:
    return None if ms is None else dtm.datetime.fromtimestamp(ms / 1000, tz=dtm.timezone.utc)


def _missing(reference: str) -> Any:
    async def missing(context: Any) -> None:
        raise UsageError(
            f"the job callback {reference} does not exist in this process (renamed or removed "
            "by a deploy?): deploy it again, or cancel the job (ptb-fence jobs cancel)"
        )

    missing.__qualname__ = missing.__name__ = reference
    return missing


class JobRunHandler(BaseHandler):  # type: ignore[type-arg]
    """Runs a durable job's callback for its run's update, and stops there.

    The processor adds it in :data:`JOB_RUN_GROUP`. The callback gets ``context.job`` (a
    :class:`FencedJob` with its ``data``), ``context.chat_data`` and ``context.user_data``
    of the job's chat and user, and ``context.attempt``.
    """

    __slots__ = ("_queue",)

    def __init__(self, queue: FencedJobQueue) -> None:
        super().__init__(self._run, block=True)
        self._queue = queue

    def check_update(self, update: object) -> Optional[JobRun]:
        """The job run ``update`` carries, or :obj:`None`."""
        if not isinstance(update, Update):
            return None
        return job_run_of(update.api_kwargs)

    def collect_additional_context(self, context: Any, update: Any, application: Any,
                                   check_result: Any) -> None:
        """Give ``context`` the job, its chat and its user."""
        run: JobRun = check_result
        if run.callback.startswith(CONVERSATION_TIMEOUT):
            callback: Any = self._time_out
        else:
            try:
                callback = resolve_callback(run.callback)
            except LookupError:
                callback = _missing(run.callback)
        context.job = FencedJob(
            callback, data=decode_state(run.data), name=run.name, chat_id=run.chat_id,
            user_id=run.user_id, queue=self._queue, job_id=run.job_id, run=run.run,
        )
        set_context_chat_and_user(context, run.chat_id, run.user_id)

    async def _run(self, update: Any, context: Any) -> None:
        job: FencedJob = context.job
        await job.callback(context)
        raise ApplicationHandlerStop

    async def _time_out(self, context: Any) -> None:
        """A conversation's timeout: its ``TIMEOUT`` handlers run and it ends, unless it
        already ended or a later update of it scheduled a later timeout."""
        job: FencedJob = context.job
        name = job.name or ""
        timed_out = conversation_timeout_of(name, job.data)
        if timed_out is None:
            return
        handler_name, key, body = timed_out
        application = context.application
        handler = _conversation_named(application, handler_name)
        if handler is None:
            raise UsageError(
                f"no ConversationHandler named {handler_name!r} in this Application: its "
                "timeout cannot run. Keep its name across deploys"
            )
        later = [other for other in self._queue.get_jobs_by_name(name)
                 if other.job_id != job.job_id]
        states = conversation_states(handler)
        if later or key not in states:
            return  # moved on (a later timeout) or ended
        update = parse_update(json.loads(body), application.bot)
        for each in handler.states.get(handler.TIMEOUT, []):
            check = each.check_update(update)
            if check is not None and check is not False:
                try:
                    await each.handle_update(update, application, check, context)
                except ApplicationHandlerStop:
                    pass
        states.pop(key, None)


def conversation_timeout_of(name: str, data: Any
                            ) -> Optional[Tuple[str, Tuple[Any, ...], str]]:
    """The handler name, conversation key and update body of a conversation timeout job
    (its ``name`` and decoded ``data``), or :obj:`None`."""
    if not name.startswith(CONVERSATION_TIMEOUT) or not isinstance(data, Mapping):
        return None
    handler_name = name[len(CONVERSATION_TIMEOUT):].rsplit(":", 1)[0]
    try:
        return handler_name, tuple(data["key"]), str(data["update"])
    except (KeyError, TypeError):
        return None


def _conversation_named(application: Any, name: str) -> Any:
    from telegram.ext import ConversationHandler

    stack = [handler for group in application.handlers.values() for handler in group]
    while stack:
        handler = stack.pop()
        if isinstance(handler, ConversationHandler):
            if handler.name == name:
                return handler
            stack.extend(handler.entry_points)
            stack.extend(handler.fallbacks)
            for group in handler.states.values():
                stack.extend(group)
    return None


def install_job_runner(application: "Application[Any, Any, Any, Any, Any, Any]",
                       queue: FencedJobQueue) -> None:
    """Add :class:`JobRunHandler` to ``application`` (once)."""
    for handler in application.handlers.get(JOB_RUN_GROUP, ()):
        if isinstance(handler, JobRunHandler):
            return
    application.add_handler(JobRunHandler(queue), group=JOB_RUN_GROUP)
