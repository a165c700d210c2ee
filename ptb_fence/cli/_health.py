"""``ptb-fence health``: the checks of an update table, their thresholds, and a bounded probe.

A probe reads the table once, read-only, in one snapshot. :func:`probe` lists its checks.
The table checks run only when the ``store`` check passed.
An unreachable store, a missing table and a store that does not answer in time all fail the
``store`` check. For a health probe they are the store being unhealthy, not an error of the
command.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ptb_fence.cli._errors import CommandError, Refused
from ptb_fence.cli._format import format_age, one_line
from ptb_fence.cli._inspect import TableInspector
from ptb_fence.cli._rows import HealthFigures, Oldest
from ptb_fence.cli._target import StoreTarget
from ptb_fence.stores._outbox_sql import outbox_table_name
from ptb_fence.stores._state_sql import state_table_name
from ptb_fence.stores.postgres._migration import PostgresSchemaState, read_schema_state

__all__ = [
    "DEFAULT_MAX_EXHAUSTIONS",
    "DEFAULT_MAX_EXHAUSTION_AGE_MS",
    "DEFAULT_MAX_FAILED_AGE_MS",
    "DEFAULT_MAX_FAILED_CALLS",
    "DEFAULT_MAX_LAPSED_AGE_MS",
    "DEFAULT_MAX_PENDING_AGE_MS",
    "DEFAULT_MAX_UNSENT_AGE_MS",
    "DEFAULT_TIMEOUT_MS",
    "HealthCheck",
    "HealthReport",
    "HealthThresholds",
    "judge",
    "probe",
    "schema_check",
]

# Why these defaults: with the default options a pending row left behind is swept 60 s
# (pending_grace_seconds) + up to 30 s (sweep_every_seconds) after it was recorded, a due retry
# runs at its due time or by the next sweep, and a lapsed lease is taken over by the next sweep.
# Five minutes is three times the slowest of these: a row still waiting then means that no
# process is taking work, not that a sweep is a little late.
DEFAULT_MAX_PENDING_AGE_MS = 5 * 60_000
DEFAULT_MAX_FAILED_AGE_MS = 5 * 60_000
DEFAULT_MAX_LAPSED_AGE_MS = 5 * 60_000
# Every sweep delivers an exhaustion to handle_exhaustion until the handler returns, which
# acknowledges it. One still unacknowledged after an hour has failed about 120 deliveries, or
# nothing is delivering.
DEFAULT_MAX_EXHAUSTION_AGE_MS = 60 * 60_000
# A sweep delivers at most 100 exhaustions: more than that waiting is a backlog deliveries do
# not keep up with (a burst of failures, or a handler that keeps failing).
DEFAULT_MAX_EXHAUSTIONS = 100
# A running process's dispatcher sends a committed call at once. A call Telegram throttles
# (429 retry_after, usually seconds) or that meets a network error waits and is retried. Five
# minutes unsent means no process is sending (none running with a bot token, or all stuck).
DEFAULT_MAX_UNSENT_AGE_MS = 5 * 60_000
# A failed call (refused by Telegram, or tried too often) waits for handle_send_failure, which
# acknowledges it. As for exhaustions, more than 100 waiting is a backlog.
DEFAULT_MAX_FAILED_CALLS = 100
# Below the usual probe timeouts (Docker's HEALTHCHECK 30 s). Set the orchestrator's timeout
# above it, since Kubernetes' default of 1 s is too short for any Python process.
DEFAULT_TIMEOUT_MS = 5_000

_CANCEL_GRACE_S = 1.0  # how long a timed-out probe waits for the cancelled query to return

_SWEEP_HINT = "is a bot process running and sweeping?"
_EXHAUSTION_HINT = "see them with `ptb-fence exhaustions`; is handle_exhaustion failing?"
_UNSENT_HINT = "is a bot process running with an outbox sender (a bot token)?"
_FAILED_CALLS_HINT = (
    "see them with `ptb-fence outbox list --state failed`; is a send-failure handler "
    "acknowledging them?"
)


@dataclass(frozen=True)
class HealthThresholds:
    """The limits a probe judges against (durations in milliseconds).

    An age check fails when the age is longer than its limit. The ``exhaustions`` check fails
    when there are more than ``max_exhaustions``.
    """

    max_pending_age: int = DEFAULT_MAX_PENDING_AGE_MS
    max_failed_age: int = DEFAULT_MAX_FAILED_AGE_MS
    max_lapsed_age: int = DEFAULT_MAX_LAPSED_AGE_MS
    max_exhaustion_age: int = DEFAULT_MAX_EXHAUSTION_AGE_MS
    max_exhaustions: int = DEFAULT_MAX_EXHAUSTIONS
    max_unsent_age: int = DEFAULT_MAX_UNSENT_AGE_MS
    max_failed_calls: int = DEFAULT_MAX_FAILED_CALLS
    timeout: int = DEFAULT_TIMEOUT_MS


@dataclass(frozen=True)
class HealthCheck:
    """The verdict of one check.

    ``value`` and ``threshold`` are seconds (``unit`` ``"seconds"``) or a number of rows
    (``unit`` ``"count"``). ``value`` is :obj:`None` when nothing was measured. That is so when
    there is no row of that kind, or the store could not be read.
    """

    name: str
    ok: bool
    message: str
    value: Optional[float]
    threshold: float
    unit: str
    update_id: Optional[int] = None

    def as_json(self) -> Dict[str, Any]:
        """The check as a JSON-ready dict."""
        return {
            "name": self.name,
            "ok": self.ok,
            "value": self.value,
            "threshold": self.threshold,
            "unit": self.unit,
            "update_id": self.update_id,
            "message": self.message,
        }


@dataclass(frozen=True)
class HealthReport:
    """The checks of one probe, ``store`` first.

    ``now`` is when the table was read, in epoch milliseconds. It is :obj:`None` if the table
    was not read."""

    checks: Tuple[HealthCheck, ...]
    now: Optional[int]

    @property
    def healthy(self) -> bool:
        """:obj:`bool`: Every check passed (and the table checks ran)."""
        return len(self.checks) > 1 and all(check.ok for check in self.checks)

    @property
    def failed(self) -> List[HealthCheck]:
        """The checks that failed."""
        return [check for check in self.checks if not check.ok]


def _seconds(ms: int) -> float:
    return ms / 1000.0


def _age_check(
    name: str,
    oldest: Optional[Oldest],
    now: int,
    limit: int,
    *,
    none: str,
    describe: str,
    hint: str,
) -> HealthCheck:
    """An age check: ``describe`` is formatted with ``update_id`` and ``age``."""
    threshold = _seconds(limit)
    if oldest is None:
        return HealthCheck(name, True, none, None, threshold, "seconds")
    # The bot's clock wrote the row. A probe whose clock is behind sees no negative age.
    age = max(now - oldest.since, 0)
    ok = age <= limit
    text = describe.format(update_id=oldest.update_id, age=format_age(age))
    message = f"{text} (threshold {format_age(limit)})" + ("" if ok else f"; {hint}")
    return HealthCheck(name, ok, message, _seconds(age), threshold, "seconds", oldest.update_id)


def judge(figures: HealthFigures, thresholds: HealthThresholds) -> List[HealthCheck]:
    """The table checks of ``figures`` (in the order of the module docstring).

    Args:
        figures (:class:`~ptb_fence.cli._rows.HealthFigures`): What the table holds.
        thresholds (:class:`HealthThresholds`): The limits.

    Returns:
        The checks ``pending_age``, ``failed_age``, ``lapsed_age``, ``exhaustions`` and
        ``exhaustion_age``, then ``unsent_age`` and ``failed_calls`` when the table has an
        outbox table.
    """
    now = figures.now
    count = figures.unacknowledged_exhaustions
    limit = thresholds.max_exhaustions
    count_ok = count <= limit
    checks = [
        _age_check(
            "pending_age", figures.oldest_pending, now, thresholds.max_pending_age,
            none="no pending update",
            describe="update {update_id} has been pending for {age}",
            hint=_SWEEP_HINT,
        ),
        _age_check(
            "failed_age", figures.oldest_failed_due, now, thresholds.max_failed_age,
            none="no failed update is due for its retry",
            describe="the retry of failed update {update_id} has been due for {age}",
            hint=_SWEEP_HINT,
        ),
        _age_check(
            "lapsed_age", figures.oldest_lapsed_lease, now, thresholds.max_lapsed_age,
            none="no lapsed lease",
            describe="the lease on update {update_id} lapsed {age} ago and was not taken over",
            hint=_SWEEP_HINT,
        ),
        HealthCheck(
            "exhaustions",
            count_ok,
            f"{count} unacknowledged exhaustion(s) (threshold {limit})"
            + ("" if count_ok else f"; {_EXHAUSTION_HINT}"),
            float(count),
            float(limit),
            "count",
        ),
        _age_check(
            "exhaustion_age", figures.oldest_exhaustion, now, thresholds.max_exhaustion_age,
            none="no unacknowledged exhaustion",
            describe="update {update_id} has been an unacknowledged exhaustion for {age}",
            hint=_EXHAUSTION_HINT,
        ),
    ]
    if figures.has_outbox:
        checks.extend(_outbox_checks(figures, thresholds))
    return checks


def _outbox_checks(figures: HealthFigures, thresholds: HealthThresholds) -> List[HealthCheck]:
    """``unsent_age`` and ``failed_calls`` of a table with an outbox table."""
    unsent = figures.oldest_unsent_call
    oldest = None if unsent is None else Oldest(unsent.update_id, unsent.since)
    call = "" if unsent is None else f"outbox call {unsent.call_id} "
    failed = figures.unacknowledged_failed_calls
    limit = thresholds.max_failed_calls
    failed_ok = failed <= limit
    return [
        _age_check(
            "unsent_age", oldest, figures.now, thresholds.max_unsent_age,
            none="no unsent outbox call",
            describe=call + "(update {update_id}) has been unsent for {age}",
            hint=_UNSENT_HINT,
        ),
        HealthCheck(
            "failed_calls",
            failed_ok,
            f"{failed} unacknowledged failed outbox call(s) (threshold {limit})"
            + ("" if failed_ok else f"; {_FAILED_CALLS_HINT}"),
            float(failed),
            float(limit),
            "count",
        ),
    ]


class _Probe:
    """One read of the table, run in its own thread so that the caller can stop waiting."""

    __slots__ = ("conn", "error", "figures", "phase", "schema", "table", "target", "timeout")

    def __init__(self, target: StoreTarget, table: str, timeout: float) -> None:
        self.target = target
        self.table = table
        self.timeout = timeout
        self.conn: Any = None
        self.phase = "connecting"
        self.figures: Optional[HealthFigures] = None
        self.schema: Optional[PostgresSchemaState] = None
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            target = self.target
            self.conn = (
                target.connect_sqlite(self.timeout)
                if target.is_sqlite
                else target.connect_postgres(self.timeout)
            )
            self.phase = "reading the table"
            with TableInspector(target, self.table, conn=self.conn) as inspector:
                self.figures = inspector.health(int(time.time() * 1000))
                if not target.is_sqlite:
                    self.phase = "reading the schema"
                    with self.conn.cursor() as cur:
                        self.schema = read_schema_state(cur, self.table)
                    self.conn.rollback()
        except BaseException as exc:  # reported by the waiting thread
            self.error = exc

    def cancel(self) -> None:
        """Stop the running statement, so that the server does not keep working for a probe
        that gave up (a query waiting for a lock would wait until the lock is released)."""
        conn = self.conn
        if conn is None:
            return
        try:
            if isinstance(conn, sqlite3.Connection):
                conn.interrupt()
            else:
                conn.cancel()
        except Exception:  # already closed, or the cancel request failed: nothing to stop
            pass


def _is_store_error(exc: BaseException) -> bool:
    return isinstance(exc, (CommandError, sqlite3.Error)) or type(exc).__module__.startswith(
        "psycopg2"
    )


def probe(target: StoreTarget, table: str, thresholds: HealthThresholds) -> HealthReport:
    """Read ``table`` once and judge it, never waiting much longer than ``thresholds.timeout``.

    The connection attempt is bounded too (libpq's ``connect_timeout``, SQLite's busy timeout).
    A read still running at the deadline is cancelled, and the ``store`` check fails.

    It judges seven checks, nine when the table has an outbox table:

    - ``store``: the store answered within ``timeout``. The table exists with the columns of
      an update table.
    - ``schema``: nothing of the current schema is missing. A PostgreSQL table created by an
      older release needs ``ptb-fence migrate`` when a column, an index or a shared table is
      missing. A missing outbox or state table is noted, not failed. SQLite stores migrate
      their table when they open it, so there it always passes.
    - ``pending_age``: the oldest pending update has waited at most ``max_pending_age`` since
      it was recorded.
    - ``failed_age``: no failed update's retry has been due for longer than
      ``max_failed_age``.
    - ``lapsed_age``: no processing update's lease lapsed longer than ``max_lapsed_age`` ago
      without being taken over.
    - ``exhaustions``: at most ``max_exhaustions`` unacknowledged exhaustions.
    - ``exhaustion_age``: no unacknowledged exhaustion is older than ``max_exhaustion_age``.
    - ``unsent_age`` (outbox): no outbox call committed longer than ``max_unsent_age`` ago is
      still unsent (pending or sending).
    - ``failed_calls`` (outbox): at most ``max_failed_calls`` failed outbox calls are
      unacknowledged.

    Args:
        target (:class:`~ptb_fence.cli._target.StoreTarget`): The database.
        table (:obj:`str`): The table (already validated).
        thresholds (:class:`HealthThresholds`): The limits.

    Returns:
        :class:`HealthReport`: Only the ``store`` check when it failed, else all seven (nine
        with an outbox table).

    Raises:
        Exception: An error that is not the store's (a bug) is raised as it is.
    """
    limit_s = _seconds(thresholds.timeout)
    work = _Probe(target, table, limit_s)
    thread = threading.Thread(target=work.run, name="ptb-fence-health", daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(limit_s)
    elapsed = time.monotonic() - started

    def store_failed(message: str) -> HealthReport:
        return HealthReport(
            (HealthCheck("store", False, message, None, limit_s, "seconds"),), None
        )

    if thread.is_alive():
        phase = work.phase
        work.cancel()
        thread.join(_CANCEL_GRACE_S)  # a daemon thread: the process may exit without it
        return store_failed(
            f"store timed out: no answer within {format_age(thresholds.timeout)} while "
            f"{phase} (--timeout)"
        )
    error = work.error
    if error is not None:
        if not _is_store_error(error):
            raise error
        text = target.redact(one_line(error))
        if work.phase == "connecting":
            return store_failed(f"store unreachable: {text}")
        if isinstance(error, Refused):  # no such table, or not an update table
            return store_failed(text)
        return store_failed(f"store failed while {work.phase}: {text}")
    figures = work.figures
    assert figures is not None
    store = HealthCheck(
        "store",
        True,
        f"reachable; table {table!r} read in {elapsed:.3f} s "
        f"(threshold {format_age(thresholds.timeout)})",
        round(elapsed, 3),
        limit_s,
        "seconds",
    )
    return HealthReport((store, schema_check(work.schema), *judge(figures, thresholds)),
                        figures.now)


def schema_check(state: Optional[PostgresSchemaState]) -> HealthCheck:
    """The ``schema`` check: fails when the PostgreSQL table is behind the current schema
    (``state`` :obj:`None`: a SQLite table, which its store migrates when it opens it)."""
    if state is None:
        return HealthCheck(
            "schema", True, "SQLite: the store migrates its table when it opens it", 0.0, 0.0,
            "count",
        )
    # a missing outbox or state table is no fault of the table: a bot that never used them
    # (made before them) runs as before, and the outbox checks are left out
    optional = (outbox_table_name(state.table), state_table_name(state.table))
    absent = [name for name in state.missing_tables if name in optional]
    gaps = [gap for gap in state.gaps() if not any(repr(name) in gap for name in absent)]
    if not gaps:
        note = "" if not absent else (
            f"; no {' or '.join(repr(name) for name in absent)} yet (`ptb-fence migrate` "
            "creates it)"
        )
        return HealthCheck("schema", True, "current: nothing to migrate" + note, 0.0, 0.0,
                           "count")
    return HealthCheck(
        "schema",
        False,
        f"the table was made by an older release and lacks {', '.join(gaps)}; apply the "
        "migration with `ptb-fence migrate` (`ptb-fence migrate --check` tells when it is "
        "done)",
        float(len(gaps)),
        0.0,
        "count",
    )
