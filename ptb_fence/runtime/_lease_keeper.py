"""LeaseKeeper: one background job per process renewing every active lease."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from ptb_fence._events import event
from ptb_fence.runtime._stats import RuntimeStats

if TYPE_CHECKING:
    from apscheduler.schedulers.background import BackgroundScheduler

    from ptb_fence.runtime._attempt import Attempt
    from ptb_fence.runtime._options import RuntimeOptions
    from ptb_fence.runtime._port import StorePort

ReportStoreError = Callable[..., None]
"""``report(error, step, *, ids=None)``: how the keeper reports a failing renewal."""

__all__ = ["EXECUTOR", "LeaseKeeper", "SCHEDULER_LOGGER", "new_scheduler"]

_LOGGER = logging.getLogger("ptb_fence.lease")


def new_scheduler() -> "BackgroundScheduler":
    """A fresh APScheduler 3 background scheduler: UTC, daemon threads, nothing skipped.

    APScheduler's defaults drop late runs (``misfire_grace_time`` of 1 s, ``max_instances=1``).
    Here a late run still runs (``misfire_grace_time=None``, coalesced into one) and a slow
    run does not make the next one vanish (``max_instances=4``). A new scheduler is built for
    every start because APScheduler 3's ``shutdown()`` drops its jobs.

    Quiet by default: APScheduler logs every job run at INFO ("Running job …", "… executed
    successfully") and every start. For ptb_fence's own scheduler those records go to the
    loggers ``ptb_fence.scheduler`` and ``apscheduler.executors.ptb_fence``, which start at
    WARNING unless you configured them (set them to INFO to see every renewal and sweep run).
    Jobs must be added with ``executor=EXECUTOR``.

    APScheduler is imported here, when a runtime starts its jobs, not by ``import ptb_fence``.
    """
    from apscheduler.executors.pool import BasePoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler

    from ptb_fence.runtime._daemon_pool import DaemonThreadPool

    class _DaemonExecutor(BasePoolExecutor):  # type: ignore[misc]
        # the jobs call the store: their threads must never keep the process alive (see
        # DaemonThreadPool)
        def __init__(self) -> None:
            super().__init__(DaemonThreadPool(4, "ptb_fence-jobs"))

    _quiet_scheduler_loggers()
    return BackgroundScheduler(
        timezone="UTC",
        daemon=True,
        logger=logging.getLogger(SCHEDULER_LOGGER),
        executors={EXECUTOR: _DaemonExecutor()},
        job_defaults={"misfire_grace_time": None, "coalesce": True, "max_instances": 4},
    )


EXECUTOR = "ptb_fence"
"""The alias of the executor of ptb_fence's scheduler (its job-run log records go to
``apscheduler.executors.ptb_fence``)."""

SCHEDULER_LOGGER = "ptb_fence.scheduler"
"""The logger of ptb_fence's scheduler ("Scheduler started", "Added job …")."""


