"""OutboxDispatcher: sends the committed outbox calls, each chat's in order, at least once.

One per process running a fenced front end on an outbox store. The runtime creates it; the
front end gives it ``send(method, params) -> result`` (blocking; PTB: the Application's
``Bot.do_api_request`` run on its event loop, the blocking front end: an httpx client) and
starts it. Its loop runs on a thread of its own:

- on a store with claimed inserts (:class:`~ptb_fence.contract.ClaimedInsertOutboxStore`)
  the commit that completes an update claims its calls for this sender already
  (:meth:`OutboxDispatcher.claim_effects` gives the terms, at most as many calls as there are
  free senders): the dispatcher reads them (no commit) and sends them, and claims with a
  commit only what such a commit left ``pending`` (its chat had an unsent call, no free
  sender) and what others left;
- it claims calls (``claim_calls`` under a sender token and a lease of ``lease_seconds``; the
  store gives a chat's calls one at a time, in commit order, across processes), at most
  twice as many as it has senders (``outbox_concurrency``) claimed and not ended, and while
  every sender is busy only a whole round of them at once: a claimed call waits at most one
  round of sends for a sender, well inside its lease;
- it is woken in-process right after a commit that carried calls and right after the calls
  of a provably dead process were taken over (its token names the store instance it holds
  liveness under: the takeover of that instance's updates takes its calls too), and
  otherwise looks every ``sweep_every_seconds`` (leases that lapsed) and when a retry it
  scheduled falls due;
- results are recorded ``sent`` in groups: at most one ``record_sent`` commit per
  :data:`RECORD_WINDOW` seconds, none waiting longer than that (a result after a quiet
  spell is recorded at once; at once too when a later call of the chat waits or a stop
  comes); failures are retried or failed by
  :func:`~ptb_fence.runtime._send_outcome.decide`;
- calls older than ``outbox_max_age_seconds`` end failed as expired, unsent;
- failed calls are delivered to ``handle_send_failure`` (at least once; acknowledged when it
  returns), or acknowledged at once without one;
- a stop claims nothing more, waits for the requests in flight and the completions whose
  commits claim calls for it (bounded), records the results, and releases at once every call
  still claimed by it that it did not start sending.
"""

from __future__ import annotations

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
from ptb_fence.runtime._backoff import Backoff
from ptb_fence.runtime._daemon_pool import DaemonThreadPool
from ptb_fence.runtime._held_call import HeldCall
from ptb_fence.runtime._options import RuntimeOptions
from ptb_fence.runtime._outcome import error_text
from ptb_fence.runtime._port import StorePort
from ptb_fence.runtime._send_outcome import decide, retry_after_seconds
from ptb_fence.runtime._stats import RuntimeStats
from ptb_fence.stores._outbox_sql import sender_token

if TYPE_CHECKING:
    import asyncio  # imported where used: import ptb_fence stays light

__all__ = ["FAILURE_PAGE", "RECORD_WINDOW", "ClaimReservation", "OutboxDispatcher", "Send",
           "no_outbox"]

_LOGGER = logging.getLogger("ptb_fence.outbox")

Send = Callable[[str, Dict[str, Any]], Any]
"""``send(method, params) -> result``: one Bot API call (blocking); raises
``telegram.error`` exceptions as python-telegram-bot's ``Bot`` does."""

FAILURE_PAGE = 100
"""Failed calls delivered per page."""

RECORD_WINDOW = 0.1
"""Seconds a sent call's result may wait to be recorded with the results that end after it
(one commit for the group), and the least time between two such commits: under load the
records cost one commit per window whatever the rate, while a lone reply is recorded at
once. A sender that dies in that time leaves the call to be sent again
after its lease, as one that dies between Telegram's answer and the record does; Telegram
takes about one message a second per chat, so a chat's next call waiting for the record is
not slowed noticeably, and such a wait records at once anyway."""

_CLAIM_AHEAD = 2
"""Completion commits claim calls for at most this many times ``outbox_concurrency`` calls
claimed and not ended (sending, or waiting for a sender)."""

