"""Durable jobs.

A keyed job is declared once per name, and a run fires once from the state it was read in.
A fired run is a ``pending`` update row, unless it is skipped.
A completion writes its jobs only when it lands.
The rules run only for a store that declares ``jobs``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

from ptb_fence._values import (
    JOB_STATES,
    AttemptEffects,
    AttemptIdentity,
    Completed,
    Failed,
    JobFire,
    JobWrite,
    Settlement,
    StoredJob,
)
from ptb_fence.contract import JOB_METHODS, Batch, StoreFeatures
from ptb_fence.conformance._probe import (
    FAR,
    L,
    T,
    Abort,
    Probe,
    bool_list,
    claimed_identity,
    has_method,
    other_claim_id,
    stamp,
    write_effects_in_block,
)
from ptb_fence.conformance._races import _race
from ptb_fence.conformance._rule import rule

RUN = 1 << 62
"""The first update id of the runs the rules fire, above Telegram's range."""


def _declares_jobs(p: Probe) -> bool:
    features = getattr(p.store, "features", None)
    return (isinstance(features, StoreFeatures) and features.jobs
            and all(has_method(p.store, method) for method in JOB_METHODS))


def _optional_int(value: object) -> bool:
    return value is None or type(value) is int


def _valid(value: object) -> bool:
    return (
        isinstance(value, StoredJob)
        and type(value.job_id) is int
        and all(isinstance(getattr(value, name), str)
                for name in ("name", "callback", "data", "schedule", "options"))
        and _optional_int(value.chat_id)
        and _optional_int(value.user_id)
        and _optional_int(value.next_run_at)
        and type(value.runs) is int
        and type(value.keyed) is bool
        and value.state in JOB_STATES
        and type(value.created_at) is int
    )


_JOB = "a StoredJob (int, str and bool fields as declared, a state of JOB_STATES)"


def _jobs(p: Probe, method: str, value: object, count: Optional[int] = None) -> List[StoredJob]:
    """Check that ``method`` returned a list of valid jobs, ``count`` of them when given."""
    ok = (isinstance(value, list) and all(_valid(item) for item in value)
          and (count is None or len(value) == count))
    size = "" if count is None else f" of {count}, one per write"
    if not p.check_type(method, ok, f"a list{size} of {_JOB}", value):
        raise Abort
    return list(cast(List[StoredJob], value))


def _schedule(p: Probe, writes: Sequence[JobWrite], at: int) -> List[StoredJob]:
    return _jobs(p, "schedule_jobs", p.call("schedule_jobs", list(writes), at), len(writes))


def _one(p: Probe, write: JobWrite, at: int) -> StoredJob:
    return _schedule(p, [write], at)[0]


def _due(p: Probe, now: int, limit: int = 100) -> List[int]:
    return [job.job_id for job in _jobs(p, "due_jobs", p.call("due_jobs", now, limit))]


def _listed(p: Probe, **options: Any) -> List[int]:
    return [job.job_id for job in _jobs(p, "list_jobs", p.call("list_jobs", **options))]


def _get(p: Probe, job_id: int) -> Optional[StoredJob]:
    value = p.call("get_job", job_id)
    if not p.check_type("get_job", value is None or _valid(value), f"{_JOB} or None", value):
        raise Abort
    return cast(Optional[StoredJob], value)


def _fire(p: Probe, fires: Sequence[JobFire], at: int) -> List[bool]:
    return bool_list(p, "fire_jobs", p.call("fire_jobs", list(fires), at), len(fires))


def _cancel(p: Probe, job_ids: Sequence[int], at: int) -> List[bool]:
    return bool_list(p, "cancel_jobs", p.call("cancel_jobs", list(job_ids), at), len(job_ids))


def _write(name: str, next_run_at: Optional[int], *, keyed: bool = False,
           schedule: str = '{"every": 1000}', callback: str = "app:remind",
           data: str = '{"n": 1}', chat_id: Optional[int] = 10, user_id: Optional[int] = 20,
           options: str = "{}") -> JobWrite:
    return JobWrite(name, callback, data, chat_id, user_id, schedule, next_run_at, keyed, options)


def _body(update_id: int) -> str:
    return f'{{"update_id": {update_id}, "job": "run"}}'


