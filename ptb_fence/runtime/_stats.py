"""RuntimeStats: what one runtime counts for operators, and the frozen snapshot it gives.

The front ends and the runtime report events here (an update recorded, an attempt started or
ended, a handler's duration, a store call's duration, a failed renewal). ``stats()`` of a
processor or an :class:`~ptb_fence.UpdateIntake` returns a :class:`Stats` snapshot.
:mod:`ptb_fence.metrics` turns the same snapshot into Prometheus metrics at scrape time. What
only the store knows is read by the sweep (:class:`~ptb_fence.StoreFigures`), never per scrape.
Counting costs a lock and a few additions per event.
"""

from __future__ import annotations

import bisect
import threading
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

from ptb_fence._values import StoreFigures
from ptb_fence.runtime._outage import StoreOutage

__all__ = [
    "ATTEMPT_OUTCOMES",
    "HANDLER_BUCKETS",
    "HistogramSnapshot",
    "RuntimeStats",
    "STORE_BUCKETS",
    "STORE_ERROR_STEPS",
    "STORE_OPERATIONS",
    "JOB_FIGURES_LIMIT",
    "Stats",
]

ATTEMPT_OUTCOMES = (
    "completed",
    "failed",
    "timed_out",
    "exhausted",
    "abandoned",
    "lost",
    "released",
    "conflicted",
)
"""How an attempt ended (each ended attempt counts once, under one of these):
``completed``. ``failed`` (a retry is scheduled). ``timed_out`` (ran past
``attempt_timeout_seconds``, a retry is scheduled). ``exhausted`` (a durable exhaustion).
``abandoned`` (its last attempt failed, no exhaustion handler). ``lost`` (its claim was lost:
another process owns the update now). ``released`` (given back unfinished at a stop, its attempt
not spent). ``conflicted`` (persisted state it changed was changed meanwhile: given back, its
attempt not spent, it runs again on the fresh state)."""

STORE_OPERATIONS = (
    "record",
    "claim",
    "renew",
    "settle",
    "sweep",
    "exhaustions",
    "prune",
    "release",
    "liveness",
    "figures",
    "outbox",
)
"""The store operations whose durations are measured (a small fixed label set)."""

STORE_ERROR_STEPS = ("ingest", "claim", "renew", "settle", "sweep", "outbox")
"""The steps a store error is counted under (``Stats.store_errors``, ``on_store_error``)."""

JOB_FIGURES_LIMIT = 1000
"""The most due jobs one read of the job figures counts (one ``due_jobs`` call)."""

_JOB_RUN_FAILED = ("failed", "timed_out")
_JOB_RUN_EXHAUSTED = ("exhausted", "abandoned")

T = TypeVar("T")

HANDLER_BUCKETS: Tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
"""Upper bounds (seconds) of the handler duration histogram."""

STORE_BUCKETS: Tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)
"""Upper bounds (seconds) of the store call duration histogram."""


@dataclass(frozen=True)
class HistogramSnapshot:
    """Observed durations, as a Prometheus histogram holds them.

    Args:
        buckets (:obj:`tuple`): ``(upper_bound, cumulative_count)`` pairs in increasing order,
            the last with the bound ``float("inf")`` (its count equals :attr:`count`).
        sum (:obj:`float`): The sum of the observed durations (seconds).
        count (:obj:`int`): How many were observed.
    """

    buckets: Tuple[Tuple[float, int], ...]
    sum: float
    count: int


