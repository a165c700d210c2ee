"""OutboxDispatcher: sends the committed outbox calls, each chat's in order, at least once.

One per process running a fenced front end on an outbox store. The runtime creates it; the
front end gives it ``send(method, params) -> result`` (blocking; PTB: the Application's
``Bot.do_api_request`` run on its event loop, the blocking front end: an httpx client) and
starts it. Its loop runs on a thread of its own:

- it claims calls (``claim_calls`` under a sender token and a lease of ``lease_seconds``; the
  store gives a chat's calls one at a time, in commit order, across processes), at most as
  many as it has free senders (``outbox_concurrency``), so nothing it claims waits unsent;
- it is woken in-process right after a commit that carried calls, and otherwise looks every
  ``sweep_every_seconds`` (calls of a process that died before sending them, leases that
  lapsed) and when a retry it scheduled falls due;
- results are recorded ``sent`` in groups (one ``record_sent`` for the calls that ended
  together); failures are retried or failed by :func:`~ptb_fence.runtime._send_outcome.decide`;
- calls older than ``outbox_max_age_seconds`` end failed as expired, unsent;
- failed calls are delivered to ``handle_send_failure`` (at least once; acknowledged when it
  returns), or acknowledged at once without one;
- a stop releases at once what it claimed but did not start sending, waits for the requests
  in flight (bounded), records their results.
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

from ptb_fence.contract import OUTBOX_METHODS
from ptb_fence._values import OutboxEntry
from ptb_fence.runtime._daemon_pool import DaemonThreadPool
from ptb_fence.runtime._held_call import HeldCall
from ptb_fence.runtime._options import RuntimeOptions
from ptb_fence.runtime._outcome import error_text
from ptb_fence.runtime._port import StorePort
from ptb_fence.runtime._send_outcome import decide, retry_after_seconds
from ptb_fence.runtime._stats import RuntimeStats

if TYPE_CHECKING:
    import asyncio  # imported where used: import ptb_fence stays light

__all__ = ["FAILURE_PAGE", "OutboxDispatcher", "Send", "no_outbox"]

_LOGGER = logging.getLogger("ptb_fence.outbox")

Send = Callable[[str, Dict[str, Any]], Any]
"""``send(method, params) -> result``: one Bot API call (blocking); raises
``telegram.error`` exceptions as python-telegram-bot's ``Bot`` does."""

FAILURE_PAGE = 100
"""Failed calls delivered per page."""

_FLOOD_CHATS = 3
"""``RetryAfter`` answers for this many different chats within one hold mean a flood limit of
the whole bot: every chat is held until it ends."""