def _run(job: StoredJob, update_id: int, next_run_at: Optional[int], *,
         skip: bool = False) -> JobFire:
    """The fire of ``job``'s next run as read, recorded as ``update_id``."""
    assert job.next_run_at is not None
    return JobFire(job.job_id, job.runs, job.next_run_at, next_run_at, update_id,
                   _body(update_id), job.chat_id, skip)


def _as_written(job: StoredJob, write: JobWrite) -> Dict[str, Tuple[Any, Any]]:
    """The fields of ``job`` that differ from ``write``, as ``{field: (stored, written)}``."""
    names = ("name", "callback", "data", "chat_id", "user_id", "schedule", "next_run_at",
             "keyed", "options")
    return {name: (getattr(job, name), getattr(write, name)) for name in names
            if getattr(job, name) != getattr(write, name)}


def _rows(p: Probe, now: int) -> Dict[int, str]:
    """The update rows ``due`` lists at ``now`` (pending ones received up to ``now``)."""
    return dict(p.due(now=now, pending_before=now, limit=1000))


def _nothing_recorded(p: Probe, update_id: int, why: str) -> None:
    rows = _rows(p, FAR)
    p.expect(update_id not in rows, f"{why} recorded the update row {update_id}; it must "
             "record nothing")


def _unchanged(p: Probe, job: StoredJob, why: str) -> None:
    now = _get(p, job.job_id)
    p.expect(now == job, f"{why} changed job {job.job_id} to {now!r}; it must stay {job!r}")


@rule(
    "jobs",
    "durable",
    "The jobs part (when declared) schedules jobs as written, declares a keyed job once per "
    "name, lists due jobs by next run up to now, fires a run only from the state it was read "
    "in as a pending update row, and cancels, lists and runs jobs now.",
    applies="only for a store that declares ``jobs``",
)
def rule_jobs(p: Probe, fenced: bool, durable: bool) -> None:
    """An empty store has no job: ``due_jobs``, ``list_jobs`` give ``[]`` and ``get_job`` gives
    :obj:`None`.

    ``schedule_jobs`` returns the jobs in order, with increasing ids and the fields as
    written. They have 0 runs, ``created_at`` is the call's time and the state is
    ``scheduled``. A job without a next run is ``ended``. ``get_job`` reads each back equal.
    ``list_jobs`` lists the live jobs by id, all of them with ``include_ended``, and honours
    ``name``, ``after_job_id`` and ``limit``. A job that is not keyed with the name of another
    is a second job.

    ``due_jobs`` lists the jobs with ``next_run_at <= now``, by next run and then by id, at
    most ``limit``. A job due at ``T+50`` is not due at ``T+49``.

    ``fire_jobs`` refuses a fire with the wrong runs or the wrong ``due_at``. A refused fire
    returns :obj:`False`, leaves the job unchanged and records nothing. A fire as read returns
    :obj:`True`. The job then has one more run and the fire's next run, or is ``ended``
    without one. Its run is a ``pending`` row received at the fire's time. ``due`` lists it
    with its body, and ``claim_owned`` takes it. The same fire again, in the same call or
    later, returns :obj:`False`. A ``skip`` fire moves the job on and records nothing.

    ``cancel_jobs`` returns :obj:`True` for a live job, then :obj:`False`, and :obj:`False`
    for an unknown id. A cancelled job is neither due nor listed (but listed with
    ``include_ended``), and a fire of it is refused.

    A keyed job declared again keeps its id, its runs, its next run and its creation time,
    and takes the new callback, data, chat, user and options. A changed schedule takes the
    new next run. A keyed name whose job was cancelled is declared as a new job.

    ``run_job_now`` makes a live job due at once and returns :obj:`True`. It returns
    :obj:`False` for an ended, a cancelled and an unknown job.
    """
    if not _declares_jobs(p):
        return
    p.expect(_due(p, FAR) == [], "due_jobs of an empty store did not return []")
    p.expect(_listed(p, include_ended=True) == [], "list_jobs of an empty store did not return "
             "[]")
    p.expect(_get(p, 1) is None, "get_job(1) of an empty store did not return None")

    remind = _write("remind", T + 100, schedule='{"once": 1}')
    digest = _write("digest", T + 50, keyed=True, callback="app:digest", data='"d"',
                    chat_id=None, user_id=None, options='{"misfire_grace_time": 5}')
    never = _write("never", None, callback="app:never", data="null")
    again = _write("remind", T + 100, callback="app:other", chat_id=11)
    writes = [remind, digest, never, again]
    jobs = _schedule(p, writes, T)
    ids = [job.job_id for job in jobs]
    p.require(all(a < b for a, b in zip(ids, ids[1:])),
              f"schedule_jobs returned the ids {ids}; later jobs get higher ids")
    for job, write, state in zip(jobs, writes, ("scheduled", "scheduled", "ended", "scheduled")):
        diff = _as_written(job, write)
        p.expect(not diff, f"schedule_jobs stored the job {write.name!r} with {diff} as "
                 "(stored, written); it must store the fields as written")
        p.expect((job.runs, job.state, job.created_at) == (0, state, T),
                 f"schedule_jobs returned job {job.job_id} with runs {job.runs}, state "
                 f"{job.state!r} and created_at {stamp(job.created_at)}; expected 0, {state!r} "
                 f"and {stamp(T)}")
        found = _get(p, job.job_id)
        p.expect(found == job, f"get_job({job.job_id}) returned {found!r}; expected {job!r}")
    p.require(len(set(ids)) == 4, f"two jobs named 'remind' that are not keyed got the ids "
              f"{ids}; each is a job of its own")
    a, d, n, b = ids  # a and b are named remind, d is keyed, n has no next run
    unknown = max(ids) + 1000
    p.expect(_get(p, unknown) is None, f"get_job({unknown}) of an unknown id did not return None")
    _listing(p, a, d, n, b)

    got = _due(p, T + 49)
    p.expect(got == [], f"due_jobs({stamp(T + 49)}) returned {got}; the earliest job is due at "
             f"{stamp(T + 50)}")
    got = _due(p, T + 50)
    p.expect(got == [d], f"due_jobs({stamp(T + 50)}) returned {got}; expected [{d}] (due at "
             f"{stamp(T + 50)}, next_run_at <= now)")
    got = _due(p, T + 100)
    p.expect(got == [d, a, b], f"due_jobs({stamp(T + 100)}) returned {got}; expected "
             f"[{d}, {a}, {b}] (by next_run_at, then by id)")
    got = _due(p, T + 100, 2)
    p.expect(got == [d, a], f"due_jobs({stamp(T + 100)}, limit=2) returned {got}; expected "
             f"[{d}, {a}]")

    fired = _fires(p, jobs)
    _cancels(p, fired, unknown)
    _keyed(p, fired[1])
    _run_now(p, fired, unknown)


