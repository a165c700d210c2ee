"""OutboxDispatcher: sends the committed outbox calls, each chat's in order, at least once.

There is one per process running a fenced front end on an outbox store.
The runtime creates it.
The front end gives it a blocking ``send(method, params) -> result`` and starts it.
With PTB, ``send`` is the Application's ``Bot.do_api_request`` run on its event loop.
The blocking front end sends with an httpx client.
Its loop runs on a thread of its own.
:class:`OutboxDispatcher` says how it claims, sends, records and stops.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ptb_fence._events import event
from ptb_fence.contract import OUTBOX_METHODS
from ptb_fence._values import AttemptEffects, AttemptIdentity, CallClaim, OutboxEntry
from ptb_fence.runtime._outbox_prepare import OutboxPrepare
from ptb_fence.runtime._daemon_pool import DaemonThreadPool
from ptb_fence.runtime._dispatch_plan import (
    CLAIM,
    LOOK,
    RECORD_WINDOW,
    ClaimReservation,
    CallKey,
    DispatchPlan,
    Done,
    Expire,
    Fail,
    Round,
    Wait,
    call_key,
)
from ptb_fence.runtime._held_call import HeldCall
from ptb_fence.runtime._options import RuntimeOptions
from ptb_fence.runtime._outcome import error_text
from ptb_fence.runtime._pacer import (
    BOT_KEY,
    BOT_WAIT_MS,
    HOLD_KEY,
    HORIZON_MS,
    LATE_MS,
    PAID_KEY,
    PacedBack,
    Pacer,
)
from ptb_fence.runtime._send_outcome import retry_after_seconds
from ptb_fence.runtime._port import StorePort
from ptb_fence.runtime._send_call import send_call
from ptb_fence.runtime._stats import RuntimeStats
from ptb_fence.stores._outbox_sql import sender_token

if TYPE_CHECKING:
    import asyncio  # imported where used: import ptb_fence stays light

__all__ = ["FAILURE_PAGE", "RECORD_WINDOW", "ClaimReservation", "OutboxDispatcher", "Send",
           "no_outbox"]

_LOGGER = logging.getLogger("ptb_fence.outbox")

Send = Callable[[str, Dict[str, Any]], Any]
"""``send(method, params) -> result``: one blocking Bot API call.

It raises ``telegram.error`` exceptions as python-telegram-bot's ``Bot`` does."""

FAILURE_PAGE = 100
"""Failed calls delivered per page."""

_READ_ALL = 10_000
"""At most this many of its claimed calls are read back at once (those being sent, waiting
to be recorded and claimed at insert: far fewer in practice)."""


def no_outbox(store: object) -> str:
    """The TypeError text for ``attempt.outbox`` on a store without the outbox."""
    return (
        f"{type(store).__name__} has no outbox: attempt.outbox needs a store that keeps Bot "
        "API calls (SQLiteUpdateStore, PostgresUpdateStore, MemoryUpdateStore, or a BatchStore "
        f"of yours that declares StoreFeatures(outbox=True) and has {', '.join(OUTBOX_METHODS)})"
    )


