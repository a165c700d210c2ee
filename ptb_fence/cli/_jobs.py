"""``ptb-fence jobs``: list, show, run now and cancel the durable jobs a store keeps.

Durable jobs are kept by a store that declares ``StoreFeatures(jobs=True)``. These commands
call the store's own job operations (``list_jobs``, ``get_job``, ``run_job_now``,
``cancel_jobs``). A job's runs are update rows with ids above Telegram's range. ``show`` reads
them as any row is read.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any, Callable, Dict, List, Optional

from ptb_fence._values import StoredJob
from ptb_fence.cli._errors import Refused
from ptb_fence.cli._format import (
    clip,
    format_age,
    format_time,
    iso_time,
    render_pairs,
    render_table,
)
from ptb_fence.cli._rows import UpdateRow
from ptb_fence.contract import StoreFeatures
from ptb_fence.runtime._durable_jobs import run_update_id

__all__ = ["RowsAfter", "add_jobs_parser", "job_json", "require_jobs", "run_jobs"]

_LOGGER = logging.getLogger("ptb_fence.cli")

_PROG = "ptb-fence"
_MAX_JOB_ID = (1 << 38) - 1
_LIVE = ("scheduled", "paused")
_SHOWN_RUNS = 20
_SCHEDULE_WIDTH = 40

RowsAfter = Callable[[int, int], List[UpdateRow]]
"""``rows_after(update_id, limit)``: at most ``limit`` update rows after ``update_id``, by id."""


# -- arguments ---------------------------------------------------------------------------------
def _job_id(text: str) -> int:
    try:
        value = int(text, 10)
    except (TypeError, ValueError):
        value = 0
    if not 1 <= value <= _MAX_JOB_ID:
        raise argparse.ArgumentTypeError(
            f"invalid job id {text!r}: a job_id is a whole number from 1 to 2**38-1 (see "
            f"`{_PROG} jobs list`)"
        )
    return value


def add_jobs_parser(
    add: Callable[[str, str], argparse.ArgumentParser],
    common: argparse.ArgumentParser,
    limit: Callable[[str], int],
) -> None:
    """Add ``jobs`` and its subcommands.

    Args:
        add: Makes a top-level command (name, help) with the common options.
        common: The parent parser of the common options (``--store``, ``--table``, ``-v``).
        limit: The argument type of ``--limit``.
    """
    jobs = add("jobs", "the durable jobs in the store: list, show, run one now, cancel")
    jobs.description = (
        "The durable jobs the store keeps (FencedUpdateProcessor(durable_jobs=True), "
        "intake.jobs). Each run of a job is an update row handled as a fenced attempt. "
        "States: scheduled (runs when due), paused (waits), ended (no more runs), cancelled "
        "(removed). Times are UTC."
    )
    commands = jobs.add_subparsers(
        dest="jobs_command", metavar="SUBCOMMAND", parser_class=type(jobs)
    )
    commands.required = True

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(
            name, parents=[common], help=help_text, description=help_text
        )
        return sub

    sub = command("list", "the live jobs (scheduled or paused) by job_id, their next run")
    sub.add_argument("--all", action="store_true",
                     help="also the ended and cancelled jobs")
    sub.add_argument("--name", metavar="NAME", help="only the jobs of this name")
    sub.add_argument("--limit", type=limit, default=50, help="at most N jobs (50)")
    sub.add_argument("--after", type=_job_id, metavar="JOB_ID", help="jobs after this id")
    sub.add_argument("--json", action="store_true", help="print JSON")

    sub = command(
        "show",
        "one job: its state, callback, schedule, next run (UTC and from now), data size, runs",
    )
    sub.add_argument("job_id", type=_job_id, metavar="JOB_ID")
    sub.add_argument("--json", action="store_true", help="print JSON")

    sub = command(
        "run-now",
        "make a live job due now: a running bot fires its next run at its next look (a "
        "paused job is scheduled again)",
    )
    sub.add_argument("job_id", type=_job_id, metavar="JOB_ID")
    sub.add_argument("--json", action="store_true", help="print JSON: the job as it was")

    sub = command(
        "cancel",
        "cancel a live job: it runs no more (a run already fired still runs)",
    )
    sub.add_argument("job_id", type=_job_id, metavar="JOB_ID")
    sub.add_argument("--json", action="store_true", help="print JSON: the job as it was")


# -- values ------------------------------------------------------------------------------------
def _decoded(text: Optional[str]) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _due_in(job: StoredJob, now: int) -> Optional[float]:
    """Seconds from ``now`` to the job's next run (below zero: late), :obj:`None` for none."""
    if job.next_run_at is None:
        return None
    return (job.next_run_at - now) / 1000.0