def _listing(p: Probe, a: int, d: int, n: int, b: int) -> None:
    cases: List[Tuple[Dict[str, Any], List[int], str]] = [
        ({}, [a, d, b], "the live jobs by id"),
        ({"include_ended": True}, [a, d, n, b], "every job by id"),
        ({"name": "remind"}, [a, b], "the two jobs named 'remind'"),
        ({"after_job_id": a}, [d, b], f"the live jobs after {a}"),
        ({"limit": 2}, [a, d], "the first two live jobs"),
        ({"name": "never", "include_ended": True}, [n], "the ended job 'never'"),
    ]
    for options, want, what in cases:
        got = _listed(p, **options)
        shown = ", ".join(f"{k}={v!r}" for k, v in options.items())
        p.expect(got == want, f"list_jobs({shown}) returned {got}; expected {want} ({what})")


def _fires(p: Probe, jobs: List[StoredJob]) -> List[StoredJob]:
    """Fire the digest, both reminders and a skip. Return the jobs as they are after."""
    remind, digest, _never, again = jobs
    right = _run(digest, RUN + 1, T + 1050)
    stale = [
        (dataclasses.replace(right, runs=1), "a fire with runs 1 of a job with 0 runs"),
        (dataclasses.replace(right, due_at=T + 49),
         f"a fire due at {stamp(T + 49)} of a job due at {stamp(T + 50)}"),
    ]
    for fire, why in stale:
        got = _fire(p, [fire], T + 60)
        p.expect(got == [False], f"fire_jobs of {why} returned {got}; expected [False]")
        _unchanged(p, digest, f"fire_jobs of {why}")
        _nothing_recorded(p, fire.update_id, f"fire_jobs of {why}")
    got = _fire(p, [right], T + 60)
    p.require(got == [True], f"fire_jobs of job {digest.job_id} as read returned {got}; "
              "expected [True]")
    moved = dataclasses.replace(digest, runs=1, next_run_at=T + 1050)
    _unchanged(p, moved, "fire_jobs as read")
    rows = _rows(p, T + 60)
    p.expect(rows.get(RUN + 1) == right.body, f"after fire_jobs at {stamp(T + 60)} due lists "
             f"{rows}; expected the run {RUN + 1} pending with its body {right.body!r}")
    early = _rows(p, T + 59)
    p.expect(RUN + 1 not in early, f"due(pending_before={stamp(T + 59)}) listed the run fired at "
             f"{stamp(T + 60)}; its row is received at the fire's time")
    got = _fire(p, [right], T + 61)
    p.expect(got == [False], f"fire_jobs of a run that fired already returned {got}; expected "
             "[False]")
    _unchanged(p, moved, "a second fire_jobs of the same run")
    identity = p.claim_owned(RUN + 1, now=T + 62, lease_until=T + 62 + L)
    p.expect(identity is not None and identity.attempt == 1,
             f"claim_owned of the fired run {RUN + 1} returned {identity!r}; expected attempt 1")

    once = _run(remind, RUN + 2, None)
    got = _fire(p, [once, once], T + 100)
    p.expect(got == [True, False], f"fire_jobs of one run twice in one call returned {got}; "
             "expected [True, False]")
    ended = dataclasses.replace(remind, runs=1, next_run_at=None, state="ended")
    _unchanged(p, ended, "fire_jobs with next_run_at None")
    rows = _rows(p, T + 100)
    p.expect(rows.get(RUN + 2) == once.body, f"the run {RUN + 2} fired at {stamp(T + 100)} is not "
             f"listed pending with its body by due: {rows}")

    skip = _run(again, RUN + 3, T + 2100, skip=True)
    got = _fire(p, [skip], T + 100)
    p.expect(got == [True], f"fire_jobs of a skip fire as read returned {got}; expected [True]")
    skipped = dataclasses.replace(again, runs=1, next_run_at=T + 2100)
    _unchanged(p, skipped, "a skip fire")
    _nothing_recorded(p, RUN + 3, "a skip fire")
    due = _due(p, T + 1049)
    p.expect(due == [], f"due_jobs({stamp(T + 1049)}) after the fires returned {due}; expected []")
    return [ended, moved, skipped]