_READ_ALL = 10_000
"""At most this many of its claimed calls are read back at once (those being sent, waiting
to be recorded and claimed at insert: far fewer in practice)."""

_FLOOD_CHATS = 3
"""``RetryAfter`` answers for this many different chats within one hold mean a flood limit of
the whole bot: every chat is held until it ends."""

_CallKey = Tuple[int, int, str, int]
_Done = Tuple[OutboxEntry, Optional[str], Optional[BaseException]]
"""A call whose request ended: the entry, its result's JSON text or the error raised."""


class ClaimReservation:
    """Senders set aside for the calls one completion commit claims at insert.

    Attributes:
        slots (:obj:`int`): The senders reserved (the claims' limits summed).
        keys (Dict[_CallKey, Optional[int]]): Per call that may be inserted claimed, its chat.
    """

    __slots__ = ("keys", "slots")

    def __init__(self) -> None:
        self.slots = 0
        self.keys: Dict[_CallKey, Optional[int]] = {}


def no_outbox(store: object) -> str:
    """The TypeError text for ``attempt.outbox`` on a store without the outbox."""
    return (
        f"{type(store).__name__} has no outbox (OutboxStore: {', '.join(OUTBOX_METHODS)}): "
        "attempt.outbox needs a store that keeps Bot API calls (SQLiteUpdateStore, "
        "PostgresUpdateStore, MemoryUpdateStore)"
    )


def _key(entry: OutboxEntry) -> _CallKey:
    return (entry.update_id, entry.attempt, entry.claim_id, entry.seq)


