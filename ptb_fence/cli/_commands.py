"""The ``ptb-fence`` commands: argument parsing and one function per command.

:func:`main` gives the exit statuses.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple

from ptb_fence._update_ids import is_update_id
from ptb_fence._errors import SchemaError, StoreBusy
from ptb_fence._values import AttemptIdentity, StepRecord
from ptb_fence.cli._bulk import (
    BulkOutcome,
    acknowledge_each,
    exhaustion_json,
    pick_exhaustions,
    pick_retries,
    retry_each,
)
from ptb_fence.cli._errors import CommandError, Refused, StoreFailure
from ptb_fence.cli._format import (
    clip,
    format_age,
    format_time,
    iso_time,
    one_line,
    parse_duration,
    pretty_body,
    render_pairs,
    render_table,
)
from ptb_fence.cli._health import (
    DEFAULT_MAX_EXHAUSTIONS,
    DEFAULT_MAX_EXHAUSTION_AGE_MS,
    DEFAULT_MAX_FAILED_AGE_MS,
    DEFAULT_MAX_FAILED_CALLS,
    DEFAULT_MAX_LAPSED_AGE_MS,
    DEFAULT_MAX_PENDING_AGE_MS,
    DEFAULT_MAX_UNSENT_AGE_MS,
    DEFAULT_TIMEOUT_MS,
    HealthThresholds,
    probe,
)
from ptb_fence.cli._inspect import STATES, TableInspector
from ptb_fence.cli._broadcasts import add_broadcast_parser, run_broadcast
from ptb_fence.cli._jobs import add_jobs_parser, require_jobs, run_jobs
from ptb_fence.cli._outbox import add_outbox_parser, run_outbox
from ptb_fence.cli._rows import UpdateRow
from ptb_fence.cli._target import StoreTarget
from ptb_fence.stores import validate_table_name
from ptb_fence.stores._names import split_table_name
from ptb_fence.stores._outbox_sql import outbox_table_name
from ptb_fence.stores._state_sql import state_table_name
from ptb_fence.cli._progress import ProgressBar
from ptb_fence.stores.postgres._migration import PostgresSchemaState, read_schema_state
from ptb_fence.stores.postgres._sql import index_names, schema_lock_key, statements

__all__ = ["build_parser", "main"]

_LOGGER = logging.getLogger("ptb_fence.cli")

PROG = "ptb-fence"
DEFAULT_TABLE = "telegram_updates"
STORE_ENV = "PTB_FENCE_STORE"
TABLE_ENV = "PTB_FENCE_TABLE"

_DAY_MS = 86_400_000
_ERROR_WIDTH = 48
_FINAL_STATES = ("completed", "abandoned")  # their due_at is a leftover of the last lease


# -- output ------------------------------------------------------------------------------------
def _out(text: str = "") -> None:
    print(text, file=sys.stdout, flush=True)


def _progress(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def _json(data: Any) -> None:
    _out(json.dumps(data, indent=2, ensure_ascii=False))


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- argument types ----------------------------------------------------------------------------
def _update_id(text: str) -> int:
    try:
        value = int(text, 10)
    except (TypeError, ValueError):
        value = -1
    if not is_update_id(value):
        raise argparse.ArgumentTypeError(
            f"invalid update id {text!r}: an update_id is a whole number from 0 to 2**63-1"
        )
    return value


def _positive_int(what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except (TypeError, ValueError):
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: a whole number >= 1")
        return value

    return parse


def _count(text: str) -> int:
    try:
        value = int(text, 10)
    except (TypeError, ValueError):
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: a whole number >= 0")
    return value


def _claim_id(text: str) -> str:
    if not text or len(text) > 256 or any(c.isspace() or not c.isprintable() for c in text):
        raise argparse.ArgumentTypeError(
            f"invalid claim id {text!r}: copy it exactly from `{PROG} exhaustions` or "
            f"`{PROG} show` (one word, no spaces)"
        )
    return text


def _duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _state(text: str) -> str:
    if text not in STATES:
        raise argparse.ArgumentTypeError(
            f"invalid state {text!r}: one of {', '.join(STATES)}"
        )
    return text


def _retry_state(text: str) -> str:
    if text not in ("failed", "abandoned"):
        raise argparse.ArgumentTypeError(
            f"invalid state {text!r}: retry makes failed or abandoned updates claimable again"
        )
    return text


def _bulk_options(sub: argparse.ArgumentParser, what: str) -> None:
    """The options of a bulk ``retry`` or ``ack``."""
    sub.add_argument("--older-than", type=_duration, metavar="DURATION",
                     help=f"bulk: only those {what} longer ago (90s, 15m, 12h, 7d)")
    sub.add_argument("--limit", type=_positive_int("limit"), metavar="N",
                     help="bulk: at most N (default: all)")
    sub.add_argument("--dry-run", action="store_true",
                     help="bulk: list what would change and change nothing")
    sub.add_argument("--json", action="store_true", help="print JSON: what changed")


# -- parser ------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit status 2 (as :class:`Refused`)."""

    def error(self, message: str) -> NoReturn:
        raise Refused(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    """Build the ``ptb-fence`` argument parser.

    ``--store``, ``--table`` and ``--verbose`` are accepted before or after the command.

    Returns:
        :class:`argparse.ArgumentParser`: The parser.
    """
    common = _Parser(add_help=False)
    common.add_argument(
        "--store",
        default=argparse.SUPPRESS,
        metavar="URL",
        help=(
            "sqlite:///relative/path.db, sqlite:////absolute/path.db or a postgresql:// DSN "
            f"(default: ${STORE_ENV})"
        ),
    )
    common.add_argument(
        "--table",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help=f"the update table (default: ${TABLE_ENV} or {DEFAULT_TABLE})",
    )
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log the ptb_fence.* INFO records (retry, ack) to stderr",
    )
    parser = _Parser(
        prog=PROG,
        parents=[common],
        description=(
            "Inspect and operate a ptb_fence update table (SQLite or PostgreSQL). Exit status: "
            "0 ok, 1 check found violations, health found the table unhealthy or migrate "
            "--check found the schema behind, 2 bad input "
            "or refused (nothing changed), 3 store unreachable or failed (for health: 1)."
        ),
        epilog="`python -m ptb_fence demo` runs the offline demo bot instead.",
    )
    from ptb_fence import __version__

    parser.add_argument(
        "--version", action="version", version=f"{PROG} {__version__}",
        help="print the version and exit",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(
            name, parents=[common], help=help_text, description=help_text
        )
        return sub

    sub = command(
        "status", "counts per state, oldest pending age, what is due now, the outbox's counts"
    )
    sub.add_argument("--json", action="store_true",
                     help="print JSON (with --watch: one line per refresh)")
    sub.add_argument(
        "--watch", nargs="?", type=_duration, const=2_000, default=None, metavar="DURATION",
        help="refresh every DURATION (default 2s) until Ctrl-C; a store error is shown and "
        "the next refresh tries again",
    )

    sub = command(
        "health",
        "probe the table for a health check: exit 0 healthy, 1 unhealthy, 2 bad arguments",
    )
    sub.description = (
        "Read the table once (read-only) and judge it. Exit status 0: healthy; 1: unhealthy, "
        "each failing check named with its figure and threshold -- an unreachable store, a "
        "missing table or no answer within --timeout is unhealthy too (exit 1, the check "
        "'store'), not exit 3 as for the other commands; 2: bad arguments. DURATION: 90s, 15m, "
        "12h, 7d (also ms, w)."
    )
    sub.add_argument("--json", action="store_true", help="print one JSON object")
    sub.add_argument(
        "--max-pending-age", type=_duration, default=DEFAULT_MAX_PENDING_AGE_MS,
        metavar="DURATION",
        help="unhealthy if an update has been pending for longer (default 5m)",
    )
    sub.add_argument(
        "--max-failed-age", type=_duration, default=DEFAULT_MAX_FAILED_AGE_MS,
        metavar="DURATION",
        help="unhealthy if a failed update's retry has been due for longer (default 5m)",
    )
    sub.add_argument(
        "--max-lapsed-age", type=_duration, default=DEFAULT_MAX_LAPSED_AGE_MS,
        metavar="DURATION",
        help="unhealthy if a lease lapsed longer ago and was not taken over (default 5m)",
    )
    sub.add_argument(
        "--max-exhaustions", type=_count, default=DEFAULT_MAX_EXHAUSTIONS, metavar="N",
        help="unhealthy if more than N exhaustions are unacknowledged (default 100; 0: any)",
    )
    sub.add_argument(
        "--max-exhaustion-age", type=_duration, default=DEFAULT_MAX_EXHAUSTION_AGE_MS,
        metavar="DURATION",
        help="unhealthy if an exhaustion has been unacknowledged for longer (default 1h)",
    )
    sub.add_argument(
        "--max-unsent-age", type=_duration, default=DEFAULT_MAX_UNSENT_AGE_MS,
        metavar="DURATION",
        help="unhealthy if an outbox call committed longer ago is still unsent (default 5m; "
        "only with an outbox table)",
    )
    sub.add_argument(
        "--max-failed-calls", type=_count, default=DEFAULT_MAX_FAILED_CALLS, metavar="N",
        help="unhealthy if more than N failed outbox calls are unacknowledged (default 100; "
        "0: any; only with an outbox table)",
    )
    sub.add_argument(
        "--timeout", type=_duration, default=DEFAULT_TIMEOUT_MS, metavar="DURATION",
        help="unhealthy if the store does not answer within DURATION (default 5s)",
    )

    sub = command("list", "rows by update_id (no bodies)")
    sub.add_argument("--state", type=_state, help=f"only rows in this state ({', '.join(STATES)})")
    sub.add_argument("--limit", type=_positive_int("limit"), default=50, help="at most N rows (50)")
    sub.add_argument("--after", type=_update_id, metavar="UPDATE_ID", help="rows after this id")
    sub.add_argument("--json", action="store_true", help="print JSON")

    sub = command("show", "one update: its state, attempts, error, times (UTC), steps and body")
    sub.add_argument("update_id", type=_update_id, metavar="UPDATE_ID")
    sub.add_argument("--json", action="store_true", help="print JSON")

    sub = command("exhaustions", "unacknowledged exhaustions, paged by update_id")
    sub.add_argument("--limit", type=_positive_int("limit"), default=50, help="at most N (50)")
    sub.add_argument("--after", type=_update_id, metavar="UPDATE_ID", help="the paging cursor")
    sub.add_argument("--json", action="store_true", help="print JSON")

    sub = command(
        "ack",
        "acknowledge one exhaustion by its exact identity, or in bulk with --all "
        "[--older-than DURATION]",
    )
    sub.add_argument("update_id", type=_update_id, metavar="UPDATE_ID", nargs="?")
    sub.add_argument("--attempt", type=_positive_int("attempt"), metavar="N")
    sub.add_argument("--claim-id", type=_claim_id, metavar="CLAIM_ID")
    sub.add_argument("--all", action="store_true",
                     help="every unacknowledged exhaustion (with --older-than: exhausted "
                     "longer ago), each by the identity read")
    _bulk_options(sub, "exhausted")

    sub = command(
        "retry",
        "make a failed or abandoned update claimable again with a full new set of attempts; "
        "in bulk with --state STATE [--older-than DURATION]",
    )
    sub.add_argument("update_id", type=_update_id, metavar="UPDATE_ID", nargs="?")
    sub.add_argument("--state", type=_retry_state, metavar="STATE",
                     help="bulk: every update in this state (failed or abandoned)")
    _bulk_options(sub, "received")

    sub = command("prune", "delete completed/abandoned rows settled longer ago than DURATION")
    sub.add_argument(
        "--older-than", type=_duration, required=True, metavar="DURATION",
        help="e.g. 90s, 15m, 12h, 7d",
    )
    sub.add_argument("--json", action="store_true", help="print JSON: what was deleted")

    sub = command(
        "persistence",
        "FencedPersistence state: import/export a PicklePersistence file, show one state",
    )
    actions = sub.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    actions.required = True
    act = actions.add_parser("import", parents=[common],
                             help="move a PicklePersistence file's state into the store")
    act.add_argument("file", metavar="PICKLE_FILE")
    act.add_argument("--multi-file", action="store_true",
                     help="the file was written with PicklePersistence(single_file=False)")
    act.add_argument("--replace", action="store_true",
                     help="overwrite state the store already holds for the file's keys")
    act.add_argument("--json", action="store_true", help="print JSON: the rows imported")
    act = actions.add_parser("export", parents=[common],
                             help="write the store's state to a PicklePersistence file")
    act.add_argument("file", metavar="PICKLE_FILE")
    act.add_argument("--json", action="store_true", help="print JSON: the rows exported")
    act = actions.add_parser("show", parents=[common],
                             help="one user's, chat's or conversation's state, or the bot's")
    which = act.add_mutually_exclusive_group(required=True)
    which.add_argument("--user", type=int, metavar="USER_ID")
    which.add_argument("--chat", type=int, metavar="CHAT_ID")
    which.add_argument("--bot", action="store_true", help="the bot_data")
    which.add_argument("--conversation", metavar="NAME", help="a ConversationHandler's name")
    act.add_argument("--key", metavar="JSON",
                     help="with --conversation: one key, e.g. [5, 7] (default: every key)")
    act.add_argument("--json", action="store_true", help="print JSON")
    add_outbox_parser(command, common, _positive_int("limit"))
    add_jobs_parser(command, common, _positive_int("limit"))
    add_broadcast_parser(command, common, _duration)

    command("schema", "print the idempotent PostgreSQL migration for --table").add_argument(
        "--json", action="store_true", help="print JSON: the table and the SQL"
    )
    sub = command("migrate", "apply the PostgreSQL migration (SQLite stores migrate themselves)")
    sub.description = (
        "Apply the PostgreSQL migration of --table. On a table that exists, missing columns "
        "and tables are added in one short transaction and missing indexes are built with "
        "CREATE INDEX CONCURRENTLY (writers are not blocked). --check changes nothing: exit "
        "0 when the schema is current, 1 when it is behind."
    )
    sub.add_argument("--check", action="store_true",
                     help="change nothing: exit 1 if the schema is behind, 0 if current")
    sub.add_argument("--json", action="store_true", help="print JSON")
    command(
        "check", "run the conformance check on scratch tables (never your table)"
    ).add_argument("--json", action="store_true", help="print JSON: the violations")
    return parser


# -- context -----------------------------------------------------------------------------------
class _Context:
    """The parsed global options of one invocation."""

    __slots__ = ("args", "store_url", "table", "_target")

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.store_url: Optional[str] = getattr(args, "store", None) or os.environ.get(STORE_ENV)
        self.table: str = getattr(args, "table", None) or os.environ.get(TABLE_ENV) or DEFAULT_TABLE
        self._target: Optional[StoreTarget] = None

    def validate_table(self) -> str:
        """The bare table name (``--table schema.table``: the connections work in the schema)."""
        try:
            return split_table_name(self.table)[1]
        except ValueError as exc:
            raise Refused(str(exc)) from None

    @property
    def schema(self) -> Optional[str]:
        """The schema of ``--table schema.table`` (:obj:`None`: the search_path's)."""
        try:
            return split_table_name(self.table)[0]
        except ValueError as exc:
            raise Refused(str(exc)) from None

    @property
    def target(self) -> StoreTarget:
        if self._target is None:
            target = StoreTarget(self.store_url or "")
            schema = self.schema
            if schema is not None:
                if target.is_sqlite:
                    raise Refused(
                        f"--table {self.table!r}: SQLite has no schemas; name the table alone"
                    )
                target.schema = schema
            self._target = target
        return self._target

    @property
    def parsed_target(self) -> Optional[StoreTarget]:
        return self._target

    def inspector(self) -> TableInspector:
        return TableInspector(self.target, self.validate_table())

    def open_store(self) -> Any:
        """The library's store on the existing table (never creates a table)."""
        target, table = self.target, self.validate_table()
        try:
            if target.is_sqlite:
                from ptb_fence.stores import SQLiteUpdateStore

                assert target.path is not None
                return SQLiteUpdateStore(target.path, table, busy_timeout=10.0)
            from ptb_fence.stores import PostgresUpdateStore

            assert target.dsn is not None
            return PostgresUpdateStore(
                target.dsn, table, create_table=False, schema=self.schema, pool_size=2,
                pool_timeout=10.0,
            )
        except Exception as exc:
            raise self.store_error(exc) from None

    def store_error(self, exc: BaseException) -> CommandError:
        """A one-line, password-free :class:`CommandError` for an error of a store call."""
        text = self.target.redact(one_line(exc))
        if isinstance(exc, SchemaError):
            return Refused(f"{text} (with the command line: `{PROG} migrate`)")
        if isinstance(exc, CommandError):
            return type(exc)(text)
        return StoreFailure(f"{self.target.display}: {type(exc).__name__}: {text}")


# -- status ------------------------------------------------------------------------------------
_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen (a terminal only)


def _cmd_status(ctx: _Context) -> int:
    every = ctx.args.watch
    if every is None:
        return _status_once(ctx, compact=False)
    ctx.validate_table()
    target = ctx.target  # a bad --store is a usage error (exit 2), before any refresh
    clear = sys.stdout.isatty() and not ctx.args.json
    refreshes = 0
    try:
        while True:
            if clear:
                print(_CLEAR, end="", file=sys.stdout)
            try:
                _status_once(ctx, compact=True)
            except StoreFailure as exc:
                # the view stays up through an outage: the next refresh tries again
                text = target.redact(one_line(exc))
                if ctx.args.json:
                    _out(json.dumps({"now": _now_ms(), "error": text}, ensure_ascii=False))
                else:
                    _out(f"store unreachable at {format_time(_now_ms(), millis=True)}: {text}")
            refreshes += 1
            if not ctx.args.json:
                _out()
                _out(f"refreshed every {format_age(every)} ({refreshes} so far); Ctrl-C stops")
            time.sleep(every / 1000.0)
    except KeyboardInterrupt:
        # the operator's way to end a watch: not an error
        if not ctx.args.json:
            _out()
        return 0


def _status_once(ctx: _Context, *, compact: bool) -> int:
    now = _now_ms()
    with ctx.inspector() as inspector:
        report = inspector.status(now)
        outbox = inspector.outbox_counts()
        outbox_table = inspector.outbox_table
        missing_outbox = inspector.missing_outbox() if outbox is None else None
    age = report.oldest_pending_age_ms
    outbox_age = None
    if outbox is not None and outbox[1] is not None:
        outbox_age = max(now - outbox[1], 0)
    if ctx.args.json:
        emit: Callable[[Any], None] = (
            (lambda data: _out(json.dumps(data, ensure_ascii=False))) if compact else _json
        )
        emit(
            {
                "store": ctx.target.display,
                "table": ctx.table,
                "now": now,
                "now_utc": iso_time(now),
                "counts": report.counts,
                "total": report.total,
                "oldest_pending": None
                if age is None
                else {
                    "update_id": report.oldest_pending_update_id,
                    "received_at": report.oldest_pending_received_at,
                    "received_at_utc": iso_time(report.oldest_pending_received_at),
                    "age_seconds": age / 1000.0,
                },
                "retries_due_now": report.retries_due,
                "leases_lapsed_now": report.leases_lapsed,
                "unacknowledged_exhaustions": report.unacknowledged_exhaustions,
                "outbox": {
                    "table": outbox_table,
                    "counts": None if outbox is None else outbox[0],
                    "oldest_unsent": None
                    if outbox is None or outbox[1] is None
                    else {
                        "created_at": outbox[1],
                        "created_at_utc": iso_time(outbox[1]),
                        "age_seconds": (outbox_age or 0) / 1000.0,
                    },
                    "missing": missing_outbox,
                },
            }
        )
        return 0
    _out(render_pairs([("store", ctx.target.display), ("table", ctx.table),
                       ("now", format_time(now, millis=True))]))
    _out()
    rows = [(state, count) for state, count in report.counts.items()]
    rows.append(("total", report.total))
    _out(render_table(("STATE", "ROWS"), rows, right=(1,)))
    _out()
    oldest = "-"
    if age is not None:
        oldest = (
            f"{format_age(age)} (update {report.oldest_pending_update_id}, received "
            f"{format_time(report.oldest_pending_received_at, millis=True)})"
        )
    _out(
        render_pairs(
            [
                ("oldest pending", oldest),
                ("retries due now", report.retries_due),
                ("leases lapsed now", report.leases_lapsed),
                ("unacknowledged exhaustions", report.unacknowledged_exhaustions),
            ]
        )
    )
    _out()
    if outbox is None:
        _out(f"outbox: none; {missing_outbox}")
    else:
        counts = outbox[0]
        _out(render_table(
            ("OUTBOX STATE", "CALLS"),
            [
                ("pending", counts["pending"]),
                ("sending", counts["sending"]),
                ("sent", counts["sent"]),
                ("failed", counts["failed"]),
                ("failed, acknowledged", counts["failed_acknowledged"]),
            ],
            right=(1,),
        ))
        _out()
        oldest_unsent = "-"
        if outbox_age is not None:
            oldest_unsent = (
                f"{format_age(outbox_age)} (queued {format_time(outbox[1], millis=True)})"
            )
        _out(render_pairs([("oldest unsent call", oldest_unsent)]))
    if report.unacknowledged_exhaustions:
        _out()
        _out(f"see them with `{PROG} exhaustions`")
    if outbox is not None and outbox[0]["failed"]:
        _out()
        _out(f"see the failed calls with `{PROG} outbox list --state failed`")
    return 0


# -- health ------------------------------------------------------------------------------------
def _cmd_health(ctx: _Context) -> int:
    args = ctx.args
    table = ctx.validate_table()
    target = ctx.target  # a bad --store is a usage error (exit 2), raised before any probe
    thresholds = HealthThresholds(
        max_pending_age=args.max_pending_age,
        max_failed_age=args.max_failed_age,
        max_lapsed_age=args.max_lapsed_age,
        max_exhaustion_age=args.max_exhaustion_age,
        max_exhaustions=args.max_exhaustions,
        max_unsent_age=args.max_unsent_age,
        max_failed_calls=args.max_failed_calls,
        timeout=args.timeout,
    )
    report = probe(target, table, thresholds)
    failed = report.failed
    if args.json:
        _json(
            {
                "healthy": report.healthy,
                "store": target.display,
                "table": table,
                "now": report.now,
                "now_utc": iso_time(report.now),
                "checks": [check.as_json() for check in report.checks],
            }
        )
        return 0 if report.healthy else 1
    if report.healthy:
        verdict = f"healthy: all {len(report.checks)} checks passed"
    elif len(report.checks) == 1:
        verdict = "unhealthy: the store check failed; the table checks were not run"
    else:
        verdict = (
            f"unhealthy: {len(failed)} of {len(report.checks)} checks failed: "
            + ", ".join(check.name for check in failed)
        )
    _out(verdict)
    pairs: List[Tuple[str, Any]] = [("store", target.display), ("table", table)]
    if report.now is not None:
        pairs.append(("now", format_time(report.now, millis=True)))
    _out(render_pairs(pairs))
    _out()
    width = max(len(check.name) for check in report.checks)
    for check in sorted(report.checks, key=lambda c: c.ok):  # the failing ones first
        _out(f"{'ok' if check.ok else 'FAIL':<4}  {check.name:<{width}}  {check.message}")
    return 0 if report.healthy else 1


# -- list / show -------------------------------------------------------------------------------
def _cmd_list(ctx: _Context) -> int:
    args = ctx.args
    with ctx.inspector() as inspector:
        rows = inspector.rows(state=args.state, limit=args.limit, after=args.after)
    more = len(rows) >= args.limit
    if args.json:
        _json(
            {
                "rows": [row.as_json() for row in rows],
                "next_after": rows[-1].update_id if more and rows else None,
            }
        )
        return 0
    if not rows:
        what = f"{args.state} rows" if args.state else "rows"
        _out(f"no {what}" + (f" after update {args.after}" if args.after is not None else ""))
        return 0
    _out(
        render_table(
            ("UPDATE_ID", "STATE", "ATTEMPTS", "RECEIVED (UTC)", "DUE (UTC)", "SETTLED (UTC)",
             "ERROR"),
            [
                (
                    row.update_id,
                    row.state,
                    row.attempts,
                    format_time(row.received_at),
                    "-" if row.state in _FINAL_STATES else format_time(row.due_at),
                    format_time(row.settled_at),
                    clip(row.error, _ERROR_WIDTH),
                )
                for row in rows
            ],
            right=(0, 2),
        )
    )
    summary = f"{len(rows)} row(s)"
    if more:
        summary += f"; next page: --after {rows[-1].update_id}"
    _out(summary)
    return 0


def _due_label(row: UpdateRow, now: int) -> str:
    if row.due_at is None or row.state == "completed":
        return "-"
    when = format_time(row.due_at, millis=True)
    delta = row.due_at - now
    if row.state == "processing":
        note = f"lease until; held for {format_age(delta)} more" if delta >= 0 else (
            f"lease until; lapsed {format_age(-delta)} ago, claimable"
        )
    elif row.state == "failed":
        note = f"retry at; in {format_age(delta)}" if delta > 0 else "retry at; due now"
    elif row.state == "abandoned":
        note = "ended at"
    else:
        note = "last lease until"  # pragma: no cover - completed rows show "-"
    return f"{when} ({note})"


def _step_json(step: StepRecord) -> Dict[str, Any]:
    return {
        "name": step.name,
        "key": step.key,
        "attempt": step.attempt,
        "claim_id": step.claim_id,
        "recorded_at": step.recorded_at,
        "recorded_at_utc": iso_time(step.recorded_at),
        "result": step.result,
    }


def _show_steps(steps: Sequence[StepRecord]) -> None:
    """The recorded steps of ``show``, one line each, the result cut short."""
    if not steps:
        _out("steps: none recorded")
        return
    _out(f"steps ({len(steps)}):")
    _out(
        render_table(
            ("NAME", "KEY", "ATTEMPT", "RECORDED (UTC)", "RESULT"),
            [
                (clip(s.name, 24), s.key, s.attempt, format_time(s.recorded_at, millis=True),
                 clip(one_line(s.result), _ERROR_WIDTH))
                for s in steps
            ],
            right=(2,),
        )
    )


def _cmd_show(ctx: _Context) -> int:
    update_id = ctx.args.update_id
    with ctx.inspector() as inspector:
        row = inspector.row(update_id)
        steps = None if row is None else inspector.steps(update_id)
    if row is None:
        raise Refused(f"no update {update_id} in table {ctx.table!r}")
    if ctx.args.json:
        data = row.as_json(body=True)
        # None: the table has no steps table (made before steps)
        data["steps"] = None if steps is None else [_step_json(s) for s in steps]
        _json(data)
        return 0
    now = _now_ms()
    exhaustion = "no"
    if row.unacknowledged_exhaustion:
        exhaustion = "yes, unacknowledged"
    received = format_time(row.received_at, millis=True)
    if row.received_at is not None:
        received += f" ({format_age(now - row.received_at)} ago)"
    _out(
        render_pairs(
            [
                ("update_id", row.update_id),
                ("state", row.state),
                ("attempts", row.attempts),
                ("claim_id", row.claim_id or "-"),
                ("received_at", received),
                ("due_at", _due_label(row, now)),
                ("settled_at", format_time(row.settled_at, millis=True)),
                ("exhaustion", exhaustion),
                ("error", one_line(row.error) if row.error else "-"),
            ]
        )
    )
    if steps is not None:
        _show_steps(steps)
    _out("body:")
    _out(pretty_body(row.body or ""))
    if row.unacknowledged_exhaustion:
        _out()
        _out(
            f"acknowledge it (after handling it): {PROG} ack {row.update_id} "
            f"--attempt {row.attempts} --claim-id {row.claim_id}"
        )
    if row.state in ("failed", "abandoned"):
        _out(f"make it claimable again: {PROG} retry {row.update_id}")
    return 0


# -- exhaustions / ack -------------------------------------------------------------------------
def _cmd_exhaustions(ctx: _Context) -> int:
    args = ctx.args
    ctx.inspector().close()  # the table must exist, and is never created
    store = ctx.open_store()
    try:
        page = list(store.due_exhaustions(limit=args.limit, after_update_id=args.after))
    except Exception as exc:
        raise ctx.store_error(exc) from None
    finally:
        store.close()
    more = len(page) >= args.limit
    if args.json:
        _json(
            {
                "exhaustions": [
                    {
                        "update_id": e.update_id,
                        "attempt": e.attempt,
                        "claim_id": e.claim_id,
                        "exhausted_at": e.exhausted_at,
                        "exhausted_at_utc": iso_time(e.exhausted_at),
                        "error": e.error,
                    }
                    for e in page
                ],
                "next_after": page[-1].update_id if more and page else None,
            }
        )
        return 0
    if not page:
        _out(
            "no unacknowledged exhaustions"
            + (f" after update {args.after}" if args.after is not None else "")
        )
        return 0
    _out(
        render_table(
            ("UPDATE_ID", "ATTEMPT", "CLAIM_ID", "EXHAUSTED (UTC)", "ERROR"),
            [
                (e.update_id, e.attempt, e.claim_id, format_time(e.exhausted_at),
                 clip(e.error, _ERROR_WIDTH))
                for e in page
            ],
            right=(0, 1),
        )
    )
    summary = f"{len(page)} unacknowledged exhaustion(s)"
    if more:
        summary += f"; next page: --after {page[-1].update_id}"
    _out(summary)
    _out(f"acknowledge one after handling it: {PROG} ack UPDATE_ID --attempt N --claim-id CLAIM_ID")
    return 0


def _explain_refused_ack(row: Optional[UpdateRow], identity: AttemptIdentity) -> str:
    if row is None:
        return f"no update {identity.update_id} (it was pruned?)"
    if row.state != "abandoned":
        return f"update {row.update_id} is {row.state}, not an exhaustion"
    if row.settled_at is not None:
        return (
            f"the exhaustion of update {row.update_id} was already acknowledged at "
            f"{format_time(row.settled_at, millis=True)}"
        )
    return (
        f"update {row.update_id} is exhausted with attempt {row.attempts} and claim id "
        f"{row.claim_id}, not attempt {identity.attempt} and claim id {identity.claim_id}: "
        "acknowledge the exact identity you handled"
    )


def _cmd_ack(ctx: _Context) -> int:
    args = ctx.args
    if args.all:
        if args.update_id is not None or args.attempt or args.claim_id:
            raise Refused("ack --all acknowledges in bulk: name no UPDATE_ID, --attempt or "
                          "--claim-id with it")
        return _ack_bulk(ctx)
    if args.older_than is not None or args.limit or args.dry_run:
        raise Refused("--older-than, --limit and --dry-run go with ack --all (bulk)")
    if args.update_id is None or not args.attempt or not args.claim_id:
        raise Refused(
            "name the exhaustion: ack UPDATE_ID --attempt N --claim-id CLAIM_ID (see "
            f"`{PROG} exhaustions`), or acknowledge in bulk with ack --all [--older-than "
            "DURATION] [--dry-run]"
        )
    identity = AttemptIdentity(
        update_id=args.update_id, attempt=args.attempt, claim_id=args.claim_id
    )
    with ctx.inspector() as inspector:
        if inspector.row(identity.update_id) is None:
            raise Refused(f"no update {identity.update_id} in table {ctx.table!r}")
        store = ctx.open_store()
        try:
            acknowledged = bool(store.acknowledge_exhaustion(identity, _now_ms()))
        except Exception as exc:
            raise ctx.store_error(exc) from None
        finally:
            store.close()
        extra = {
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "table": ctx.table,
        }
        if not acknowledged:
            reason = _explain_refused_ack(inspector.row(identity.update_id), identity)
            _LOGGER.info(
                "ack refused: update %s attempt %s (claim %s): %s",
                identity.update_id, identity.attempt, identity.claim_id, reason, extra=extra,
            )
            raise Refused(f"not acknowledged: {reason}; nothing changed")
    _LOGGER.info(
        "ack: exhaustion of update %s attempt %s (claim %s) acknowledged by the operator",
        identity.update_id, identity.attempt, identity.claim_id, extra=extra,
    )
    if args.json:
        _json({"acknowledged": [{"update_id": identity.update_id, "attempt": identity.attempt,
                                 "claim_id": identity.claim_id}]})
        return 0
    _out(
        f"acknowledged the exhaustion of update {identity.update_id} (attempt "
        f"{identity.attempt}, claim {identity.claim_id}): it is settled history now and is "
        "pruned after the retention period"
    )
    return 0


def _ack_bulk(ctx: _Context) -> int:
    """``ack --all [--older-than D] [--limit N] [--dry-run]``."""
    args = ctx.args
    now = _now_ms()
    before = None if args.older_than is None else now - args.older_than
    ctx.inspector().close()  # the table must exist, and is never created
    store = ctx.open_store()
    try:
        picked = pick_exhaustions(store, before, args.limit)
        changed: List[int] = []
        skipped: List[Tuple[int, str]] = []
        if not args.dry_run and picked:
            bar = ProgressBar("ack", len(picked), unit="exhaustion(s)", say=_progress)
            changed, skipped = acknowledge_each(store, picked, now, bar.advance)
            bar.finish()
    except CommandError:
        raise
    except Exception as exc:
        raise ctx.store_error(exc) from None
    finally:
        store.close()
    outcome = BulkOutcome(args.dry_run, tuple(exhaustion_json(e) for e in picked),
                          tuple(changed), tuple(skipped))
    if not args.dry_run:
        _LOGGER.info("ack: %d exhaustion(s) acknowledged in bulk by the operator (%d skipped)",
                     len(changed), len(skipped),
                     extra={"table": ctx.table, "update_ids": changed})
    if args.json:
        _json(outcome.as_json())
        return 0
    age = "" if before is None else f" exhausted before {format_time(before, millis=True)}"
    if not picked:
        _out(f"no unacknowledged exhaustions{age}; nothing changed")
        return 0
    _out(render_table(
        ("UPDATE_ID", "ATTEMPT", "CLAIM_ID", "EXHAUSTED (UTC)", "ERROR"),
        [(e.update_id, e.attempt, e.claim_id, format_time(e.exhausted_at),
          clip(e.error, _ERROR_WIDTH)) for e in picked],
        right=(0, 1),
    ))
    if args.dry_run:
        _out(f"dry run: would acknowledge {len(picked)} exhaustion(s){age}; nothing changed")
        return 0
    _report_bulk("acknowledged", changed, skipped)
    return 0


def _report_bulk(verb: str, changed: List[int], skipped: List[Tuple[int, str]]) -> None:
    _out(f"{verb} {len(changed)} update(s)" + (f", skipped {len(skipped)}:" if skipped else ""))
    for update_id, why in skipped:
        _out(f"  {update_id}: {why}")


# -- retry -------------------------------------------------------------------------------------
def _retry_bulk(ctx: _Context) -> int:
    """``retry --state S [--older-than D] [--limit N] [--dry-run]``."""
    args = ctx.args
    now = _now_ms()
    before = None if args.older_than is None else now - args.older_than
    with ctx.inspector() as inspector:
        picked = pick_retries(inspector, args.state, before, args.limit)
        changed: List[int] = []
        skipped: List[Tuple[int, str]] = []
        if not args.dry_run and picked:
            bar = ProgressBar("retry", len(picked), unit="update(s)", say=_progress)
            changed, skipped = retry_each(inspector, picked, bar.advance)
            bar.finish()
    outcome = BulkOutcome(args.dry_run, tuple(r.as_json() for r in picked), tuple(changed),
                          tuple(skipped))
    if not args.dry_run:
        _LOGGER.info("retry: %d %s update(s) -> pending in bulk, attempts -> 0 (%d skipped)",
                     len(changed), args.state, len(skipped),
                     extra={"table": ctx.table, "update_ids": changed,
                            "previous_state": args.state})
    if args.json:
        _json(outcome.as_json())
        return 0
    age = "" if before is None else f" received before {format_time(before, millis=True)}"
    if not picked:
        _out(f"no {args.state} updates{age}; nothing changed")
        return 0
    _out(render_table(
        ("UPDATE_ID", "STATE", "ATTEMPTS", "RECEIVED (UTC)", "ERROR"),
        [(r.update_id, r.state, r.attempts, format_time(r.received_at),
          clip(r.error, _ERROR_WIDTH)) for r in picked],
        right=(0, 2),
    ))
    if args.dry_run:
        _out(f"dry run: would make {len(picked)} {args.state} update(s){age} pending with a "
             "full new set of attempts; nothing changed")
        return 0
    _report_bulk("retried", changed, skipped)
    _out("each got a full new set of attempts; the next sweep of a running bot claims them")
    return 0


def _cmd_retry(ctx: _Context) -> int:
    args = ctx.args
    if args.state is not None:
        if args.update_id is not None:
            raise Refused("retry --state retries in bulk: name no UPDATE_ID with it")
        return _retry_bulk(ctx)
    if args.older_than is not None or args.limit or args.dry_run:
        raise Refused("--older-than, --limit and --dry-run go with retry --state (bulk)")
    if args.update_id is None:
        raise Refused("name the update: retry UPDATE_ID, or retry in bulk with retry --state "
                      "failed|abandoned [--older-than DURATION] [--dry-run]")
    return _retry_one(ctx)


def _retry_one(ctx: _Context) -> int:
    update_id = ctx.args.update_id
    with ctx.inspector() as inspector:
        before, changed = inspector.retry(update_id)
    if before is None:
        raise Refused(f"no update {update_id} in table {ctx.table!r}")
    if not changed:
        if before.state in ("failed", "abandoned"):
            raise Refused(
                f"update {update_id} changed while it was being retried; nothing changed "
                f"(look again with `{PROG} show {update_id}`)"
            )
        why = {
            "pending": "it is already pending (claimable)",
            "processing": "it is processing: its lease is never disturbed (a lapsed lease is "
            "taken over by the next sweep anyway)",
            "completed": "it completed; a completed update is never run again",
        }.get(before.state, f"its state is {before.state!r}")
        raise Refused(
            f"cannot retry update {update_id}: {why}; retry only makes failed or abandoned "
            "updates claimable again; nothing changed"
        )
    was_exhaustion = before.unacknowledged_exhaustion
    _LOGGER.info(
        "retry: update %s %s -> pending, attempts %s -> 0 (last claim %s)%s",
        update_id,
        "abandoned (unacknowledged exhaustion)" if was_exhaustion else before.state,
        before.attempts,
        before.claim_id or "-",
        "; it is no longer an exhaustion" if was_exhaustion else "",
        extra={
            "update_id": update_id,
            "attempt": before.attempts,
            "claim_id": before.claim_id,
            "previous_state": before.state,
            "was_exhaustion": was_exhaustion,
            "table": ctx.table,
        },
    )
    if ctx.args.json:
        _json({"changed": [update_id], "before": before.as_json(), "state": "pending",
               "attempts": 0, "was_exhaustion": was_exhaustion})
        return 0
    state = "abandoned, an unacknowledged exhaustion" if was_exhaustion else before.state
    _out(f"update {update_id}: {state} -> pending")
    _out(
        f"attempts {before.attempts} -> 0: it gets a full new set of attempts "
        "(due_at and settled_at cleared)"
    )
    if before.error:
        _out(f"last error kept for the record: {clip(before.error, 200)}")
    if was_exhaustion:
        _out(
            f"it is no longer an exhaustion: the identity (attempt {before.attempts}, claim "
            f"{before.claim_id}) cannot be acknowledged any more, and the exhaustion handler "
            "runs again only if it is exhausted again"
        )
    _out("the next sweep of a running bot claims it")
    return 0


# -- prune -------------------------------------------------------------------------------------
_PRUNE_BATCH = 10_000  # rows per transaction: a long prune never holds one long transaction


def _cmd_prune(ctx: _Context) -> int:
    older_than = ctx.args.older_than
    now = _now_ms()
    before = now - older_than
    with ctx.inspector() as inspector:  # the table must exist, and is never created
        total, bounds = inspector.prune_bounds(before, _PRUNE_BATCH)
    if older_than < _DAY_MS:
        _progress(
            "warning: pruning rows settled less than 24h ago; Telegram may still redeliver "
            "such an update, which would then be recorded and handled again"
        )
    _progress(
        f"pruning completed and abandoned rows (acknowledged exhaustions included) of "
        f"{ctx.table!r} settled before {format_time(before, millis=True)}: {total:,} row(s) …"
    )
    started = time.monotonic()
    bar = ProgressBar("prune", total, unit="row(s)", say=_progress)
    deleted = 0
    store = ctx.open_store()
    try:
        # Oldest first, one transaction per batch. Each bound deletes the rows settled before
        # it. The last bound is the command's, which also takes rows settled meanwhile.
        for bound in [*bounds, before]:
            batch = int(store.prune(bound))
            deleted += batch
            bar.advance(batch)
    except Exception as exc:
        raise ctx.store_error(exc) from None
    finally:
        store.close()
    if total:
        bar.finish()
    elapsed = time.monotonic() - started
    _LOGGER.info(
        "prune: %d row(s) settled before %s deleted", deleted, iso_time(before),
        extra={"table": ctx.table, "deleted": deleted},
    )
    if ctx.args.json:
        _json({"table": ctx.table, "deleted": deleted, "settled_before": before,
               "settled_before_utc": iso_time(before), "seconds": round(elapsed, 3)})
        return 0
    _out(
        f"pruned {deleted} row(s) settled before {format_time(before, millis=True)} in "
        f"{elapsed:.2f}s (pending, processing and failed rows and "
        "unacknowledged exhaustions are never pruned)"
    )
    return 0


# -- schema / migrate --------------------------------------------------------------------------
_SQLITE_SELF_MIGRATES = (
    "SQLite: SQLiteUpdateStore creates its table and adds a missing claim_id column itself "
    "when it opens the file; there is nothing to apply"
)


def _cmd_schema(ctx: _Context) -> int:
    from ptb_fence.stores import postgres_update_store_schema

    table = ctx.validate_table()
    sqlite = bool(ctx.store_url) and ctx.target.is_sqlite
    if ctx.args.json:
        _json({"table": table, "dialect": "sqlite" if sqlite else "postgresql",
               "sql": None if sqlite else postgres_update_store_schema(table, schema=ctx.schema),
               "note": _SQLITE_SELF_MIGRATES if sqlite else None})
        return 0
    if sqlite:
        _out(_SQLITE_SELF_MIGRATES)
        return 0
    _out(postgres_update_store_schema(table, schema=ctx.schema).rstrip("\n"))
    return 0


def _migrate_changes(before: PostgresSchemaState, after: PostgresSchemaState) -> List[str]:
    """What a migration changed, from the states before and after it."""
    if not before.table_exists:
        return ["created the table"] if after.table_exists else []
    changes = []
    for column in before.missing_columns:
        if column not in after.missing_columns:
            changes.append(f"added the {column} column")
    for name in before.missing_tables:
        if name not in after.missing_tables:
            if name == outbox_table_name(before.table):
                changes.append(f"created the outbox table {name!r}")
            elif name == state_table_name(before.table):
                changes.append(f"created the state table {name!r}")
            else:
                changes.append(f"created the table {name!r}")
    for name in before.missing_indexes + before.invalid_indexes:
        if name not in after.missing_indexes + after.invalid_indexes:
            changes.append(f"built the index {name} concurrently")
    return changes


def _build_indexes(cur: Any, table: str, state: PostgresSchemaState, bar: ProgressBar) -> None:
    """Build the missing (and rebuild the invalid) indexes of an existing table with
    ``CREATE INDEX CONCURRENTLY`` (autocommit): writers are not blocked while it scans."""
    if not (state.missing_indexes or state.invalid_indexes):
        return
    # One migrator at a time. CONCURRENTLY cannot run in a transaction, so this is a session
    # lock. The stores' own migration waits for it too, then finds the indexes built.
    sql, lock = statements(table), {"key": schema_lock_key(table)}
    cur.execute(sql["admin_lock_schema"], lock)
    try:
        for key, name, _ in index_names(table):
            if name in state.invalid_indexes:
                cur.execute(sql["drop_" + key])
            elif name not in state.missing_indexes:
                continue
            bar.advance(0, f"building index {name} …")
            cur.execute(sql["build_" + key])
            bar.advance(1, f"built index {name}")
    finally:
        cur.execute(sql["admin_unlock_schema"], lock)


def _cmd_migrate(ctx: _Context) -> int:
    from ptb_fence.stores import postgres_update_store_schema

    table = ctx.validate_table()
    target = ctx.target
    check, as_json = ctx.args.check, ctx.args.json
    if target.is_sqlite:
        if as_json:
            _json({"store": target.display, "table": table, "dialect": "sqlite",
                   "current": True, "changes": [], "note": _SQLITE_SELF_MIGRATES})
        else:
            _out(_SQLITE_SELF_MIGRATES)
        return 0
    import psycopg2

    conn = target.connect_postgres()
    try:
        with conn.cursor() as cur:
            before = read_schema_state(cur, table)
            conn.rollback()
            if check:
                return _report_schema_check(ctx, before)
            steps = int(before.needs_ddl)
            if before.table_exists:
                steps += len(before.missing_indexes) + len(before.invalid_indexes)
            bar = ProgressBar(f"migrate {table!r}", steps, unit="step(s)", say=_progress)
            if not before.table_exists:
                # a new, empty table: its indexes are built in the same transaction
                bar.advance(0, "creating the tables …")
                # --table schema.table: the script creates the schema and runs in it
                cur.execute(postgres_update_store_schema(table, schema=ctx.schema))
                conn.commit()
                bar.advance(1, "created the tables")
            elif before.needs_ddl:
                bar.advance(0, "adding the missing columns and tables …")
                cur.execute(statements(table)["schema_tables"])
                conn.commit()
                bar.advance(1, "added the missing columns and tables")
            if before.table_exists:
                state = read_schema_state(cur, table)
                conn.rollback()
                bar.total = bar.done + len(state.missing_indexes) + len(state.invalid_indexes)
                conn.autocommit = True
                _build_indexes(cur, table, state, bar)
                conn.autocommit = False
            after = read_schema_state(cur, table)
            conn.rollback()
            if steps:
                bar.finish()
    except psycopg2.Error as exc:
        raise ctx.store_error(exc) from None
    finally:
        conn.close()
    changes = _migrate_changes(before, after)
    _LOGGER.info("migrate: %s", "; ".join(changes) or "up to date",
                 extra={"table": table, "changes": changes})
    if as_json:
        _json({"store": target.display, "table": table, "dialect": "postgresql",
               "current": after.current, "changes": changes, "before": before.as_json(),
               "after": after.as_json()})
    elif changes:
        _out(f"migrated table {table!r} in {target.display}: {', '.join(changes)}")
    else:
        _out(f"table {table!r} in {target.display} is up to date; nothing changed")
    return 0


def _report_schema_check(ctx: _Context, state: PostgresSchemaState) -> int:
    """``migrate --check``: exit 0 when the schema is current, 1 when it is behind."""
    if ctx.args.json:
        _json(dict(state.as_json(), store=ctx.target.display, table=state.table,
                   dialect="postgresql"))
    elif state.current:
        _out(f"table {state.table!r} in {ctx.target.display} is up to date")
    else:
        _out(f"table {state.table!r} in {ctx.target.display} is behind: it lacks "
             f"{', '.join(state.gaps())}; apply it with `{PROG} migrate`")
    return 0 if state.current else 1


# -- check -------------------------------------------------------------------------------------
def _cmd_check(ctx: _Context) -> int:
    from ptb_fence.conformance import RULES, check_update_store

    target = StoreTarget(ctx.store_url or "")  # scratch tables: never --table's schema
    total = len(RULES)
    counter = iter(range(1, 10_000))
    started = time.monotonic()

    def announce() -> None:
        number = next(counter)
        name = RULES[number - 1].name if number <= total else "?"
        _progress(f"rule {number}/{total}: {name}")

    if target.is_sqlite:
        from ptb_fence.stores import SQLiteUpdateStore

        with tempfile.TemporaryDirectory(prefix="ptb-fence-check-") as scratch:
            _progress(
                f"checking SQLiteUpdateStore (SQLite {sqlite3.sqlite_version}) on scratch files "
                f"in {scratch}; your database is not touched"
            )

            def make_sqlite() -> Any:
                announce()
                return SQLiteUpdateStore(os.path.join(scratch, f"check-{uuid.uuid4().hex}.db"))

            violations = check_update_store(make_sqlite)
        store_name = "SQLiteUpdateStore"
    else:
        from ptb_fence.stores import PostgresUpdateStore

        assert target.dsn is not None
        dsn = target.dsn
        conn = target.connect_postgres()  # fail early (exit 3) if the server is unreachable
        conn.close()
        tables: List[str] = []
        prefix = f"ptb_fence_check_{uuid.uuid4().hex[:12]}_"
        _progress(
            f"checking PostgresUpdateStore at {target.display} on scratch tables "
            f"{prefix}* (dropped afterwards); your table is not touched"
        )

        def make_postgres() -> Any:
            announce()
            name = f"{prefix}{len(tables) + 1}"
            tables.append(name)
            return PostgresUpdateStore(dsn, name)

        try:
            violations = check_update_store(make_postgres)
        finally:
            _drop_scratch_tables(target, tables)
        store_name = "PostgresUpdateStore"
    elapsed = time.monotonic() - started
    if ctx.args.json:
        _json({"store": store_name, "rules": total, "seconds": round(elapsed, 1),
               "conforms": not violations,
               "violations": [target.redact(one_line(v)) for v in violations]})
        return 1 if violations else 0
    for violation in violations:
        _out(target.redact(one_line(violation)))
    if violations:
        _out(f"{store_name}: {len(violations)} violation(s) of the store contract "
             f"({total} rules, {elapsed:.1f}s)")
        return 1
    _out(f"{store_name} conforms: {total} rules, 0 violations ({elapsed:.1f}s)")
    return 0


def _drop_scratch_tables(target: StoreTarget, tables: Sequence[str]) -> None:
    if not tables:
        return
    conn = target.connect_postgres()
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            for name in tables:
                sql = statements(validate_table_name(name))
                for drop in ("admin_drop_table", "admin_drop_outbox", "admin_drop_state",
                             "admin_drop_steps", "admin_drop_jobs", "admin_drop_pace",
                             "admin_drop_broadcasts"):
                    cur.execute(sql[drop])
                cur.execute(sql["meta_exists"])
                if cur.fetchone()[0]:  # the conformance rule bind-bot binds scratch tables
                    cur.execute(sql["forget_table"], {"table": name})
    finally:
        conn.close()
    _progress(f"dropped {len(tables)} scratch table(s)")


# -- outbox ------------------------------------------------------------------------------------
def _cmd_outbox(ctx: _Context) -> int:
    with ctx.inspector() as inspector:
        return run_outbox(ctx.args, inspector, now=_now_ms(), out=_out)


# -- jobs --------------------------------------------------------------------------------------
def _cmd_jobs(ctx: _Context) -> int:
    store = ctx.open_store()
    try:
        require_jobs(store)
        if ctx.args.jobs_command != "show":
            return run_jobs(ctx.args, store, now=_now_ms(), out=_out)
        with ctx.inspector() as inspector:
            return run_jobs(
                ctx.args, store, now=_now_ms(), out=_out,
                rows_after=lambda after, limit: inspector.rows(after=after, limit=limit),
            )
    finally:
        store.close()


# -- broadcasts --------------------------------------------------------------------------------
def _cmd_broadcast(ctx: _Context) -> int:
    store = ctx.open_store()
    try:
        return run_broadcast(ctx.args, store, now=_now_ms, out=_out)
    finally:
        store.close()


# -- persistence -------------------------------------------------------------------------------
def _cmd_persistence(ctx: _Context) -> int:
    from ptb_fence.cli import _persistence

    args = ctx.args
    store = ctx.open_store()
    try:
        if args.action == "import":
            counts = _persistence.import_pickle(store, args.file, at=_now_ms(),
                                                multi_file=args.multi_file, replace=args.replace,
                                                progress=_progress)
            if args.json:
                _json({"imported": sum(counts.values()), "counts": counts, "file": args.file,
                       "table": ctx.table})
                return 0
            _out(f"imported {sum(counts.values())} state row(s) from {args.file!r} into table "
                 f"{ctx.table!r}: " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                                       or "nothing to import"))
            return 0
        if args.action == "export":
            counts = _persistence.export_pickle(store, args.file, progress=_progress)
            if args.json:
                _json({"exported": sum(counts.values()), "counts": counts, "file": args.file,
                       "table": ctx.table})
                return 0
            _out(f"exported {sum(counts.values())} state row(s) of table {ctx.table!r} to "
                 f"{args.file!r}: " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                                      or "no state"))
            return 0
        rows = _persistence.show_state(store, user=args.user, chat=args.chat, bot=args.bot,
                                       conversation=args.conversation, key=args.key)
    finally:
        store.close()
    if args.json:
        _json([{"kind": k.kind, "name": k.name, "key": k.key, "version": e.version,
                "deleted": e.value is None, "value": None if e.value is None else repr(v)}
               for k, e, v in rows])
        return 0
    if not rows:
        _out("no state stored for that")
        return 0
    _out(render_table(("KIND", "NAME", "KEY", "VERSION", "VALUE"), [
        (k.kind, k.name or "-", k.key or "-", e.version,
         "(deleted)" if e.value is None else clip(repr(v), 200))
        for k, e, v in rows], right=(3,)))
    return 0