@dataclass(frozen=True)
class Stats:
    """A snapshot of what one processor or :class:`~ptb_fence.UpdateIntake` counted since it
    was created (counters never go down), and how things stand now (gauges).

    Returned by ``processor.stats()`` and ``intake.stats()``: for users with their own
    metrics system (StatsD, OpenTelemetry). :mod:`ptb_fence.metrics` exposes the same figures
    to Prometheus.

    Args:
        updates_recorded (:obj:`int`): Updates recorded by this process (counter).
        updates_duplicate (:obj:`int`): Updates not recorded because their id was recorded
            before: redeliveries (counter).
        updates_invalid (:obj:`int`): Bodies refused as not a Telegram update (counter).
        ingest_errors (:obj:`int`): Recordings that failed with a store error. Those updates
            were not acknowledged to Telegram (counter).
        attempts_started (:obj:`int`): Attempts claimed by this process (counter).
        attempts_ended (Mapping[:obj:`str`, :obj:`int`]): Ended attempts by outcome, every key
            of :data:`ATTEMPT_OUTCOMES` present (counters).
        attempts_running (:obj:`int`): Attempts whose handler runs now (gauge).
        claims_held (:obj:`int`): Claims this process holds and renews now, running or about to
            start (gauge).
        lease_renewal_failures (:obj:`int`): Lease renewals that failed: a store error, or a
            renewal refused because the claim was lost (counter).
        store_errors (Mapping[:obj:`str`, :obj:`int`]): Store errors by step (``ingest``,
            ``claim``, ``renew``, ``settle``, ``sweep``), as ``on_store_error`` sees them
            (counters).
        handler_seconds (:class:`HistogramSnapshot`): Handler durations.
        store_seconds (Mapping[:obj:`str`, :class:`HistogramSnapshot`]): Store call durations
            by operation (:data:`STORE_OPERATIONS`), only operations that ran.
        unsettled (:obj:`int` | :obj:`None`): Updates pending, processing or failed in the
            store, as of :attr:`figures_read_at` (gauge). It is :obj:`None` if the store does
            not count them or no sweep read them yet.
        oldest_unsettled_age_seconds (:obj:`float` | :obj:`None`): Age now of the oldest of
            them (gauge, :obj:`None` if there is none or it was not read).
        exhaustions_waiting (:obj:`int` | :obj:`None`): Unacknowledged exhaustions in the store
            (gauge, :obj:`None` if not read).
        figures_read_at (:obj:`float` | :obj:`None`): When the sweep last read the store's
            figures (epoch seconds).
        last_sweep_at (:obj:`float` | :obj:`None`): When a sweep last read the due updates
            successfully (epoch seconds).
        last_renewal_tick_at (:obj:`float` | :obj:`None`): When the lease keeper last ran
            (epoch seconds).
        calls_sent (:obj:`int`): Outbox calls this process sent and recorded ``sent``
            (counter).
        calls_failed (:obj:`int`): Outbox calls this process ended ``failed`` (refused,
            unknown outcome of an ``at_most_once`` call, expired) (counter).
        calls_retried (:obj:`int`): Sends of outbox calls that failed and were scheduled
            again (``RetryAfter``, network errors, 5xx answers) (counter).
        outbox (Mapping[:obj:`str`, :obj:`int`] | :obj:`None`): The store's outbox counts
            (:meth:`~ptb_fence.OutboxStore.outbox_counts`: ``pending``, ``sending``,
            ``sent``, ``failed``, ``failed_acknowledged``) as of :attr:`figures_read_at`
            (gauges, :obj:`None` without an outbox or before the first read).
        handlers_left_running (:obj:`int`): Handlers let go while they still run (gauge): a
            blocking :class:`~ptb_fence.UpdateIntake` handler's worker thread stuck past
            ``attempt_timeout_seconds``, or an asyncio handler task that ignored its
            cancellation (at the attempt timeout or the stop). Their attempts ended (fenced
            writes refused, no lease renewal). They are not in :attr:`attempts_running`. A
            stuck thread no longer counts against ``max_concurrent``, but only
            ``max_concurrent`` of them are replaced.
        jobs_due (:obj:`int` | :obj:`None`): Durable jobs due and not yet fired, as of
            :attr:`jobs_read_at` (gauge). These are ``scheduled`` jobs whose next run has come.
            The sweep counts at most :data:`JOB_FIGURES_LIMIT` of them. It is :obj:`None` for a
            store without jobs, or before the first read.
        jobs_late_seconds (:obj:`float` | :obj:`None`): How far behind its schedule the most
            overdue of them was when read (gauge, ``0.0`` when none is due, :obj:`None` as for
            :attr:`jobs_due`). A running bot fires a due run within about a second. A figure
            that keeps growing means no process with durable jobs runs.
        jobs_read_at (:obj:`float` | :obj:`None`): When the sweep last read the due jobs
            (epoch seconds).
        job_runs_running (:obj:`int`): Runs of durable jobs this process holds claims on now,
            running or about to start (gauge, part of :attr:`claims_held`).
        job_runs_failed (:obj:`int`): Attempts at job runs that failed in this process, a retry
            scheduled (timed out ones included) (counter, part of :attr:`attempts_ended`).
        job_runs_exhausted (:obj:`int`): Job runs whose last attempt failed in this process:
            exhausted, or abandoned without ``handle_exhaustion`` (counter, part of
            :attr:`attempts_ended`).
        broadcast_sends (Mapping[:obj:`str`, :obj:`int`]): Broadcast recipients this process
            recorded, by result: ``sent``, ``failed``, ``blocked`` (the user blocked the bot)
            and ``retried`` (put back for a later try) (counters).
        broadcast_recipients (Mapping[:obj:`str`, :obj:`int`] | :obj:`None`): The store's
            broadcast recipients by state (:data:`~ptb_fence.RECIPIENT_STATES`), summed over
            its broadcasts, as of :attr:`figures_read_at` (gauges, :obj:`None` without
            broadcasts or before the first read).
    """

    updates_recorded: int
    updates_duplicate: int
    updates_invalid: int
    ingest_errors: int
    attempts_started: int
    attempts_ended: Mapping[str, int]
    attempts_running: int
    claims_held: int
    lease_renewal_failures: int
    store_errors: Mapping[str, int]
    handler_seconds: HistogramSnapshot
    store_seconds: Mapping[str, HistogramSnapshot]
    unsettled: Optional[int]
    oldest_unsettled_age_seconds: Optional[float]
    exhaustions_waiting: Optional[int]
    figures_read_at: Optional[float]
    last_sweep_at: Optional[float]
    last_renewal_tick_at: Optional[float]
    calls_sent: int = 0
    calls_failed: int = 0
    calls_retried: int = 0
    outbox: Optional[Mapping[str, int]] = None
    handlers_left_running: int = 0
    jobs_due: Optional[int] = None
    jobs_late_seconds: Optional[float] = None
    jobs_read_at: Optional[float] = None
    job_runs_running: int = 0
    job_runs_failed: int = 0
    job_runs_exhausted: int = 0
    broadcast_sends: Mapping[str, int] = field(default_factory=lambda: types.MappingProxyType(
        dict.fromkeys(("sent", "failed", "blocked", "retried"), 0)))
    broadcast_recipients: Optional[Mapping[str, int]] = None