class OutboxDispatcher:
    """The sender of one process's outbox.

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
        "_behind",
        "_claim_keys",
        "_claims_open",
        "_cond",
        "_defaults",
        "_delivering",
        "_done",
        "_done_since",
        "_ended",
        "_failure_cursor",
        "_failures_due",
        "_flood",
        "_held",
        "_last_record",
        "_hold_until",
        "_inflight",
        "_loop",
        "_next_retry",
        "_noted",
        "_options",
        "_pool",
        "_prepare",
        "_port",
        "_read_at",
        "_read_backoff",
        "_read_due",
        "_report",
        "_reserved",
        "_seen",
        "_send",
        "_sender",
        "_sender_missing",
        "_started",
        "_stats",
        "_stop_deadline",
        "_stopping",
        "_thread",
        "_unrecorded",
        "_unsent",
        "_woken",
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
        self._send: Optional[Send] = None
        self._loop: "Optional[asyncio.AbstractEventLoop]" = None
        self._sender = ""
        self._thread: Optional[threading.Thread] = None
        self._pool: Optional[DaemonThreadPool] = None
        self._stopping = False
        self._stop_deadline = 0.0  # monotonic: when a stop stops waiting for requests
        self._woken = False
        self._inflight: Dict[int, OutboxEntry] = {}  # claimed here, not yet ended
        self._started: "set[int]" = set()  # of those, the ones whose request began
        self._done: List[_Done] = []
        self._done_since = 0.0  # monotonic: when the oldest unrecorded result ended
        self._last_record = 0.0  # monotonic: when results were last recorded
        # calls claimed at insert by completion commits (claim_effects .. claims_ended)
        self._reserved = 0  # senders set aside for them
        self._claims_open = 0  # such commits not ended yet
        self._ended: List[Tuple[ClaimReservation, "set[_CallKey]"]] = []  # ended, not read
        self._claim_keys: Dict[_CallKey, Optional[int]] = {}  # may be inserted claimed
        self._seen: "set[_CallKey]" = set()  # read back claimed
        self._read_due = False
        self._read_at = 0.0  # monotonic: when a read that failed is tried again
        self._read_backoff = Backoff()
        self._held: "set[int]" = set()  # claimed by this run and not given up here yet
        self._behind: Dict[Optional[int], int] = {}  # chat -> calls left pending behind ours
        self._unsent: List[int] = []  # claimed, never started (a stop came first)
        self._unrecorded: List[Tuple[int, str, str, int]] = []  # sent; record_sent failed
        self._noted: "set[int]" = set()  # sent, in the store's sent journal, counted
        self._next_retry: Optional[int] = None  # epoch ms of the earliest retry set here
        self._hold_until = 0  # epoch ms: a flood limit of the whole bot holds every chat
        self._flood: Dict[Optional[int], int] = {}  # chat -> end of its RetryAfter hold
        self._failures_due = True
        self._failure_cursor: Optional[int] = None
        self._delivering = False
        self._awaiting: "weakref.WeakValueDictionary[_CallKey, HeldCall]" = (
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
        """Make ``attempt.outbox`` refuse with ``why`` (the front end cannot send);
        :obj:`None` allows it again."""
        self._sender_missing = why

    def refusal(self) -> Optional[str]:
        """Why calls cannot be queued here, or :obj:`None`."""
        return self._sender_missing

    @property
    def running(self) -> bool:
        """:obj:`bool`: The loop runs (started, not stopped)."""
        thread = self._thread
        return thread is not None and thread.is_alive() and not self._stopping

    @property
    def sender_token(self) -> str:
        """:obj:`str`: The token this dispatcher claims calls under (new at each start)."""
        return self._sender

    def start(self, send: Send, *, loop: "Optional[asyncio.AbstractEventLoop]" = None) -> None:
        """Start sending with ``send`` (``loop``: the event loop an async
        ``handle_send_failure`` runs on; :obj:`None`: :func:`asyncio.run`). Idempotent while
        running."""
        if self.running:
            return
        self._send = send
        self._loop = loop
        # the store instance this process holds liveness under, in the token: when the
        # process dies, the takeover of its updates makes its calls claimable too
        self._sender = sender_token(
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}",
            self._port.held_instance,
        )
        self._stopping = False
        self._woken = True  # a first claim at once: calls left by a previous run
        self._reserved, self._claims_open, self._ended = 0, 0, []
        self._claim_keys, self._seen, self._held, self._behind = {}, set(), set(), {}
        self._noted = set()
        self._read_due = False
        self._failures_due = True
        self._pool = DaemonThreadPool(self._options.outbox_concurrency, "ptb_fence_outbox")
        self._thread = threading.Thread(target=self._run, name="ptb_fence_outbox", daemon=True)
        self._thread.start()

    def wake(self, handles: Sequence[HeldCall] = ()) -> None:
        """A commit carrying calls landed: send them now (``handles``: held calls whose ids
        this process learns when it claims them)."""
        claim = not handles
        for handle in handles:
            key = (handle.identity.update_id, handle.identity.attempt,
                   handle.identity.claim_id, handle.seq)
            if handle.call_id is None:
                self._awaiting[key] = handle
            if key not in self._claim_keys:  # inserted pending: claimed with a commit
                claim = True
        if not claim:  # claimed in the commit: read back at claims_ended
            return
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    # -- claims at insert (a completion's commit claims its calls for this sender) ------------
    def claim_effects(
        self, effects: Mapping[AttemptIdentity, AttemptEffects]
    ) -> Tuple[Dict[AttemptIdentity, AttemptEffects], Optional[ClaimReservation]]:
        """For a completion about to commit ``effects``: the same effects with a
        :class:`~ptb_fence.CallClaim` for as many calls as there are free senders (set aside
        until :meth:`claims_ended`), and the reservation; ``effects`` unchanged and
        :obj:`None` when nothing can be claimed (not running, stopping, no free sender, a
        store without claimed inserts). Call :meth:`claims_ended` after the commit whatever
        its outcome when a reservation was given."""
        if not self._port.has_claimed_inserts:
            return dict(effects), None
        with self._cond:
            if (self._stopping or self._send is None or not self.running
                    or self._now() < self._hold_until):  # a flood hold: nothing sent now
                return dict(effects), None
            # a claimed call waits at most one round of sends for a sender: well inside
            # its lease, and a flood hold refuses claims (above)
            free = (_CLAIM_AHEAD * self._options.outbox_concurrency - len(self._inflight)
                    - self._reserved)
            if free <= 0:
                return dict(effects), None
            reservation = ClaimReservation()
            lease_until = self._options.lease_deadline(self._now())
            claimed: Dict[AttemptIdentity, AttemptEffects] = {}
            for identity, held in effects.items():
                limit = min(free - reservation.slots, len(held.calls))
                if limit <= 0:
                    claimed[identity] = held
                    continue
                # the same effects (its persisted state too), the first calls claimed
                claimed[identity] = AttemptEffects(
                    calls=held.calls, claim=CallClaim(self._sender, lease_until, limit),
                    state=held.state,
                )
                reservation.slots += limit
                for call in held.calls[:limit]:
                    key = (identity.update_id, identity.attempt, identity.claim_id, call.seq)
                    reservation.keys[key] = call.chat_key
            if not reservation.slots:
                return claimed, None
            self._reserved += reservation.slots
            self._claims_open += 1
            self._claim_keys.update(reservation.keys)
            return claimed, reservation

    def claims_ended(
        self, reservation: Optional[ClaimReservation], landed: Sequence[AttemptIdentity]
    ) -> None:
        """The commit of ``reservation`` ended (``landed``: the identities whose completion
        landed; none when it failed): read back what it claimed."""
        if reservation is None:
            return
        ids = {(i.update_id, i.attempt, i.claim_id) for i in landed}
        with self._cond:
            self._claims_open -= 1
            self._ended.append((reservation, {k for k in reservation.keys if k[:3] in ids}))
            self._read_due = True
            self._cond.notify_all()

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
            self._stopping = True
            self._stop_deadline = deadline
            self._cond.notify_all()
            # the requests in flight finish (or the bound passes)
            while self._started and time.monotonic() < deadline:
                self._cond.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            left = sorted(self._started)
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

    def _claim_room(self) -> int:
        """How many calls a claim takes now (under the condition's lock): while a sender is
        free, up to :data:`_CLAIM_AHEAD` times ``outbox_concurrency`` claimed and not ended;
        while all are busy, nothing until that room is a whole round of sends (one claim
        commit per round, not per freed sender), so the senders never run dry."""
        concurrency = self._options.outbox_concurrency
        room = _CLAIM_AHEAD * concurrency - len(self._inflight) - self._reserved
        if len(self._inflight) >= concurrency and room < concurrency:
            return 0
        return max(room, 0)

    def _record_at(self) -> float:
        """When the results that ended are due to be recorded (monotonic; under the
        condition's lock): a window after the last record, or after the oldest of them
        ended if that is sooner (no result waits longer than a window)."""
        return min(self._done_since, self._last_record) + RECORD_WINDOW

    def _record_due(self, mono: float) -> bool:
        """Whether the results that ended are recorded now (under the condition's lock)."""
        if not self._done:
            return False
        return mono >= self._record_at() or any(
            self._behind.get(entry.chat_key) for entry, _, _ in self._done
        )

    def _run(self) -> None:
        poll_ms = int(self._options.sweep_every_seconds * 1000)
        next_poll = 0  # epoch ms; 0: claim at once
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        break
                    now = self._now()
                    mono = time.monotonic()
                    if self._record_due(mono) or (self._read_due and mono >= self._read_at):
                        break
                    free = self._claim_room()
                    held = now < self._hold_until
                    due = self._woken or now >= next_poll or (
                        self._next_retry is not None and now >= self._next_retry
                    )
                    if free > 0 and due and not held:
                        break
                    wake_at = self._hold_until if held else min(
                        next_poll, self._next_retry or next_poll
                    )
                    wait = max(0.001, min((wake_at - now) / 1000.0, 1.0))
                    if self._done:
                        wait = min(wait, max(0.001, self._record_at() - mono))
                    if self._read_due:  # a read that failed: again after its back-off
                        wait = min(wait, max(0.001, self._read_at - mono))
                    self._cond.wait(wait)
                stopping = self._stopping
                done: List[_Done] = []
                if stopping or self._record_due(time.monotonic()):
                    done, self._done = self._done, []
                read = self._read_due and time.monotonic() >= self._read_at
                self._read_due = self._read_due and not read
                now = self._now()
                claim = (
                    self._woken or now >= next_poll
                    or (self._next_retry is not None and now >= self._next_retry)
                )
                self._woken = False
            try:
                swept = self._record(done)
                if stopping:
                    self._finish_stop()
                    return
                if read:
                    self._read_claimed()
                with self._cond:
                    if swept:  # the record's commit claimed every call in turn: what woke
                        # this round before it is served; a sweep round stays due
                        claim = self._now() >= next_poll
                    claim = claim or self._woken
                    self._woken = False
                # a recorded call may have been what a pending call of its chat waited for,
                # another process's too (not woken by this one): claim if any call is pending
                # (a read; a claim is a commit)
                if not claim and done and not swept:
                    claim = self._pending_exists()
                if not claim:
                    continue
                now = self._now()
                if now < self._hold_until:  # claim the moment the hold ends
                    next_poll = min(next_poll, self._hold_until)
                    continue
                if self._next_retry is not None and now >= self._next_retry:
                    self._next_retry = None
                sweep = now >= next_poll
                if sweep:  # a sweep round: failures of other processes too
                    self._failures_due = True
                    if self._port.has_claimed_inserts:  # and any claimed call not read back
                        self._read_claimed()
                full = self._claim_and_send(sweep)
                next_poll = now if full else (now + poll_ms if sweep else next_poll)
                self._deliver_failures_soon()
            except Exception:  # never let the loop die: the next round tries again
                _LOGGER.exception("outbox: the sender loop failed; it goes on")
                next_poll = self._now() + 1000

    def _pending_exists(self) -> bool:
        """Whether the store has a call ``pending`` (a read; on an error: assume so)."""
        try:
            return bool(self._stats.timed(
                "outbox", self._port.list_calls, state="pending", limit=1
            ))
        except Exception as exc:
            self._report(exc, "outbox")
            return True

    def _read_claimed(self) -> None:
        """Read back the calls completion commits claimed for this sender and send them;
        what an ended commit left pending waits behind its chat's call, or is claimed now."""
        with self._cond:
            ended, self._ended = self._ended, []
        try:  # all of them: those being sent or waiting to be recorded come first
            entries = self._stats.timed(
                "outbox", self._port.claimed_calls, self._sender, limit=_READ_ALL
            )
        except Exception as exc:
            self._report(exc, "outbox")
            with self._cond:  # read again after a back-off (at once: a busy loop in an outage)
                self._ended = ended + self._ended
                self._read_due = True
                self._read_at = time.monotonic() + self._read_backoff.failed()
            return
        self._read_backoff.answered()
        now = self._now()
        margin = int(self._options.lease_seconds * 500)
        fresh = []
        with self._cond:
            for entry in entries:
                key = _key(entry)
                if entry.call_id in self._held:
                    continue
                if entry.due_at - now < margin:  # too little lease left: claimed afresh later
                    continue
                self._held.add(entry.call_id)
                self._seen.add(key)
                fresh.append(entry)
            claim_now = False
            for reservation, landed in ended:
                self._reserved -= reservation.slots
                for key, chat in reservation.keys.items():
                    self._claim_keys.pop(key, None)
                    seen = key in self._seen
                    self._seen.discard(key)
                    if key not in landed or seen:
                        continue
                    # inserted pending: its chat had an unsent call
                    if any(e.chat_key == chat for e in self._inflight.values()) or any(
                        e.chat_key == chat for e in fresh
                    ):
                        self._behind[chat] = self._behind.get(chat, 0) + 1
                    else:  # behind another sender's call (whose record claims it next,
                        claim_now = True  # see _pending_exists), or a sender is free now
            if claim_now:
                self._woken = True
        self._start(fresh, now)

    def _finish_stop(self) -> None:
        """The loop's last round: wait (bounded by :meth:`stop`) for the requests in flight
        and the commits claiming calls for it, record the results, release every call it
        still holds that it did not start."""
        with self._cond:
            deadline = self._stop_deadline
            while (self._started or self._claims_open) and time.monotonic() < deadline:
                self._cond.wait(0.05)
            done, self._done = self._done, []
            started = set(self._started)
            unsent, self._unsent = self._unsent, []
            # claimed and handed to a sender thread that has not begun: never begins now
            unsent.extend(cid for cid in self._inflight if cid not in self._started)
        self._record(done)
        self._flush_unrecorded()
        if self._port.has_claimed_inserts:  # and what commits claimed for it, read or not
            try:
                mine = self._stats.timed(
                    "outbox", self._port.claimed_calls, self._sender, limit=_READ_ALL
                )
            except Exception as exc:
                self._report(exc, "outbox")
            else:
                with self._cond:
                    unrecorded = {item[0] for item in self._unrecorded}
                unsent.extend(e.call_id for e in mine
                              if e.call_id not in started and e.call_id not in unrecorded)
        if unsent:
            try:
                landed = self._stats.timed(
                    "outbox", self._port.release_calls, sorted(set(unsent)), self._sender,
                    self._now(),
                )
            except Exception as exc:
                self._report(exc, "outbox")
            else:
                _LOGGER.info("outbox: %d claimed call(s) given back at the stop", sum(landed))

    def _claim_and_send(self, sweep: bool = True) -> bool:
        """Claim as many calls as there are free senders and start them; whether the claim
        was full (more may be due at once). ``sweep``: a sweep round (a claim that is not
        full forgets the calls it knew waiting behind its chats: the next sweeps take them)."""
        with self._cond:
            free = self._claim_room()
            if free <= 0:  # still due: claimed when a sender is free
                self._woken = True
        if free <= 0 or self._send is None:
            return False
        now = self._now()
        try:
            claimed = self._stats.timed(
                "outbox", self._port.claim_calls, now=now,
                lease_until=self._options.lease_deadline(now), limit=free, sender=self._sender,
            )
        except Exception as exc:
            self._report(exc, "outbox")
            return False
        with self._cond:
            self._held.update(entry.call_id for entry in claimed)
            if sweep and len(claimed) < free:
                self._behind = {}
        self._start(claimed, now)
        return len(claimed) >= free

    def _start(self, claimed: Sequence[OutboxEntry], now: int) -> None:
        """Hand calls claimed by this sender to the sender threads (expired ones fail)."""
        max_age = int(self._options.outbox_max_age_seconds * 1000)
        pool = self._pool
        for entry in claimed:
            handle = self._awaiting.pop(_key(entry), None)
            if handle is not None:
                handle.resolve(entry.call_id)
            if entry.created_at < now - max_age:
                self._fail(entry, f"expired: queued more than "
                                  f"{self._options.outbox_max_age_seconds:g} s ago, never sent")
                continue
            with self._cond:
                self._inflight[entry.call_id] = entry
            assert pool is not None
            try:
                pool.submit(self._send_one, entry)
            except RuntimeError:  # the pool was shut down: a stop
                with self._cond:
                    self._inflight.pop(entry.call_id, None)
                    self._unsent.append(entry.call_id)

    def _send_one(self, entry: OutboxEntry) -> None:
        """On a sender thread: one request, its result handed to the loop."""
        with self._cond:
            if self._stopping:
                self._inflight.pop(entry.call_id, None)
                self._unsent.append(entry.call_id)
                self._cond.notify_all()
                return
            # a sender paused (SIGSTOP, a frozen VM) between the claim and here may have lost
            # the call to another sender meanwhile: a request is begun only while the lease
            # still has a quarter of its length left, room for the request itself
            room = int(self._options.lease_seconds * 250)
            if self._now() > entry.due_at - room:
                self._inflight.pop(entry.call_id, None)
                self._held.discard(entry.call_id)
                self._cond.notify_all()
                _LOGGER.warning(
                    "outbox: call %s not sent: its sender lease (until %s) is (nearly) over, "
                    "this process was held up since the claim; it is sent by whoever claims "
                    "it after the lease", entry.call_id, entry.due_at,
                )
                return
            self._started.add(entry.call_id)
        result: Optional[str] = None
        error: Optional[BaseException] = None
        send = self._send
        assert send is not None
        try:
            params = json.loads(entry.params_json)
            result = json.dumps(send(entry.method, params), ensure_ascii=False,
                                separators=(",", ":"), default=_json_default)
        except BaseException as exc:  # noqa: B036 - every failure is decided, none lost
            error = exc
        if error is None and result:
            self._note_sent(entry, result)
        with self._cond:
            self._started.discard(entry.call_id)
            self._inflight.pop(entry.call_id, None)
            if not self._done:
                self._done_since = time.monotonic()
            self._done.append((entry, result, error))
            self._cond.notify_all()

    def _note_sent(self, entry: OutboxEntry, result: str) -> None:
        """On the sender thread, right after Telegram's answer: a store with a sent journal
        (SQLite) records the call at once, whatever transaction holds its write lock, so the
        send window stays the answer plus that one short commit. The grouped record follows
        as usual (the journal is folded into it)."""
        try:
            noted = self._port.note_sent([(entry.call_id, self._sender, result, self._now())])
        except Exception as exc:  # the grouped record still records it
            self._report(exc, "outbox")
            return
        if noted:  # readers see it sent from now on: so do the stats
            self._stats.calls_sent(1)
            with self._cond:
                self._noted.add(entry.call_id)

    # -- outcomes ------------------------------------------------------------------------------
    def _record(self, done: Sequence[_Done]) -> bool:
        """Record what ended: the sent calls in one commit that also claims the calls in
        turn now (a chat's next call among them), then each failure's decision. Whether
        that claim took every call in turn (nothing else is due until the next change)."""
        if not done:
            self._flush_unrecorded()
            return False
        now = self._now()
        sent = [(e.call_id, self._sender, r, now) for e, r, err in done if err is None and r]
        self._unrecorded.extend(sent)
        swept = self._flush_unrecorded(claim=True)
        failed = False
        for entry, _, error in done:
            if error is not None:
                failed = True
                self._failed_send(entry, error)
        with self._cond:
            unrecorded = {item[0] for item in self._unrecorded}
            for entry, _, _ in done:
                if entry.call_id not in unrecorded:
                    self._held.discard(entry.call_id)
                behind = self._behind.get(entry.chat_key, 0)
                if behind:  # the chat's next call is in turn now
                    if not swept or failed:  # not claimed with the record: claim it now
                        self._woken = True
                    if behind > 1:
                        self._behind[entry.chat_key] = behind - 1
                    else:
                        del self._behind[entry.chat_key]
        return swept and not failed

    def _flush_unrecorded(self, claim: bool = False) -> bool:
        """Record the sent calls in one commit (kept for the next round if it fails: until
        the sender lease lapses nobody else sends them). ``claim``: the same commit claims
        as many calls as there is room for, and they are started; whether that claim ran and
        was not full (it took every call in turn)."""
        items, self._unrecorded = self._unrecorded, []
        if not items:
            return False
        with self._cond:
            room = 0 if not claim or self._stopping or self._send is None else (
                self._claim_room())
        now = self._now()
        if room > 0 and now < self._hold_until:  # a flood hold: nothing is claimed now
            room = 0
        self._last_record = time.monotonic()
        try:
            landed, claimed = self._stats.timed(
                "outbox", self._port.record_sent_and_claim, items, now=now,
                lease_until=self._options.lease_deadline(now), limit=room,
                sender=self._sender,
            )
        except Exception as exc:
            self._report(exc, "outbox")
            self._unrecorded = items + self._unrecorded
            return False
        with self._cond:
            noted = self._noted
            self._stats.calls_sent(sum(1 for (call_id, *_), ok in zip(items, landed)
                                       if ok and call_id not in noted))
            noted.difference_update(item[0] for item in items)
            self._held.difference_update(item[0] for item in items)
            self._held.update(entry.call_id for entry in claimed)
        for (call_id, *_), ok in zip(items, landed):
            if not ok:
                _LOGGER.warning(
                    "outbox: call %s was sent but its sender lease had lapsed and another "
                    "sender holds it: it may be sent twice", call_id,
                )
        if claimed:
            self._start(claimed, now)
        return room > 0 and len(claimed) < room

    def _failed_send(self, entry: OutboxEntry, error: BaseException) -> None:
        now = self._now()
        decision = decide(entry, error, global_hold=self._flooded(entry, error, now))
        if decision.fail:
            self._fail(entry, decision.error)
            return
        due_at = now + int(decision.delay_seconds * 1000)
        if decision.hold_all:
            self._hold_until = max(self._hold_until, due_at)
        try:
            landed = self._stats.timed(
                "outbox", self._port.retry_call, entry.call_id, self._sender,
                due_at=due_at, error=decision.error,
            )
        except Exception as exc:
            self._report(exc, "outbox")
            return
        if landed:
            self._stats.calls_retried(1)
            if self._next_retry is None or due_at < self._next_retry:
                self._next_retry = due_at
        _LOGGER.info(
            "outbox: %s call %s (chat %s) %s; retried in %.1f s%s", entry.method,
            entry.call_id, entry.chat_key,
            "left without an answer" if decision.unknown else "was not sent",
            decision.delay_seconds,
            " (every chat held: a flood limit)" if decision.hold_all else "",
            extra=event("outbox_send_retried", call_id=entry.call_id, error=decision.error),
        )

    def _flooded(self, entry: OutboxEntry, error: BaseException, now: int) -> bool:
        """Whether a ``RetryAfter`` means a flood limit of the whole bot: it came for a call
        of no chat, or for :data:`_FLOOD_CHATS` chats whose holds overlap."""
        if "RetryAfter" not in {c.__name__ for c in type(error).__mro__}:
            return False
        if entry.chat_key is None:
            return True
        seconds = retry_after_seconds(error) or 0.0
        self._flood = {chat: until for chat, until in self._flood.items() if until > now}
        self._flood[entry.chat_key] = now + int(seconds * 1000)
        return len(self._flood) >= _FLOOD_CHATS

    def _fail(self, entry: OutboxEntry, text: str) -> None:
        now = self._now()
        try:
            landed = self._stats.timed(
                "outbox", self._port.fail_call, entry.call_id, self._sender, at=now, error=text
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
            try:  # nobody to tell: the WARNING was the report; prunable from now on
                self._port.acknowledge_send_failure(entry.call_id, now)
            except Exception as exc:
                self._report(exc, "outbox")
        else:
            self._failures_due = True

    # -- failure delivery ----------------------------------------------------------------------
    def _deliver_failures_soon(self) -> None:
        """Deliver due failures to ``handle_send_failure`` on a thread of their own (a slow
        callback never holds the sending), one round at a time: after a failure here, and
        at every sweep interval (failures of other processes, callbacks that raised)."""
        if self._options.handle_send_failure is None:
            return
        with self._cond:
            if self._delivering or not self._failures_due:
                return
            self._delivering = True
            self._failures_due = False
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
                if self._stopping:
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
                self._delivering = False
                if self._failure_cursor is not None:
                    self._failures_due = True
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
        return self._delivering or self._failures_due


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _json_default(value: Any) -> Any:
    """A PTB object in a result (a sender that returns de-JSONed objects)."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise TypeError(f"cannot keep a {type(value).__name__} as JSON")