def _cancels(p: Probe, jobs: List[StoredJob], unknown: int) -> None:
    ended, _digest, skipped = jobs
    got = _cancel(p, [skipped.job_id, skipped.job_id, unknown, ended.job_id], T + 200)
    p.expect(got == [True, False, False, False],
             f"cancel_jobs of a live job twice, an unknown id and an ended job returned {got}; "
             "expected [True, False, False, False]")
    cancelled = _get(p, skipped.job_id)
    p.expect(cancelled is not None and cancelled.state == "cancelled",
             f"get_job of a cancelled job returned {cancelled!r}; expected the state 'cancelled'")
    due = _due(p, FAR)
    p.expect(skipped.job_id not in due, f"due_jobs({stamp(FAR)}) listed the cancelled job "
             f"{skipped.job_id}: {due}")
    listed = _listed(p)
    p.expect(skipped.job_id not in listed, f"list_jobs() listed the cancelled job "
             f"{skipped.job_id}: {listed}")
    listed = _listed(p, include_ended=True)
    p.expect(skipped.job_id in listed, f"list_jobs(include_ended=True) did not list the "
             f"cancelled job {skipped.job_id}: {listed}")
    fire = _run(skipped, RUN + 4, T + 4100)
    got = _fire(p, [fire], T + 2100)
    p.expect(got == [False], f"fire_jobs of a cancelled job returned {got}; expected [False]")
    _nothing_recorded(p, RUN + 4, "fire_jobs of a cancelled job")
    after = _get(p, skipped.job_id)
    p.expect(after == cancelled, f"fire_jobs of a cancelled job changed it to {after!r}")


