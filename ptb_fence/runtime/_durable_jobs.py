"""DurableJobs: jobs kept in the store, each run handled as a fenced update.

A due job's run becomes an update row with an update id above Telegram's range. The store records it and
moves the job on to its next run in one transaction. So each run fires once across
processes. From there a run is an update like any other: claimed under a lease with a claim
id, retried, exhausted, taken over from a dead process, in its chat's turn. The front end
recognises a run by its body and calls the job's callback instead of the handlers.

A job scheduled inside an attempt is held by the attempt and written by its completion. So a
failed, rolled-back or stale attempt schedules nothing.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ptb_fence._errors import UsageError
from ptb_fence._values import JobFire, JobWrite, StoredJob
from ptb_fence.runtime._chats import JOB_KEY
from ptb_fence.runtime._job_schedule import JobSchedule

if TYPE_CHECKING:
    from ptb_fence.runtime._port import StorePort

__all__ = ["IGNORED_OPTIONS", "KEPT_OPTIONS", "job_options", "DurableJobs", "JOB_KEY", "JobRun", "RUN_ID_BASE", "job_run_of", "run_update_id"]

_LOGGER = logging.getLogger("ptb_fence.jobs")


RUN_ID_BASE = 1 << 62
"""Job runs have update ids from here on. Telegram's update ids are far below it."""

_RUN_BITS = 24
"""A run's update id is ``RUN_ID_BASE + (job_id << 24 | run)``: 16.7 million runs of a job
before an id comes back, far more than a job fires within the retention of settled rows."""

FIRE_PAGE = 200
"""The most due jobs one look fires."""

KEPT_OPTIONS = ("misfire_grace_time",)
"""The APScheduler options (PTB's ``job_kwargs``) a durable job keeps."""

IGNORED_OPTIONS = ("coalesce", "max_instances", "replace_existing", "id")
"""The APScheduler options a durable job takes and ignores (missed runs always coalesce)."""


def job_options(job_kwargs: Optional[Mapping[str, Any]], allowed: Tuple[str, ...] = ()
             ) -> Dict[str, Any]:
    """The run options a durable job keeps from PTB's ``job_kwargs``."""
    kept: Dict[str, Any] = {}
    for key, value in (job_kwargs or {}).items():
        if key in KEPT_OPTIONS:
            if value is not None:
                kept[key] = float(value)
        elif key not in IGNORED_OPTIONS and key not in allowed:
            raise UsageError(
                f"job_kwargs {key!r} cannot be kept by a durable job: durable jobs keep "
                f"{', '.join(KEPT_OPTIONS)} (missed runs are always coalesced into one)"
            )
    return kept


def run_update_id(job_id: int, run: int) -> int:
    """The update id of a job's ``run``-th run (never a Telegram update id)."""
    if not 0 < int(job_id) < 1 << (62 - _RUN_BITS):
        raise ValueError(f"job id {job_id} is out of the range of run update ids")
    return RUN_ID_BASE + ((int(job_id) << _RUN_BITS) | (int(run) & ((1 << _RUN_BITS) - 1)))


@dataclass(frozen=True)
class JobRun:
    """One run of a durable job, as its update body carries it.

    Args:
        job_id (:obj:`int`): The job.
        run (:obj:`int`): Which run (from 1).
        due_at (:obj:`int`): When it was due (epoch milliseconds).
        name (:obj:`str`): The job's name.
        callback (:obj:`str`): The callback's reference.
        data (:obj:`str`): The job's encoded ``data``.
        chat_id (:obj:`int` | :obj:`None`): The job's chat.
        user_id (:obj:`int` | :obj:`None`): The job's user.
    """

    job_id: int
    run: int
    due_at: int
    name: str
    callback: str
    data: str
    chat_id: Optional[int]
    user_id: Optional[int]

    def body(self, update_id: int) -> str:
        """The update body of this run."""
        payload = {
            "job_id": self.job_id, "run": self.run, "due_at": self.due_at, "name": self.name,
            "callback": self.callback, "data": self.data, "chat_id": self.chat_id,
            "user_id": self.user_id,
        }
        return json.dumps({"update_id": update_id, JOB_KEY: payload},
                          separators=(",", ":"), ensure_ascii=False)