def _quiet_scheduler_loggers() -> None:
    for name in (SCHEDULER_LOGGER, f"apscheduler.executors.{EXECUTOR}"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:  # never override a level the user chose
            logger.setLevel(logging.WARNING)


class LeaseKeeper:
    """Renews the leases of every active attempt of one runtime, one tick at a time.

    Where the store offers a batched renewal (``renew_owned_many`` / ``renew_many``) one
    statement per tick renews every active lease. Otherwise one call per attempt. A refused
    renewal, or the last proven lease passing, fires that attempt's ``owner_lost``. A renewal
    that raises is reported (``on_store_error(error, "renew")``) and does not fire it by itself.
    A result of :obj:`None` (the row is locked by another open transaction right now) is
    undecided: neither renewed nor refused. An attempt inside its own fenced transaction is not
    renewed (its row lock would make the renewal wait) and, once its ownership check succeeded
    (:attr:`Attempt.holds_fence`), never reported lost until that transaction ends.
    """

    __slots__ = (
        "_active",
        "_lock",
        "_options",
        "_renewing",
        "_report",
        "_stats",
        "_store",
        "ticks",
    )

    def __init__(
        self,
        store: "StorePort",
        options: "RuntimeOptions",
        report: ReportStoreError,
        stats: "Optional[RuntimeStats]" = None,
    ) -> None:
        self._store = store
        self._options = options
        self._report = report
        self._stats = stats if stats is not None else RuntimeStats()
        self._lock = threading.Lock()
        self._active: Dict[Tuple[int, int], "Attempt"] = {}
        # held while a renewal call runs: a slow or hung store (e.g. a dead connection without a
        # timeout) must not pile up ticks until APScheduler skips them, which would stop the
        # "last proven lease passed" check below as well
        self._renewing = threading.Lock()
        self.ticks = 0

    def register(self, attempt: "Attempt") -> None:
        """Start renewing ``attempt``'s lease."""
        with self._lock:
            self._active[(attempt.update_id, attempt.attempt)] = attempt

    def unregister(self, attempt: "Attempt") -> None:
        """Stop renewing ``attempt``'s lease (it ended). Late renewal results are ignored."""
        attempt.end()
        with self._lock:
            key = (attempt.update_id, attempt.attempt)
            if self._active.get(key) is attempt:
                del self._active[key]

    def count(self) -> int:
        """How many attempts are being renewed (the claims this process holds)."""
        with self._lock:
            return len(self._active)

    def active(self) -> List["Attempt"]:
        """A snapshot of the attempts being renewed."""
        with self._lock:
            return list(self._active.values())

    def add_job(
        self,
        scheduler: "BackgroundScheduler",
        wrap: Optional[Callable[[Callable[[], None], str], Callable[[], Any]]] = None,
    ) -> None:
        """Add the renewal job (every ``lease_seconds / 4``) to ``scheduler``.

        Args:
            scheduler: The scheduler.
            wrap: ``wrap(fn, name)`` returns the callable to schedule instead of ``fn``.
        """
        scheduler.add_job(
            self.tick if wrap is None else wrap(self.tick, "ptb_fence lease keeper"),
            "interval",
            executor=EXECUTOR,
            seconds=self._options.lease_seconds / 4.0,
            id="ptb_fence_lease_keeper",
            name="ptb_fence lease keeper",
        )

    def tick(self) -> None:
        """Renew every active lease once and fire ``owner_lost`` where it is gone."""
        self.ticks += 1
        self._stats.renewal_tick()
        attempts = [a for a in self.active() if not a.finished]
        if not attempts:
            return
        now = self._options.now_ms()
        lease_until = self._options.lease_deadline(now)
        live = []
        for attempt in attempts:
            if attempt.holds_fence:
                continue  # holds its row lock: provably owned. A renewal would wait on it
            if attempt.proven_until < now:
                self._lost(attempt, "its last proven lease passed")
            elif not attempt.in_fenced_transaction:
                live.append(attempt)
        if not live or not self._renewing.acquire(blocking=False):
            return  # the previous renewal is still running. Deadlines were checked above
        try:
            self._renew_all(live, lease_until, now)
        finally:
            self._renewing.release()

    def _renew_all(self, live: List["Attempt"], lease_until: int, now: int) -> None:
        fenced = [a for a in live if a.fenced]
        unary = [a for a in live if not a.fenced]
        store = self._store
        if fenced:
            self._renew(
                fenced,
                store.renew_owned_many if store.renews_owned_in_batches else None,
                lambda batch: [a.identity for a in batch],
                lambda a: store.renew_owned(a.identity, lease_until, now),
                lease_until,
                now,
            )
        if unary:
            self._renew(
                unary,
                store.renew_many if store.renews_in_batches else None,
                lambda batch: [(a.update_id, a.attempt) for a in batch],
                lambda a: store.renew(a.update_id, a.attempt, lease_until, now),
                lease_until,
                now,
            )

    def _renew(
        self,
        attempts: List["Attempt"],
        batched: Optional[Callable[..., List[Optional[bool]]]],
        keys: Callable[[List["Attempt"]], List[Any]],
        single: Callable[["Attempt"], bool],
        lease_until: int,
        now: int,
    ) -> None:
        if batched is not None:
            try:
                results = list(
                    self._stats.timed("renew", batched, keys(attempts), lease_until, now)
                )
            except Exception as exc:
                self._report(exc, "renew")
                self._name_lock_holders(len(attempts))
                return
            for attempt, ok in zip(attempts, results):
                # None: the row is locked by another open transaction right now (PostgreSQL
                # SKIP LOCKED): undecided, neither renewed nor refused
                self._apply(attempt, None if ok is None else bool(ok), lease_until)
            return
        for attempt in attempts:
            try:
                ok = bool(self._stats.timed("renew", single, attempt))
            except Exception as exc:
                self._report(
                    exc,
                    "renew",
                    ids={
                        "update_id": attempt.update_id,
                        "attempt": attempt.attempt,
                        "claim_id": attempt.claim_id or None,
                    },
                )
                self._name_lock_holders(1)
                continue
            self._apply(attempt, ok, lease_until)

    def _name_lock_holders(self, count: int) -> None:
        """After a failed renewal: name this process's open fenced transactions, if any (on
        SQLite one holds the database's write lock, so no lease can be renewed until it ends)."""
        holders = [a for a in self.active() if a.holds_fence]
        if not holders:
            return
        _LOGGER.warning(
            "renewal of %d lease(s) failed while %s open: on SQLite a fenced transaction holds "
            "the database's write lock, so leases are not renewed until it ends (they lapse if "
            "it stays open longer than the lease); keep fenced transactions short",
            count,
            ", ".join(
                f"the fenced transaction of update {a.update_id} attempt {a.attempt} is"
                for a in holders[:5]
            ),
        )

    def _apply(self, attempt: "Attempt", ok: Optional[bool], lease_until: int) -> None:
        # None or a refusal while it holds its fence: undecided (the row is locked right now,
        # maybe by this attempt's own fenced transaction, which proves ownership). The deadline
        # and later ticks decide
        if attempt.renewed(ok, lease_until):
            self._stats.renewal_refused()
            self._lost(attempt, "its renewal was refused")

    def _lost(self, attempt: "Attempt", why: str) -> None:
        if not attempt.may_report_lost():
            # ended, or the runtime's settle decides (and fires it if needed), or it holds
            # its row lock inside a fenced transaction (provably still the owner)
            return
        if not attempt.lost:
            _LOGGER.warning(
                "owner lost: update %s attempt %s (claim %s): %s",
                attempt.update_id,
                attempt.attempt,
                attempt.claim_id or "-",
                why,
                extra=event(
                    "claim_lost",
                    update_id=attempt.update_id,
                    attempt=attempt.attempt,
                    claim_id=attempt.claim_id or None,
                    reason=why,
                ),
            )
        attempt.mark_owner_lost()