def _keyed(p: Probe, digest: StoredJob) -> None:
    """Declare the keyed job again: as it is, with a new schedule, after it was cancelled."""
    same = _write("digest", T + 5, keyed=True, callback="app:digest2", data='"d2"', chat_id=5,
                  user_id=6, options='{"coalesce": true}')
    got = _one(p, same, T + 300)
    want = dataclasses.replace(digest, callback="app:digest2", data='"d2"', chat_id=5,
                               user_id=6, options='{"coalesce": true}')
    p.expect(got == want, f"schedule_jobs of the keyed job {digest.name!r} again with the same "
             f"schedule returned {got!r}; expected {want!r} (its id, runs, next run and "
             "creation kept, the new callback, data, chat, user and options)")
    listed = _listed(p, name="digest", include_ended=True)
    p.expect(listed == [digest.job_id], f"after declaring the keyed job {digest.name!r} twice "
             f"list_jobs(name='digest') returned {listed}; expected one job [{digest.job_id}]")
    moved = dataclasses.replace(same, schedule='{"every": 2000}', next_run_at=T + 2300)
    got = _one(p, moved, T + 300)
    want = dataclasses.replace(want, schedule='{"every": 2000}', next_run_at=T + 2300)
    p.expect(got == want, f"schedule_jobs of the keyed job {digest.name!r} with a new schedule "
             f"returned {got!r}; expected {want!r} (the new schedule takes its next run)")
    got_ids = _cancel(p, [digest.job_id], T + 400)
    p.expect(got_ids == [True], f"cancel_jobs of the live keyed job returned {got_ids}")
    fresh = _one(p, same, T + 500)
    p.expect(fresh.job_id > digest.job_id and fresh.runs == 0 and fresh.next_run_at == T + 5,
             f"schedule_jobs of the keyed name {digest.name!r} whose job was cancelled returned "
             f"{fresh!r}; expected a new job (a higher id, 0 runs, next run {stamp(T + 5)})")


def _run_now(p: Probe, jobs: List[StoredJob], unknown: int) -> None:
    ended, _digest, cancelled = jobs
    later = _one(p, _write("later", FAR), T + 600)
    p.expect(later.job_id not in _due(p, T + 700), f"due_jobs({stamp(T + 700)}) listed a job "
             f"due at {stamp(FAR)}")
    got = p.real_bool("run_job_now", p.call("run_job_now", later.job_id, T + 700))
    p.expect(got, "run_job_now of a live job returned False")
    found = _get(p, later.job_id)
    p.expect(found is not None and found.next_run_at == T + 700 and found.state == "scheduled",
             f"run_job_now at {stamp(T + 700)} left {found!r}; expected next_run_at "
             f"{stamp(T + 700)} and the state 'scheduled'")
    due = _due(p, T + 700)
    p.expect(later.job_id in due, f"due_jobs({stamp(T + 700)}) after run_job_now returned {due}; "
             f"expected job {later.job_id} in it")
    for job_id, what in ((ended.job_id, "an ended job"), (cancelled.job_id, "a cancelled job"),
                         (unknown, "an unknown id")):
        got = p.real_bool("run_job_now", p.call("run_job_now", job_id, T + 700))
        p.expect(not got, f"run_job_now of {what} returned True; expected False")
    found = _get(p, cancelled.job_id)
    p.expect(found is not None and found.state == "cancelled",
             f"run_job_now of a cancelled job changed it to {found!r}")


@rule(
    "jobs-concurrent-fire",
    "durable",
    "Of 8 concurrent fires of one job's run (when jobs are declared) exactly one fires.",
    applies="only for a store that declares ``jobs``",
)
def rule_jobs_concurrent_fire(p: Probe, fenced: bool, durable: bool) -> None:
    """Eight threads fire the same run of one job at once, each with ``fire_jobs``.

    Exactly one returns :obj:`True`. The job has one run more, and ``due`` lists the run's row
    once. The race repeats for the job's next run.
    """
    if not _declares_jobs(p):
        return
    job = _one(p, _write("race", T + 10), T)
    for round_, next_run in enumerate((T + 20, T + 30)):
        fire = _run(job, RUN + round_, next_run)

        def call(fire: JobFire = fire) -> List[bool]:
            return _fire(p, [fire], fire.due_at)

        results = _race(p, call)
        if results is None:
            return
        wins = sum(1 for result in results if result == [True])
        p.expect(wins == 1, f"8 concurrent fire_jobs of run {job.runs + 1} of job {job.job_id} "
                 f"returned {results}; expected exactly one [True]")
        after = _get(p, job.job_id)
        want = dataclasses.replace(job, runs=job.runs + 1, next_run_at=next_run)
        p.require(after == want, f"after 8 concurrent fires job {job.job_id} is {after!r}; "
                  f"expected {want!r}")
        job = want
    rows = _rows(p, FAR)
    p.expect([u for u in rows if u >= RUN] == [RUN, RUN + 1],
             f"the two raced runs left the rows {sorted(rows)}; expected [{RUN}, {RUN + 1}]")