# -- dispatch ----------------------------------------------------------------------------------
_COMMANDS: Dict[str, Callable[[_Context], int]] = {
    "status": _cmd_status,
    "health": _cmd_health,
    "list": _cmd_list,
    "show": _cmd_show,
    "exhaustions": _cmd_exhaustions,
    "ack": _cmd_ack,
    "retry": _cmd_retry,
    "prune": _cmd_prune,
    "schema": _cmd_schema,
    "migrate": _cmd_migrate,
    "check": _cmd_check,
    "persistence": _cmd_persistence,
    "outbox": _cmd_outbox,
    "jobs": _cmd_jobs,
    "broadcast": _cmd_broadcast,
}


class _VerboseLogging:
    """Send ``ptb_fence.*`` INFO records to stderr while a command runs (``--verbose``)."""

    def __init__(self, enabled: bool) -> None:
        self._handler: Optional[logging.Handler] = None
        self._enabled = enabled
        self._level = logging.NOTSET

    def __enter__(self) -> "_VerboseLogging":
        if self._enabled:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            logger = logging.getLogger("ptb_fence")
            self._level = logger.level
            logger.addHandler(handler)
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)
            self._handler = handler
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._handler is not None:
            logger = logging.getLogger("ptb_fence")
            logger.removeHandler(self._handler)
            logger.setLevel(self._level)