_CallKey = Tuple[int, int, str, int]
_Done = Tuple[OutboxEntry, Optional[str], Optional[BaseException]]
"""A call whose request ended: the entry, its result's JSON text or the error raised."""


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
        "_cond",
        "_defaults",
        "_delivering",
        "_done",
        "_failure_cursor",
        "_failures_due",
        "_flood",
        "_hold_until",
        "_inflight",
        "_loop",
        "_next_retry",
        "_options",
        "_pool",
        "_port",
        "_report",
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
        self._unsent: List[int] = []  # claimed, never started (a stop came first)
        self._unrecorded: List[Tuple[int, str, str, int]] = []  # sent; record_sent failed
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
        self._sender = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._stopping = False
        self._woken = True  # a first claim at once: calls left by a previous run
        self._failures_due = True
        self._pool = DaemonThreadPool(self._options.outbox_concurrency, "ptb_fence_outbox")
        self._thread = threading.Thread(target=self._run, name="ptb_fence_outbox", daemon=True)
        self._thread.start()

    def wake(self, handles: Sequence[HeldCall] = ()) -> None:
        """A commit carrying calls landed: send them now (``handles``: held calls whose ids
        this process learns when it claims them)."""
        for handle in handles:
            if handle.call_id is None:
                self._awaiting[(handle.identity.update_id, handle.identity.attempt,
                                handle.identity.claim_id, handle.seq)] = handle
        with self._cond:
            self._woken = True
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

    def _run(self) -> None:
        poll_ms = int(self._options.sweep_every_seconds * 1000)
        next_poll = 0  # epoch ms; 0: claim at once
        while True:
            with self._cond:
                while True:
                    if self._stopping or self._done:
                        break
                    now = self._now()
                    free = self._options.outbox_concurrency - len(self._inflight)
                    held = now < self._hold_until
                    due = self._woken or now >= next_poll or (
                        self._next_retry is not None and now >= self._next_retry
                    )
                    if free > 0 and due and not held:
                        break
                    wake_at = self._hold_until if held else min(
                        next_poll, self._next_retry or next_poll
                    )
                    self._cond.wait(max(0.001, min((wake_at - now) / 1000.0, 1.0)))
                self._woken = False
                done, self._done = self._done, []
                stopping = self._stopping
            try:
                self._record(done)
                if stopping:
                    self._finish_stop()
                    return
                now = self._now()
                if now < self._hold_until:  # claim the moment the hold ends
                    next_poll = min(next_poll, self._hold_until)
                    continue
                if self._next_retry is not None and now >= self._next_retry:
                    self._next_retry = None
                if now >= next_poll:  # a sweep round: failures of other processes too
                    self._failures_due = True
                full = self._claim_and_send()
                next_poll = now if full else now + poll_ms
                self._deliver_failures_soon()
            except Exception:  # never let the loop die: the next round tries again
                _LOGGER.exception("outbox: the sender loop failed; it goes on")
                next_poll = self._now() + 1000

    def _finish_stop(self) -> None:
        """The loop's last round: wait (bounded by :meth:`stop`) for the requests in flight,
        record them, release what never started."""
        with self._cond:
            deadline = self._stop_deadline
            while self._started and time.monotonic() < deadline:
                self._cond.wait(0.05)
            done, self._done = self._done, []
            unsent, self._unsent = self._unsent, []
            # claimed and handed to a sender thread that has not begun: never begins now
            unsent.extend(cid for cid in self._inflight if cid not in self._started)
        self._record(done)
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
        self._flush_unrecorded()

    def _claim_and_send(self) -> bool:
        """Claim as many calls as there are free senders and start them; whether the claim
        was full (more may be due at once)."""
        free = self._options.outbox_concurrency - len(self._inflight)
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
        return len(claimed) >= free

    def _send_one(self, entry: OutboxEntry) -> None:
        """On a sender thread: one request, its result handed to the loop."""
        with self._cond:
            if self._stopping:
                self._inflight.pop(entry.call_id, None)
                self._unsent.append(entry.call_id)
                self._cond.notify_all()
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
        with self._cond:
            self._started.discard(entry.call_id)
            self._inflight.pop(entry.call_id, None)
            self._done.append((entry, result, error))
            self._cond.notify_all()

    # -- outcomes ------------------------------------------------------------------------------
    def _record(self, done: Sequence[_Done]) -> None:
        """Record what ended: the sent calls in one commit, then each failure's decision."""
        if not done:
            self._flush_unrecorded()
            return
        now = self._now()
        sent = [(e.call_id, self._sender, r, now) for e, r, err in done if err is None and r]
        self._unrecorded.extend(sent)
        self._flush_unrecorded()
        for entry, _, error in done:
            if error is not None:
                self._failed_send(entry, error)

    def _flush_unrecorded(self) -> None:
        """Record the sent calls in one commit (kept for the next round if it fails: until
        the sender lease lapses nobody else sends them)."""
        items, self._unrecorded = self._unrecorded, []
        if not items:
            return
        try:
            landed = self._stats.timed("outbox", self._port.record_sent, items)
        except Exception as exc:
            self._report(exc, "outbox")
            self._unrecorded = items + self._unrecorded
            return
        self._stats.calls_sent(sum(1 for ok in landed if ok))
        for (call_id, *_), ok in zip(items, landed):
            if not ok:
                _LOGGER.warning(
                    "outbox: call %s was sent but its sender lease had lapsed and another "
                    "sender holds it: it may be sent twice", call_id,
                )

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
            extra={"call_id": entry.call_id, "error": decision.error},
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
            extra={"call_id": entry.call_id, "update_id": entry.update_id,
                   "attempt": entry.attempt, "claim_id": entry.claim_id},
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
