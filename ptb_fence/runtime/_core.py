"""Runtime: the decisions shared by UpdateIntake and the PTB processors.

The store makes each step atomic; the runtime decides when to claim, how long a lease lives,
when an attempt has lost its update, when to retry, when to give up and how a final failure is
delivered. It knows nothing about threads or asyncio: the front ends call it from wherever they
run handlers (blocking calls only).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import traceback
from typing import Any, Callable, List, Optional

from ptb_fence._durations import format_duration
from ptb_fence._values import (
    Abandoned,
    AttemptIdentity,
    Completed,
    Exhaustion,
    Failed,
    Settlement,
    StoredUpdate,
)
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._chat_ops import ChatOrderOps
from ptb_fence.runtime._hop import StoreHop
from ptb_fence.runtime._jobs import Jobs
from ptb_fence.runtime._lease_keeper import LeaseKeeper
from ptb_fence.runtime._options import RuntimeOptions
from ptb_fence.runtime._outcome import Outcome, error_text, exhaustion_ids, ids
from ptb_fence.runtime._port import StorePort
from ptb_fence.runtime._recording import RecordingOps
from ptb_fence.runtime._recovery import AttemptTimeout, Recovery
from ptb_fence.runtime._retry import default_retry

__all__ = ["EXHAUSTION_PAGE", "Outcome", "Runtime"]

_LOGGER = logging.getLogger("ptb_fence.runtime")

EXHAUSTION_PAGE = 100
"""Exhaustions delivered per sweep page."""

_MAX_RETRY_DELAY_SECONDS = 366 * 86400.0
"""Retry delays from a custom policy are clamped to this (a year; keeps store times finite)."""


class Runtime(RecordingOps, Jobs, Recovery, ChatOrderOps):
    """The shared runtime of one front end (one :class:`~ptb_fence.UpdateIntake` or processor).

    Args:
        store: The update store.
        options (:class:`RuntimeOptions`): Validated options.
        attempt_aware (:obj:`bool`): Handlers receive an :class:`~ptb_fence.Attempt` (needs a
            fenced store).
        handle_exhaustion (:obj:`bool`): Terminal failures become durable exhaustions (needs a
            durable store).
        component (:obj:`str`): Name used in error messages.

    Attributes:
        store: The user's store as given (for display; the runtime never calls it directly).
        port (:class:`~ptb_fence.runtime._port.StorePort`): The store behind one typed
            interface: every store call of the runtime goes through it.

    Raises:
        TypeError: The store lacks a method the configuration needs (the message names them).
    """

    __slots__ = (
        "_cursor",
        "_ingest_lock",
        "_jobs",
        "_jobs_running",
        "_redeliveries",
        "_scheduler",
        "_scheduler_lock",
        "attempt_aware",
        "delivers_exhaustions",
        "executor",
        "keeper",
        "options",
        "port",
        "retry_soon",
        "running_count",
        "store",
    )

    def __init__(
        self,
        store: Any,
        options: RuntimeOptions,
        *,
        attempt_aware: bool,
        handle_exhaustion: bool,
        component: str = "UpdateIntake",
    ) -> None:
        # the one place the store is probed for its capabilities (decided once, here)
        self.port = StorePort(
            store,
            component=component,
            fenced=attempt_aware,
            durable=handle_exhaustion,
            chat_order=options.strict_chat_order,
        )
        self.store = store
        self.options = options
        self.attempt_aware = attempt_aware
        self.delivers_exhaustions = handle_exhaustion
        self.keeper = LeaseKeeper(self.port, options, self.report_store_error)
        self._cursor: Optional[int] = None
        self._ingest_lock = threading.Lock()
        # redeliveries dropped at ingest so far (numbers them: only the first few log at INFO)
        self._redeliveries = itertools.count()
        # running_count(): attempts whose handler runs now (set by a front end that claims at
        # ingest); bounds the claims at ingest (see RecordingOps._claim_budget)
        self.running_count: Callable[[], int] = lambda: 0
        # the store threads for blocking store work from asyncio (Attempt.run_in_transaction
        # and friends); None uses asyncio.to_thread. Set by the PTB processors.
        self.executor: Optional[StoreHop] = None
        # retry_soon(update_id, delay_seconds, body): set by a front end that can hand an
        # update back at its retry time; called for a landed retry due before the next sweep
        # (body: the stored text the attempt was claimed with, when known)
        self.retry_soon: Optional[Callable[[int, float, Optional[str]], None]] = None
        self._scheduler: Any = None
        self._scheduler_lock = threading.Lock()
        self._jobs = threading.Condition()
        self._jobs_running: "dict[str, int]" = {}

    def now_ms(self) -> int:
        """The current time in store units (the options' clock)."""
        return self.options.now_ms()

    # -- observers --------------------------------------------------------------------------
    def _observe(self, name: str, *args: Any) -> None:
        callback = getattr(self.options, name)
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:  # an observer can never break the pipeline
            _LOGGER.exception("%s observer raised; ignored", name)

    def report_store_error(
        self, error: BaseException, step: str, *, ids: "Optional[dict[str, Any]]" = None
    ) -> None:
        """Log a store error and pass it to ``on_store_error(error, step)``.

        The record carries ``step`` and ``update_id``, ``attempt``, ``claim_id`` (``ids``;
        :obj:`None` where the error concerns no single attempt) as ``extra`` fields.
        """
        fields: "dict[str, Any]" = {"update_id": None, "attempt": None, "claim_id": None}
        fields.update(ids or {})
        fields["step"] = step
        _LOGGER.error(
            "store error during %s%s: %s",
            step,
            "" if fields["update_id"] is None else f" of update {fields['update_id']}",
            error_text(error),
            extra=fields,
        )
        self._observe("on_store_error", error, step)

    def log_transaction_refused(self, attempt: Attempt) -> None:
        """Log that a fenced transaction was refused because the attempt lost its update."""
        _LOGGER.warning(
            "fenced transaction refused: update %s attempt %s (claim %s) no longer owns it",
            attempt.update_id,
            attempt.attempt,
            attempt.claim_id,
            extra=ids(attempt),
        )

    # -- one attempt ------------------------------------------------------------------------
    def claim(self, update_id: int, body: Optional[str] = None) -> Optional[Attempt]:
        """Claim ``update_id`` for a new attempt and register it with the lease keeper.

        Returns :obj:`None` when it was not taken (a live lease elsewhere, a final row, attempts
        spent) or when the store failed (reported as step ``"claim"``; the lease and the sweep
        take care of the update).
        """
        options = self.options
        now = options.now_ms()
        lease_until = options.lease_deadline(now)
        try:
            if options.strict_chat_order or self.uses_claim_ids:
                port = self.port  # strict_chat_order: only when it is its chat's turn
                claim = port.claim_in_chat_order if options.strict_chat_order else port.claim_owned
                identity = claim(
                    update_id,
                    now=now,
                    lease_until=lease_until,
                    max_attempts=options.max_attempts,
                    durable_exhaustion=self.delivers_exhaustions,
                )
                if identity is None:
                    return None
                claim_id = identity.claim_id if self.uses_claim_ids else None
                attempt = Attempt(self, update_id, identity.attempt, claim_id, lease_until, body)
                self._note_suspect(attempt, identity)
            else:
                number = self.port.claim(
                    update_id,
                    now=now,
                    lease_until=lease_until,
                    max_attempts=options.max_attempts,
                )
                if number is None:
                    return None
                attempt = Attempt(self, update_id, number, None, lease_until, body)
        except Exception as exc:
            self.report_store_error(exc, "claim", ids={"update_id": update_id})
            return None
        _LOGGER.debug(
            "claimed update %s attempt %s (claim %s)",
            update_id,
            attempt.attempt,
            attempt.claim_id or "-",
            extra=ids(attempt),
        )
        self.keeper.register(attempt)
        return attempt

    @property
    def uses_claim_ids(self) -> bool:
        """Whether attempts are claimed with ``claim_owned`` (attempt-aware or durable)."""
        return self.attempt_aware or self.delivers_exhaustions

    def adopt(
        self,
        identity: AttemptIdentity,
        lease_until: int,
        body: Optional[str] = None,
        *,
        at_ingest: bool = True,
    ) -> Attempt:
        """Register an attempt the store already claimed (``add_claimed_many`` at ingest, or
        ``claim_owned_many``) and return it."""
        attempt = Attempt(
            self, identity.update_id, identity.attempt, identity.claim_id, lease_until, body
        )
        self._note_suspect(attempt, identity)
        _LOGGER.debug(
            "claimed update %s attempt %s (claim %s)%s",
            attempt.update_id,
            attempt.attempt,
            attempt.claim_id or "-",
            " at ingest" if at_ingest else "",
            extra=ids(attempt),
        )
        self.keeper.register(attempt)
        return attempt

    def _note_suspect(self, attempt: Attempt, identity: AttemptIdentity) -> None:
        """Make ``attempt`` run alone if its claim took a suspect row (a dict lookup in the
        store object, no statement)."""
        if self.port.claimed_suspect(identity):
            attempt.suspect_claim = identity
            _LOGGER.info(
                "update %s attempt %s runs alone: a process that died had claimed it (the "
                "crash may have been its own)",
                attempt.update_id,
                attempt.attempt,
                extra=ids(attempt),
            )

    def mark_isolated(self, attempt: Attempt) -> bool:
        """Before the handler of a suspect attempt starts alone: record it in the store (one
        committed statement), so that a crash now counts against this attempt only.

        Returns :obj:`False` when it did not land (the claim was lost meanwhile, or the store
        failed: reported as step ``"claim"``): then the handler must not start; give the
        attempt back with :meth:`~ptb_fence.runtime._recovery.Recovery.release`.
        """
        identity = attempt.suspect_claim
        if identity is None:
            return True
        try:
            landed = self.port.mark_isolated(identity, self.options.now_ms())
        except Exception as exc:
            self.report_store_error(exc, "claim", ids=ids(attempt))
            return False
        if not landed:
            _LOGGER.warning(
                "update %s attempt %s lost its claim before its handler could start alone; "
                "it runs later",
                attempt.update_id,
                attempt.attempt,
                extra=ids(attempt),
            )
        return landed

    def _store_settle(self, attempt: Attempt, settlement: Settlement) -> bool:
        """Settle; True when it landed (unary settles are assumed to land)."""
        if attempt.fenced:
            return bool(self.port.settle_owned(attempt.identity, settlement))
        self.port.settle(attempt.update_id, attempt.attempt, settlement)
        return True

    def settle(
        self, attempt: Attempt, error: Optional[BaseException]
    ) -> "tuple[Outcome, Optional[Exhaustion]]":
        """Settle an attempt after its handler returned (``error`` None) or raised.

        Returns the outcome and the :class:`~ptb_fence.Exhaustion` to deliver, if any. The
        caller then calls :meth:`end`.
        """
        # a renewal refused from now on may just be this settle landing first: the settle's
        # own result decides whether the owner was lost (renewals continue meanwhile)
        attempt.begin_settling()
        if attempt.exhausted:
            return Outcome.EXHAUSTED, self._exhaustion_of(attempt)
        if error is None:
            return self.settle_completed(attempt), None
        return self.settle_failed(attempt, error)

    def settle_completed(self, attempt: Attempt) -> Outcome:
        """Settle a successful attempt as completed; fire ``owner_lost`` if it did not land."""
        if attempt.completed:
            return Outcome.COMPLETED
        if attempt.exhausted:
            return Outcome.EXHAUSTED
        try:
            landed = self._store_settle(attempt, Completed(self.options.now_ms()))
        except Exception as exc:
            return self.completion_failed(attempt, exc)
        return self.completion_settled(attempt, landed)

    def completion_settled(self, attempt: Attempt, landed: bool) -> Outcome:
        """The outcome of a completion settle (also a grouped one): fire ``owner_lost`` if it
        did not land."""
        if not landed:
            _LOGGER.warning(
                "completion of update %s attempt %s did not land: it runs again after the lease",
                attempt.update_id,
                attempt.attempt,
                extra=ids(attempt),
            )
            attempt.mark_owner_lost()
            return Outcome.LOST
        return Outcome.COMPLETED

    def completion_failed(self, attempt: Attempt, error: BaseException) -> Outcome:
        """A completion settle raised: report it; the lease and the sweep take over."""
        self.report_store_error(error, "settle", ids=ids(attempt))
        return Outcome.LOST

    def settle_failed(
        self, attempt: Attempt, error: BaseException
    ) -> "tuple[Outcome, Optional[Exhaustion]]":
        """Record a failed attempt: retry later, abandon, or exhaust.

        Returns the outcome and, when the attempt was exhausted with an exhaustion handler,
        the :class:`~ptb_fence.Exhaustion` to deliver.
        """
        if attempt.exhausted:
            return Outcome.EXHAUSTED, self._exhaustion_of(attempt)
        if attempt.in_fenced_transaction:
            # e.g. attempt_timeout_seconds passed while the handler's fenced transaction was
            # still open on a thread (it cannot be stopped): its commit may still complete the
            # attempt; a failure settle would wait for its lock anyway
            self._wait_for_transactions(attempt)
        if attempt.completed:
            return self._completed_then_failed(attempt, error)
        options = self.options
        delay: Optional[float] = None
        if attempt.attempt < options.max_attempts:
            policy = options.retry or default_retry
            try:
                delay = policy(error, attempt.attempt)
                if delay is not None:
                    delay = float(delay)  # a non-number is a broken policy, like raising
                    if delay != delay:
                        raise ValueError("the retry policy returned NaN")
            except Exception:
                _LOGGER.exception(
                    "retry policy raised or returned neither seconds nor None; using the "
                    "default policy"
                )
                delay = default_retry(error, attempt.attempt)
            if delay is not None:
                # negative means now; infinity (or absurd values) must not overflow the store
                delay = min(max(delay, 0.0), _MAX_RETRY_DELAY_SECONDS)
        now = options.now_ms()
        text = error_text(error)
        exhaustion: Optional[Exhaustion] = None
        outcome = Outcome.LOST  # stays LOST if the store call below raises
        try:
            if delay is None:
                if self.delivers_exhaustions:
                    landed = bool(self.port.exhaust(attempt.identity, at=now, error=text))
                    if landed:
                        attempt.record_exhaustion(text, now)
                        exhaustion = self._exhaustion_of(attempt, at=now)
                    outcome = Outcome.EXHAUSTED
                else:
                    landed = self._store_settle(attempt, Abandoned(now, text))
                    outcome = Outcome.ABANDONED
            else:
                retry_at = now + int(delay * 1000)
                landed = self._store_settle(attempt, Failed(now, retry_at, text))
                outcome = Outcome.RETRYING
        except Exception as exc:
            self.report_store_error(exc, "settle", ids=ids(attempt))
            landed = False
        if not landed and attempt.completed:  # its completing transaction committed meanwhile
            return self._completed_then_failed(attempt, error)
        retrying = outcome == Outcome.RETRYING
        if not landed:
            attempt.mark_owner_lost()
            retrying = True
            outcome = Outcome.LOST
            exhaustion = None
        what: str = outcome.value
        if outcome == Outcome.RETRYING:
            what = f"retry scheduled in {format_duration(delay or 0.0)}"
            if (delay or 0.0) < options.sweep_every_seconds:
                if self.retry_soon is not None:
                    try:
                        self.retry_soon(attempt.update_id, delay or 0.0, attempt.body)
                    except Exception:  # the sweep still finds it
                        _LOGGER.exception("could not schedule the retry; the sweep takes it")
                else:
                    what += (
                        f" (runs at the next sweep, within "
                        f"{format_duration(options.sweep_every_seconds)})"
                    )
        log = _LOGGER.warning if retrying else _LOGGER.error
        log(
            "update %s attempt %s failed (%s): %s",
            attempt.update_id,
            attempt.attempt,
            what,
            text,
            extra=dict(ids(attempt), outcome=outcome.value),
        )
        self._observe("on_failure", error, attempt, retrying)
        return outcome, exhaustion

    def _wait_for_transactions(self, attempt: Attempt) -> None:
        """Wait (at most ``lease_seconds``) until no fenced transaction of ``attempt`` is open."""
        deadline = time.monotonic() + self.options.lease_seconds
        while attempt.in_fenced_transaction and time.monotonic() < deadline:
            time.sleep(0.005)

    def _completed_then_failed(
        self, attempt: Attempt, error: BaseException
    ) -> "tuple[Outcome, Optional[Exhaustion]]":
        """The attempt completed (its fenced transaction committed) and its handler then
        failed: report that once; it is not retried (no ``on_failure``: nothing failed that the
        runtime could retry)."""
        if isinstance(error, AttemptTimeout):
            what = (
                f"but its handler ran longer than attempt_timeout_seconds={error.seconds:g} "
                "and was ended (cancelled, or left running on its thread)"
            )
        else:
            what = f"then the handler raised {error_text(error)}"
        _LOGGER.warning(
            "update %s attempt %s completed (its fenced transaction committed), %s: not "
            "retried; the user may have missed a reply",
            attempt.update_id,
            attempt.attempt,
            what,
            extra=dict(ids(attempt), outcome=Outcome.COMPLETED.value),
        )
        if not isinstance(error, AttemptTimeout):
            _LOGGER.debug(
                "update %s attempt %s: what the handler raised after its completion",
                attempt.update_id,
                attempt.attempt,
                exc_info=error,
                extra=ids(attempt),
            )
        return Outcome.COMPLETED, None

    def settle_exhausted(self, attempt: Attempt, reason: str) -> bool:
        """Handler-terminal failure (``Attempt.exhaust``): exhaust or abandon now."""
        now = self.options.now_ms()
        try:
            if self.delivers_exhaustions:
                landed = bool(self.port.exhaust(attempt.identity, at=now, error=reason))
            else:
                landed = self._store_settle(attempt, Abandoned(now, reason))
        except Exception as exc:  # reported, and the handler learns that it did not land
            self.report_store_error(exc, "settle", ids=ids(attempt))
            raise
        if landed:
            attempt.record_exhaustion(reason, now)  # nothing left to renew
            _LOGGER.error(
                "update %s exhausted by its handler at attempt %s: %s",
                attempt.update_id,
                attempt.attempt,
                reason,
                extra=ids(attempt),
            )
        else:
            attempt.mark_owner_lost()
        return landed

    def _exhaustion_of(self, attempt: Attempt, at: Optional[int] = None) -> Optional[Exhaustion]:
        error = attempt.exhaustion_error
        if not self.delivers_exhaustions or error is None:
            return None
        return Exhaustion(
            update_id=attempt.update_id,
            attempt=attempt.attempt,
            claim_id=attempt.claim_id,
            body=attempt.body or "",
            exhausted_at=at if at is not None else (attempt.exhausted_at or 0),
            error=error,
        )

    def end(self, attempt: Attempt) -> None:
        """The attempt is over: stop renewing it; late renewal results are ignored."""
        self.keeper.unregister(attempt)

    # -- exhaustion delivery ----------------------------------------------------------------
    def acknowledge(self, exhaustion: Exhaustion) -> bool:
        """Acknowledge a delivered exhaustion with its exact identity."""
        try:
            ok = bool(
                self.port.acknowledge_exhaustion(exhaustion.identity, self.options.now_ms())
            )
        except Exception as exc:
            self.report_store_error(exc, "sweep", ids=exhaustion_ids(exhaustion))
            return False
        if ok:
            _LOGGER.info(
                "exhaustion of update %s attempt %s acknowledged",
                exhaustion.update_id,
                exhaustion.attempt,
                extra=exhaustion_ids(exhaustion),
            )
        return ok

    def exhaustion_failed(self, error: BaseException, exhaustion: Exhaustion) -> None:
        """Report a failing exhaustion handler; the exhaustion stays due."""
        _LOGGER.error(
            "exhaustion handler failed for update %s attempt %s; it stays due: %s",
            exhaustion.update_id,
            exhaustion.attempt,
            error_text(error),
            extra={
                "update_id": exhaustion.update_id,
                "attempt": exhaustion.attempt,
                "claim_id": exhaustion.claim_id,
            },
        )
        _LOGGER.debug("exhaustion handler traceback:\n%s", "".join(traceback.format_exception(error)))
        self._observe("on_exhaustion_failure", error, exhaustion)

    # -- sweep pieces -----------------------------------------------------------------------
    def due_page(self, *, limit: int, include_fresh: bool = False) -> List[StoredUpdate]:
        """Updates to hand over now (pending after the grace period, or all pending).

        First makes the claims of provably dead processes claimable
        (:meth:`~ptb_fence.runtime._recovery.Recovery.take_over_dead`), so they are among
        them."""
        self.take_over_dead()
        now = self.options.now_ms()
        grace = 0 if include_fresh else int(self.options.pending_grace_seconds * 1000)
        if self.options.strict_chat_order:  # only updates whose chat's turn it is
            return self._due_in_chat_order(now, now - grace, limit)
        return list(self.port.due(now=now, pending_before=now - grace, limit=limit))

    def exhaustion_page(self, limit: int = EXHAUSTION_PAGE) -> List[Exhaustion]:
        """The next page of at most ``limit`` due exhaustions, with a rotating cursor."""
        if not self.delivers_exhaustions:
            return []
        page = list(self.port.due_exhaustions(limit=limit, after_update_id=self._cursor))
        if len(page) < limit:
            self._cursor = None
        else:
            self._cursor = page[-1].update_id
        return page

    def prune(self) -> int:
        """Delete rows settled more than ``retain_seconds`` ago."""
        before = self.options.now_ms() - int(self.options.retain_seconds * 1000)
        return int(self.port.prune(before))
