"""DispatchPlan: what the outbox dispatcher does next, decided without threads, clocks or stores.

The dispatcher (:mod:`~ptb_fence.runtime._dispatcher`) holds one under its condition's lock.
It tells the plan what happened (calls claimed, a send ended, a commit carried calls, a store
error, a stop) with the times it read, and performs what the plan answers (waits, claims,
records, sends, releases). Two clocks are passed in: ``now`` in store units (epoch ms, the
options' clock) and ``mono`` in monotonic seconds (the record window and back-offs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ptb_fence._values import OutboxEntry
from ptb_fence.runtime._backoff import Backoff
from ptb_fence.runtime._send_outcome import SendDecision, decide, retry_after_seconds

__all__ = [
    "CLAIM",
    "LOOK",
    "REST",
    "RECORD_WINDOW",
    "ClaimReservation",
    "DispatchPlan",
    "Expire",
    "Fail",
    "Record",
    "Retry",
    "Round",
    "Send",
    "StopTake",
    "Wait",
]

RECORD_WINDOW = 0.1
"""Seconds a sent call's result may wait to be recorded with the results that end after it
(one commit for the group), and the least time between two such commits. Under load the
records cost one commit per window whatever the rate, while a lone reply is recorded at
once. A sender that dies in that time leaves the call to be sent again after its lease, as
one that dies between Telegram's answer and the record does. Telegram takes about one
message a second per chat, so a chat's next call waiting for the record is not slowed
noticeably, and such a wait records at once anyway."""

CLAIM_AHEAD = 2
"""Claims take calls for at most this many times ``outbox_concurrency`` calls claimed and not
ended (sending, or waiting for a sender)."""

FLOOD_CHATS = 3
"""``RetryAfter`` answers for this many different chats within one hold mean a flood limit of
the whole bot. Every chat is then held until it ends."""

LAPSED_SWEEP_MS = 1000
"""After a round that raised, the next sweep comes this many milliseconds later."""

CLAIM = "claim"
"""A round claims calls."""

LOOK = "look"
"""A round claims calls if the store has one pending (a recorded call may have been what it
waited for)."""

REST = "rest"
"""A round claims nothing."""

CallKey = Tuple[int, int, str, int]
"""A call's key before its id is known: update id, attempt, claim id, seq."""

Done = Tuple[OutboxEntry, Optional[str], Optional[BaseException]]
"""A call whose request ended: the entry, its result's JSON text or the error raised."""

SentItem = Tuple[int, str, str, int]
"""A sent call to record: call id, sender token, result JSON, when (epoch ms)."""


def call_key(entry: OutboxEntry) -> CallKey:
    """The key of ``entry`` before its id is known."""
    return (entry.update_id, entry.attempt, entry.claim_id, entry.seq)


