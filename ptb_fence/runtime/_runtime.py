"""Runtime: the decisions shared by UpdateIntake and the PTB processors.

The store makes each step atomic. The runtime decides when to claim, how long a lease lives,
when an attempt has lost its update, when to retry, when to give up and how a final failure is
delivered. It knows nothing about threads or asyncio: the front ends call it from wherever they
run handlers (blocking calls only).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import traceback
from typing import (
    Any,
    Callable,
    Dict,
    Hashable,
    Iterable,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from ptb_fence._events import event
from ptb_fence._durations import format_duration
from ptb_fence._errors import SchemaError, StateConflictError, UsageError, is_misuse
from ptb_fence.contract import Batch, ClaimTerms, Committed
from ptb_fence._values import (
    Abandoned,
    AttemptEffects,
    RECIPIENT_STATES,
    BroadcastWrite,
    AttemptIdentity,
    Completed,
    Exhaustion,
    Failed,
    Landing,
    OutboxEntry,
    Settlement,
    StateConflict,
    StoredUpdate,
)
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._chats import stored_chat_key
from ptb_fence.runtime._broadcasts import Broadcasts, BroadcastSender
from ptb_fence.runtime._dispatcher import ClaimReservation, OutboxDispatcher, no_outbox
from ptb_fence.runtime._pacer import OutboxPacing
from ptb_fence.runtime._delivered import DeliveredExhaustion, ExhaustionCalls
from ptb_fence.runtime._held_call import HeldCall
from ptb_fence.runtime._hop import StoreHop
from ptb_fence.runtime._jobs import BackgroundJobs
from ptb_fence.runtime._lease_keeper import LeaseKeeper
from ptb_fence.runtime._options import RuntimeOptions
from ptb_fence.runtime._outbox_prepare import OutboxPrepare
from ptb_fence.runtime._phase import Phase
from ptb_fence.runtime._outcome import Outcome, error_text, exhaustion_ids, ids
from ptb_fence.runtime._port import Row, StorePort
from ptb_fence.runtime._recovery import AttemptTimeout, Recovery
from ptb_fence.runtime._retry import default_retry
from ptb_fence.runtime._alarms import Alarms, Health, oldest_date
from ptb_fence.runtime._conflicts import ConflictRetries
from ptb_fence.runtime._probes import ProbeServer
from ptb_fence.runtime._durable_jobs import RUN_ID_BASE
from ptb_fence.runtime._stats import JOB_FIGURES_LIMIT, RuntimeStats, Stats
from ptb_fence.runtime._store_chat_order import StoreChatOrder
from ptb_fence.runtime._sweep import SWEEP_PAGE, SweepPage

__all__ = ["EXHAUSTION_PAGE", "REDELIVERIES_AT_INFO", "FrontEndHooks", "Outcome", "Record", "Runtime"]

_LOGGER = logging.getLogger("ptb_fence.runtime")
_INGEST_LOGGER = logging.getLogger("ptb_fence.ingest")

EXHAUSTION_PAGE = 100
"""Exhaustions delivered per sweep page."""

FIGURES_EVERY_SECONDS = 10.0
"""The sweep reads the store's figures (unsettled updates, the oldest one's age, exhaustions
waiting) at most this often: a count on the store, never per metrics scrape."""

_MAX_RETRY_DELAY_SECONDS = 366 * 86400.0
"""Retry delays from a custom policy are clamped to this (a year, which keeps store times finite)."""

_FAILED_DROPS = "the attempt failed: its retry queues its own calls"
"""Why a failed attempt's held calls are discarded."""

REDELIVERIES_AT_INFO = 5
"""How many redeliveries dropped at ingest one runtime logs at INFO. Later ones at DEBUG (a
redelivery is normal for webhooks, but a bot that drops every new message must be able to see
why)."""

Record = Union[Attempt, bool]
"""Per recorded update: the :class:`~ptb_fence.Attempt` it was claimed with at ingest (already
registered with the lease keeper), :obj:`True` (recorded pending) or :obj:`False` (the id
exists: a duplicate)."""


class _Group(NamedTuple):
    """What a group commit gave its callers."""

    records: "Union[List[Record], BaseException]"
    """Per item its record, or the store error that kept them all from being recorded."""
    outcomes: List[Outcome]
    """Per completed attempt its outcome."""
    claimed: "List[Optional[Attempt]]"
    """Per admitted claim the attempt, or :obj:`None` when it was not taken."""


_NO_LOCK = contextlib.nullcontext()


def _none_running() -> int:
    return 0


def _no_executor() -> Optional[StoreHop]:
    return None


def _stored_body(attempt: Attempt) -> Optional[str]:
    return attempt.body


class FrontEndHooks(NamedTuple):
    """How the runtime calls back into its front end. Given to :class:`Runtime` at
    construction (each front end passes its own, the defaults do nothing).

    Attributes:
        retry_soon: ``retry_soon(update_id, delay_seconds, body)``: hand the update back at
            its retry time (called on a store thread for a landed retry due before the next
            sweep. ``body``: the stored text the attempt was claimed with, when known).
            :obj:`None`: the next sweep takes every retry.
        running_count: Attempts started here and not ended yet (bounds the claims at
            ingest. :class:`Stats` counts the running handlers itself, see
            :meth:`RuntimeStats.handler_began <ptb_fence.runtime._stats.RuntimeStats.handler_began>`).
        left_running_count: Handlers (threads or tasks) that passed their attempt timeout or
            the stop, were let go and still run (their attempts ended): a gauge for
            :class:`Stats`.
        executor: The store threads for blocking store work from asyncio
            (``Attempt.run_in_transaction`` and friends) while the front end runs.
            :obj:`None`: :func:`asyncio.to_thread`.
        body_of: The stored text of an attempt's update, for an attempt claimed without it
            (its update is handed back with it after a version conflict).
    """

    retry_soon: Optional[Callable[[int, float, Optional[str]], None]] = None
    running_count: Callable[[], int] = _none_running
    left_running_count: Callable[[], int] = _none_running
    executor: Callable[[], Optional[StoreHop]] = _no_executor
    body_of: Callable[[Attempt], Optional[str]] = _stored_body


