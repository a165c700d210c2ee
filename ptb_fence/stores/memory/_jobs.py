"""MemoryJobs: the durable jobs of a MemoryUpdateStore, kept under the store's lock.

The store holds one and calls it with its lock held. The rules are those of
:class:`ptb_fence.BatchStore`'s jobs part: a keyed job is declared once per name, and a run
fires only from the state it was read in.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from ptb_fence._values import JobFire, JobWrite, StoredJob

__all__ = ["MemoryJobs"]

_LIVE = ("scheduled", "paused")


class MemoryJobs:
    """Durable jobs by id (the caller holds the store's lock)."""

    __slots__ = ("_jobs", "_next_id")

    def __init__(self) -> None:
        self._jobs: Dict[int, StoredJob] = {}
        self._next_id = 1

    def _keyed(self, name: str) -> Optional[StoredJob]:
        for job in self._jobs.values():
            if job.keyed and job.name == name and job.state in _LIVE:
                return job
        return None

    def schedule(self, writes: Sequence[JobWrite], at: int) -> List[StoredJob]:
        """Add jobs, or declare keyed ones again (see :class:`~ptb_fence.JobWrite`)."""
        stored: List[StoredJob] = []
        for write in writes:
            known = self._keyed(write.name) if write.keyed else None
            if known is not None:
                moved = known.schedule != write.schedule
                job = replace(
                    known, callback=write.callback, data=write.data, chat_id=write.chat_id,
                    user_id=write.user_id, schedule=write.schedule, options=write.options,
                    next_run_at=write.next_run_at if moved else known.next_run_at,
                    state=("ended" if moved and write.next_run_at is None else known.state),
                )
            else:
                job = StoredJob(
                    self._next_id, write.name, write.callback, write.data, write.chat_id,
                    write.user_id, write.schedule, write.next_run_at, 0, write.keyed,
                    "scheduled" if write.next_run_at is not None else "ended", at,
                    write.options,
                )
                self._next_id += 1
            self._jobs[job.job_id] = job
            stored.append(job)
        return stored

    def cancel(self, job_ids: Sequence[int]) -> List[bool]:
        """Cancel live jobs. Per id, whether it was live."""
        done: List[bool] = []
        for job_id in job_ids:
            job = self._jobs.get(int(job_id))
            if job is None or job.state not in _LIVE:
                done.append(False)
                continue
            self._jobs[job.job_id] = replace(job, state="cancelled", next_run_at=None)
            done.append(True)
        return done

    def due(self, now: int, limit: int) -> List[StoredJob]:
        """The scheduled jobs whose next run is due, the earliest first."""
        due = [job for job in self._jobs.values()
               if job.state == "scheduled" and job.next_run_at is not None
               and job.next_run_at <= now]
        due.sort(key=lambda job: (job.next_run_at, job.job_id))
        return due[:limit]

    def advance(self, fire: JobFire) -> bool:
        """Move a job on past the run ``fire`` names, if it is still as read."""
        job = self._jobs.get(fire.job_id)
        if (job is None or job.state != "scheduled" or job.runs != fire.runs
                or job.next_run_at != fire.due_at):
            return False
        self._jobs[job.job_id] = replace(
            job, runs=job.runs + 1, next_run_at=fire.next_run_at,
            state="scheduled" if fire.next_run_at is not None else "ended",
        )
        return True

    def listed(self, name: Optional[str], include_ended: bool, after: int,
               limit: int) -> List[StoredJob]:
        """The jobs after an id, by id."""
        jobs = [job for job in sorted(self._jobs.values(), key=lambda job: job.job_id)
                if job.job_id > after and (name is None or job.name == name)
                and (include_ended or job.state in _LIVE)]
        return jobs[:limit]

    def get(self, job_id: int) -> Optional[StoredJob]:
        """One job by id."""
        return self._jobs.get(int(job_id))

    def run_now(self, job_id: int, at: int) -> bool:
        """Make a live job due at ``at`` (an operator's run-now)."""
        job = self._jobs.get(int(job_id))
        if job is None or job.state not in _LIVE:
            return False
        self._jobs[job.job_id] = replace(job, next_run_at=at, state="scheduled")
        return True