class ClaimReservation:
    """Senders set aside for the calls one completion commit claims at insert.

    Attributes:
        slots (:obj:`int`): The senders reserved (the claims' limits summed).
        keys (Dict[CallKey, Optional[int]]): Per call that may be inserted claimed, its chat.
        entries (List[:class:`~ptb_fence.OutboxEntry`] | :obj:`None`): The calls the commit
            inserted claimed, as its store reported them. :obj:`None`: the store did not say,
            so they are read back.
    """

    __slots__ = ("entries", "keys", "slots")

    def __init__(self) -> None:
        self.slots = 0
        self.keys: Dict[CallKey, Optional[int]] = {}
        self.entries: Optional[List[OutboxEntry]] = None


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing is due: wait on the condition.

    Attributes:
        seconds: The longest wait (a wake-up ends it sooner).
    """

    seconds: float


@dataclass(frozen=True, slots=True)
class Round:
    """Something is due: one round of the loop.

    Attributes:
        done: The results to record now (none: not due yet).
        read: Read back the calls completion commits claimed for this sender.
        claim: A claim is due (woken, a sweep, or a retry's time came).
        stop: A stop came: the round records and ends the loop.
    """

    done: Tuple[Done, ...]
    read: bool
    claim: bool
    stop: bool


@dataclass(frozen=True, slots=True)
class Send:
    """Hand a claimed call to a sender thread.

    Attributes:
        entry: The call.
    """

    entry: OutboxEntry


@dataclass(frozen=True, slots=True)
class Expire:
    """End a claimed call failed without sending it (older than ``outbox_max_age_seconds``).

    Attributes:
        entry: The call.
        error: The text stored with it.
    """

    entry: OutboxEntry
    error: str


@dataclass(frozen=True, slots=True)
class Record:
    """Record sent calls in one commit that may claim calls too.

    Attributes:
        items: The sent calls.
        limit: How many calls the same commit claims (0: none).
    """

    items: Tuple[SentItem, ...]
    limit: int

    def took_all(self, claimed: int) -> bool:
        """Whether a claim of ``claimed`` calls took every call in turn (it was not full)."""
        return 0 < self.limit and claimed < self.limit


@dataclass(frozen=True, slots=True)
class Retry:
    """Set a call whose send failed to be retried.

    Attributes:
        entry: The call.
        due_at: When it is retried (epoch ms).
        decision: Why (its error text, whether every chat is held).
    """

    entry: OutboxEntry
    due_at: int
    decision: SendDecision


@dataclass(frozen=True, slots=True)
class Fail:
    """End a call whose send failed as failed (never retried).

    Attributes:
        entry: The call.
        error: The text stored with it.
    """

    entry: OutboxEntry
    error: str


@dataclass(frozen=True, slots=True)
class StopTake:
    """What the loop's last round finishes with.

    Attributes:
        done: The results to record.
        started: The calls whose request began and did not end (left to their lease).
        unsent: The calls claimed here and never started (released).
    """

    done: Tuple[Done, ...]
    started: frozenset[int]
    unsent: Tuple[int, ...]


class DispatchPlan:
    """The bookkeeping of one outbox dispatcher and its decisions.

    Not thread-safe: the dispatcher calls it under its condition's lock.

    Args:
        concurrency: Senders (``outbox_concurrency``).
        lease_seconds: The sender lease of a claimed call.
        sweep_every_seconds: The time between two sweeps (lapsed leases, other processes).
        max_age_seconds: A call older than this ends failed, unsent.
        failure_handler: A ``handle_send_failure`` is set (failures are delivered to it).

    Attributes:
        sender (:obj:`str`): The token calls are claimed under in this run.
        stopping (:obj:`bool`): A stop came.
        stop_deadline (:obj:`float`): When a stop stops waiting for requests (mono).
        woken (:obj:`bool`): A claim is due at once.
        next_poll (:obj:`int`): When the next sweep is due (epoch ms, 0: at once).
        inflight (Dict[int, OutboxEntry]): The calls claimed here and not ended, by id.
        started (Set[int]): Of those, the calls whose request began.
        done (List[Done]): The results not taken for a record yet.
        done_since (:obj:`float`): When the oldest of them ended (mono).
        last_record (:obj:`float`): When results were last recorded (mono).
        reserved (:obj:`int`): Senders set aside for calls claimed at insert.
        claims_open (:obj:`int`): Commits claiming calls at insert that did not end yet.
        ended (List[Tuple[ClaimReservation, Set[CallKey]]]): Such commits that ended, with
            their calls that landed, not read back yet.
        claim_keys (Dict[CallKey, Optional[int]]): The calls that may be inserted claimed.
        seen (Set[CallKey]): Of those, the calls read back claimed.
        read_due (:obj:`bool`): A read back of calls claimed at insert is due.
        read_at (:obj:`float`): When a read that failed is tried again (mono).
        read_backoff (:class:`~ptb_fence.runtime._backoff.Backoff`): The waits between
            reads that failed.
        held (Set[int]): The calls claimed by this run and not given up yet.
        behind (Dict[Optional[int], int]): Per chat, its calls left pending behind ours.
        unsent (List[int]): The calls claimed and never started (a stop came first).
        unrecorded (List[SentItem]): The sent calls to record (the last record failed).
        noted (Set[int]): The sent calls in the store's sent journal (counted already).
        next_retry (Optional[int]): The earliest retry set here (epoch ms).
        hold_until (:obj:`int`): The end of a flood limit of the whole bot (epoch ms).
        flood (Dict[Optional[int], int]): Per chat, the end of its ``RetryAfter`` hold.
        failures_due (:obj:`bool`): A failure delivery is due.
        delivering (:obj:`bool`): A failure delivery runs.
    """

    __slots__ = (
        "behind",
        "claim_keys",
        "claims_open",
        "concurrency",
        "delivering",
        "done",
        "done_since",
        "ended",
        "failure_handler",
        "failures_due",
        "flood",
        "held",
        "hold_until",
        "inflight",
        "last_record",
        "lease_seconds",
        "max_age_seconds",
        "next_poll",
        "next_retry",
        "noted",
        "poll_ms",
        "read_at",
        "read_backoff",
        "read_due",
        "reserved",
        "seen",
        "sender",
        "started",
        "stop_deadline",
        "stopping",
        "unrecorded",
        "unsent",
        "woken",
    )

    def __init__(
        self,
        concurrency: int,
        lease_seconds: float,
        sweep_every_seconds: float,
        max_age_seconds: float,
        failure_handler: bool = False,
    ) -> None:
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.poll_ms = int(sweep_every_seconds * 1000)
        self.max_age_seconds = max_age_seconds
        self.failure_handler = failure_handler
        self.sender = ""
        self.stopping = False
        self.stop_deadline = 0.0
        self.woken = False
        self.next_poll = 0
        self.inflight: Dict[int, OutboxEntry] = {}
        self.started: "set[int]" = set()
        self.done: List[Done] = []
        self.done_since = 0.0
        self.last_record = 0.0
        self.reserved = 0
        self.claims_open = 0
        self.ended: List[Tuple[ClaimReservation, "set[CallKey]"]] = []
        self.claim_keys: Dict[CallKey, Optional[int]] = {}
        self.seen: "set[CallKey]" = set()
        self.read_due = False
        self.read_at = 0.0
        self.read_backoff = Backoff()
        self.held: "set[int]" = set()
        self.behind: Dict[Optional[int], int] = {}
        self.unsent: List[int] = []
        self.unrecorded: List[SentItem] = []
        self.noted: "set[int]" = set()
        self.next_retry: Optional[int] = None
        self.hold_until = 0
        self.flood: Dict[Optional[int], int] = {}
        self.failures_due = True
        self.delivering = False

    # -- the run -------------------------------------------------------------------------------
    def begin_run(self, sender: str) -> None:
        """A start: claim under ``sender`` and look for calls left by a previous run at once."""
        self.sender = sender
        self.stopping = False
        self.woken = True
        self.next_poll = 0
        self.reserved, self.claims_open, self.ended = 0, 0, []
        self.claim_keys, self.seen, self.held, self.behind = {}, set(), set(), {}
        self.noted = set()
        self.read_due = False
        self.failures_due = True

    def stop(self, deadline: float) -> None:
        """A stop came: claim nothing more, wait for requests until ``deadline`` (mono)."""
        self.stopping = True
        self.stop_deadline = deadline

    def wake(self, keys: Sequence[CallKey] = ()) -> bool:
        """A commit carrying calls (``keys``, none: unknown) landed. Whether a claim is due
        (a call not claimed at insert) or all of them are read back at :meth:`claims_ended`."""
        if keys and all(key in self.claim_keys for key in keys):
            return False
        self.woken = True
        return True

    # -- claims at insert ----------------------------------------------------------------------
    def insert_room(self, now: int) -> int:
        """How many calls a completion commit may claim at insert now.

        A claimed call waits at most one round of sends for a sender, well inside its lease.
        A stop or a flood hold claims nothing.
        """
        if self.stopping or now < self.hold_until:
            return 0
        return max(0, CLAIM_AHEAD * self.concurrency - len(self.inflight) - self.reserved)

    def reserve(self, reservation: ClaimReservation) -> None:
        """A completion commit claims ``reservation``'s calls: its senders are set aside."""
        self.reserved += reservation.slots
        self.claims_open += 1
        self.claim_keys.update(reservation.keys)

    def claims_ended(self, reservation: ClaimReservation, landed: "set[CallKey]") -> None:
        """The commit of ``reservation`` ended (``landed``: its calls that were inserted)."""
        self.claims_open -= 1
        self.ended.append((reservation, landed))
        self.read_due = True

    # -- the loop's rounds ---------------------------------------------------------------------
    def claim_room(self) -> int:
        """How many calls a claim takes now.

        While a sender is free: up to :data:`CLAIM_AHEAD` times ``concurrency`` claimed and
        not ended. While all are busy: nothing until that room is a whole round of sends (one
        claim commit per round, not per freed sender), so the senders never run dry.
        """
        room = CLAIM_AHEAD * self.concurrency - len(self.inflight) - self.reserved
        if len(self.inflight) >= self.concurrency and room < self.concurrency:
            return 0
        return max(room, 0)

    def record_at(self) -> float:
        """When the results that ended are due to be recorded (mono): a window after the last
        record, or after the oldest of them ended if that is sooner."""
        return min(self.done_since, self.last_record) + RECORD_WINDOW

    def record_due(self, mono: float) -> bool:
        """Whether the results that ended are recorded now: their window passed, or a later
        call of one of their chats waits for them."""
        if not self.done:
            return False
        return mono >= self.record_at() or any(
            self.behind.get(entry.chat_key) for entry, _, _ in self.done
        )

    def _claim_due(self, now: int) -> bool:
        return self.woken or now >= self.next_poll or (
            self.next_retry is not None and now >= self.next_retry
        )

    def next_step(self, now: int, mono: float) -> Union[Wait, Round]:
        """What the loop does now: wait, or a round (whose results and read it takes)."""
        read = self.read_due and mono >= self.read_at
        if not (self.stopping or self.record_due(mono) or read or (
                self.claim_room() > 0 and self._claim_due(now) and now >= self.hold_until)):
            return Wait(self._wait(now, mono))
        done: Tuple[Done, ...] = ()
        if self.stopping or self.record_due(mono):
            done, self.done = tuple(self.done), []
        self.read_due = self.read_due and not read
        claim = self._claim_due(now)
        self.woken = False
        return Round(done, read, claim, self.stopping)

    def _wait(self, now: int, mono: float) -> float:
        if now < self.hold_until:
            wake_at = self.hold_until
        else:
            wake_at = min(self.next_poll, self.next_retry or self.next_poll)
        wait = max(0.001, min((wake_at - now) / 1000.0, 1.0))
        if self.done:
            wait = min(wait, max(0.001, self.record_at() - mono))
        if self.read_due:  # a read that failed: again after its back-off
            wait = min(wait, max(0.001, self.read_at - mono))
        return wait

    def after_record(self, step: Round, swept: bool, now: int) -> str:
        """Whether the round claims after its record: :data:`CLAIM`, :data:`LOOK` or
        :data:`REST`. ``swept``: the record's commit claimed every call in turn, so what woke
        the round before it is served (a sweep round stays due)."""
        claim = now >= self.next_poll if swept else step.claim
        claim = claim or self.woken
        self.woken = False
        if claim:
            return CLAIM
        return LOOK if step.done and not swept else REST

    def claim_round(self, now: int) -> Optional[bool]:
        """A claim is due at ``now``: whether it is a sweep round (failures of other processes
        and calls claimed at insert not read back are looked at too), or :obj:`None` while a
        flood hold lasts (the claim comes the moment it ends)."""
        if now < self.hold_until:
            self.next_poll = min(self.next_poll, self.hold_until)
            return None
        if self.next_retry is not None and now >= self.next_retry:
            self.next_retry = None
        sweep = now >= self.next_poll
        if sweep:
            self.failures_due = True
        return sweep

    def claim_limit(self) -> int:
        """How many calls the claim of this round takes (0: still due, when a sender frees)."""
        free = self.claim_room()
        if free <= 0:
            self.woken = True
        return free

    def claimed(self, entries: Sequence[OutboxEntry], limit: int, sweep: bool) -> bool:
        """A claim of at most ``limit`` took ``entries``. Whether it was full (more may be due
        at once). A sweep that is not full forgets the calls known to wait behind their
        chats (the next sweeps take them)."""
        self.held.update(entry.call_id for entry in entries)
        if sweep and len(entries) < limit:
            self.behind = {}
        return len(entries) >= limit

    def round_ended(self, now: int, sweep: bool, full: bool) -> None:
        """The claim of a round ended: a full one claims again at once, a sweep schedules the
        next one."""
        if full:
            self.next_poll = now
        elif sweep:
            self.next_poll = now + self.poll_ms

    def round_failed(self, now: int) -> None:
        """A round raised: the next sweep is soon."""
        self.next_poll = now + LAPSED_SWEEP_MS

    # -- sending -------------------------------------------------------------------------------
    def start(self, entries: Sequence[OutboxEntry], now: int) -> Tuple[Union[Send, Expire], ...]:
        """Calls claimed by this sender: each is sent, or expires (too old to send)."""
        oldest = now - int(self.max_age_seconds * 1000)
        actions: List[Union[Send, Expire]] = []
        for entry in entries:
            if entry.created_at < oldest:
                actions.append(Expire(entry, f"expired: queued more than "
                                             f"{self.max_age_seconds:g} s ago, never sent"))
                continue
            self.inflight[entry.call_id] = entry
            actions.append(Send(entry))
        return tuple(actions)

    def not_submitted(self, call_id: int) -> None:
        """A call could not be handed to a sender (the pool shut down at a stop)."""
        self.inflight.pop(call_id, None)
        self.unsent.append(call_id)

    def begin_send(self, entry: OutboxEntry, now: int) -> Optional[str]:
        """A sender thread is about to send ``entry``: :obj:`None` to send it, ``"stopping"``
        (it is released) or ``"lapsed"`` (its lease is nearly over).

        A sender paused (SIGSTOP, a frozen VM) between the claim and here may have lost the
        call to another sender meanwhile. A request is begun only while the lease still has a
        quarter of its length left, room for the request itself.
        """
        if self.stopping:
            self.not_submitted(entry.call_id)
            return "stopping"
        if now > entry.due_at - int(self.lease_seconds * 250):
            self.inflight.pop(entry.call_id, None)
            self.held.discard(entry.call_id)
            return "lapsed"
        self.started.add(entry.call_id)
        return None

    def send_ended(
        self, entry: OutboxEntry, result: Optional[str], error: Optional[BaseException],
        mono: float,
    ) -> None:
        """The request of ``entry`` ended with ``result`` or ``error``."""
        self.started.discard(entry.call_id)
        self.inflight.pop(entry.call_id, None)
        if not self.done:
            self.done_since = mono
        self.done.append((entry, result, error))

    def note(self, call_id: int) -> None:
        """A sent call is in the store's sent journal (counted sent already)."""
        self.noted.add(call_id)

    # -- recording -----------------------------------------------------------------------------
    def results(self, done: Sequence[Done], now: int) -> None:
        """The sent calls among ``done`` are to be recorded (at ``now``)."""
        self.unrecorded.extend(
            (entry.call_id, self.sender, result, now)
            for entry, result, error in done if error is None and result
        )

    def record(self, claim: bool, now: int, mono: float) -> Optional[Record]:
        """The record of every sent call not recorded yet, or :obj:`None`. ``claim``: its
        commit claims as many calls as there is room for (none at a stop or a flood hold)."""
        items, self.unrecorded = tuple(self.unrecorded), []
        if not items:
            return None
        limit = self.claim_room() if claim and not self.stopping else 0
        if limit > 0 and now < self.hold_until:
            limit = 0
        self.last_record = mono
        return Record(items, limit)

    def record_failed(self, record: Record) -> None:
        """The record's commit failed: its calls are recorded with the next one (until the
        sender lease lapses nobody else sends them)."""
        self.unrecorded = list(record.items) + self.unrecorded

    def recorded(
        self, record: Record, landed: Sequence[bool], claimed: Sequence[OutboxEntry]
    ) -> int:
        """The record's commit landed (``landed`` per item) and claimed ``claimed``. How many
        calls it counts sent (those not counted when the journal noted them)."""
        count = sum(1 for (call_id, *_), ok in zip(record.items, landed)
                    if ok and call_id not in self.noted)
        ids = [item[0] for item in record.items]
        self.noted.difference_update(ids)
        self.held.difference_update(ids)
        self.held.update(entry.call_id for entry in claimed)
        return count

    def results_recorded(self, done: Sequence[Done], swept: bool, failed: bool) -> bool:
        """The results of ``done`` were recorded (``swept``: their commit claimed every call
        in turn, ``failed``: a send among them failed). Whether nothing else is due until
        the next change. A chat's next call waiting behind them is claimed now if that
        commit did not take it."""
        unrecorded = {item[0] for item in self.unrecorded}
        for entry, _, _ in done:
            if entry.call_id not in unrecorded:
                self.held.discard(entry.call_id)
            behind = self.behind.get(entry.chat_key, 0)
            if behind:
                if not swept or failed:
                    self.woken = True
                if behind > 1:
                    self.behind[entry.chat_key] = behind - 1
                else:
                    del self.behind[entry.chat_key]
        return swept and not failed

    # -- failed sends --------------------------------------------------------------------------
    def send_failed(
        self, entry: OutboxEntry, error: BaseException, now: int
    ) -> Union[Retry, Fail]:
        """The send of ``entry`` raised ``error`` at ``now``: retry it (when) or fail it. A
        flood limit of the whole bot holds every chat until the retry."""
        decision = decide(entry, error, global_hold=self._flooded(entry, error, now))
        if decision.fail:
            return Fail(entry, decision.error)
        due_at = now + int(decision.delay_seconds * 1000)
        if decision.hold_all:
            self.hold_until = max(self.hold_until, due_at)
        return Retry(entry, due_at, decision)

    def _flooded(self, entry: OutboxEntry, error: BaseException, now: int) -> bool:
        """Whether a ``RetryAfter`` means a flood limit of the whole bot: it came for a call
        of no chat, or for :data:`FLOOD_CHATS` chats whose holds overlap."""
        if "RetryAfter" not in {c.__name__ for c in type(error).__mro__}:
            return False
        if entry.chat_key is None:
            return True
        seconds = retry_after_seconds(error) or 0.0
        self.flood = {chat: until for chat, until in self.flood.items() if until > now}
        self.flood[entry.chat_key] = now + int(seconds * 1000)
        return len(self.flood) >= FLOOD_CHATS

    def paced_back(self, until: int, bot_wide: bool) -> None:
        """A call went back unsent, due at ``until``, since its slot was later than a sender
        may wait. ``bot_wide``: the whole bot waits, so nothing is claimed before ``until``."""
        if bot_wide:
            self.hold_until = max(self.hold_until, until)
        self.retry_set(until)

    def retry_set(self, due_at: int) -> None:
        """A retry at ``due_at`` landed: the loop claims when it falls due."""
        if self.next_retry is None or due_at < self.next_retry:
            self.next_retry = due_at

    def failed(self) -> None:
        """A call ended failed: a ``handle_send_failure`` hears of it."""
        if self.failure_handler:
            self.failures_due = True

    # -- reading back what commits claimed -----------------------------------------------------
    def take_ended(self) -> List[Tuple[ClaimReservation, "set[CallKey]"]]:
        """The ended claiming commits whose calls are read back now."""
        ended, self.ended = self.ended, []
        return ended

    def read_failed(
        self, ended: List[Tuple[ClaimReservation, "set[CallKey]"]], mono: float
    ) -> None:
        """The read of ``ended`` failed: it is read again after a back-off (at once would be
        a busy loop in an outage)."""
        self.ended = ended + self.ended
        self.read_due = True
        self.read_at = mono + self.read_backoff.failed()

    def read_back(
        self, ended: List[Tuple[ClaimReservation, "set[CallKey]"]],
        entries: Sequence[OutboxEntry], now: int,
    ) -> List[OutboxEntry]:
        """The calls claimed for this sender read back (``entries``, for ``ended``): those to
        send now. What an ended commit left pending waits behind its chat's call here, or is
        claimed now."""
        self.read_backoff.answered()
        margin = int(self.lease_seconds * 500)
        fresh = []
        for entry in entries:
            if entry.call_id in self.held:
                continue
            if entry.due_at - now < margin:  # too little lease left: claimed afresh later
                continue
            self.held.add(entry.call_id)
            self.seen.add(call_key(entry))
            fresh.append(entry)
        for reservation, landed in ended:
            self.reserved -= reservation.slots
            for key, chat in reservation.keys.items():
                self.claim_keys.pop(key, None)
                seen = key in self.seen
                self.seen.discard(key)
                if key not in landed or seen:
                    continue
                # inserted pending: its chat had an unsent call
                if any(e.chat_key == chat for e in self.inflight.values()) or any(
                    e.chat_key == chat for e in fresh
                ):
                    self.behind[chat] = self.behind.get(chat, 0) + 1
                else:  # behind another sender's call (whose record claims it next), or a
                    self.woken = True  # sender is free now
        return fresh

    # -- the stop ------------------------------------------------------------------------------
    def stop_waits(self, mono: float) -> bool:
        """Whether the last round still waits for requests in flight and claiming commits."""
        return bool(self.started or self.claims_open) and mono < self.stop_deadline

    def stop_take(self) -> StopTake:
        """The loop's last round: the results to record, and what was claimed and never
        started (a call handed to a sender thread that has not begun never begins now)."""
        done, self.done = tuple(self.done), []
        unsent, self.unsent = self.unsent, []
        unsent.extend(cid for cid in self.inflight if cid not in self.started)
        return StopTake(done, frozenset(self.started), tuple(unsent))

    def to_release(self, take: StopTake, mine: Sequence[OutboxEntry]) -> List[int]:
        """The calls a stop gives back: those never started, and of ``mine`` (claimed for
        this sender by commits, read or not) those neither started nor waiting to be
        recorded."""
        unrecorded = {item[0] for item in self.unrecorded}
        unsent = set(take.unsent)
        unsent.update(e.call_id for e in mine
                      if e.call_id not in take.started and e.call_id not in unrecorded)
        return sorted(unsent)

    # -- failure delivery ----------------------------------------------------------------------
    def delivery_begins(self) -> bool:
        """Whether a round of failure delivery starts now (one at a time, when due)."""
        if not self.failure_handler or self.delivering or not self.failures_due:
            return False
        self.delivering = True
        self.failures_due = False
        return True

    def delivery_ended(self, more: bool) -> None:
        """A failure delivery round ended (``more``: a next page is due)."""
        self.delivering = False
        if more:
            self.failures_due = True