class Runtime:
    """The shared runtime of one front end (one :class:`~ptb_fence.UpdateIntake` or processor).

    Args:
        store: The update store.
        options (:class:`RuntimeOptions`): Validated options.
        attempt_aware (:obj:`bool`): Handlers receive an :class:`~ptb_fence.Attempt` (needs a
            fenced store).
        handle_exhaustion (:obj:`bool`): Terminal failures become durable exhaustions (needs a
            durable store).
        component (:obj:`str`): Name used in error messages.
        hooks (:class:`FrontEndHooks`): How the runtime calls back into its front end.

    Attributes:
        store: The user's store as given (for display, the runtime never calls it directly).
        port (:class:`~ptb_fence.runtime._port.StorePort`): The store behind one typed
            interface: every store call of the runtime goes through it.
        keeper (:class:`~ptb_fence.runtime._lease_keeper.LeaseKeeper`): Renews the leases of
            the attempts running here.
        recovery (:class:`~ptb_fence.runtime._recovery.Recovery`): Gives claims back, holds
            the liveness signal, takes over dead processes' claims.
        chat_order (:class:`~ptb_fence.runtime._store_chat_order.StoreChatOrder`): Chat order
            across processes (``strict_chat_order``).
        jobs (:class:`~ptb_fence.runtime._jobs.BackgroundJobs`): The scheduler jobs (lease
            renewal, the front end's sweep, the takeover watch).
        probes (:class:`~ptb_fence.runtime._probes.ProbeServer`): ``/healthz``, ``/readyz``
            and ``/metrics`` over HTTP (``probe_port``), started and stopped by the front end.

    Raises:
        TypeError: The store lacks a method the configuration needs (the message names them).
    """

    __slots__ = (
        "_cursor",
        "_claims_lock",
        "_ingest_lock",
        "_reserved",
        "_redeliveries",
        "_unary_claim_ids",
        "attempt_aware",
        "chat_order",
        "conflicts",
        "delivers_exhaustions",
        "_hooks",
        "alarms",
        "broadcasts",
        "broadcast_sender",
        "jobs",
        "keeper",
        "options",
        "outbox",
        "port",
        "probes",
        "recovery",
        "stats",
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
        hooks: FrontEndHooks = FrontEndHooks(),
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
        # unary handling claims with claim ids too where the store can run a suspect alone
        # (a crash is then charged only to the handler that ran alone, as for attempt-aware
        # handling). The handler still gets no Attempt. Cleared for good by a table without
        # the claim_id column (see claim).
        port = self.port
        self._unary_claim_ids = (
            not (attempt_aware or handle_exhaustion or options.strict_chat_order)
            and "fenced" in port.capabilities
            and port.isolates
            and port.has_liveness
        )
        self.stats = RuntimeStats()
        self.keeper = LeaseKeeper(self.port, options, self.report_store_error, self.stats)
        self._cursor: Optional[int] = None
        self._ingest_lock = threading.Lock()
        # claims on their way to the store (not registered with the keeper yet), counted
        # against the bound by every claimer (see _reserve)
        self._claims_lock = threading.Lock()
        self._reserved = 0
        # redeliveries dropped at ingest so far (numbers them: only the first few log at INFO)
        self._redeliveries = itertools.count()
        self._hooks = hooks
        self.recovery = Recovery(
            self.port, options, self.keeper, self.report_store_error, self.stats,
            taken_over=self._wake_senders,
        )
        self.chat_order = StoreChatOrder(self.port, options, self.report_store_error)
        # version conflicts: given back unspent, handed back one at a time per key
        self.conflicts = ConflictRetries(
            self.port, options, self.keeper, self.report_store_error, self.stats,
            hooks.retry_soon,
        )
        self.alarms = Alarms(self.stats, options)
        # the sender of the calls queued by attempts (a fenced front end on an outbox store)
        self.outbox: Optional[OutboxDispatcher] = (
            OutboxDispatcher(self.port, options, self.stats, self.report_store_error)
            if attempt_aware and self.port.has_outbox
            else None
        )
        # broadcasts (a store that keeps them): recorded per recipient, sent by this process's
        # broadcast sender beside its outbox, at the store-wide pace
        broadcast_store = self.port.broadcast_store if self.outbox is not None else None
        self.broadcasts: Optional[Broadcasts] = (
            None if broadcast_store is None else Broadcasts(broadcast_store, self.now_ms))
        self.broadcast_sender: Optional[BroadcastSender] = (
            None if broadcast_store is None else BroadcastSender(
                broadcast_store, options.outbox_pacing or OutboxPacing(),
                self.port.take_send_slots, self.port.hold_sends, self.now_ms,
                options.handle_blocked, self.stats))
        self.jobs = BackgroundJobs(
            self.keeper,
            options,
            self.recovery.take_over_dead if self.port.has_liveness else None,
            self.stats.outage,
        )
        self.probes = ProbeServer(
            options.probe_host,
            options.probe_port,
            lambda: self.alarms.liveness(running=self.jobs.running),
            lambda: self.alarms.readiness(running=self.jobs.running),
            self.snapshot,
        )

    def _wake_senders(self) -> None:
        """Dead processes were taken over: the outbox claims their calls now."""
        if self.outbox is not None:
            self.outbox.wake()

    @property
    def executor(self) -> Optional[StoreHop]:
        """The front end's store threads for blocking store work from asyncio, while it runs
        (:obj:`None`: :func:`asyncio.to_thread`)."""
        return self._hooks.executor()

    def claim_terms(self, now: Optional[int] = None) -> ClaimTerms:
        """The terms of the claims made now (or at ``now``): the lease from the options, their
        ``max_attempts``, and durable exhaustion when this runtime delivers exhaustions."""
        at = self.options.now_ms() if now is None else now
        return ClaimTerms(
            at,
            self.options.lease_deadline(at),
            self.options.max_attempts,
            self.delivers_exhaustions,
        )

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

        During an outage only the first errors of each step are logged at ERROR, the rest at
        DEBUG, and the first store call that answers again says so once (see
        :class:`~ptb_fence.runtime._outage.StoreOutage`). Every error is counted and observed.
        The record carries ``step`` and ``update_id``, ``attempt``, ``claim_id`` (``ids``,
        :obj:`None` where the error concerns no single attempt) as ``extra`` fields.
        """
        fields: "dict[str, Any]" = {"update_id": None, "attempt": None, "claim_id": None}
        fields.update(ids or {})
        fields["step"] = step
        self.stats.store_error(step)
        # an outage fails every loop again and again: a few lines per step, then DEBUG
        level = self.stats.outage.failed(step)
        if _LOGGER.isEnabledFor(level):
            _LOGGER.log(
                level,
                "store error during %s%s: %s%s",
                step,
                "" if fields["update_id"] is None else f" of update {fields['update_id']}",
                error_text(error),
                self.stats.outage.note(step) if level == logging.ERROR else "",
                extra=event("store_error", **fields),
            )
        self._observe("on_store_error", error, step)

    # -- the outbox (what attempts hold for their completion) ---------------------------------
    def outbox_refusal(self) -> Optional[str]:
        """Why ``attempt.outbox`` cannot be used here (naming the fix), or :obj:`None`."""
        if self.outbox is None:
            if not self.port.has_outbox:
                return no_outbox(self.store)
            return (
                "attempt.outbox needs attempt-aware handling: use FencedUpdateProcessor (PTB) "
                "or UpdateIntake(handle_attempt=...), not DurableUpdateProcessor or "
                "UpdateIntake(handle=...)"
            )
        return self.outbox.refusal()

    def broadcast_write(self, name: str, chat_ids: Iterable[int], method: str,
                        params: Mapping[str, Any]) -> BroadcastWrite:
        """The broadcast ``attempt.broadcast`` holds, checked.

        Raises:
            UsageError: The store keeps no broadcasts, nothing sends them, or the arguments
                are wrong (the message names the fix).
        """
        if self.broadcasts is None:
            raise UsageError(
                f"attempt.broadcast: {type(self.store).__name__} keeps no broadcasts: use a "
                "store that declares StoreFeatures(outbox=True, broadcasts=True), such as "
                "SQLiteUpdateStore or PostgresUpdateStore")
        refusal = self.outbox_refusal()  # no sender: nothing would send the recipients
        if refusal is not None:
            raise UsageError(f"attempt.broadcast: {refusal}")
        return self.broadcasts.write_of(name, chat_ids, method, **params)

    def broadcast_landed(self, write: BroadcastWrite) -> None:
        """A commit started the broadcast ``write``: this process's sender looks now."""
        if self.broadcast_sender is not None:
            self.broadcast_sender.started(write)

    def outbox_defaults(self) -> Mapping[str, Any]:
        """The bot's defaults for outbox calls (empty without an outbox or defaults)."""
        return {} if self.outbox is None else self.outbox.defaults

    def outbox_prepare(self) -> "Optional[OutboxPrepare]":
        """The front end's change to queued calls (:obj:`None`: none, or no outbox)."""
        return None if self.outbox is None else self.outbox.prepare

    def calls_committed(self, handles: Sequence[HeldCall] = ()) -> None:
        """A commit carrying outbox calls landed: wake the sender (no polling delay).
        ``handles``: the held calls it carried (their ids are learnt when claimed)."""
        if self.outbox is not None:
            self.outbox.wake(handles)

    def outbox_call(self, call: "Union[int, HeldCall]") -> Optional[OutboxEntry]:
        """The outbox call ``call`` (its id, or the :class:`~ptb_fence.HeldCall` of a call
        whose id is known) as stored now, or :obj:`None` (no such call, no outbox, or a held
        call whose id is not known here)."""
        if isinstance(call, HeldCall):
            if call.call_id is None:
                return None
            call = call.call_id
        if isinstance(call, bool) or not isinstance(call, int):
            raise TypeError(f"an outbox call id (int) or HeldCall is needed, got {call!r}")
        return self.port.get_call(call)

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
        spent) or when the store failed (reported as step ``"claim"``, the lease and the sweep
        take care of the update).
        """
        options = self.options
        terms = self.claim_terms()
        lease_until = terms.lease_until
        try:
            if options.strict_chat_order or self.uses_claim_ids:
                port = self.port  # strict_chat_order: only when it is its chat's turn
                claim = port.claim_in_chat_order if options.strict_chat_order else port.claim_owned
                identity = self.stats.timed("claim", claim, update_id, terms)
                if identity is None:
                    return None
                claim_id = identity.claim_id if self.uses_claim_ids else None
                attempt = Attempt(self, update_id, identity.attempt, claim_id, lease_until, body)
                self._note_suspect(attempt, identity)
            elif self._unary_claim_ids:
                claimed = self._claim_unary(update_id, terms, body)
                if claimed is None:
                    return None
                attempt = claimed
            else:
                number = self.stats.timed("claim", self.port.claim, update_id, terms)
                if number is None:
                    return None
                attempt = Attempt(self, update_id, number, None, lease_until, body)
        except Exception as exc:
            self.report_store_error(exc, "claim", ids={"update_id": update_id})
            return None
        if _LOGGER.isEnabledFor(logging.DEBUG):  # per update: no record, no extra dict
            _LOGGER.debug(
                "claimed update %s attempt %s (claim %s)",
                update_id,
                attempt.attempt,
                attempt.claim_id or "-",
                extra=ids(attempt),
            )
        self.stats.attempt_started()
        self.keeper.register(attempt)
        return attempt

    def _claim_unary(
        self, update_id: int, terms: ClaimTerms, body: Optional[str]
    ) -> Optional[Attempt]:
        """The claim of a unary attempt on a store that isolates suspects: ``claim_owned``, so
        that a suspect row can run alone and a crash counts only once its handler started.
        The attempt carries no claim id (it settles and renews as a unary attempt). Only its
        suspect claim keeps the identity, for ``mark_isolated``. A table without the
        ``claim_id`` column (``create_table=False`` on a table from before fencing) refuses
        the statement: from then on this runtime claims with the base ``claim``."""
        try:
            identity = self.stats.timed("claim", self.port.claim_owned, update_id, terms)
        except SchemaError:
            self._unary_claim_ids = False
            _LOGGER.info(
                "the table has no claim_id column: unary claims use the base claim, so a "
                "crash counts against every update the process had claimed (apply the "
                "migration of the store's schema to isolate them)"
            )
            number = self.stats.timed("claim", self.port.claim, update_id, terms)
            if number is None:
                return None
            return Attempt(self, update_id, number, None, terms.lease_until, body)
        if identity is None:
            return None
        attempt = Attempt(self, update_id, identity.attempt, None, terms.lease_until, body)
        self._note_suspect(attempt, identity)
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
        """Register an attempt the store already claimed (a claimed record at ingest, or a
        claim of a commit) and return it."""
        attempt = Attempt(
            self, identity.update_id, identity.attempt, identity.claim_id, lease_until, body
        )
        self._note_suspect(attempt, identity)
        if _LOGGER.isEnabledFor(logging.DEBUG):  # per update: no record, no extra dict
            _LOGGER.debug(
                "claimed update %s attempt %s (claim %s)%s",
                attempt.update_id,
                attempt.attempt,
                attempt.claim_id or "-",
                " at ingest" if at_ingest else "",
                extra=ids(attempt),
            )
        self.stats.attempt_started()
        self.keeper.register(attempt)
        return attempt

    def _note_suspect(self, attempt: Attempt, identity: AttemptIdentity) -> None:
        """Make ``attempt`` start on probation or run alone if its claim took a suspect row
        (a dict lookup in the store object, no statement)."""
        suspicion = self.port.claimed_suspect(identity)
        if suspicion:
            attempt.suspect(identity, suspicion)
            _LOGGER.info(
                "update %s attempt %s %s: a process that died had claimed it (the crash may "
                "have been its own)",
                attempt.update_id,
                attempt.attempt,
                "runs alone" if attempt.runs_alone else "starts on probation",
                extra=ids(attempt),
            )

    def mark_isolated(self, attempt: Attempt) -> bool:
        """Before the handler of a suspect attempt starts on probation or alone: record it in
        the store (one committed statement), so that a crash now counts against this attempt
        only.

        Returns :obj:`False` when it did not land (the claim was lost meanwhile, or the store
        failed: reported as step ``"claim"``): then the handler must not start. Give the
        attempt back with :meth:`~ptb_fence.runtime._recovery.Recovery.release`.
        """
        identity = attempt.suspect_claim
        if identity is None:
            return True
        try:
            landed = self.stats.timed(
                "claim", self.port.mark_isolated, identity, self.options.now_ms()
            )
        except Exception as exc:
            self.report_store_error(exc, "claim", ids=ids(attempt))
            return False
        if not landed:
            _LOGGER.warning(
                "update %s attempt %s lost its claim before its handler could start; it runs "
                "later",
                attempt.update_id,
                attempt.attempt,
                extra=ids(attempt),
            )
        return landed

    def end_probation(self, attempt: Attempt) -> None:
        """The handler of a suspect ``attempt`` ran past its probation: end its mark (one
        committed statement), so that a crash from now on is not charged to it alone. Before
        the next suspect's mark. Reported (step ``"claim"``), never raised: the mark then
        stays until the attempt ends."""
        identity = attempt.suspect_claim
        if identity is None or attempt.finished:
            return
        try:
            self.stats.timed("claim", self.port.end_probation, identity, self.options.now_ms())
        except Exception as exc:
            self.report_store_error(exc, "claim", ids=ids(attempt))

    def _store_settle(self, attempt: Attempt, settlement: Settlement) -> bool:
        """Settle. True when it landed (unary settles are assumed to land)."""
        timed = self.stats.timed
        if attempt.fenced:
            return bool(timed("settle", self.port.settle_owned, attempt.identity, settlement))
        timed("settle", self.port.settle, attempt.update_id, attempt.attempt, settlement)
        return True

    def settle(
        self, attempt: Attempt, error: Optional[BaseException]
    ) -> "tuple[Outcome, Optional[Exhaustion]]":
        """Settle an attempt after its handler returned (``error`` None) or raised.

        Returns the outcome and the :class:`~ptb_fence.Exhaustion` to deliver, if any. The
        caller then calls :meth:`end`.
        """
        outcome, exhaustion, decided = self._settle(attempt, error)
        if decided:  # otherwise counted once its open fenced transaction ends
            self._count_ended([outcome], error, job_run=attempt.update_id >= RUN_ID_BASE)
        return outcome, exhaustion

    def _count_ended(
        self, outcomes: Sequence[Outcome], error: Optional[BaseException] = None,
        job_run: bool = False,
    ) -> None:
        for outcome in outcomes:
            if outcome == Outcome.RETRYING:
                label = "timed_out" if isinstance(error, AttemptTimeout) else "failed"
            else:
                label = outcome.value
            self.stats.attempt_ended(label, job_run=job_run)

    def _settle(
        self, attempt: Attempt, error: Optional[BaseException]
    ) -> "tuple[Outcome, Optional[Exhaustion], bool]":
        # a renewal refused from now on may just be this settle landing first: the settle's
        # own result decides whether the owner was lost (renewals continue meanwhile)
        attempt.begin_settling()
        if attempt.exhausted:
            attempt.drop_effects("the attempt was exhausted")
            return Outcome.EXHAUSTED, self._exhaustion_of(attempt), True
        if error is None:
            return self.settle_completed(attempt), None, True
        return self._settle_failed(attempt, error)  # it discards what the attempt holds

    def settle_completed(self, attempt: Attempt) -> Outcome:
        """Settle a successful attempt as completed. Fire ``owner_lost`` if it did not land."""
        if attempt.completed:
            return Outcome.COMPLETED
        if attempt.exhausted:
            return Outcome.EXHAUSTED
        taken = attempt.take_effects()
        if taken is not None:  # what the attempt holds rides the completion's commit
            return self._commit(attempts=[attempt], effects={attempt.identity: taken[0]}).outcomes[0]
        try:
            landed = self._store_settle(attempt, Completed(self.options.now_ms()))
        except Exception as exc:
            return self.completion_failed(attempt, exc)
        return self.completion_settled(attempt, landed)

    def completion_settled(self, attempt: Attempt, landed: Landing) -> Outcome:
        """The outcome of a completion settle (also a grouped one): fire ``owner_lost`` if it
        did not land. A :class:`~ptb_fence.StateConflict` (persisted state it changed moved
        meanwhile: the attempt still owns its update) gives the attempt back unspent, to run
        again on the fresh state (see :meth:`settle_failed`)."""
        if isinstance(landed, StateConflict):
            attempt.drop_effects("persisted state the attempt changed was changed meanwhile")
            outcome, _ = self.settle_failed(attempt, StateConflictError(landed.keys))
            return outcome
        if landed:
            handles = attempt.effects_landed()
            if handles:
                self.calls_committed(handles)
        else:
            attempt.drop_effects("the attempt's completion did not land")
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
        """A completion settle raised: report it. The lease and the sweep take over."""
        attempt.drop_effects("the attempt's completion failed in the store")
        self.report_store_error(error, "settle", ids=ids(attempt))
        return Outcome.LOST

    def settle_failed(
        self, attempt: Attempt, error: BaseException
    ) -> "tuple[Outcome, Optional[Exhaustion]]":
        """Record a failed attempt: retry later, abandon, or exhaust.

        Returns the outcome and, when the attempt was exhausted with an exhaustion handler,
        the :class:`~ptb_fence.Exhaustion` to deliver.
        """
        outcome, exhaustion, _ = self._settle_failed(attempt, error)
        return outcome, exhaustion

    def _settle_failed(
        self, attempt: Attempt, error: BaseException
    ) -> "tuple[Outcome, Optional[Exhaustion], bool]":
        # the third value: whether the outcome is decided (and reported) now. False when it
        # waits for a fenced transaction still open, which reports and counts it as it ends
        if attempt.exhausted:
            return Outcome.EXHAUSTED, self._exhaustion_of(attempt), True
        if attempt.in_fenced_transaction:
            # e.g. attempt_timeout_seconds passed while the handler's fenced transaction was
            # still open on a thread (it cannot be stopped): its commit may still complete the
            # attempt. A failure settle would wait for its lock anyway
            self._wait_for_transactions(attempt)
        if attempt.completed:
            return self._completed_then_failed(attempt, error) + (True,)
        if not attempt.in_fenced_transaction:
            # a completing transaction still open would carry what the attempt holds: kept
            # for it until it ended (below)
            attempt.drop_effects(_FAILED_DROPS)
        if isinstance(error, StateConflictError) and self._given_back_unspent(attempt, error):
            return Outcome.CONFLICTED, None, True
        options = self.options
        misuse = is_misuse(error)
        delay = self.retry_delay(attempt, error)
        now = options.now_ms()
        text = error_text(error)
        exhaustion: Optional[Exhaustion] = None
        outcome = Outcome.LOST  # stays LOST if the store call below raises
        try:
            if delay is None:
                if self.delivers_exhaustions:
                    landed = bool(
                        self.stats.timed(
                            "settle", self.port.exhaust, attempt.identity, at=now, error=text
                        )
                    )
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
        if not landed:
            if attempt.after_transactions(lambda: self._transaction_decided(attempt, error)):
                # its fenced transaction is still open (it outlasted the wait above), and may
                # hold the row: the settle was refused because of it (on PostgreSQL a lapsed
                # lease fails the settle's condition before it would wait for the row lock).
                # Whether the attempt completed is known only when it ends: reported then.
                return Outcome.LOST, None, False
            if attempt.completed:  # its completing transaction committed meanwhile
                return self._completed_then_failed(attempt, error) + (True,)
            self._report_lost(attempt, error)
            return Outcome.LOST, None, True
        attempt.drop_effects(_FAILED_DROPS)  # the failure landed: no completion can follow
        retrying = outcome == Outcome.RETRYING
        what: str = outcome.value
        if misuse:
            what += ", not retried: a misuse of ptb_fence, fix the handler"
        if outcome == Outcome.RETRYING:
            what = f"retry scheduled in {format_duration(delay or 0.0)}"
            if (delay or 0.0) < options.sweep_every_seconds:
                retry_soon = self._hooks.retry_soon
                if retry_soon is not None:
                    try:
                        retry_soon(attempt.update_id, delay or 0.0, attempt.body)
                    except Exception:  # the sweep still finds it
                        _LOGGER.exception("could not schedule the retry; the sweep takes it")
                else:
                    what += (
                        f" (runs at the next sweep, within "
                        f"{format_duration(options.sweep_every_seconds)})"
                    )
        self._report_failure(attempt, error, outcome, what, retrying)
        return outcome, exhaustion, True

    def retry_follows(self, attempt: Attempt, error: BaseException) -> bool:
        """Whether the update runs again after ``attempt`` failed with ``error`` (what
        :attr:`Attempt.retry_follows <ptb_fence.Attempt.retry_follows>` answers): a version
        conflict always does (it spends no attempt), otherwise as :meth:`retry_delay`."""
        if isinstance(error, StateConflictError):
            return True
        return self.retry_delay(attempt, error) is not None

    def retry_delay(self, attempt: Attempt, error: BaseException) -> Optional[float]:
        """When ``attempt``'s update runs again after it failed with ``error``: seconds from
        now, or :obj:`None` (never: exhausted or abandoned). Decided once per attempt and
        error (the retry policy is asked once), so an error handler that read
        ``attempt.retry_follows`` and the settle agree."""
        decided = attempt.retry_decision
        if decided is not None and decided[0] is error:
            return decided[1]
        delay = self._decide_retry(attempt, error)
        attempt.retry_decision = (error, delay)
        return delay

    def _decide_retry(self, attempt: Attempt, error: BaseException) -> Optional[float]:
        options = self.options
        if is_misuse(error):
            return None  # a mistake in the handler's use of ptb_fence: every retry repeats it
        if attempt.attempt >= options.max_attempts:
            return None
        if isinstance(error, StateConflictError):
            return 0.0  # nothing is wrong with the update: it runs again on fresh state
        policy = options.retry or default_retry
        delay: Optional[float]
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
        if delay is None:
            return None
        # negative means now. Infinity (or absurd values) must not overflow the store
        return min(max(delay, 0.0), _MAX_RETRY_DELAY_SECONDS)

    def _given_back_unspent(self, attempt: Attempt, error: StateConflictError) -> bool:
        """A version conflict: nothing is wrong with the update, so the attempt is not spent.
        Its claim is released and its update handed back in turn
        (:class:`~ptb_fence.runtime._conflicts.ConflictRetries`). :obj:`False` when the claim
        could not be released: the conflict then settles as a failure, retried at once."""
        if attempt.body is None:
            try:
                attempt.body = self._hooks.body_of(attempt)
            except Exception:  # then the sweep hands it back
                _LOGGER.exception("the stored text of update %s is unknown", attempt.update_id)
        return self.conflicts.give_back(attempt, error.keys)

    def _report_failure(
        self, attempt: Attempt, error: BaseException, outcome: Outcome, what: str, retrying: bool
    ) -> None:
        log = _LOGGER.warning if retrying else _LOGGER.error
        log(
            "update %s attempt %s failed (%s): %s",
            attempt.update_id,
            attempt.attempt,
            what,
            error_text(error),
            extra=event("attempt_failed", **ids(attempt), outcome=outcome.value),
        )
        self._observe("on_failure", error, attempt, retrying)

    def _report_lost(self, attempt: Attempt, error: BaseException) -> None:
        """The failure settle did not land: the attempt lost its update (the lease and the
        sweep take it over)."""
        attempt.drop_effects(_FAILED_DROPS)
        attempt.mark_owner_lost()
        self._report_failure(attempt, error, Outcome.LOST, Outcome.LOST.value, True)

    def _transaction_decided(self, attempt: Attempt, error: BaseException) -> None:
        """The fenced transaction that was open when the failure settle was refused has
        ended: report (and count) the attempt as completed if it committed its completion,
        else as lost."""
        if attempt.completed:
            outcome, _ = self._completed_then_failed(attempt, error)
        else:
            self._report_lost(attempt, error)
            outcome = Outcome.LOST
        self._count_ended([outcome], error)

    def _wait_for_transactions(self, attempt: Attempt) -> None:
        """Wait (at most ``lease_seconds``) until no fenced transaction of ``attempt`` is open."""
        deadline = time.monotonic() + self.options.lease_seconds
        while attempt.in_fenced_transaction and time.monotonic() < deadline:
            time.sleep(0.005)

    def _completed_then_failed(
        self, attempt: Attempt, error: BaseException
    ) -> "tuple[Outcome, Optional[Exhaustion]]":
        """The attempt completed (its fenced transaction committed) and its handler then
        failed: report that once. It is not retried (no ``on_failure``: nothing failed that the
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
                landed = bool(
                    self.stats.timed(
                        "settle", self.port.exhaust, attempt.identity, at=now, error=reason
                    )
                )
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
                extra=event("update_exhausted", **ids(attempt)),
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
        """The attempt is over: stop renewing it. Late renewal results are ignored. Effects
        it still holds (it was released, or its completion never ran) are discarded."""
        self.keeper.unregister(attempt)
        self.conflicts.ended(attempt)  # its update's turn after a conflict passes on
        # a completing transaction still open (e.g. past attempt_timeout_seconds) carries
        # them in its commit: dropped only once it ended (nothing left then if it committed)
        if not attempt.after_transactions(attempt.drop_effects):
            attempt.drop_effects()

    # -- exhaustion delivery ----------------------------------------------------------------
    def delivered(self, exhaustion: Exhaustion) -> DeliveredExhaustion:
        """``exhaustion`` as ``handle_exhaustion`` receives it: with an outbox whose calls
        :meth:`acknowledge` writes in the acknowledgement's commit."""
        refusal = self.outbox_refusal()
        if refusal is None and not self.port.acknowledges_with_calls:
            refusal = (
                f"exhaustion.outbox needs a store whose acknowledge_exhaustion takes effects= "
                f"(the SQLite, PostgreSQL and memory stores do; {type(self.store).__name__} "
                "does not)"
            )
        return DeliveredExhaustion.of(exhaustion, ExhaustionCalls(self, exhaustion, refusal))

    def acknowledge(self, exhaustion: Exhaustion) -> bool:
        """Acknowledge a delivered exhaustion with its exact identity. The calls its handler
        queued (a :class:`DeliveredExhaustion`) are written in the same commit, and dropped
        when it does not land."""
        calls = exhaustion.calls if isinstance(exhaustion, DeliveredExhaustion) else None
        taken = None if calls is None else calls.take()
        try:
            ok = bool(
                self.stats.timed(
                    "exhaustions",
                    self.port.acknowledge_exhaustion,
                    exhaustion.identity,
                    self.options.now_ms(),
                    None if taken is None else taken[0],
                )
            )
        except Exception as exc:
            if calls is not None:
                calls.discard("the exhaustion's acknowledgement failed in the store")
            self.report_store_error(exc, "sweep", ids=exhaustion_ids(exhaustion))
            return False
        if calls is not None:
            if ok:
                handles = calls.landed()
                if handles:
                    self.calls_committed(handles)
            else:
                calls.discard("the exhaustion was acknowledged elsewhere")
        if ok:
            _LOGGER.info(
                "exhaustion of update %s attempt %s acknowledged",
                exhaustion.update_id,
                exhaustion.attempt,
                extra=exhaustion_ids(exhaustion),
            )
        return ok

    def exhaustion_failed(self, error: BaseException, exhaustion: Exhaustion) -> None:
        """Report a failing exhaustion handler. The exhaustion stays due."""
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

    # -- recording, and claims and completions in groups ----------------------------------
    def record(self, update_id: int, body: str, chat: Hashable = None) -> bool:
        """Record one update as pending. :obj:`False` when its id exists (a duplicate).

        ``update_id`` must be valid (:func:`ptb_fence._update_ids.is_update_id`). A store
        error propagates (the update was not recorded: do not acknowledge it to Telegram).
        ``chat``: the update's chat key (:func:`~ptb_fence.runtime._chats.chat_key`), stored
        under ``strict_chat_order``.
        """
        if self.options.strict_chat_order:
            return self.record_many([(update_id, body)], chats=[chat])[0] is True
        try:
            added = self.stats.timed("record", self.port.add, update_id, body, self.options.now_ms())
        except Exception:
            self._ingest_failed([(update_id, body)])
            raise
        self._note_redeliveries([(update_id, body)], [added])
        return added

    def _note_redeliveries(
        self, items: Sequence[Tuple[int, str]], records: Sequence[Record]
    ) -> None:
        duplicates = 0
        for (update_id, _), record in zip(items, records):
            if record is False:
                duplicates += 1
                self._dropped_redelivery(update_id)
        self.stats.recorded(len(records) - duplicates, duplicates)

    def _ingest_failed(self, items: Sequence[Tuple[int, str]]) -> None:
        """Count a recording that failed (its updates were not recorded) and remember the
        oldest Telegram ``date`` among them: Telegram keeps an unconfirmed update for 24 h."""
        self.stats.ingest_failed(oldest_date(body for _, body in items))
        self.alarms.check()

    def _dropped_redelivery(self, update_id: int) -> None:
        """Say that ``update_id`` was not recorded because its id is already recorded.

        The first :data:`REDELIVERIES_AT_INFO` of this runtime log at INFO: a fake Bot API
        restarted against a kept database numbers its updates from the start again, and a
        bot that then drops every new message without a word looks broken. A different update
        under a recorded id was already logged at WARNING by the store.
        """
        seen = next(self._redeliveries)
        extra = {"update_id": update_id}
        if seen >= REDELIVERIES_AT_INFO:
            _INGEST_LOGGER.debug("update %s is already recorded: not handled again", update_id,
                          extra=extra)
            return
        _INGEST_LOGGER.info(
            "update %s is already recorded: not handled again (a redelivery, which is normal; "
            "if it is a new message, its update id was used before: a test Bot API restarted "
            "against a kept database, or two bots sharing one table)%s",
            update_id,
            "; further redeliveries are logged at DEBUG" if seen == REDELIVERIES_AT_INFO - 1
            else "",
            extra=extra,
        )

    def _rows(self, items: Sequence[Tuple[int, str]], now: int) -> List[Row]:
        return [(update_id, body, now) for update_id, body in items]

    def _claims_at_ingest(self, claim: bool) -> bool:
        # under strict_chat_order an update is claimed only when it is its chat's turn
        return (
            claim
            and self.uses_claim_ids
            and self.port.commits_batches
            and not self.options.strict_chat_order
        )

    def record_many(
        self,
        items: Sequence[Tuple[int, str]],
        *,
        claim: bool = False,
        chats: Optional[Sequence[Hashable]] = None,
    ) -> List[Record]:
        """Record ``(update_id, body)`` updates (one commit where the store can).

        With ``claim`` (and a fenced runtime whose store records and claims in one commit,
        ``port.commits_batches``) the first fresh updates, as many as the claim budget allows
        (``max_concurrent + ingest_claim_buffer`` minus the claims held here), are claimed for
        their first attempt in the same commit and returned as registered
        :class:`~ptb_fence.Attempt` objects. The others are recorded pending (:obj:`True`).
        :obj:`False` means a duplicate. A store error propagates. ``chats`` gives each item's
        chat key, stored under ``strict_chat_order`` (which never claims at ingest).
        """
        if not self._claims_at_ingest(claim):
            return self._record_pending(items, chats)
        group = self._commit(items=items)
        if isinstance(group.records, BaseException):
            raise group.records
        return group.records

    def _record_pending(
        self, items: Sequence[Tuple[int, str]], chats: Optional[Sequence[Hashable]]
    ) -> List[Record]:
        now = self.options.now_ms()
        try:
            if self.options.strict_chat_order:
                keys = list(chats) if chats is not None else [None] * len(items)
                rows = [
                    (u, body, now, stored_chat_key(key)) for (u, body), key in zip(items, keys)
                ]
                records = list(self.stats.timed("record", self.port.add_many_in_chats, rows))
            else:
                records = list(
                    self.stats.timed("record", self.port.add_many, self._rows(items, now))
                )
        except Exception:
            self._ingest_failed(items)
            raise
        self._note_redeliveries(items, records)
        return list(records)

    def _reserve(self, wanted: int, *, freed: int = 0, limited: bool = True) -> int:
        """Reserve room for ``wanted`` claims on their way to the store and return how many
        fit: ``max_concurrent + ingest_claim_buffer`` less the claims held here (registered
        with the keeper) and those already on their way, plus ``freed``: the attempts settled
        in the same commit as these claims. ``limited=False``: reserve all ``wanted`` (claims
        the caller makes anyway, the others then see them). Give it back with
        :meth:`_unreserve` once the claims are registered (or failed)."""
        options = self.options
        with self._claims_lock:
            room = options.max_concurrent + options.ingest_claim_buffer + freed
            room -= self.keeper.count() + self._reserved
            granted = max(0, min(wanted, room)) if limited else wanted
            self._reserved += granted
            return granted

    def _unreserve(self, count: int) -> None:
        with self._claims_lock:
            self._reserved -= count

    def _claim_budget(self) -> int:
        """How many more claims at ingest: ``max_concurrent + ingest_claim_buffer`` minus the
        claims held here (being renewed) minus the slots still free (the front end may claim
        for them when it starts an update recorded pending). So claims waiting to start never
        exceed the buffer, and all claims held never exceed ``max_concurrent + buffer``."""
        held = len(self.keeper.active())
        running = min(self._hooks.running_count(), held)
        return max(0, self.options.ingest_claim_buffer - (held - running))

    @property
    def claims_in_groups(self) -> bool:
        """:obj:`bool`: :meth:`claim_many` claims in one commit (a fenced runtime, a store
        with ``commit``, no ``strict_chat_order``). Otherwise it is the loop of
        :meth:`claim`, and a front end gains nothing by grouping its claims."""
        return (
            self.uses_claim_ids
            and self.port.commits_batches
            and not self.options.strict_chat_order
        )

    def claim_many(
        self, update_ids: Sequence[int], bodies: Optional[Sequence[Optional[str]]] = None
    ) -> "List[Optional[Attempt]]":
        """Claim updates that start now for their next attempt (one commit where the store
        can: :attr:`claims_in_groups`), each registered with the lease keeper.

        Per position what :meth:`claim` gives: the attempt, or :obj:`None` when it was not
        taken (a live lease elsewhere, a final row, attempts spent, an id repeated in
        ``update_ids``) or when the store failed (reported per update as step ``"claim"``,
        the lease and the sweep take care of the updates).
        """
        texts = list(bodies) if bodies is not None else [None] * len(update_ids)
        if not self.claims_in_groups or len(update_ids) < 2:
            return [self.claim(update_id, text) for update_id, text in zip(update_ids, texts)]
        return self._commit(update_ids=update_ids, bodies=texts, limit_claims=False).claimed

    def completes_in_group(self, attempt: Attempt, error: Optional[BaseException]) -> bool:
        """Whether a front end completes ``attempt`` with :meth:`complete_many`, grouped with
        the completions that arrive at the same time (one commit): its handler succeeded
        (``error`` :obj:`None`), it is fenced, not completed by its own transaction, not
        exhausted, and the store settles many in one commit. Otherwise :meth:`settle`."""
        return (
            error is None
            and self.uses_claim_ids
            and self.port.commits_batches
            and attempt.fenced
            and not attempt.completed
            and not attempt.exhausted
        )

    def complete_many(self, attempts: Sequence["Attempt"]) -> "List[Outcome]":
        """Settle handled attempts as completed (one commit where the store can).

        Per attempt its outcome: ``COMPLETED``, or ``LOST`` when the settle did not land
        (``owner_lost`` fired) or the store failed (reported as step ``"settle"``).
        """
        outcomes = self._complete_many(attempts)
        self._count_ended(outcomes)
        return outcomes

    def _complete_many(self, attempts: Sequence["Attempt"]) -> "List[Outcome]":
        if not attempts:
            return []
        if all(attempt.fenced for attempt in attempts):
            return self._commit(attempts=attempts).outcomes
        at = self.options.now_ms()
        try:
            landed = [self._store_settle(attempt, Completed(at)) for attempt in attempts]
        except Exception as exc:
            return [self.completion_failed(attempt, exc) for attempt in attempts]
        return [self.completion_settled(a, ok) for a, ok in zip(attempts, landed)]

    def _claimed(
        self, effects: Optional[Dict[AttemptIdentity, AttemptEffects]]
    ) -> "Tuple[Optional[Dict[AttemptIdentity, AttemptEffects]], Optional[ClaimReservation]]":
        """``effects`` with the calls this process's sender can take claimed in the commit
        that writes them (a store with claimed inserts), and the senders set aside for them."""
        if not effects or self.outbox is None:
            return effects, None
        return self.outbox.claim_effects(effects)

    def _claims_ended(
        self,
        reservation: Optional[ClaimReservation],
        attempts: Sequence[Attempt],
        landed: Optional[Sequence[Landing]],
    ) -> None:
        """The commit of ``reservation`` ended (``landed``: per attempt, truthy when its
        completion landed. :obj:`None`: it raised)."""
        if reservation is None or self.outbox is None:
            return
        done = [] if landed is None else [a.identity for a, ok in zip(attempts, landed) if ok]
        self.outbox.claims_ended(reservation, done)

    def _claims_committed(
        self,
        reservation: Optional[ClaimReservation],
        attempts: Sequence[Attempt],
        batch: Batch,
        committed: Committed,
    ) -> None:
        """The commit of ``reservation`` landed: hand its sender the calls it inserted claimed.

        A batch store reports their ids, so its sender needs no read back.
        """
        if reservation is None or self.outbox is None:
            return
        done = [a.identity for a, ok in zip(attempts, committed.landed) if ok]
        inserted = None
        if self.port.commits_batches and batch.effects:
            at = batch.settlements[0][1].at if batch.settlements else self.options.now_ms()
            inserted = self.outbox.inserted_claimed(
                batch.effects, committed.call_ids, committed.sending, at
            )
        self.outbox.claims_ended(reservation, done, inserted)

    def record_and_complete(
        self,
        items: Sequence[Tuple[int, str]],
        attempts: Sequence["Attempt"],
        *,
        claim: bool = True,
        chats: Optional[Sequence[Hashable]] = None,
    ) -> "Tuple[Union[List[Record], BaseException], List[Outcome]]":
        """:meth:`record_many` and :meth:`complete_many` as one group: one commit where the
        store can record, claim and settle together (``commit``).

        Returns the records (or the store error that prevented them: do not acknowledge those
        updates) and the outcomes of the completions.
        """
        if (
            not items
            or not attempts
            or not self._claims_at_ingest(claim)
            or not (self.port.commits_batches and all(a.fenced for a in attempts))
            or (
                # a store that commits batches records the rest pending in the same commit
                not self.port.commits_batches
                and len(items) > min(self._claim_budget(), self._room())
            )
        ):
            try:
                records: "Union[List[Record], BaseException]" = (
                    self.record_many(items, claim=claim, chats=chats) if items else []
                )
            except Exception as exc:
                records = exc
            return records, self.complete_many(attempts)
        group = self._commit(items=items, attempts=attempts)
        self._count_ended(group.outcomes)
        return group.records, group.outcomes

    @property
    def claims_with_completions(self) -> bool:
        """:obj:`bool`: :meth:`complete_and_claim` is one commit (claims in groups, and a store
        with ``commit``): a front end then claims the updates that take the slots
        of finished attempts in the commit that completes those attempts."""
        return self.claims_in_groups and self.port.commits_batches

    def complete_and_claim(
        self, attempts: Sequence["Attempt"], update_ids: Sequence[int]
    ) -> "Tuple[List[Outcome], List[Optional[Attempt]]]":
        """:meth:`complete_many` and, for as many of ``update_ids`` as the bound
        ``max_concurrent + ingest_claim_buffer`` has room for, :meth:`claim_many`, as one
        group: one commit where the store can (:attr:`claims_with_completions`), else the two
        one after the other (the completions first).

        The completions land in the commit of the claims, so the attempts they end make room
        for these claims. Returns the outcomes of the completions and, per id admitted (the
        first ones of ``update_ids``, in order), what :meth:`claim_many` gives. The ids past
        the end of that list found no room and were not claimed.
        """
        if not self.claims_with_completions or not all(a.fenced for a in attempts):
            outcomes = self.complete_many(attempts)
            room = self._room()
            return outcomes, self.claim_many(update_ids[:room]) if room else []
        group = self._commit(attempts=attempts, update_ids=update_ids)
        self._count_ended(group.outcomes)
        return group.outcomes, group.claimed

    def _room(self) -> int:
        options = self.options
        with self._claims_lock:
            room = options.max_concurrent + options.ingest_claim_buffer
            return max(0, room - self.keeper.count() - self._reserved)

    def _commit(
        self,
        *,
        items: Sequence[Tuple[int, str]] = (),
        attempts: Sequence[Attempt] = (),
        update_ids: Sequence[int] = (),
        bodies: Optional[Sequence[Optional[str]]] = None,
        limit_claims: bool = True,
        effects: Optional[Dict[AttemptIdentity, AttemptEffects]] = None,
    ) -> "_Group":
        """The group commit: record ``items``, complete ``attempts`` and claim ``update_ids``
        in one :class:`~ptb_fence.contract.Batch`.

        The first items are recorded claimed, as many as the claim budget allows. The rest are
        recorded pending. The ids are claimed as far as ``max_concurrent +
        ingest_claim_buffer`` has room, counting the slots the completions free
        (``limit_claims=False``: all of them). The attempts must be fenced. ``effects``: what
        they hold, when already taken. Outcomes are not
        counted here: the caller counts them. A store error fails the completions and is
        reported per claimed update, and the records become that error.
        """
        terms = self.claim_terms()
        rows = self._rows(items, terms.now)
        # the ingest budget is counted and spent by one recorder at a time
        with self._ingest_lock if items else _NO_LOCK:
            budget = self._reserve(self._claim_budget()) if items else 0
            freed = sum(1 for attempt in attempts if attempt.phase is not Phase.ENDED)
            admitted = (
                self._reserve(len(update_ids), freed=freed, limited=limit_claims)
                if update_ids else 0
            )
            try:
                held = effects if effects is not None else _held_effects(attempts)
                claimed_effects, reservation = self._claimed(held)
                batch = Batch(
                    terms,
                    records=tuple(rows[budget:]),
                    claimed_records=tuple(rows[:budget]),
                    settlements=tuple((a.identity, Completed(terms.now)) for a in attempts),
                    effects=claimed_effects,
                    claims=tuple(update_ids[:admitted]),
                )
                # one call, one operation: claims alone are claims, whatever carries them
                step = "record" if items else "settle" if attempts else "claim"
                try:
                    committed = self.stats.timed(step, self.port.commit, batch)
                except Exception as exc:
                    self._claims_ended(reservation, attempts, None)
                    if items:
                        self._ingest_failed(items)
                    for update_id in batch.claims:  # as if each had been claimed on its own
                        self.report_store_error(exc, "claim", ids={"update_id": update_id})
                    failed = [self.completion_failed(attempt, exc) for attempt in attempts]
                    return _Group(exc, failed, [None] * len(batch.claims))
                return self._committed(committed, batch, items, attempts, bodies, reservation)
            finally:
                self._unreserve(budget + admitted)

    def _committed(
        self,
        committed: Committed,
        batch: Batch,
        items: Sequence[Tuple[int, str]],
        attempts: Sequence[Attempt],
        bodies: Optional[Sequence[Optional[str]]],
        reservation: Optional[ClaimReservation],
    ) -> "_Group":
        """Register what a group commit claimed and settle the completions' outcomes."""
        assert batch.terms is not None  # the group commit always gives terms
        lease_until = batch.terms.lease_until
        records: List[Record] = [
            False if identity is None else self.adopt(identity, lease_until, body)
            for identity, (_, body) in zip(committed.claimed_records, items)
        ]
        records.extend(committed.recorded)
        if items:
            self._note_redeliveries(items, records)
        outcomes = [self.completion_settled(a, ok) for a, ok in zip(attempts, committed.landed)]
        self._claims_committed(reservation, attempts, batch, committed)  # after the wakes
        texts = bodies if bodies is not None else [None] * len(committed.claims)
        claimed = [
            None if identity is None
            else self.adopt(identity, lease_until, text, at_ingest=False)
            for identity, text in zip(committed.claims, texts)
        ]
        return _Group(records, outcomes, claimed)

    # -- sweep pieces -----------------------------------------------------------------------
    def due_page(self, *, limit: int, include_fresh: bool = False) -> List[StoredUpdate]:
        """Updates to hand over now (pending after the grace period, or all pending).

        First makes the claims of provably dead processes claimable
        (:meth:`Recovery.take_over_dead <ptb_fence.runtime._recovery.Recovery.take_over_dead>`), so they are among
        them, and under ``strict_chat_order`` keys the rows recorded without a chat key
        (:meth:`StoreChatOrder.key_recorded_since
        <ptb_fence.runtime._store_chat_order.StoreChatOrder.key_recorded_since>`) before and
        after listing."""
        self.recovery.take_over_dead()
        now = self.options.now_ms()
        grace = 0 if include_fresh else int(self.options.pending_grace_seconds * 1000)
        if self.options.strict_chat_order:  # only updates whose chat's turn it is
            chat_order = self.chat_order
            # what a process without the option recorded since the last sweep gets its
            # chat's key first, so that it is listed only in its chat's turn
            chat_order.key_recorded_since()
            rows = list(
                self.stats.timed(
                    "sweep",
                    self.port.due_in_chat_order,
                    now=now,
                    pending_before=now - grace,
                    limit=limit,
                )
            )
            # and what it recorded meanwhile (a row without a key is always listed as in
            # turn) gets its key before these rows are claimed: the claim checks the turn
            # again, in its one statement, and refuses a listed row that is not in turn
            chat_order.key_recorded_since()
            return rows
        return list(
            self.stats.timed(
                "sweep", self.port.due, now=now, pending_before=now - grace, limit=limit
            )
        )

    def sweep_page(self, *, include_fresh: bool) -> SweepPage:
        """The due updates one sweep hands over (:data:`~ptb_fence.runtime._sweep.SWEEP_PAGE`
        at most, see :meth:`due_page`). A store error is reported (step ``"sweep"``) and
        gives an empty page: the next sweep tries again."""
        self.stats.sweep_ran()
        try:
            rows = self.due_page(limit=SWEEP_PAGE, include_fresh=include_fresh)
        except Exception as exc:
            self.report_store_error(exc, "sweep")
            rows = []
        else:
            self.stats.swept()
        # updates waiting for their turn after a conflict are handed back in turn instead
        return SweepPage(self.conflicts.unswept(rows), len(rows) >= SWEEP_PAGE)

    def sweep_done(self, handed: int) -> None:
        """The end of a sweep that handed ``handed`` updates over: prune, read the store's
        figures for the operators (at most every :data:`FIGURES_EVERY_SECONDS`), raise the
        alarms that are due (a store error is reported, step ``"sweep"``) and log what was
        handed over (INFO)."""
        try:
            self.prune()
        except Exception as exc:
            self.report_store_error(exc, "sweep")
        self._read_figures()
        self._read_due_jobs()
        self.alarms.check()
        if handed:
            _LOGGER.info("sweep handed %d update(s) over to the handlers", handed)

    def _read_figures(self) -> None:
        if not self.port.has_figures:
            return
        read_at = self.stats.figures_read_at
        if read_at is not None and time.time() - read_at < FIGURES_EVERY_SECONDS:
            return
        try:
            figures = self.stats.timed("figures", self.port.figures)
            counts = (
                self.stats.timed("figures", self.port.outbox_counts)
                if self.outbox is not None
                else None
            )
        except Exception as exc:
            self.report_store_error(exc, "sweep")
            return
        if counts is not None:
            self.stats.outbox_counts(counts)
        if self.broadcasts is not None:
            try:
                broadcasts = self.stats.timed("figures", self.broadcasts.list)
            except Exception as exc:
                self.report_store_error(exc, "sweep")
            else:
                self.stats.broadcast_recipients(
                    {state: sum(getattr(b, state) for b in broadcasts)
                     for state in RECIPIENT_STATES})
        if figures is not None:
            self.stats.figures(figures)

    def _read_due_jobs(self) -> None:
        """Read the due jobs for the operators (a store that keeps jobs, at most every
        :data:`FIGURES_EVERY_SECONDS`)."""
        if not self.port.has_jobs:
            return
        read_at = self.stats.jobs_read_at
        if read_at is not None and time.time() - read_at < FIGURES_EVERY_SECONDS:
            return
        now = self.options.now_ms()
        try:
            due = self.stats.timed("figures", self.port.due_jobs, now, JOB_FIGURES_LIMIT)
        except Exception as exc:
            self.report_store_error(exc, "sweep")
            return
        self.stats.due_jobs_read([job.next_run_at for job in due if job.next_run_at is not None],
                                 now)

    # -- what operators see -----------------------------------------------------------------
    def snapshot(self) -> Stats:
        """What this runtime counted, and how things stand now (see :class:`Stats`)."""
        active = self.keeper.active()
        return self.stats.snapshot(
            claims_held=len(active),
            now_ms=self.options.now_ms(),
            left_running=self._hooks.left_running_count(),
            job_runs_running=sum(1 for attempt in active if attempt.update_id >= RUN_ID_BASE),
        )

    def health(self) -> Health:
        """Whether this process is healthy now, for a readiness probe (see :class:`Health`)."""
        return self.alarms.health(running=self.jobs.running)

    def exhaustion_page(self, limit: int = EXHAUSTION_PAGE) -> List[Exhaustion]:
        """The next page of at most ``limit`` due exhaustions, with a rotating cursor."""
        if not self.delivers_exhaustions:
            return []
        page = list(
            self.stats.timed(
                "exhaustions", self.port.due_exhaustions, limit=limit, after_update_id=self._cursor
            )
        )
        if len(page) < limit:
            self._cursor = None
        else:
            self._cursor = page[-1].update_id
        return page

    def prune(self) -> int:
        """Delete rows settled more than ``retain_seconds`` ago."""
        before = self.options.now_ms() - int(self.options.retain_seconds * 1000)
        return int(self.stats.timed("prune", self.port.prune, before))


def _held_effects(attempts: Sequence[Attempt]) -> Optional[Dict[AttemptIdentity, AttemptEffects]]:
    """What the attempts completing together hold (:obj:`None` when none holds anything: the
    store is then called exactly as without an outbox). Each is resolved or discarded by
    :meth:`Runtime.completion_settled`/:meth:`Runtime.completion_failed`."""
    effects: Optional[Dict[AttemptIdentity, AttemptEffects]] = None
    for attempt in attempts:
        taken = attempt.take_effects()
        if taken is not None:
            if effects is None:
                effects = {}
            effects[attempt.identity] = taken[0]
    return effects