class _Histogram:
    """Bucket counts of observed durations (guarded by the owner's lock)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def snapshot(self) -> HistogramSnapshot:
        cumulative: List[Tuple[float, int]] = []
        running = 0
        for bound, count in zip(self.bounds + (float("inf"),), self.counts):
            running += count
            cumulative.append((bound, running))
        return HistogramSnapshot(tuple(cumulative), self.sum, running)


class RuntimeStats:
    """The counters of one runtime (thread-safe). Every method is cheap and never raises."""

    __slots__ = (
        "_attempts_ended",
        "_attempts_started",
        "_calls",
        "_broadcast_sends",
        "_duplicates",
        "_figures",
        "_figures_read_at",
        "_handler",
        "_handlers_running",
        "_ingest_errors",
        "_invalid",
        "_jobs_due",
        "_jobs_late",
        "_jobs_read_at",
        "_job_runs",
        "_last_renewal_tick",
        "_last_sweep",
        "_last_sweep_run",
        "_lock",
        "_outbox",
        "_recipients",
        "_recorded",
        "_renewal_failures",
        "_store",
        "_store_errors",
        "ingest_failing_since",
        "oldest_unrecorded_date",
        "outage",
        "store_failing_since",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recorded = 0
        self._duplicates = 0
        self._invalid = 0
        self._ingest_errors = 0
        self._attempts_started = 0
        self._attempts_ended: Dict[str, int] = dict.fromkeys(ATTEMPT_OUTCOMES, 0)
        self._renewal_failures = 0
        self._store_errors: Dict[str, int] = {}
        self._handler = _Histogram(HANDLER_BUCKETS)
        # counted here, under the lock of the ended counters (not read from the front end):
        # a snapshot never shows an attempt both running and ended
        self._handlers_running = 0
        self._store: Dict[str, _Histogram] = {}
        self._figures: Optional[StoreFigures] = None
        self._figures_read_at: Optional[float] = None
        self._last_sweep: Optional[float] = None
        # a sweep that ran, whether the store answered or not (the liveness probe's: an outage
        # of the store must not read as a process that stopped)
        self._last_sweep_run: Optional[float] = None
        self._last_renewal_tick: Optional[float] = None
        self._calls: Dict[str, int] = {"sent": 0, "failed": 0, "retried": 0}
        self._broadcast_sends: Dict[str, int] = dict.fromkeys(
            ("sent", "failed", "blocked", "retried"), 0)
        self._outbox: Optional[Dict[str, int]] = None
        self._recipients: Optional[Dict[str, int]] = None
        # the due jobs as the sweep last read them, and the runs' attempts ended here
        self._jobs_due: Optional[int] = None
        self._jobs_late: Optional[float] = None
        self._jobs_read_at: Optional[float] = None
        self._job_runs: Dict[str, int] = {"failed": 0, "exhausted": 0}
        # since when recording fails (epoch seconds, None if the last recording succeeded), and
        # the oldest Telegram ``date`` among the updates it failed to record (for the alarm)
        self.ingest_failing_since: Optional[float] = None
        self.oldest_unrecorded_date: Optional[int] = None
        # since when store calls fail (epoch seconds, None if the last one answered)
        self.store_failing_since: Optional[float] = None
        # what the log says of the store errors of one outage (the first store call that
        # answers ends it)
        self.outage = StoreOutage()

    # -- ingest -----------------------------------------------------------------------------
    def recorded(self, added: int, duplicates: int) -> None:
        """A recording landed: ``added`` new updates, ``duplicates`` redeliveries."""
        with self._lock:
            self._recorded += added
            self._duplicates += duplicates
            self.ingest_failing_since = None
            self.oldest_unrecorded_date = None

    def invalid(self) -> None:
        """A body was refused as not a Telegram update."""
        with self._lock:
            self._invalid += 1

    def ingest_failed(self, oldest_date: Optional[int]) -> None:
        """A recording failed with a store error (``oldest_date``: the oldest Telegram
        ``date`` among its updates, when known)."""
        with self._lock:
            self._ingest_errors += 1
            if self.ingest_failing_since is None:
                self.ingest_failing_since = time.time()
            if oldest_date is not None and (
                self.oldest_unrecorded_date is None or oldest_date < self.oldest_unrecorded_date
            ):
                self.oldest_unrecorded_date = oldest_date

    # -- attempts ---------------------------------------------------------------------------
    def attempt_started(self, count: int = 1) -> None:
        """``count`` attempts were claimed."""
        with self._lock:
            self._attempts_started += count

    def attempt_ended(self, outcome: str, count: int = 1, *, job_run: bool = False) -> None:
        """``count`` attempts ended with ``outcome`` (one of :data:`ATTEMPT_OUTCOMES`).

        ``job_run``: they were attempts at runs of durable jobs."""
        with self._lock:
            self._attempts_ended[outcome] = self._attempts_ended.get(outcome, 0) + count
            if job_run:
                if outcome in _JOB_RUN_FAILED:
                    self._job_runs["failed"] += count
                elif outcome in _JOB_RUN_EXHAUSTED:
                    self._job_runs["exhausted"] += count

    def handler_time(self, seconds: float) -> None:
        """A handler ran for ``seconds``."""
        with self._lock:
            self._handler.observe(seconds)

    def handler_began(self) -> None:
        """A handler began to run (:attr:`Stats.attempts_running` counts it)."""
        with self._lock:
            self._handlers_running += 1

    def handler_gone(self, seconds: Optional[float] = None) -> None:
        """A handler that began no longer counts as running: it returned (after
        ``seconds``, observed when given), was let go, or was cancelled. Called before its
        attempt's end is counted."""
        with self._lock:
            self._handlers_running -= 1
            if seconds is not None:
                self._handler.observe(seconds)

    # -- the outbox -------------------------------------------------------------------------
    def calls_sent(self, count: int) -> None:
        """``count`` outbox calls were recorded sent."""
        with self._lock:
            self._calls["sent"] += count

    def calls_failed(self, count: int) -> None:
        """``count`` outbox calls ended failed."""
        with self._lock:
            self._calls["failed"] += count

    def calls_retried(self, count: int) -> None:
        """``count`` failed sends were scheduled again."""
        with self._lock:
            self._calls["retried"] += count

    def broadcast_sent(self, result: str, count: int = 1) -> None:
        """``count`` broadcast recipients were recorded with ``result``."""
        with self._lock:
            self._broadcast_sends[result] = self._broadcast_sends.get(result, 0) + count

    def broadcast_recipients(self, counts: Mapping[str, int]) -> None:
        """The sweep counted the store's broadcast recipients by state."""
        with self._lock:
            self._recipients = dict(counts)

    def outbox_counts(self, counts: Mapping[str, int]) -> None:
        """The sweep read the store's outbox counts."""
        with self._lock:
            self._outbox = dict(counts)

    # -- the store --------------------------------------------------------------------------
    def store_time(self, operation: str, seconds: float, ok: bool = True) -> None:
        """A store call of ``operation`` took ``seconds`` (``ok``: it answered)."""
        with self._lock:
            histogram = self._store.get(operation)
            if histogram is None:
                histogram = self._store[operation] = _Histogram(STORE_BUCKETS)
            histogram.observe(seconds)
            if ok:
                self.store_failing_since = None
            elif self.store_failing_since is None:
                self.store_failing_since = time.time()
        if ok:
            self.outage.answered()

    def timed(self, operation: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call the store with ``fn(*args, **kwargs)`` and count its duration under
        ``operation`` (its error propagates, counted as a store call that did not answer)."""
        started = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            self.store_time(operation, time.perf_counter() - started, ok=False)
            raise
        self.store_time(operation, time.perf_counter() - started)
        return result

    def store_error(self, step: str) -> None:
        """A store error was reported for ``step``."""
        with self._lock:
            self._store_errors[step] = self._store_errors.get(step, 0) + 1
            if step == "renew":
                self._renewal_failures += 1
            if self.store_failing_since is None:
                self.store_failing_since = time.time()

    def renewal_refused(self, count: int = 1) -> None:
        """``count`` renewals were refused (the claims were lost)."""
        with self._lock:
            self._renewal_failures += count

    def renewal_tick(self) -> None:
        """The lease keeper ran."""
        self._last_renewal_tick = time.time()

    def swept(self) -> None:
        """A sweep read the due updates."""
        self._last_sweep = time.time()

    def sweep_ran(self) -> None:
        """A sweep ran (the store answered or not)."""
        self._last_sweep_run = time.time()

    def figures(self, figures: StoreFigures) -> None:
        """The sweep read the store's figures."""
        with self._lock:
            self._figures = figures
            self._figures_read_at = time.time()

    def due_jobs_read(self, due_at: Sequence[int], now_ms: int) -> None:
        """The sweep read the due jobs: ``due_at`` are their next runs (epoch milliseconds),
        ``now_ms`` is when it read them."""
        late = max((now_ms - min(due_at)) / 1000.0, 0.0) if due_at else 0.0
        with self._lock:
            self._jobs_due = len(due_at)
            self._jobs_late = late
            self._jobs_read_at = time.time()

    @property
    def jobs_read_at(self) -> Optional[float]:
        """When the sweep last read the due jobs (epoch seconds)."""
        return self._jobs_read_at

    @property
    def jobs_late_seconds(self) -> Optional[float]:
        """How late the most overdue due job was when the sweep read them (seconds)."""
        return self._jobs_late

    @property
    def jobs_due_count(self) -> Optional[int]:
        """How many jobs were due when the sweep read them."""
        return self._jobs_due

    @property
    def last_figures(self) -> Optional[StoreFigures]:
        """The store's figures as the sweep last read them."""
        return self._figures

    @property
    def figures_read_at(self) -> Optional[float]:
        """When the sweep last read them (epoch seconds)."""
        return self._figures_read_at

    @property
    def last_sweep_at(self) -> Optional[float]:
        """When a sweep last read the due updates (epoch seconds)."""
        return self._last_sweep

    @property
    def last_sweep_run_at(self) -> Optional[float]:
        """When a sweep last ran, the store answering or not (epoch seconds)."""
        return self._last_sweep_run

    @property
    def last_renewal_tick_at(self) -> Optional[float]:
        """When the lease keeper last ran (epoch seconds)."""
        return self._last_renewal_tick

    # -- the snapshot -----------------------------------------------------------------------
    def snapshot(self, *, claims_held: int, now_ms: int, left_running: int = 0,
                 job_runs_running: int = 0) -> Stats:
        """The figures now.

        ``claims_held``, ``left_running`` and ``job_runs_running`` are the front end's gauges.
        ``now_ms`` is the runtime's clock, for the age of the oldest unsettled update."""
        with self._lock:
            figures = self._figures
            oldest_age: Optional[float] = None
            if figures is not None and figures.oldest_unsettled_received_at is not None:
                oldest_age = max(0.0, (now_ms - figures.oldest_unsettled_received_at) / 1000.0)
            return Stats(
                updates_recorded=self._recorded,
                updates_duplicate=self._duplicates,
                updates_invalid=self._invalid,
                ingest_errors=self._ingest_errors,
                attempts_started=self._attempts_started,
                attempts_ended=types.MappingProxyType(dict(self._attempts_ended)),
                attempts_running=self._handlers_running,
                claims_held=claims_held,
                handlers_left_running=left_running,
                lease_renewal_failures=self._renewal_failures,
                store_errors=types.MappingProxyType(dict(self._store_errors)),
                handler_seconds=self._handler.snapshot(),
                store_seconds=types.MappingProxyType(
                    {name: h.snapshot() for name, h in sorted(self._store.items())}
                ),
                unsettled=None if figures is None else figures.unsettled,
                oldest_unsettled_age_seconds=oldest_age,
                exhaustions_waiting=None if figures is None else figures.exhaustions_waiting,
                figures_read_at=self._figures_read_at,
                last_sweep_at=self._last_sweep,
                last_renewal_tick_at=self._last_renewal_tick,
                calls_sent=self._calls["sent"],
                calls_failed=self._calls["failed"],
                calls_retried=self._calls["retried"],
                outbox=None if self._outbox is None else types.MappingProxyType(dict(self._outbox)),
                jobs_due=self._jobs_due,
                jobs_late_seconds=self._jobs_late,
                jobs_read_at=self._jobs_read_at,
                job_runs_running=job_runs_running,
                job_runs_failed=self._job_runs["failed"],
                job_runs_exhausted=self._job_runs["exhausted"],
                broadcast_sends=types.MappingProxyType(dict(self._broadcast_sends)),
                broadcast_recipients=None if self._recipients is None
                else types.MappingProxyType(dict(self._recipients)),
            )