@rule(
    "jobs-effects",
    "durable",
    "A completion's jobs and cancelled jobs (when jobs are declared) are written when it lands "
    "and not at all when it is refused.",
    applies="only for a store that declares ``jobs``",
)
def rule_jobs_effects(p: Probe, fenced: bool, durable: bool) -> None:
    """One ``commit`` settles four attempts, each with jobs to write and a job to cancel.

    A's completion lands. Its job is written as a new job created at the completion's time,
    and its cancelled job is cancelled.
    B is a wrong claim id, C's lease ended before its completion and D fails.
    They write and cancel nothing.
    The rest needs ``transaction()`` and ``write_effects``.
    The jobs ``write_effects`` writes in a block vanish when the block raises.
    They land when it ends normally.
    """
    if not _declares_jobs(p):
        return
    doomed = _schedule(p, [_write(f"doomed-{i}", FAR) for i in range(4)], T)
    a = claimed_identity(p, 1, T + L)
    b_real = claimed_identity(p, 2, T + L)
    b = AttemptIdentity(b_real.update_id, b_real.attempt, other_claim_id(b_real.claim_id))
    c = claimed_identity(p, 3, T + 5)
    d = claimed_identity(p, 4, T + L)
    identities = (a, b, c, d)
    settlements: Tuple[Tuple[AttemptIdentity, Settlement], ...] = (
        (a, Completed(T + 10)), (b, Completed(T + 10)), (c, Completed(T + 10)),
        (d, Failed(T + 10, T + 100, "x")),
    )
    effects = {
        identity: AttemptEffects(jobs=(_write(f"from-{identity.update_id}", T + 1000),),
                                 cancelled_jobs=(job.job_id,))
        for identity, job in zip(identities, doomed)
    }
    landed = p.settle_batch(Batch(settlements=settlements, effects=effects))
    p.expect(landed == [True, False, False, True],
             f"commit landed {landed}; expected [True, False, False, True] (the owner's "
             "completion, a wrong claim id, a lease ended at "
             f"{stamp(T + 5)}, the owner's failure)")
    jobs = _jobs(p, "list_jobs", p.call("list_jobs", include_ended=True))
    written = [job.name for job in jobs if job.name.startswith("from-")]
    p.expect(written == ["from-1"], f"after the commit the jobs written by completions are "
             f"{written}; expected only ['from-1'], the job of the completion that landed")
    for job in jobs:
        if job.name == "from-1":
            p.expect((job.created_at, job.next_run_at, job.state) == (T + 10, T + 1000,
                                                                     "scheduled"),
                     f"the landed completion wrote {job!r}; expected it created at "
                     f"{stamp(T + 10)}, scheduled at {stamp(T + 1000)}")
    states = {job.name: job.state for job in jobs if job.name.startswith("doomed-")}
    want = {"doomed-0": "cancelled", "doomed-1": "scheduled", "doomed-2": "scheduled",
            "doomed-3": "scheduled"}
    p.expect(states == want, f"after the commit the jobs to cancel are {states}; expected "
             f"{want} (only the landed completion cancels)")
    _in_transaction(p)


def _in_transaction(p: Probe) -> None:
    identity = AttemptIdentity(9, 1, "attempt-of-the-transaction")
    for name, raises in (("rolled", True), ("kept", False)):
        effects = AttemptEffects(jobs=(_write(name, T + 1000),))
        if not write_effects_in_block(p, identity, effects, T + 20, rolls_back=raises):
            return
        listed = [job.name for job in _jobs(p, "list_jobs", p.call("list_jobs", name=name))]
        want = [] if raises else [name]
        what = "raised" if raises else "ended normally"
        p.expect(listed == want, f"write_effects(connection=) of a job inside a transaction() "
                 f"block that {what} left the jobs {listed}; expected {want}")