def job_run_of(data: Any) -> Optional[JobRun]:
    """The job run an update's data (a dict, or PTB's ``Update.api_kwargs``) carries, or
    :obj:`None` for a Telegram update."""
    if not isinstance(data, Mapping):
        return None
    payload = data.get(JOB_KEY)
    if not isinstance(payload, Mapping):
        return None
    try:
        return JobRun(
            int(payload["job_id"]), int(payload["run"]), int(payload["due_at"]),
            str(payload["name"]), str(payload["callback"]), str(payload["data"]),
            None if payload.get("chat_id") is None else int(payload["chat_id"]),
            None if payload.get("user_id") is None else int(payload["user_id"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


class DurableJobs:
    """The durable jobs of one runtime: scheduled, listed, cancelled, fired when due.

    Args:
        port: The store (it declares ``StoreFeatures(jobs=True)``).
        now_ms: The runtime's clock in epoch milliseconds.
        chat_order: Runs of a job with a chat take their turn in that chat.
    """

    __slots__ = ("_chat_order", "_now_ms", "_port")

    def __init__(self, port: "StorePort", now_ms: Any, chat_order: bool = False) -> None:
        self._port = port
        self._now_ms = now_ms
        self._chat_order = chat_order

    # -- scheduling -------------------------------------------------------------------------
    def write(self, *, name: str, callback: str, data: str, chat_id: Optional[int],
              user_id: Optional[int], schedule: JobSchedule, keyed: bool,
              options: Optional[Mapping[str, Any]] = None) -> JobWrite:
        """A job to schedule, its first run computed now."""
        if not isinstance(name, str) or not name:
            raise UsageError("a durable job needs a non-empty name")
        return JobWrite(
            name=name, callback=callback, data=data, chat_id=chat_id, user_id=user_id,
            schedule=schedule.text(), next_run_at=schedule.first(self._now_ms()), keyed=keyed,
            options=json.dumps(dict(options or {}), sort_keys=True, separators=(",", ":")),
        )

    def schedule(self, *, callback: Any, data: object, name: Optional[str],
                 chat_id: Optional[int], user_id: Optional[int], schedule: JobSchedule,
                 keyed: bool, options: Optional[Mapping[str, Any]], handle: Any,
                 reference: Optional[str] = None, encoded: Optional[str] = None,
                 quiet: bool = False) -> Tuple[JobWrite, Optional[StoredJob]]:
        """Schedule a job of ``callback``: in the current attempt's completion when one runs
        here (then it returns no stored job yet), else at once.

        ``handle`` is the front end's object of the job (removed from the attempt's effects
        by :meth:`remove` before the commit). A front end that keeps the callback and the data
        its own way passes them as ``reference`` and ``encoded``. ``quiet`` leaves out the
        WARNING for a job scheduled after the attempt's completion committed.

        Raises:
            UsageError: ``callback`` cannot be found by another process, or ``data`` cannot
                be pickled. The message names the fix.
        """
        from ptb_fence._state_codec import encode_state
        from ptb_fence.runtime._attempt import current_attempt
        from ptb_fence.runtime._job_callbacks import callback_reference

        if reference is None:
            reference = callback_reference(callback)
        if encoded is None:
            try:
                encoded = encode_state(data)
            except Exception as exc:
                raise UsageError(
                    f"a durable job's data must be picklable, as persisted state is: {exc}. "
                    "Pass ids and plain values, not connections or locks"
                ) from None
        name = name or getattr(callback, "__name__", None) or type(callback).__name__
        write = self.write(name=name, callback=reference, data=encoded, chat_id=chat_id,
                           user_id=user_id, schedule=schedule, keyed=keyed, options=options)
        attempt = current_attempt()
        if attempt is not None and attempt.fenced:
            if not attempt.completed:
                attempt.effects.hold_job(write, handle)
                return write, None
            # its transaction(complete=True) committed already: written right after it
            if not quiet:
                _LOGGER.warning(
                    "jobs: update %s scheduled job %r after its transaction(complete=True) "
                    "committed: written right after it, outside the fence (a crash in between "
                    "loses it). Schedule jobs before that transaction", attempt.update_id, name)
        (stored,) = self.schedule_now([write])
        return write, stored

    def remove(self, handle: Any, job_id: Optional[int]) -> None:
        """Remove a job: with the current attempt's completion when one runs here, else at
        once."""
        from ptb_fence.runtime._attempt import current_attempt

        attempt = current_attempt()
        if attempt is not None and attempt.fenced:
            attempt.effects.cancel_job(handle)
        elif job_id is not None:
            self.cancel_now([job_id])

    def schedule_now(self, writes: Sequence[JobWrite]) -> List[StoredJob]:
        """Write jobs at once, outside any attempt (a bot's start, an operator)."""
        return self._port.schedule_jobs(list(writes), self._now_ms())

    def cancel_now(self, job_ids: Sequence[int]) -> List[bool]:
        """Cancel jobs at once, outside any attempt."""
        return self._port.cancel_jobs(list(job_ids), self._now_ms())

    def list(self, name: Optional[str] = None) -> List[StoredJob]:
        """The live jobs (scheduled or paused), by id, of ``name`` when given."""
        return self._port.list_jobs(name=name)

    # -- firing -----------------------------------------------------------------------------
    def fire_due(self) -> List[Tuple[int, str]]:
        """Fire the runs that are due now. Returns each fired run's update id and body."""
        now = self._now_ms()
        due = self._port.due_jobs(now, FIRE_PAGE)
        if not due:
            return []
        fires: List[JobFire] = []
        for job in due:
            fires.append(self._fire_of(job, now))
        landed = self._port.fire_jobs(fires, now)
        fired = [(fire.update_id, fire.body) for fire, ok in zip(fires, landed)
                 if ok and not fire.skip]
        if fired:
            _LOGGER.debug("jobs: %d run(s) fired", len(fired))
        return fired

    def _fire_of(self, job: StoredJob, now: int) -> JobFire:
        assert job.next_run_at is not None
        due = job.next_run_at
        run = job.runs + 1
        update_id = run_update_id(job.job_id, run)
        try:
            schedule = JobSchedule.from_text(job.schedule)
            following, _skipped = schedule.after(due, now)
        except Exception as exc:  # a schedule no process can read: end it, loudly
            _LOGGER.error("jobs: job %s (%s) has a schedule that cannot be read (%s): it "
                          "runs this once and ends", job.job_id, job.name, exc)
            following = None
        options: Dict[str, Any] = {}
        try:
            options = json.loads(job.options or "{}")
        except ValueError:
            pass
        grace = options.get("misfire_grace_time")
        skip = grace is not None and now - due > float(grace) * 1000
        if skip:
            _LOGGER.warning("jobs: run %d of job %s (%s) was due %.1f s ago, past its "
                            "misfire_grace_time of %s s: skipped", run, job.job_id, job.name,
                            (now - due) / 1000, grace)
        body = JobRun(job.job_id, run, due, job.name, job.callback, job.data, job.chat_id,
                      job.user_id).body(update_id)
        chat_key = job.chat_id if self._chat_order else None
        return JobFire(job.job_id, job.runs, due, following, update_id, body, chat_key, skip)
