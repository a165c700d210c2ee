"""Broadcasts: one message to many chats, recorded per recipient, sent once, at Telegram's pace.

A broadcast is recorded in the store before anything is sent: the broadcast once, its
recipients in batches. :class:`BroadcastSender` claims recipients under a lease, waits for
each one's slot in the store-wide pace and sends it. A crash loses nothing: a recipient
held by a dead sender is claimed again once its lease ends. Only a recipient whose send
Telegram answered and whose outcome was not recorded yet can go twice (the send window).

A sender takes the slots of about half a second of sends at a time (:data:`PAGE_SECONDS`).
A reply paced through the same store waits at most that long behind a broadcast.
"""

from __future__ import annotations

import collections
import inspect
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from ptb_fence._errors import UsageError
from ptb_fence._values import (
    BroadcastWrite,
    PaceBucket,
    Recipient,
    RecipientOutcome,
    StoredBroadcast,
)
from ptb_fence.runtime._backoff import Backoff
from ptb_fence.runtime._bot_answers import FAIL, HOLD, MIGRATE, SENT, outcome_of
from ptb_fence.runtime._bot_params import api_method
from ptb_fence.runtime._outcome import error_text
from ptb_fence.runtime._pacer import HOLD_KEY, HORIZON_MS, LATE_MS, OutboxPacing
from ptb_fence.runtime._send_outcome import retry_after_seconds
from ptb_fence.stores._broadcasts import check_chat_ids, check_name

__all__ = ["Broadcasts", "BroadcastSender", "PAGE", "RECORD_BATCH"]

_LOGGER = logging.getLogger("ptb_fence.broadcasts")

RECORD_BATCH = 5000
"""Recipients recorded per transaction."""

LEASE_MS = 10_000
"""How long a sender holds the recipients it claimed."""

PAGE = 50
"""The most recipients one claim takes."""

LOOK_SECONDS = 2.0
"""How often an idle sender looks for recipients. A broadcast started or resumed in this
process wakes it at once. One started by another process or the command line waits at most
this long."""

STOP_SECONDS = 1.0
"""How long a stop waits for the send or store call in flight."""

PAGE_SECONDS = 0.5
"""A claim takes about this many seconds of sends at the bot's pace (at most :data:`PAGE`).
So a pause or a cancel stops the sends of every process within about that time."""

RECORD_EVERY_SECONDS = 0.2
"""A sender records its outcomes at least this often, and after each page."""

_HOLD = PaceBucket(HOLD_KEY, 1)
"""Read before the sends: a flood hold of the bot another process stored since the page's
slots were taken."""

HOLD_READ_MS = 50
"""A sender reads the store's hold at most this often. So a hold another process was told
of stops its sends within about that time after it was stored."""

MAX_TRIES = 10
"""A recipient whose sends kept failing without an answer is recorded failed after this many
tries."""

Send = Callable[[str, Dict[str, Any]], Any]
"""``send(method, params) -> result``: one blocking Bot API call (as the outbox's)."""

Blocked = Callable[[str, int], Any]
"""``blocked(broadcast name, chat_id)``: a recipient blocked the bot."""