class OutboxDispatcher:
    """The sender of one process's outbox.

    Its decisions are a :class:`~ptb_fence.runtime._dispatch_plan.DispatchPlan` kept under the
    condition's lock. The dispatcher performs them: store calls, sender threads, waits.

    - Some stores have claimed inserts (:class:`~ptb_fence.contract.OutboxStore`).
      There the commit that completes an update already claims its calls for this sender.
      :meth:`claim_effects` gives the terms, at most as many calls as there are free senders.
      The dispatcher reads those calls without a commit and sends them.
      It claims with a commit only what such a commit left ``pending`` and what others left.
      A call stays ``pending`` when its chat had an unsent call or no sender was free.
    - It claims calls with ``claim_calls`` under a sender token and a lease of
      ``lease_seconds``. The store gives a chat's calls one at a time, in commit order, across
      processes. At most twice as many calls as it has senders (``outbox_concurrency``) are
      claimed and not ended. While every sender is busy it claims only a whole round at once.
      So a claimed call waits at most one round of sends for a sender, well inside its lease.
    - It is woken in-process right after a commit that carried calls.
      It is woken too right after the calls of a provably dead process were taken over.
      Its token names the store instance it holds liveness under.
      So the takeover of that instance's updates takes its calls too.
      Otherwise it looks every ``sweep_every_seconds`` for lapsed leases, and when a retry it
      scheduled falls due.
    - Results are recorded ``sent`` in groups. There is at most one ``record_sent`` commit per
      :data:`RECORD_WINDOW` seconds, and no result waits longer than that.
      A result after a quiet spell is recorded at once.
      So is a result when a later call of the chat waits or a stop comes.
    - :func:`~ptb_fence.runtime._send_outcome.decide` retries or fails the failures.
    - Calls older than ``outbox_max_age_seconds`` end failed as expired, unsent.
    - Failed calls are delivered to ``handle_send_failure`` at least once.
      They are acknowledged when it returns, or at once without one.
    - A stop claims nothing more.
      It waits, bounded, for the requests in flight and for the completions whose commits
      claim calls for it. It records the results. It releases at once every call still
      claimed by it that it did not start sending.

    Args:
        port: The store.
        options: The runtime's options (``lease_seconds``, ``sweep_every_seconds``,
            ``stop_timeout_seconds``, ``outbox_concurrency``, ``outbox_max_age_seconds``,
            ``handle_send_failure``, the clock).
        stats: Where sends are counted.
        report_store_error: ``report(error, step)`` for store errors (step ``"outbox"``).
    """

    __slots__ = (
        "_awaiting",
        "_cond",
        "_defaults",
        "_failure_cursor",
        "_loop",
        "_options",
        "_pacer",
        "_plan",
        "_pool",
        "_port",
        "_prepare",
        "_report",
        "_send",
        "_sender_missing",
        "_stats",
        "_thread",
    )

    def __init__(
        self,
        port: StorePort,
        options: RuntimeOptions,
        stats: RuntimeStats,
        report_store_error: Callable[..., None],
    ) -> None:
        self._port = port
        self._options = options
        self._stats = stats
        self._report = report_store_error
        self._defaults: Dict[str, Any] = {}
        self._prepare: Optional[OutboxPrepare] = None
        self._sender_missing: Optional[str] = None
        self._cond = threading.Condition()
        self._plan = DispatchPlan(
            options.outbox_concurrency, options.lease_seconds, options.sweep_every_seconds,
            options.outbox_max_age_seconds, options.handle_send_failure is not None,
        )
        pacing = options.outbox_pacing
        self._pacer = None if pacing is None else Pacer(
            pacing, port.take_send_slots, port.hold_sends, options.now_ms)
        self._send: Optional[Send] = None
        self._loop: "Optional[asyncio.AbstractEventLoop]" = None
        self._thread: Optional[threading.Thread] = None
        self._pool: Optional[DaemonThreadPool] = None
        self._failure_cursor: Optional[int] = None
        self._awaiting: "weakref.WeakValueDictionary[CallKey, HeldCall]" = (
            weakref.WeakValueDictionary()
        )

    # -- configuration (the front end) -------------------------------------------------------
    @property
    def defaults(self) -> Mapping[str, Any]:
        """The bot's defaults applied to queued calls (PTB ``Defaults.api_defaults``)."""
        return self._defaults

    @defaults.setter
    def defaults(self, values: Mapping[str, Any]) -> None:
        self._defaults = dict(values)

    @property
    def prepare(self) -> Optional[OutboxPrepare]:
        """The front end's change to queued calls before they are kept as JSON (PTB with
        ``arbitrary_callback_data``: inline keyboards go into the bot's callback-data cache),
        or :obj:`None`."""
        return self._prepare

    @prepare.setter
    def prepare(self, prepare: Optional[OutboxPrepare]) -> None:
        self._prepare = prepare

    def refuse_calls(self, why: Optional[str]) -> None:
        """Make ``attempt.outbox`` refuse with ``why`` because the front end cannot send.

        :obj:`None` allows it again."""
        self._sender_missing = why

    def refusal(self) -> Optional[str]:
        """Why calls cannot be queued here, or :obj:`None`."""
        return self._sender_missing

    @property
    def running(self) -> bool:
        """:obj:`bool`: The loop runs (started, not stopped)."""
        thread = self._thread
        return thread is not None and thread.is_alive() and not self._plan.stopping

    @property
    def sender_token(self) -> str:
        """:obj:`str`: The token this dispatcher claims calls under (new at each start)."""
        return self._plan.sender

    def start(self, send: Send, *, loop: "Optional[asyncio.AbstractEventLoop]" = None) -> None:
        """Start sending with ``send``. Idempotent while running.

        ``loop`` is the event loop an async ``handle_send_failure`` runs on.
        With :obj:`None` it runs under :func:`asyncio.run`."""
        if self.running:
            return
        self._send = send
        self._loop = loop
        # the store instance this process holds liveness under, in the token: when the
        # process dies, the takeover of its updates makes its calls claimable too
        sender = sender_token(
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}",
            self._port.held_instance,
        )
        with self._cond:
            self._plan.begin_run(sender)  # a first claim at once: calls left by a previous run
        self._pool = DaemonThreadPool(self._options.outbox_concurrency, "ptb_fence_outbox")
        self._thread = threading.Thread(target=self._run, name="ptb_fence_outbox", daemon=True)
        self._thread.start()

    def wake(self, handles: Sequence[HeldCall] = ()) -> None:
        """A commit carrying calls landed: send them now (``handles``: held calls whose ids
        this process learns when it claims them)."""
        keys = []
        for handle in handles:
            key = (handle.identity.update_id, handle.identity.attempt,
                   handle.identity.claim_id, handle.seq)
            if handle.call_id is None:
                self._awaiting[key] = handle
            keys.append(key)
        with self._cond:
            # calls claimed in the commit are read back at claims_ended
            if self._plan.wake(keys):
                self._cond.notify_all()

    # -- claims at insert (a completion's commit claims its calls for this sender) ------------
    def claim_effects(
        self, effects: Mapping[AttemptIdentity, AttemptEffects]
    ) -> Tuple[Dict[AttemptIdentity, AttemptEffects], Optional[ClaimReservation]]:
        """Claim terms for a completion about to commit ``effects``.

        It returns the same effects with a :class:`~ptb_fence.CallClaim` for as many calls as
        there are free senders, and the reservation. Those senders are set aside until
        :meth:`claims_ended`. When nothing can be claimed it returns ``effects`` unchanged and
        :obj:`None`. That is so when it is not running, stopping, without a free sender, or on
        a store without claimed inserts. When a reservation was given, call
        :meth:`claims_ended` after the commit, whatever its outcome."""
        if not self._port.has_claimed_inserts:
            return dict(effects), None
        with self._cond:
            free = self._plan.insert_room(self._now())
            if self._send is None or not self.running or free <= 0:
                return dict(effects), None
            reservation = ClaimReservation()
            lease_until = self._options.lease_deadline(self._now())
            claimed: Dict[AttemptIdentity, AttemptEffects] = {}
            for identity, held in effects.items():
                limit = min(free - reservation.slots, len(held.calls))
                if limit <= 0:
                    claimed[identity] = held
                    continue
                # the same effects (its persisted state and jobs too), the first calls claimed
                claimed[identity] = dataclasses.replace(
                    held, claim=CallClaim(self._plan.sender, lease_until, limit))
                reservation.slots += limit
                for call in held.calls[:limit]:
                    key = (identity.update_id, identity.attempt, identity.claim_id, call.seq)
                    reservation.keys[key] = call.chat_key
            if not reservation.slots:
                return claimed, None
            self._plan.reserve(reservation)
            return claimed, reservation

    def claims_ended(
        self,
        reservation: Optional[ClaimReservation],
        landed: Sequence[AttemptIdentity],
        inserted: Optional[Sequence[OutboxEntry]] = None,
    ) -> None:
        """The commit of ``reservation`` ended.

        ``landed`` names the identities whose completion landed (none when it failed).
        ``inserted`` holds the calls it inserted claimed, when the commit said. Otherwise they
        are read back.
        """
        if reservation is None:
            return
        if inserted is not None:
            reservation.entries = list(inserted)
        ids = {(i.update_id, i.attempt, i.claim_id) for i in landed}
        with self._cond:
            self._plan.claims_ended(reservation, {k for k in reservation.keys if k[:3] in ids})
            self._cond.notify_all()

    @staticmethod
    def inserted_claimed(
        effects: Mapping[AttemptIdentity, AttemptEffects],
        call_ids: Mapping[AttemptIdentity, Tuple[int, ...]],
        sending: "frozenset[int]",
        at: int,
    ) -> List[OutboxEntry]:
        """The calls a commit inserted claimed, from what it wrote and the ids it returned."""
        entries = []
        for identity, ids in call_ids.items():
            held = effects.get(identity)
            if held is None or held.claim is None:
                continue
            for call, call_id in zip(held.calls, ids):
                if call_id in sending:
                    entries.append(OutboxEntry(
                        call_id, identity.update_id, identity.attempt, identity.claim_id,
                        int(call.seq), None if call.chat_key is None else int(call.chat_key),
                        call.method, call.params_json,
                        bool(call.at_most_once), "sending", 1, held.claim.lease_until, at,
                        None, None, None, False,
                    ))
        return sorted(entries, key=lambda entry: entry.call_id)

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop: claim nothing more, give back at once what was claimed and not started,
        wait for the requests in flight (at most ``timeout``, default
        ``stop_timeout_seconds``) and record their results. Blocking (call it off an event
        loop the sends need)."""
        thread = self._thread
        if thread is None:
            return
        bound = self._options.stop_timeout_seconds if timeout is None else timeout
        deadline = time.monotonic() + bound
        with self._cond:
            self._plan.stop(deadline)
            self._cond.notify_all()
            # the requests in flight finish (or the bound passes)
            while self._plan.started and time.monotonic() < deadline:
                self._cond.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            left = sorted(self._plan.started)
        thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
        if left:
            _LOGGER.warning(
                "outbox: %d call(s) still being sent after %.1f s at the stop: left to their "
                "sender lease (sent again after it, if Telegram did not answer): %s",
                len(left), bound, ", ".join(map(str, left)),
            )
        self._thread = None
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    # -- reading ------------------------------------------------------------------------------
    def call(self, call_id: int) -> Optional[OutboxEntry]:
        """The call ``call_id`` as stored now (its state and result), or :obj:`None`."""
        return self._port.get_call(int(call_id))

    # -- the loop -----------------------------------------------------------------------------
    def _now(self) -> int:
        return self._options.now_ms()

    def _run(self) -> None:
        plan = self._plan
        while True:
            with self._cond:
                while True:
                    step = plan.next_step(self._now(), time.monotonic())
                    if not isinstance(step, Wait):
                        break
                    self._cond.wait(step.seconds)
            try:
                if self._round(step):
                    return
            except Exception:  # never let the loop die: the next round tries again
                _LOGGER.exception("outbox: the sender loop failed; it goes on")
                with self._cond:
                    plan.round_failed(self._now())

    def _round(self, step: Round) -> bool:
        """One round of the loop: record, read back, claim. Whether the loop ends (a stop)."""
        plan = self._plan
        swept = self._record(step.done)
        if step.stop:
            self._finish_stop()
            return True
        if step.read:
            self._read_claimed()
        with self._cond:
            then = plan.after_record(step, swept, self._now())
        # a recorded call may have been what a pending call of its chat waited for, another
        # process's too (not woken by this one): claim if any call is pending (a read, a claim
        # is a commit)
        if then != CLAIM and not (then == LOOK and self._pending_exists()):
            return False
        now = self._now()
        with self._cond:
            sweep = plan.claim_round(now)
        if sweep is None:  # a flood hold: claimed the moment it ends
            return False
        if sweep and self._port.has_claimed_inserts:  # and any claimed call not read back
            self._read_claimed()
        full = self._claim_and_send(sweep)
        with self._cond:
            plan.round_ended(now, sweep, full)
        self._deliver_failures_soon()
        return False

    def _pending_exists(self) -> bool:
        """Whether the store has a call ``pending``, by a read. An error counts as yes."""
        try:
            return bool(self._stats.timed(
                "outbox", self._port.list_calls, state="pending", limit=1
            ))
        except Exception as exc:
            self._report(exc, "outbox")
            return True

    def _read_claimed(self) -> None:
        """Read back the calls completion commits claimed for this sender and send them."""
        with self._cond:
            ended = self._plan.take_ended()
        told = [reservation.entries for reservation, _ in ended]
        if all(entries is not None for entries in told):  # the commits said: no read back
            entries = [entry for known in told if known is not None for entry in known]
        else:
            try:  # all of them: those being sent or waiting to be recorded come first
                entries = self._stats.timed(
                    "outbox", self._port.claimed_calls, self._plan.sender, limit=_READ_ALL
                )
            except Exception as exc:
                self._report(exc, "outbox")
                with self._cond:
                    self._plan.read_failed(ended, time.monotonic())
                return
        now = self._now()
        with self._cond:
            fresh = self._plan.read_back(ended, entries, now)
        self._start(fresh, now)

    def _finish_stop(self) -> None:
        """The loop's last round.

        It waits for the requests in flight and the commits claiming calls for it.
        :meth:`stop` bounds that wait. It records the results. It releases every call it
        still holds that it did not start."""
        plan = self._plan
        with self._cond:
            while plan.stop_waits(time.monotonic()):
                self._cond.wait(0.05)
            take = plan.stop_take()
        self._record(take.done)
        self._flush_unrecorded()
        mine: Sequence[OutboxEntry] = ()
        if self._port.has_claimed_inserts:  # and what commits claimed for it, read or not
            try:
                mine = self._stats.timed(
                    "outbox", self._port.claimed_calls, plan.sender, limit=_READ_ALL
                )
            except Exception as exc:
                self._report(exc, "outbox")
        with self._cond:
            unsent = plan.to_release(take, mine)
        if unsent:
            try:
                landed = self._stats.timed(
                    "outbox", self._port.release_calls, unsent, plan.sender, self._now(),
                )
            except Exception as exc:
                self._report(exc, "outbox")
            else:
                _LOGGER.info("outbox: %d claimed call(s) given back at the stop", sum(landed))

    def _claim_and_send(self, sweep: bool = True) -> bool:
        """Claim as many calls as there are free senders and start them. Whether the claim
        was full (more may be due at once)."""
        with self._cond:
            free = self._plan.claim_limit()
        if free <= 0 or self._send is None:
            return False
        now = self._now()
        try:
            claimed = self._stats.timed(
                "outbox", self._port.claim_calls, now=now,
                lease_until=self._options.lease_deadline(now), limit=free,
                sender=self._plan.sender,
            )
        except Exception as exc:
            self._report(exc, "outbox")
            return False
        with self._cond:
            full = self._plan.claimed(claimed, free, sweep)
        self._start(claimed, now)
        return full

    def _start(self, claimed: Sequence[OutboxEntry], now: int) -> None:
        """Hand calls claimed by this sender to the sender threads (expired ones fail)."""
        for entry in claimed:
            handle = self._awaiting.pop(call_key(entry), None)
            if handle is not None:
                handle.resolve(entry.call_id)
        with self._cond:
            actions = self._plan.start(claimed, now)
        pool = self._pool
        for action in actions:
            if isinstance(action, Expire):
                self._fail(action.entry, action.error)
                continue
            assert pool is not None
            try:
                pool.submit(self._send_one, action.entry)
            except RuntimeError:  # the pool was shut down: a stop
                with self._cond:
                    self._plan.not_submitted(action.entry.call_id)

    def _send_one(self, entry: OutboxEntry) -> None:
        """On a sender thread: one request, its result handed to the loop."""
        with self._cond:
            refused = self._plan.begin_send(entry, self._now())
            if refused is not None:
                self._cond.notify_all()
        if refused == "lapsed":
            _LOGGER.warning(
                "outbox: call %s not sent: its sender lease (until %s) is (nearly) over, "
                "this process was held up since the claim; it is sent by whoever claims "
                "it after the lease", entry.call_id, entry.due_at,
            )
        if refused is not None:
            return
        result: Optional[str] = None
        error: Optional[BaseException] = None
        send = self._send
        assert send is not None
        try:
            params = json.loads(entry.params_json)
            self._wait_for_slot(entry, params)
            result = json.dumps(send_call(send, entry, params), ensure_ascii=False,
                                separators=(",", ":"), default=_json_default)
        except BaseException as exc:  # noqa: B036 - every failure is decided, none lost
            error = exc
        if error is None and result:
            self._note_sent(entry, result)
        elif error is not None and self._pacer is not None:
            seconds = retry_after_seconds(error)
            if seconds is not None:  # announced at once: the others stop within the hold
                self._hold_in_store(self._now() + int(seconds * 1000))
        with self._cond:
            self._plan.send_ended(entry, result, error, time.monotonic())
            self._cond.notify_all()

    def _wait_for_slot(self, entry: OutboxEntry, params: Dict[str, Any]) -> None:
        """Wait for the send's slot in the pace of every process (``outbox_pacing``).

        Raises:
            PacedBack: The slot is further away than a sender waits. The call goes back.
            Exception: The store's error. The send is then retried as any failed try.
        """
        pacer = self._pacer
        if pacer is None:
            return
        buckets = pacer.buckets(entry.method, params, entry.chat_key)
        if not buckets:
            return
        while True:
            at = pacer.slot(buckets)
            now = self._now()
            if at <= now + HORIZON_MS:
                if at > now:
                    time.sleep((at - now) / 1000.0)
                if self._now() - at <= LATE_MS:
                    return
                continue  # held up past its slot: it is given up, and the send asks again
            paced = pacer.deferred(buckets, at)
            if not paced.bot_wide or at - now > BOT_WAIT_MS or self._plan.stopping:
                raise paced  # a chat's pace or a hold: the sender serves others meanwhile
            # the bot at its pace: every call waits alike, so this one waits here
            time.sleep((at - now - HORIZON_MS // 2) / 1000.0)

    def _paced_back(self, entry: OutboxEntry, paced: PacedBack) -> None:
        """Give a call back unsent, due at its slot, its try not counted."""
        try:
            self._stats.timed("outbox", self._port.release_calls, [entry.call_id],
                              self._plan.sender, paced.until)
        except Exception as exc:  # its lease lapses and it is claimed again
            self._report(exc, "outbox")
        with self._cond:
            self._plan.paced_back(paced.until, paced.bot_wide)
        _LOGGER.debug("outbox: call %s (chat %s) waits for its slot at %s%s", entry.call_id,
                      entry.chat_key, paced.until, " (the whole bot)" if paced.bot_wide else "")

    def _hold_in_store(self, due_at: int) -> None:
        """A ``RetryAfter`` holds the whole bot in the store: every process sharing it waits it
        out. The answer's own call is retried at ``due_at`` as well."""
        pacer = self._pacer
        if pacer is None:
            return
        try:
            for key in pacer.hold_keys():
                pacer.hold(key, due_at)
        except Exception as exc:  # this process holds all the same, and the retry holds the call
            self._report(exc, "outbox")

    def _note_sent(self, entry: OutboxEntry, result: str) -> None:
        """Journal a sent call on the sender thread, right after Telegram's answer.

        A store with a sent journal (SQLite) records the call at once, whatever transaction
        holds its write lock. So the send window stays the answer plus that one short commit.
        The grouped record follows as usual, and the journal is folded into it."""
        try:
            noted = self._port.note_sent(
                [(entry.call_id, self._plan.sender, result, self._now())]
            )
        except Exception as exc:  # the grouped record still records it
            self._report(exc, "outbox")
            return
        if noted:  # readers see it sent from now on: so do the stats
            self._stats.calls_sent(1)
            with self._cond:
                self._plan.note(entry.call_id)

    # -- outcomes ------------------------------------------------------------------------------
    def _record(self, done: Sequence[Done]) -> bool:
        """Record what ended: the sent calls in one commit that also claims the calls in
        turn now (a chat's next call among them), then each failure's decision. Whether
        that claim took every call in turn (nothing else is due until the next change)."""
        if not done:
            self._flush_unrecorded()
            return False
        with self._cond:
            self._plan.results(done, self._now())
        swept = self._flush_unrecorded(claim=True)
        failed = False
        for entry, _, error in done:
            if error is not None:
                failed = True
                self._failed_send(entry, error)
        with self._cond:
            return self._plan.results_recorded(done, swept, failed)

    def _flush_unrecorded(self, claim: bool = False) -> bool:
        """Record the sent calls in one commit (kept for the next round if it fails: until
        the sender lease lapses nobody else sends them). ``claim``: the same commit claims
        as many calls as there is room for, and they are started. Whether that claim ran and
        was not full (it took every call in turn)."""
        now = self._now()
        with self._cond:
            record = self._plan.record(claim and self._send is not None, now,
                                       time.monotonic())
        if record is None:
            return False
        try:
            landed, claimed = self._stats.timed(
                "outbox", self._port.record_sent_and_claim, list(record.items), now=now,
                lease_until=self._options.lease_deadline(now), limit=record.limit,
                sender=self._plan.sender,
            )
        except Exception as exc:
            self._report(exc, "outbox")
            with self._cond:
                self._plan.record_failed(record)
            return False
        with self._cond:
            self._stats.calls_sent(self._plan.recorded(record, landed, claimed))
        for (call_id, *_), ok in zip(record.items, landed):
            if not ok:
                _LOGGER.warning(
                    "outbox: call %s was sent but its sender lease had lapsed and another "
                    "sender holds it: it may be sent twice", call_id,
                )
        if claimed:
            self._start(claimed, now)
        return record.took_all(len(claimed))

    def _failed_send(self, entry: OutboxEntry, error: BaseException) -> None:
        if isinstance(error, PacedBack):
            self._paced_back(entry, error)
            return
        with self._cond:
            decided = self._plan.send_failed(entry, error, self._now())
        if isinstance(decided, Fail):
            self._fail(entry, decided.error)
            return
        decision = decided.decision
        if retry_after_seconds(error) is not None and self._pacer is not None:
            # the chats are paced within their limits, so a RetryAfter is the bot's: every
            # chat of every process waits it out, as PTB's AIORateLimiter pauses every request
            # (the sender thread announced the hold in the store as the answer came)
            decision = decision._replace(hold_all=True)
            with self._cond:
                self._plan.paced_back(decided.due_at, True)
        try:
            landed = self._stats.timed(
                "outbox", self._port.retry_call, entry.call_id, self._plan.sender,
                due_at=decided.due_at, error=decision.error,
            )
        except Exception as exc:
            self._report(exc, "outbox")
            return
        if landed:
            self._stats.calls_retried(1)
            with self._cond:
                self._plan.retry_set(decided.due_at)
        _LOGGER.info(
            "outbox: %s call %s (chat %s) %s; retried in %.1f s%s", entry.method,
            entry.call_id, entry.chat_key,
            "left without an answer" if decision.unknown else "was not sent",
            decision.delay_seconds,
            " (every chat held: a flood limit)" if decision.hold_all else "",
            extra=event("outbox_send_retried", call_id=entry.call_id, error=decision.error),
        )

    def _fail(self, entry: OutboxEntry, text: str) -> None:
        now = self._now()
        try:
            landed = self._stats.timed(
                "outbox", self._port.fail_call, entry.call_id, self._plan.sender, at=now,
                error=text,
            )
        except Exception as exc:
            self._report(exc, "outbox")
            return
        if not landed:
            return
        self._stats.calls_failed(1)
        _LOGGER.warning(
            "outbox: %s call %s of update %s (chat %s) failed, not retried: %s",
            entry.method, entry.call_id, entry.update_id, entry.chat_key, text,
            extra=event("outbox_call_failed", call_id=entry.call_id, update_id=entry.update_id,
                        attempt=entry.attempt, claim_id=entry.claim_id),
        )
        if self._options.handle_send_failure is None:
            try:  # nobody to tell: the WARNING was the report, prunable from now on
                self._port.acknowledge_send_failure(entry.call_id, now)
            except Exception as exc:
                self._report(exc, "outbox")
        else:
            with self._cond:
                self._plan.failed()

    # -- failure delivery ----------------------------------------------------------------------
    def _deliver_failures_soon(self) -> None:
        """Deliver due failures to ``handle_send_failure`` on a thread of their own.

        So a slow callback never holds the sending. It runs one round at a time.
        A round starts after a failure here, and at every sweep interval. The sweep catches
        failures of other processes and callbacks that raised."""
        with self._cond:
            if not self._plan.delivery_begins():
                return
        thread = threading.Thread(
            target=self._deliver_failures, name="ptb_fence_outbox_failures", daemon=True
        )
        thread.start()

    def _deliver_failures(self) -> None:
        callback = self._options.handle_send_failure
        try:
            if callback is None:
                return
            try:
                page = self._stats.timed(
                    "outbox", self._port.due_send_failures, limit=FAILURE_PAGE,
                    after_call_id=self._failure_cursor,
                )
            except Exception as exc:
                self._report(exc, "outbox")
                return
            self._failure_cursor = page[-1].call_id if len(page) >= FAILURE_PAGE else None
            for entry in page:
                if self._plan.stopping:
                    return
                try:
                    self._run_callback(callback, entry)
                except Exception as exc:
                    _LOGGER.error(
                        "handle_send_failure raised for call %s; it stays due: %s",
                        entry.call_id, error_text(exc), extra={"call_id": entry.call_id},
                    )
                    continue
                try:
                    self._port.acknowledge_send_failure(entry.call_id, self._now())
                except Exception as exc:
                    self._report(exc, "outbox")
        finally:
            with self._cond:
                self._plan.delivery_ended(self._failure_cursor is not None)
                self._cond.notify_all()

    def _run_callback(self, callback: Callable[[OutboxEntry], Any], entry: OutboxEntry) -> None:
        result = callback(entry)
        if not inspect.isawaitable(result):
            return
        import asyncio

        loop = self._loop
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(_awaited(result), loop).result()
        else:
            asyncio.run(_awaited(result))

    @property
    def failures_pending(self) -> bool:
        """:obj:`bool`: A failure delivery is running or due here."""
        return self._plan.delivering or self._plan.failures_due


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _json_default(value: Any) -> Any:
    """A PTB object in a result (a sender that returns de-JSONed objects)."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise TypeError(f"cannot keep a {type(value).__name__} as JSON")