def _run(argv: List[str]) -> int:
    args = build_parser().parse_args(argv)
    ctx = _Context(args)
    ctx.validate_table()  # before any SQL
    with _VerboseLogging(bool(getattr(args, "verbose", False))):
        try:
            return _COMMANDS[args.command](ctx)
        except CommandError as exc:
            target = ctx.parsed_target
            text = target.redact(str(exc)) if target is not None else str(exc)
            raise type(exc)(text) from None
        except (SchemaError, StoreBusy, sqlite3.Error) as exc:
            raise ctx.store_error(exc) from None
        except Exception as exc:
            if type(exc).__module__.startswith("psycopg2"):
                raise ctx.store_error(exc) from None
            raise


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``ptb-fence`` command line.

    Args:
        argv: The arguments without the program name. :obj:`None` uses ``sys.argv[1:]``.

    Returns:
        :obj:`int`: The exit status.

        - ``0``: ok.
        - ``1``: the conformance check found violations, ``health`` found the table unhealthy
          (an unreachable store included), or ``migrate --check`` found the schema behind.
        - ``2``: bad input or a refused action. A one-line message goes to stderr, and
          nothing was changed.
        - ``3``: the store could not be reached or failed.
        - ``130``: interrupted.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(arguments)
    except SystemExit as exc:  # --help
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    except CommandError as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr, flush=True)
        return exc.status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr, flush=True)
        return 130
    except BrokenPipeError:
        # the reader went away (`ptb-fence list | head`): stop quietly, like standard tools
        _silence_stdout()
        return 0
    except Exception as exc:
        # unexpected: still one line, and never with the DSN (only the type and message)
        url = os.environ.get(STORE_ENV) or ""
        text = one_line(exc)
        try:
            text = StoreTarget(_store_of(arguments) or url).redact(text)
        except CommandError:
            pass
        print(f"{PROG}: error: {type(exc).__name__}: {text}", file=sys.stderr, flush=True)
        return 3


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that flushing it at exit raises no second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (captured output)
        pass


def _store_of(arguments: Sequence[str]) -> Optional[str]:
    found: Optional[str] = None
    iterator: Iterator[str] = iter(arguments)
    for item in iterator:
        if item == "--store":
            found = next(iterator, None)
        elif item.startswith("--store="):
            found = item.split("=", 1)[1]
    return found