class Broadcasts:
    """The broadcasts of one runtime: started, paused, resumed, cancelled, counted.

    Args:
        store: The store (it declares ``StoreFeatures(broadcasts=True)``).
        now_ms: The runtime's clock in epoch milliseconds.
    """

    __slots__ = ("_now_ms", "_store")

    def __init__(self, store: Any, now_ms: Callable[[], int]) -> None:
        self._store = store
        self._now_ms = now_ms

    def start(self, name: str, chat_ids: Iterable[int], method: str = "sendMessage",
              **params: Any) -> StoredBroadcast:
        """Record the broadcast ``name`` and its recipients. Returns it, counted.

        Starting a broadcast whose name exists adds the chats it lacks and keeps its call.
        So a bot that crashed while recording goes on where it stopped.

        Raises:
            UsageError: ``params`` has ``chat_id``, cannot be kept as JSON, or ``name``
                exists with another method or parameters.
        """
        write = self.write_of(name, (), method, **params)
        at = self._now_ms()
        started = self._store.start_broadcast(name, write.method, write.params_json, at)
        if (started.method, started.params_json) != (write.method, write.params_json):
            raise UsageError(_other_call(name, started))
        batch: List[int] = []
        for chat in chat_ids:
            batch.append(chat)
            if len(batch) >= RECORD_BATCH:
                self._store.add_recipients(started.broadcast_id, batch, at)
                batch = []
        if batch:
            self._store.add_recipients(started.broadcast_id, batch, at)
        return self.get(name)

    @staticmethod
    def write_of(name: str, chat_ids: Iterable[int], method: str = "sendMessage",
                 **params: Any) -> BroadcastWrite:
        """The broadcast ``name`` as a store writes it, checked. Nothing is written.

        Raises:
            UsageError: ``name`` is no broadcast name, a chat id is not an :obj:`int`,
                ``params`` has ``chat_id`` or cannot be kept as JSON.
        """
        method = api_method(method)
        if "chat_id" in params:
            raise UsageError("broadcast(): pass the chats as chat_ids, not chat_id=")
        try:
            params_json = json.dumps(params, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False)
        except TypeError as exc:
            raise UsageError(f"broadcast(): the parameters must be JSON values: {exc}. "
                             "Upload a file once and broadcast its file_id") from None
        try:
            return BroadcastWrite(check_name(name), method, params_json,
                                  tuple(check_chat_ids(list(chat_ids))))
        except ValueError as exc:
            raise UsageError(f"broadcast(): {exc}") from None

    def pause(self, name: str) -> StoredBroadcast:
        """Send nothing more of ``name`` until :meth:`resume`. Sends in flight finish."""
        return self._set(name, "paused")

    def resume(self, name: str) -> StoredBroadcast:
        """Send the rest of a paused broadcast."""
        return self._set(name, "active")

    def cancel(self, name: str) -> StoredBroadcast:
        """Send nothing more of ``name``, ever: its pending recipients become cancelled."""
        return self._set(name, "cancelled")

    def get(self, name: str) -> StoredBroadcast:
        """The broadcast ``name``, counted.

        Raises:
            UsageError: There is none of that name.
        """
        found = self._store.list_broadcasts(name)
        if not found:
            raise UsageError(f"there is no broadcast named {name!r}")
        return found[0]  # type: ignore[no-any-return]

    def list(self) -> List[StoredBroadcast]:
        """Every broadcast the store keeps, by id, counted."""
        return list(self._store.list_broadcasts())

    def _set(self, name: str, state: str) -> StoredBroadcast:
        done = self._store.set_broadcast_state(name, state, self._now_ms())
        if done is None:
            raise UsageError(f"there is no broadcast named {name!r}")
        if done.state != state:
            raise UsageError(f"the broadcast {name!r} was cancelled: it stays cancelled")
        return done  # type: ignore[no-any-return]