def job_json(job: StoredJob, now: int, *, full: bool = False) -> Dict[str, Any]:
    """A job as a JSON-ready dict, with times as epoch ms and as ISO 8601 UTC.

    ``full`` adds the schedule and the options (decoded JSON) and the data's size."""
    data: Dict[str, Any] = {
        "job_id": job.job_id,
        "name": job.name,
        "state": job.state,
        "callback": job.callback,
        "chat_id": job.chat_id,
        "user_id": job.user_id,
        "keyed": job.keyed,
        "runs": job.runs,
        "created_at": job.created_at,
        "created_at_utc": iso_time(job.created_at),
        "next_run_at": job.next_run_at,
        "next_run_at_utc": iso_time(job.next_run_at),
        "next_run_in_seconds": _due_in(job, now),
    }
    if full:
        data["schedule"] = _decoded(job.schedule)
        data["options"] = _decoded(job.options)
        data["data_bytes"] = _size(job.data)
    return data


def _schedule_label(job: StoredJob) -> str:
    schedule = _decoded(job.schedule)
    if isinstance(schedule, dict) and isinstance(schedule.get("kind"), str):
        rest = {key: value for key, value in schedule.items() if key != "kind"}
        spec = rest.get("spec", rest)
        text = json.dumps(spec, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
        return clip(f"{schedule['kind']} {text}", _SCHEDULE_WIDTH)
    return clip(job.schedule, _SCHEDULE_WIDTH)


def _next_label(job: StoredJob, now: int) -> str:
    """The next run with what it means now."""
    if job.next_run_at is None:
        return "- (no more runs)"
    when = format_time(job.next_run_at, millis=True)
    delta = job.next_run_at - now
    if job.state == "paused":
        return f"{when} (paused: it does not run until resumed)"
    if job.state != "scheduled":
        return f"{when} ({job.state})"
    if delta > 0:
        return f"{when} (in {format_age(delta)})"
    return f"{when} (due now, late by {format_age(-delta)})"


def _short_next(job: StoredJob, now: int) -> str:
    if job.next_run_at is None:
        return "-"
    delta = job.next_run_at - now
    if job.state != "scheduled":
        return format_time(job.next_run_at)
    if delta > 0:
        return f"{format_time(job.next_run_at)} (in {format_age(delta)})"
    return f"{format_time(job.next_run_at)} (late {format_age(-delta)})"


def _run_state(row: UpdateRow) -> str:
    if row.state == "abandoned" and row.settled_at is None:
        return "exhausted (unacknowledged)"
    return row.state


# -- the store ---------------------------------------------------------------------------------
def require_jobs(store: Any) -> None:
    """Refuse a store that keeps no durable jobs, naming the fix.

    Raises:
        ptb_fence.cli._errors.Refused: The store does not declare ``StoreFeatures(jobs=True)``.
    """
    features = getattr(store, "features", None)
    if isinstance(features, StoreFeatures) and features.jobs:
        return
    raise Refused(
        f"{type(store).__name__} keeps no durable jobs (it does not declare "
        "StoreFeatures(jobs=True)): durable jobs need SQLiteUpdateStore or "
        "PostgresUpdateStore of a ptb_fence version with jobs (a PostgreSQL table made "
        f"before: run `{_PROG} migrate`)"
    )


# -- commands ----------------------------------------------------------------------------------
def run_jobs(
    args: argparse.Namespace,
    store: Any,
    *,
    now: int,
    out: Callable[[str], None],
    rows_after: Optional[RowsAfter] = None,
) -> int:
    """Run ``ptb-fence jobs SUBCOMMAND`` on the store.

    Args:
        args: The parsed arguments.
        store: A store that keeps jobs.
        now: The time now (epoch milliseconds).
        out: Prints a line.
        rows_after: Reads a job's run rows for ``show`` (:obj:`None`: no runs are shown).

    Raises:
        ptb_fence.cli._errors.Refused: A store without jobs, an unknown job, or a refused
            action (nothing changed).
    """
    require_jobs(store)
    command = args.jobs_command
    if command == "list":
        return _list(args, store, now, out)
    if command == "show":
        return _show(args, store, now, out, rows_after)
    if command == "run-now":
        return _run_now(args, store, now, out)
    return _cancel(args, store, now, out)


def _require_job(store: Any, job_id: int) -> StoredJob:
    job = store.get_job(job_id)
    if not isinstance(job, StoredJob):
        raise Refused(f"no job {job_id} in the store (see `{_PROG} jobs list --all`)")
    return job


def _list(args: argparse.Namespace, store: Any, now: int, out: Callable[[str], None]) -> int:
    jobs: List[StoredJob] = list(store.list_jobs(
        name=args.name, include_ended=args.all, after_job_id=args.after or 0, limit=args.limit,
    ))
    more = len(jobs) >= args.limit
    if args.json:
        out(json.dumps(
            {
                "now": now,
                "now_utc": iso_time(now),
                "jobs": [job_json(job, now) for job in jobs],
                "next_after": jobs[-1].job_id if more and jobs else None,
            },
            indent=2, ensure_ascii=False,
        ))
        return 0
    if not jobs:
        what = "jobs" if args.all else "live jobs"
        if args.name is not None:
            what += f" named {args.name!r}"
        out(f"no {what}" + (f" after job {args.after}" if args.after is not None else "")
            + ("" if args.all else f" (ended and cancelled ones: `{_PROG} jobs list --all`)"))
        return 0
    out(render_table(
        ("JOB_ID", "NAME", "STATE", "RUNS", "NEXT RUN (UTC)", "SCHEDULE", "CHAT", "CALLBACK"),
        [
            (
                job.job_id,
                clip(job.name, 32),
                job.state,
                job.runs,
                _short_next(job, now),
                _schedule_label(job),
                "-" if job.chat_id is None else job.chat_id,
                clip(job.callback, 40),
            )
            for job in jobs
        ],
        right=(0, 3),
    ))
    summary = f"{len(jobs)} job(s)"
    late = [job for job in jobs if job.state == "scheduled" and job.next_run_at is not None
            and job.next_run_at <= now]
    if late:
        summary += f", {len(late)} due now"
    if more:
        summary += f"; next page: --after {jobs[-1].job_id}"
    out(summary)
    return 0


def _runs(job: StoredJob, rows_after: Optional[RowsAfter]) -> Optional[List[UpdateRow]]:
    """The rows of the job's latest runs still in the table (older ones may be pruned)."""
    if rows_after is None or job.runs <= 0:
        return None if rows_after is None else []
    first = max(job.runs - _SHOWN_RUNS, 0)
    last_id = run_update_id(job.job_id, job.runs)
    rows = rows_after(run_update_id(job.job_id, first), job.runs - first)
    return [row for row in rows if row.update_id <= last_id]


def _run_number(job: StoredJob, update_id: int) -> int:
    return update_id - run_update_id(job.job_id, 0)


def _run_json(job: StoredJob, row: UpdateRow) -> Dict[str, Any]:
    return {
        "run": _run_number(job, row.update_id),
        "update_id": row.update_id,
        "state": row.state,
        "exhausted": row.state == "abandoned" and row.settled_at is None,
        "attempts": row.attempts,
        "received_at": row.received_at,
        "received_at_utc": iso_time(row.received_at),
        "settled_at": row.settled_at,
        "settled_at_utc": iso_time(row.settled_at),
        "error": row.error,
    }


def _show(
    args: argparse.Namespace, store: Any, now: int, out: Callable[[str], None],
    rows_after: Optional[RowsAfter],
) -> int:
    job = _require_job(store, args.job_id)
    runs = _runs(job, rows_after)
    if args.json:
        data = job_json(job, now, full=True)
        data["now"] = now
        data["now_utc"] = iso_time(now)
        data["run_rows"] = None if runs is None else [_run_json(job, row) for row in runs]
        out(json.dumps(data, indent=2, ensure_ascii=False))
        return 0
    created = format_time(job.created_at, millis=True)
    created += f" ({format_age(max(now - job.created_at, 0))} ago)"
    out(render_pairs([
        ("job_id", job.job_id),
        ("name", job.name + (" (keyed: one live job of this name)" if job.keyed else "")),
        ("state", job.state),
        ("callback", job.callback),
        ("chat", "-" if job.chat_id is None else job.chat_id),
        ("user", "-" if job.user_id is None else job.user_id),
        ("runs fired", job.runs),
        ("created_at", created),
        ("next run", _next_label(job, now)),
        ("data", f"{_size(job.data)} bytes (encoded)"),
    ]))
    out("schedule:")
    out(_pretty(job.schedule))
    options = _decoded(job.options)
    if options not in ({}, None, ""):
        out("options:")
        out(_pretty(job.options))
    if runs is not None:
        if not runs:
            out("runs: none in the table" + (" (pruned)" if job.runs else ""))
        else:
            out(f"runs (the latest {len(runs)} still in the table):")
            out(render_table(
                ("RUN", "UPDATE_ID", "STATE", "ATTEMPTS", "FIRED (UTC)", "SETTLED (UTC)",
                 "ERROR"),
                [
                    (
                        _run_number(job, row.update_id),
                        row.update_id,
                        _run_state(row),
                        row.attempts,
                        format_time(row.received_at),
                        format_time(row.settled_at),
                        clip(row.error, 48),
                    )
                    for row in runs
                ],
                right=(0, 1, 3),
            ))
            out(f"one run in full: `{_PROG} show UPDATE_ID`")
    if job.state in _LIVE:
        out("")
        out(f"run it now: {_PROG} jobs run-now {job.job_id}")
        out(f"cancel it: {_PROG} jobs cancel {job.job_id}")
    return 0


def _pretty(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True)
    except (ValueError, RecursionError):
        return text


def _not_live(job: StoredJob, action: str) -> Refused:
    return Refused(
        f"cannot {action} job {job.job_id} ({job.name}): it is {job.state}, not live "
        "(scheduled or paused); nothing changed"
    )


def _log(action: str, job: StoredJob, text: str) -> None:
    _LOGGER.info(
        "jobs %s: job %s (%s) %s", action, job.job_id, job.name, text,
        extra={"job_id": job.job_id, "job_name": job.name, "previous_state": job.state},
    )


def _run_now(args: argparse.Namespace, store: Any, now: int, out: Callable[[str], None]) -> int:
    before = _require_job(store, args.job_id)
    if before.state not in _LIVE:
        raise _not_live(before, "run")
    if not store.run_job_now(before.job_id, now):
        raise Refused(
            f"job {before.job_id} changed while it was being made due; nothing changed (look "
            f"again with `{_PROG} jobs show {before.job_id}`)"
        )
    _log("run-now", before, "due now")
    if args.json:
        out(json.dumps({"run_now": before.job_id, "before": job_json(before, now),
                        "next_run_at": now, "next_run_at_utc": iso_time(now)},
                       indent=2, ensure_ascii=False))
        return 0
    out(f"job {before.job_id} ({before.name}): due now ({format_time(now, millis=True)})"
        + (", scheduled again (it was paused)" if before.state == "paused" else ""))
    if before.next_run_at is not None and before.next_run_at > now:
        out(f"its run of {format_time(before.next_run_at, millis=True)} runs now instead; "
            "the runs after it follow its schedule")
    out("a running bot fires it at its next look for due jobs (about every second)")
    return 0


def _cancel(args: argparse.Namespace, store: Any, now: int, out: Callable[[str], None]) -> int:
    before = _require_job(store, args.job_id)
    if before.state not in _LIVE:
        raise _not_live(before, "cancel")
    done = list(store.cancel_jobs([before.job_id], now))
    if not (done and done[0]):
        raise Refused(
            f"job {before.job_id} changed while it was being cancelled; nothing changed (look "
            f"again with `{_PROG} jobs show {before.job_id}`)"
        )
    _log("cancel", before, f"{before.state} -> cancelled")
    if args.json:
        out(json.dumps({"cancelled": before.job_id, "before": job_json(before, now)},
                       indent=2, ensure_ascii=False))
        return 0
    out(f"cancelled job {before.job_id} ({before.name}), {before.state}: it runs no more")
    out("a run already fired (an update row) still runs; see it with "
        f"`{_PROG} jobs show {before.job_id}`")
    return 0