class BroadcastSender:
    """The thread that sends the recipients of the store's broadcasts, for one process.

    Args:
        store: The store (it declares ``StoreFeatures(broadcasts=True)``).
        pacing: Telegram's limits. Broadcasts are always paced.
        take: The store-wide pace: ``take(wants, now, horizon_ms)`` (the port's).
        hold: The store-wide holds (the port's ``hold_sends``).
        now_ms: The runtime's clock.
        blocked: Told of each recipient that blocked the bot, on the sender's thread.
        stats: Counts the recorded outcomes (:attr:`ptb_fence.Stats.broadcast_sends`).
    """

    __slots__ = ("_backoff", "_blocked", "_gap", "_started", "_hold", "_hold_read", "_next_send", "_loop",
                 "_names", "_now_ms", "_pacing", "_page", "_send", "_stats", "_stop", "_store",
                 "_take", "_thread", "_token", "_wake", "sent")

    def __init__(self, store: Any, pacing: OutboxPacing, take: Any, hold: Any,
                 now_ms: Callable[[], int], blocked: Optional[Blocked] = None,
                 stats: Any = None) -> None:
        self._store = store
        self._pacing = pacing
        self._take = take
        self._hold = hold
        self._stats = stats
        # The slots of the bot's stripes may coincide. This process's sends keep at least one
        # interval of the bot's pace apart, so they do not go in a burst (Telegram counts per
        # second). The spacing is planned per page, so a late wake-up is not carried on.
        self._gap = 1000.0 / (pacing.per_second * (1.0 - pacing.headroom))
        self._next_send = 0.0
        self._hold_read = 0  # when the hold was last read, and found none
        self._page = max(1, min(PAGE, int(pacing.per_second * PAGE_SECONDS)))
        self._now_ms = now_ms
        self._blocked = blocked
        self._token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}:broadcast"
        self._send: Optional[Send] = None
        self._loop: Any = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._backoff = Backoff()
        self._names: Dict[int, str] = {}
        # broadcasts that handlers' completions started, to check on the sender's thread
        self._started: "collections.deque[BroadcastWrite]" = collections.deque()
        #: Recipients this sender recorded sent.
        self.sent = 0

    @property
    def running(self) -> bool:
        """:obj:`bool`: The thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, send: Send, *, loop: Any = None) -> None:
        """Start sending through ``send``. An async ``handle_blocked`` runs on ``loop``."""
        if self.running:
            return
        self._send = send
        self._loop = loop
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ptb_fence-broadcasts",
                                        daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look for recipients now (a broadcast was started or resumed)."""
        self._wake.set()

    def started(self, write: BroadcastWrite) -> None:
        """A completion started ``write``: look for its recipients now. The sender's thread
        logs an ERROR when a broadcast of that name had another call, so got none of them."""
        self._started.append(write)
        self._wake.set()

    def stop(self, timeout: Optional[float] = STOP_SECONDS) -> None:
        """Stop after the send in flight, waiting at most ``timeout`` seconds for it.

        The recipients claimed and not sent go back. A thread still in a store call or a
        send after ``timeout`` is left behind (a daemon): a database that does not answer
        must not hold the stop. What it held is claimed again once its lease ends."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        self._thread = None

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            pause = LOOK_SECONDS
            try:
                self._check_started()
                claimed = self._store.claim_recipients(
                    self._token, now=self._now_ms(), lease_until=self._now_ms() + LEASE_MS,
                    limit=self._page)
                self._backoff.answered()
                if failing:  # the runtime's own loops say that the store is back
                    failing = False
                    _LOGGER.debug("broadcasts: claiming recipients again")
                if claimed:
                    self._send_page(claimed)
                    pause = 0.0
            except Exception as exc:  # the store failed: nothing is lost, try again
                pause = self._backoff.failed()
                # one WARNING per outage: an outage must not flood the log
                _LOGGER.log(logging.DEBUG if failing else logging.WARNING,
                            "broadcasts: the store failed (%s): trying again in %.1f s%s",
                            error_text(exc), pause, "" if failing else
                            " (further failures are logged at DEBUG until it answers again)")
                failing = True
            if pause:
                self._wake.wait(pause)
                self._wake.clear()

    def _check_started(self) -> None:
        while self._started:
            write = self._started[0]
            found = self._store.list_broadcasts(write.name)
            if found and (found[0].method, found[0].params_json) != (write.method,
                                                                     write.params_json):
                _LOGGER.error("broadcasts: %s. The %d chat(s) a handler started it with were "
                              "not added", _other_call(write.name, found[0]),
                              len(write.chat_ids))
            self._started.popleft()

    def _send_page(self, claimed: Sequence[Recipient]) -> None:
        """Send a claimed page: its slots taken in one store call, each send at its slot."""
        calls = []
        for recipient in claimed:
            params = dict(json.loads(recipient.params_json))
            params["chat_id"] = recipient.chat_id
            calls.append((recipient, params,
                          self._pacing.buckets(recipient.method, params, recipient.chat_id)))
        now = self._now_ms()
        try:
            times = self._take([buckets for _, _, buckets in calls], now, HORIZON_MS)
        except Exception:  # back at once, their tries counted: the loop backs off
            self._record([RecipientOutcome(r.broadcast_id, r.chat_id, "pending", due_at=now)
                          for r in claimed])
            raise
        outcomes: List[RecipientOutcome] = []
        recorded_at = time.monotonic()
        held: Optional[int] = None  # a flood hold learnt during the page: the rest waits
        for (recipient, params, _), at, go in self._plan(calls, times, now):
            ids = (recipient.broadcast_id, recipient.chat_id)
            if held is not None:
                outcomes.append(RecipientOutcome(*ids, "pending", due_at=held))
                continue
            if self._stop.is_set():
                outcomes.append(RecipientOutcome(*ids, "pending", due_at=self._now_ms()))
                continue
            if at > now + HORIZON_MS:  # no slot taken: a hold, or its chat's pace far off
                outcomes.append(RecipientOutcome(*ids, "pending", due_at=at))
                continue
            wait = (go - self._now_ms()) / 1000.0
            if wait > 0:
                self._stop.wait(wait)
            held = self._held_until()  # another process may have been told to hold
            if held is not None:
                outcomes.append(RecipientOutcome(*ids, "pending", due_at=held))
                continue
            if self._now_ms() - go > LATE_MS:
                outcomes.append(RecipientOutcome(*ids, "pending", due_at=self._now_ms()))
                continue
            outcome, held = self._one(recipient, params)
            outcomes.append(outcome)
            if time.monotonic() - recorded_at >= RECORD_EVERY_SECONDS:
                self._record(outcomes)
                outcomes, recorded_at = [], time.monotonic()
        self._record(outcomes)

    def _plan(self, calls: Sequence[Any], times: Sequence[int], now: int
              ) -> "List[tuple[Any, int, float]]":
        """The page in the order of its slots, each with its slot and the time it goes: its
        slot, at least one interval of the bot's pace after the send before it."""
        planned = []
        after = max(self._next_send, float(now) - self._gap)
        for call, at in sorted(zip(calls, times), key=lambda pair: pair[1]):
            go = max(float(at), after + self._gap)
            if at <= now + HORIZON_MS:
                after = go
            planned.append((call, at, go))
        self._next_send = after
        return planned

    def _record(self, outcomes: List[RecipientOutcome]) -> None:
        if not outcomes:
            return
        tries = 0
        while True:
            try:
                landed = self._store.settle_recipients(self._token, outcomes, self._now_ms())
                break
            except Exception as exc:  # held until it lands: a lost record sends again
                if self._stop.is_set():
                    _LOGGER.warning("broadcasts: %d outcome(s) not recorded at stop (%s): "
                                    "those recipients are sent again", len(outcomes),
                                    error_text(exc))
                    return
                wait = self._backoff.failed()
                tries += 1
                _LOGGER.log(logging.WARNING if tries == 1 else logging.DEBUG,
                            "broadcasts: recording %d outcome(s) failed (%s): trying again in "
                            "%.1f s%s", len(outcomes), error_text(exc), wait,
                            " (further tries are logged at DEBUG)" if tries == 1 else "")
                self._stop.wait(wait)
        for outcome, ok in zip(outcomes, landed):
            if not ok:
                continue
            if self._stats is not None:
                self._stats.broadcast_sent(
                    "retried" if outcome.state == "pending" else outcome.state)
            if outcome.state == "sent":
                self.sent += 1
            elif outcome.state == "blocked" and self._blocked is not None:
                self._tell_blocked(outcome)

    def _tell_blocked(self, outcome: RecipientOutcome) -> None:
        assert self._blocked is not None
        try:
            result = self._blocked(self._name_of(outcome.broadcast_id), outcome.chat_id)
            if inspect.isawaitable(result):
                import asyncio

                loop = self._loop
                if loop is not None and loop.is_running():
                    asyncio.run_coroutine_threadsafe(_awaited(result), loop).result()
                else:
                    asyncio.run(_awaited(result))
        except Exception:
            _LOGGER.exception("broadcasts: handle_blocked raised for chat %s",
                              outcome.chat_id)

    def _name_of(self, broadcast_id: int) -> str:
        name = self._names.get(broadcast_id)
        if name is None:
            for broadcast in self._store.list_broadcasts():
                self._names[broadcast.broadcast_id] = broadcast.name
            name = self._names.get(broadcast_id, str(broadcast_id))
        return name

    # -- one recipient ----------------------------------------------------------------------
    def _held_until(self) -> Optional[int]:
        """The end of a flood hold of the bot in the store, or :obj:`None`."""
        now = self._now_ms()
        if now - self._hold_read < HOLD_READ_MS:
            return None
        try:
            until = int(self._take([[_HOLD]], now, -1)[0])
        except Exception:  # no answer: the send goes, as it would have a moment ago
            return None
        if until > now:
            return until
        self._hold_read = now
        return None

    def _one(self, recipient: Recipient, params: Dict[str, Any]
             ) -> "tuple[RecipientOutcome, Optional[int]]":
        """Send to one recipient: its outcome, and the end of the flood hold its answer
        announced (:obj:`None` without one)."""
        assert self._send is not None
        try:
            self._send(recipient.method, params)
            return RecipientOutcome(recipient.broadcast_id, recipient.chat_id, "sent"), None
        except Exception as exc:
            outcome = self._failed(recipient, params, exc)
            held = outcome.due_at if outcome_of(exc, recipient.method) == HOLD else None
            return outcome, held

    def _failed(self, recipient: Recipient, params: Dict[str, Any],
                exc: BaseException) -> RecipientOutcome:
        text = error_text(exc)
        outcome = outcome_of(exc, recipient.method)
        ids = (recipient.broadcast_id, recipient.chat_id)
        if outcome == SENT:
            return RecipientOutcome(*ids, "sent")
        if outcome == HOLD:
            seconds = retry_after_seconds(exc) or 1.0
            until = self._now_ms() + int(seconds * 1000)
            try:  # every process of the bot waits it out, announced at once
                self._hold([(key, until) for key in self._pacing.hold_keys()])
            except Exception:
                _LOGGER.warning("broadcasts: the hold of %.0f s could not be stored", seconds)
            return RecipientOutcome(*ids, "pending", due_at=until, error=text)
        if outcome == MIGRATE:
            new_chat = getattr(exc, "new_chat_id", None)
            if isinstance(new_chat, int):
                try:
                    self._send(recipient.method, {**params, "chat_id": new_chat})  # type: ignore[misc]
                    return RecipientOutcome(*ids, "sent")
                except Exception as again:
                    exc, text = again, error_text(again)
            return RecipientOutcome(*ids, "failed", error=text)
        if outcome == FAIL:
            state = "blocked" if "Forbidden" in {c.__name__ for c in type(exc).__mro__} else "failed"
            return RecipientOutcome(*ids, state, error=text)
        if recipient.tries >= MAX_TRIES:
            return RecipientOutcome(*ids, "failed", error=text)
        backoff = min(60_000, 1000 * 2 ** min(recipient.tries, 6))
        return RecipientOutcome(*ids, "pending", due_at=self._now_ms() + backoff, error=text)


def _other_call(name: str, found: StoredBroadcast) -> str:
    return (f"a broadcast named {name!r} exists with another call ({found.method} "
            f"{found.params_json}): pick a new name, or cancel it first")


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
