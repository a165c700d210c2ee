"""UpdateIntake: the durable, fenced runtime for blocking bots (no asyncio)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Dict, Hashable, Iterable, List, Literal, Optional, Set, Tuple

from ptb_fence._durations import format_duration
from ptb_fence._errors import UsageError
from ptb_fence.contract import UpdateStore
from ptb_fence._values import Exhaustion, OutboxEntry, StoredBroadcast, StoredUpdate
from ptb_fence.runtime._delivered import DeliveredExhaustion
from ptb_fence.blocking._sender import DEFAULT_BASE_URL, HttpxSender
from ptb_fence.runtime._held_call import HeldCall
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._broadcasts import STOP_SECONDS, Broadcasts
from ptb_fence.runtime._chats import ChatOrder, chat_key
from ptb_fence.runtime._alarms import Health
from ptb_fence.runtime._runtime import FrontEndHooks, Record, Runtime
from ptb_fence.runtime._stats import Stats
from ptb_fence.runtime._sweep import recheck_delay, retry_delay
from ptb_fence.blocking._deliveries import ThreadDeliveries
from ptb_fence.runtime._ingest import InvalidUpdate, parse_update_body
from ptb_fence.blocking._flow_adapter import ThreadFlowAdapter
from ptb_fence.blocking._intake_runs import IntakeRuns, IntakeWorkers
from ptb_fence.blocking._isolation import ThreadIsolationGate
from ptb_fence.runtime._options import RuntimeOptions
from ptb_fence.runtime._outcome import Outcome
from ptb_fence.runtime._recovery import STOP_MARGIN_SECONDS
from ptb_fence.blocking._group_commit import ThreadGroupCommit
from ptb_fence.blocking._jobs import IntakeJobQueue
from ptb_fence.blocking._wakeups import Wakeups
from ptb_fence.runtime._durable_jobs import FIRE_PAGE, DurableJobs, job_run_of

__all__ = ["UpdateIntake"]

_LOGGER = logging.getLogger("ptb_fence.intake")

AcceptResult = Literal["accepted", "duplicate", "invalid"]


class UpdateIntake:
    """Durable intake and fenced handling of Telegram updates for blocking bots.

    Every update is recorded in the store by :meth:`accept` before it returns (answer
    Telegram only after that), then claimed under a lease, handled on a worker thread and
    settled. Failures retry with backoff. A final failure becomes a durable exhaustion when
    ``handle_exhaustion`` is given.

    Args:
        store: An update store (:class:`~ptb_fence.UpdateStore`). It must be fenced for
            ``handle_attempt`` and durable for ``handle_exhaustion``.
        handle: ``handle(update_dict)``: unary handler (any base store, including a legacy
            PostgreSQL table).
        handle_attempt: ``handle_attempt(update_dict, attempt)``: attempt-aware handler that
            receives the :class:`~ptb_fence.Attempt` (needs a fenced store).
        handle_exhaustion: ``handle_exhaustion(exhaustion)``: called at least once per
            exhaustion. The exhaustion is acknowledged when it returns normally.
        bot_token: The bot's token: with an outbox store (:class:`~ptb_fence.OutboxStore`)
            and ``handle_attempt`` the intake sends the calls handlers queue with
            ``attempt.outbox`` (a blocking httpx client). Without it ``attempt.outbox``
            refuses with a :exc:`TypeError` (nothing would send the calls here). Its bot id
            is part of every ``attempt.effect_key``.
        bot_base_url: The Bot API base URL the token is appended to (default
            ``"https://api.telegram.org/bot"``, as PTB's ``base_url``).
        **options: The options of :class:`~ptb_fence.runtime.RuntimeOptions`
            (``max_attempts``, ``lease_seconds``, ``sweep_every_seconds``,
            ``pending_grace_seconds``, ``retain_seconds``, ``max_concurrent``, ``retry``,
            ``on_failure``, ``on_exhaustion_failure``, ``on_store_error``, ``clock``,
            ``strict_chat_order``, …).

    Raises:
        TypeError: Not exactly one of ``handle``/``handle_attempt``, or the store lacks the
            methods the configuration needs (named in the message).
        ValueError: A numeric option is not positive (named in the message).
    """

    __slots__ = (
        "_adapter",
        "_chats",
        "_claims",
        "_closed",
        "_delivery",
        "_delivery_lock",
        "_durable_jobs",
        "_gate",
        "_handle_exhaustion",
        "_job_looks",
        "_jobs",
        "_lock",
        "_refill",
        "_records",
        "_refills",
        "_runs",
        "_wakeups",
        "_runtime",
        "_sender",
        "_started",
        "_sweep_lock",
        "_workers",
    )

    def __init__(
        self,
        store: UpdateStore,
        *,
        handle: Optional[Callable[[Dict[str, Any]], Any]] = None,
        handle_attempt: Optional[Callable[[Dict[str, Any], Attempt], Any]] = None,
        handle_exhaustion: Optional[Callable[[DeliveredExhaustion], Any]] = None,
        bot_token: Optional[str] = None,
        bot_base_url: str = DEFAULT_BASE_URL,
        **options: Any,
    ) -> None:
        if (handle is None) == (handle_attempt is None):
            raise TypeError("UpdateIntake needs exactly one of handle= or handle_attempt=")
        for name, fn in (
            ("handle", handle),
            ("handle_attempt", handle_attempt),
            ("handle_exhaustion", handle_exhaustion),
        ):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable, got {fn!r}")
        self._runtime = Runtime(
            store,
            RuntimeOptions.from_options("UpdateIntake", options),
            attempt_aware=handle_attempt is not None,
            handle_exhaustion=handle_exhaustion is not None,
            component="UpdateIntake",
            hooks=FrontEndHooks(
                retry_soon=self._retry_soon,
                running_count=self._running_count,
                left_running_count=self._left_running_count,
            ),
        )
        head = (bot_token or "").split(":", 1)[0]
        if head.isdigit():  # the bot of attempt.effect_key (the store is not bound to it)
            self._runtime.port.bot_id = int(head)
        outbox = self._runtime.outbox
        self._sender: Optional[HttpxSender] = None
        if outbox is not None:
            if bot_token is None:
                outbox.refuse_calls(
                    "UpdateIntake has no bot_token: pass UpdateIntake(..., bot_token=TOKEN) so "
                    "the intake sends the calls attempt.outbox queues"
                )
            else:
                self._sender = HttpxSender(bot_token, bot_base_url)
        self._handle_exhaustion = handle_exhaustion
        self._lock = threading.Lock()
        self._sweep_lock = threading.Lock()
        self._delivery_lock = threading.Lock()
        # exhaustion handlers run on their own threads, never on a worker holding a chat's turn
        # nor on the sweep: a hanging one blocks neither (the runtime's decisions: at most one
        # delivery per exhaustion, at most MAX_DELIVERIES at once)
        self._delivery = (
            ThreadDeliveries(self._runtime, handle_exhaustion)
            if handle_exhaustion is not None
            else None
        )
        # a handler past attempt_timeout_seconds stops counting against max_concurrent there
        self._workers = IntakeWorkers(
            self._runtime.options.max_concurrent,
            lambda job: self._run_update(*job),
            lambda job: self._chats.done(job[0], job[1]),
        )
        self._chats = ChatOrder(self._start_update)
        self._started = False
        self._closed = False
        self._refill = False
        self._refills: Set[threading.Thread] = set()
        # a retry due before the next sweep is handed back at its time (same fenced claim)
        self._wakeups = Wakeups("ptb_fence-retries")
        # updates accepted together are recorded together, and workers that finish together
        # complete together (one commit each where the store can)
        self._records: ThreadGroupCommit[Tuple[int, str, Hashable], Record] = ThreadGroupCommit(
            self._record_group
        )
        completions: ThreadGroupCommit[Attempt, Outcome] = ThreadGroupCommit(
            self._runtime.complete_many
        )
        # workers that start together claim together (one commit) where the store can
        self._claims: Optional[ThreadGroupCommit[Tuple[int, str], Optional[Attempt]]] = (
            ThreadGroupCommit(self._claim_group) if self._runtime.claims_in_groups else None
        )
        # an attempt of a suspect row starts on probation or runs alone (see _isolation)
        self._gate = ThreadIsolationGate()
        self._runs = IntakeRuns(
            self._runtime,
            self._wakeups,
            self._workers,
            self._turn_done,
            self._submit_exhaustion,
            self._gate,
        )
        handler = handle_attempt if handle_attempt is not None else handle
        assert handler is not None  # exactly one, checked above
        # durable jobs: on a store that keeps them, for attempt-aware handling. A run is an
        # update whose body carries the job: it goes to the job's callback, not the handler
        self._jobs: Optional[IntakeJobQueue] = None
        self._durable_jobs: Optional[DurableJobs] = None
        self._job_looks = Wakeups("ptb_fence-jobs")
        if handle_attempt is not None and self._runtime.port.has_jobs:
            self._durable_jobs = DurableJobs(self._runtime.port, self._runtime.now_ms,
                                             self._runtime.options.strict_chat_order)
            self._jobs = IntakeJobQueue(self._durable_jobs,
                                        lambda: self._runtime.now_ms() / 1000)
            handler = self._handler_with_jobs(handle_attempt, self._jobs)
        # the per-update flow (runtime._flow), each update on its worker thread
        self._adapter = ThreadFlowAdapter(
            self._runtime,
            self._gate,
            self._runs,
            self._claims,
            completions,
            handler,
            handle_attempt is not None,
            self._turn_done,
            self._submit_exhaustion,
        )

    # -- properties -------------------------------------------------------------------------
    @property
    def jobs(self) -> IntakeJobQueue:
        """:class:`~ptb_fence.blocking.IntakeJobQueue`: The durable jobs of this intake.

        Raises:
            TypeError: The intake has no ``handle_attempt``, or its store keeps no jobs
                (``StoreFeatures(jobs=True)``).
        """
        if self._jobs is None:
            raise TypeError(
                "UpdateIntake.jobs needs handle_attempt=... and a store that keeps jobs "
                "(StoreFeatures(jobs=True): SQLiteUpdateStore, PostgresUpdateStore, "
                f"MemoryUpdateStore); {type(self.store).__name__} with "
                f"{'handle_attempt' if self._runtime.attempt_aware else 'handle'} has none"
            )
        return self._jobs

    @staticmethod
    def _handler_with_jobs(handle_attempt: Callable[[Dict[str, Any], Attempt], Any],
                           jobs: IntakeJobQueue) -> Callable[[Dict[str, Any], Attempt], Any]:
        def handle(update: Dict[str, Any], attempt: Attempt) -> Any:
            run = job_run_of(update)
            if run is not None:
                return jobs.run(run, attempt)
            return handle_attempt(update, attempt)

        return handle

    def _look_for_jobs(self) -> None:
        """Fire the due runs of durable jobs and hand them to the workers, then look again."""
        durable = self._durable_jobs
        if durable is None or self._closed:
            return
        try:
            fired = durable.fire_due()
        except Exception as exc:  # the store did not answer: the next look tries again
            _LOGGER.warning("jobs: looking for due runs failed (%s): trying again", exc)
            fired = []
        for update_id, body in fired:
            if self._closed:
                break
            self._dispatch(update_id, body, json.loads(body))
        interval = min(1.0, self._runtime.options.sweep_every_seconds)
        self._job_looks.call_later(0.0 if len(fired) >= FIRE_PAGE else interval,
                                   self._look_for_jobs)

    @property
    def store(self) -> Any:
        """The update store."""
        return self._runtime.store

    @property
    def options(self) -> RuntimeOptions:
        """The validated options."""
        return self._runtime.options

    @property
    def runtime(self) -> Runtime:
        """The shared runtime (lease keeper, decisions)."""
        return self._runtime

    def stats(self) -> Stats:
        """What this intake counted since it was created, and how things stand now.

        A frozen :class:`~ptb_fence.Stats` snapshot for your own metrics system. It is cheap
        (no store call). :mod:`ptb_fence.metrics` exposes the same to Prometheus."""
        return self._runtime.snapshot()

    def healthy(self) -> Health:
        """Whether this intake is healthy now, for a readiness endpoint: started, the store
        answering, the lease keeper on time, a sweep recent, recording not failing. The
        :class:`~ptb_fence.Health` value is true when healthy and names each problem
        otherwise (no store call)."""
        return self._runtime.health()

    def outbox_call(self, call: "int | HeldCall") -> Optional[OutboxEntry]:
        """The outbox call ``call`` as stored now: its state, tries, last error and, once
        sent, the Bot API result (``json.loads(entry.result_json)["message_id"]``).

        ``call`` is what ``attempt.outbox`` returned: an outbox id, or a
        :class:`~ptb_fence.HeldCall` (:obj:`None` while its id is not known here).

        Raises:
            TypeError: ``call`` is neither.
        """
        return self._runtime.outbox_call(call)

    def _running_count(self) -> int:
        return self._runs.count()

    def _left_running_count(self) -> int:
        return self._workers.stuck_count()

    # -- broadcasts --------------------------------------------------------------------------
    def _broadcasts(self) -> Broadcasts:
        broadcasts = self._runtime.broadcasts
        if broadcasts is None or self._sender is None:
            raise UsageError(
                f"UpdateIntake: {type(self._runtime.store).__name__} keeps no broadcasts, or "
                "the intake has no bot_token to send with: pass bot_token= and a store that "
                "declares StoreFeatures(outbox=True, broadcasts=True), such as "
                "SQLiteUpdateStore or PostgresUpdateStore")
        return broadcasts

    def broadcast(self, name: str, chat_ids: Iterable[int], method: str = "sendMessage",
                  **params: Any) -> StoredBroadcast:
        """Send ``method(chat_id=..., **params)`` to every chat of ``chat_ids``, once each.

        As :meth:`ptb_fence.ptb.FencedUpdateProcessor.broadcast`, blocking: it returns once
        the broadcast and its recipients are recorded.

        Raises:
            UsageError: The store keeps no broadcasts, ``chat_id`` was passed, or ``name``
                exists with another call.
        """
        started = self._broadcasts().start(name, chat_ids, method, **params)
        if self._runtime.broadcast_sender is not None:
            self._runtime.broadcast_sender.wake()
        return started

    def pause_broadcast(self, name: str) -> StoredBroadcast:
        """Send nothing more of the broadcast ``name`` until :meth:`resume_broadcast`."""
        return self._broadcasts().pause(name)

    def resume_broadcast(self, name: str) -> StoredBroadcast:
        """Send the rest of the paused broadcast ``name``."""
        resumed = self._broadcasts().resume(name)
        if self._runtime.broadcast_sender is not None:
            self._runtime.broadcast_sender.wake()
        return resumed

    def cancel_broadcast(self, name: str) -> StoredBroadcast:
        """Send nothing more of the broadcast ``name``, ever."""
        return self._broadcasts().cancel(name)

    def get_broadcast(self, name: str) -> StoredBroadcast:
        """The broadcast ``name`` with its recipients counted per state."""
        return self._broadcasts().get(name)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start workers, the lease keeper and the periodic sweep, and take every pending row.

        Idempotent. Updates accepted before ``start()`` are handled now.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("this UpdateIntake is closed; make a new one")
            if self._started:
                return
            self._runtime.probes.start()  # first: a port in use fails the start before anything ran
            self._workers.start()
            self._started = True
        # this process's liveness signal: its claims are taken over at once elsewhere only
        # once it is gone
        self._runtime.recovery.hold_liveness()
        self._runtime.chat_order.key_unkeyed()  # before the first claim (strict_chat_order)
        self._runtime.jobs.start(self._scheduled_sweep, taken_over=self._sweep_taken_over)
        self._runtime.alarms.started()
        if self._sender is not None and self._runtime.outbox is not None:
            self._runtime.outbox.start(self._sender)
            if self._runtime.broadcast_sender is not None:
                self._runtime.broadcast_sender.start(self._sender)
        self._sweep(include_fresh=True)
        if self._durable_jobs is not None:
            self._job_looks.call_later(0.0, self._look_for_jobs)

    def close(self, timeout: Optional[float] = None) -> None:
        """Stop taking work and wait (bounded) for running attempts to finish.

        Updates waiting for their turn stay in the store for the next start or another
        process. Running attempts get ``stop_timeout_seconds`` (or ``timeout``, if shorter) to
        finish. Then they are released in one ``release_many``, their attempts not spent. Their
        fenced writes are refused from then on. Their threads are abandoned and run on until
        their handler returns. :meth:`accept` still records after ``close()``, so nothing posted
        late is lost. It does not close the store.

        It waits for every thread the intake started. Close the store only after ``close()``
        returned.

        Args:
            timeout: Seconds to wait in all. With :obj:`None`, attempts get
                ``stop_timeout_seconds`` and the intake's own store work at most 2 s more, so a
                database that does not answer cannot hold ``close()``. Exhaustion deliveries
                get as long as they need. Giving back the attempts still running may take up
                to 2 s beyond it. What still runs after it is named in a WARNING.
        """
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> Optional[float]:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        self._runtime.alarms.stopped()
        self._runtime.probes.stop()
        self._gate.close()  # a worker waiting as a suspect gives its update back
        self._chats.drop_waiting()
        running: List[str] = []
        if started:
            # queued runs are not cancelled: each sees _closed, skips its update (left in the
            # store) and calls ChatOrder.done, so idle() still becomes true
            self._workers.shutdown()
            grace = self._runtime.options.stop_timeout_seconds
            remaining = left()
            waited = grace if remaining is None else min(grace, remaining)
            if not self._chats.wait_empty(waited):
                running_now = self._runs.count()
                if running_now:
                    _LOGGER.warning(
                        "close(): %d handler(s) still running after %s: releasing their "
                        "updates where possible (open fenced transactions are ended first; "
                        "what is not released is logged) and abandoning their threads",
                        running_now,
                        format_duration(waited),
                    )
        # Giving back what still runs takes milliseconds when the store answers. It gets the
        # margin even past ``timeout`` (a release cut short would strand the update for its
        # lease), and no more: a database that does not answer must not hold close()
        self._runs.release_all(STOP_MARGIN_SECONDS)
        margin_until = time.monotonic() + STOP_MARGIN_SECONDS

        def internal() -> float:  # the intake's own threads: bounded even without a timeout
            until = margin_until if deadline is None else min(margin_until, deadline)
            return max(0.0, until - time.monotonic())

        running += self._wakeups.close(internal())
        running += self._job_looks.close(internal())
        running += self._runtime.jobs.stop(internal())
        outbox = self._runtime.outbox
        if outbox is not None and self._sender is not None:
            grace = self._runtime.options.stop_timeout_seconds
            remaining = left()
            if self._runtime.broadcast_sender is not None:
                self._runtime.broadcast_sender.stop(
                    STOP_SECONDS if remaining is None else min(STOP_SECONDS, remaining))
                remaining = left()
            outbox.stop(grace if remaining is None else min(grace, remaining))
            self._sender.close()
        with self._lock:
            refills = list(self._refills)
        for thread in refills:
            thread.join(internal())
            if thread.is_alive():
                running.append(thread.name)
        if self._delivery is not None:
            running += self._delivery.close(left())
        self._runtime.recovery.release_liveness()
        if running:
            _LOGGER.warning(
                "close(): still running when close() returned: %s; attempts lose their lease "
                "renewal and are taken over after the lease; close the store only after they "
                "end (idle())",
                ", ".join(running),
            )
        stuck = self._workers.stuck()
        if stuck:
            # their attempts were failed at the timeout (lease no longer renewed, writes
            # refused): only the threads are left, and a thread cannot be stopped
            _LOGGER.warning(
                "close(): %d worker thread(s) still stuck in handlers that passed "
                "attempt_timeout_seconds (their attempts already ended): %s; they keep the "
                "interpreter from exiting until their handlers return",
                len(stuck),
                ", ".join(stuck),
            )

    def __enter__(self) -> "UpdateIntake":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- intake -----------------------------------------------------------------------------
    def accept(self, body: "bytes | str") -> AcceptResult:
        """Record one update durably, then hand it to a worker.

        Args:
            body: The request body (bytes or str): the update's JSON text.

        Returns:
            ``"accepted"`` (recorded now), ``"duplicate"`` (already recorded) or ``"invalid"``
            (not an update, nothing stored).

        Raises:
            Exception: A store error propagates: the update was not recorded, so do not
                acknowledge it to Telegram.
        """
        try:
            update_id, text, update = parse_update_body(body)
        except InvalidUpdate as exc:
            _LOGGER.info("invalid update refused: %s", exc)
            self._runtime.stats.invalid()
            return "invalid"
        # threads that accept at the same time record in one commit (webhook servers)
        added = self._records.submit((update_id, text, chat_key(update))) is True
        if not added:
            return "duplicate"
        _LOGGER.debug("recorded update %s", update_id, extra={"update_id": update_id})
        if self._started and not self._closed:
            self._dispatch(update_id, text, update)
        return "accepted"

    def idle(self, timeout: Optional[float] = None) -> bool:
        """Wait until no update is queued or running and no exhaustion is being delivered.

        Returns:
            :obj:`True` when idle, :obj:`False` when ``timeout`` (seconds) passed first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> Optional[float]:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if not self._chats.wait_empty(left()):
            return False
        if self._delivery is not None and not self._delivery.wait_idle(left()):
            return False
        return self._chats.wait_empty(left())

    def sweep(self) -> int:
        """Run one sweep now: hand over due updates, deliver exhaustions, prune.

        Waits for the exhaustion deliveries it starts (each at most
        ``DELIVERY_WAIT_SECONDS``, 30 s), not for ones already being delivered.

        Returns:
            The number of updates handed to workers.
        """
        return self._sweep(include_fresh=False)

    # -- internals --------------------------------------------------------------------------
    def _scheduled_sweep(self) -> None:
        # the scheduled sweep never waits for an exhaustion handler: a hanging one must not
        # stop the retries and lapsed-lease takeovers of this process
        self._sweep(include_fresh=False, deliver_inline=False)

    def _sweep_taken_over(self) -> None:
        # a dead process's claims were taken over: its pending rows (recorded past its claim
        # budget) are taken now too, not after pending_grace_seconds
        self._sweep(include_fresh=True, deliver_inline=False)

    def _deliver_exhaustions(self, wait: bool) -> List[threading.Event]:
        """Start deliveries for one page of due exhaustions (rotating cursor).

        Returns one event per delivery started now (set once delivered, or once it ran longer
        than ``DELIVERY_WAIT_SECONDS``). Without ``wait``, skipped while every delivery slot
        is taken.
        """
        delivery = self._delivery
        if delivery is None or self._closed:
            return []
        if not wait and delivery.full:
            return []
        if not self._delivery_lock.acquire(blocking=False):
            return []  # another sweep is fetching a page (it keeps the cursor)
        try:
            page = delivery.due()
        finally:
            self._delivery_lock.release()
        return delivery.submit(page)

    def _sweep(self, *, include_fresh: bool, deliver_inline: bool = True) -> int:
        runtime = self._runtime
        if not self._sweep_lock.acquire(blocking=False):
            return 0
        handed = 0
        delivering: List[threading.Event] = []
        try:
            page = runtime.sweep_page(include_fresh=include_fresh)
            for row in page.rows:
                if self._closed:
                    break
                if self._dispatch_stored(row):
                    handed += 1
            # more may be due: the next page follows when the workers drain
            self._refill = page.more(handed)
            delivering = self._deliver_exhaustions(wait=deliver_inline)
            runtime.sweep_done(handed)
        finally:
            self._sweep_lock.release()
        if deliver_inline:
            for event in delivering:  # outside the lock: scheduled sweeps go on meanwhile
                event.wait()
        return handed

    def _dispatch_stored(self, row: StoredUpdate) -> bool:
        try:
            update = json.loads(row.body)
            if not isinstance(update, dict):
                raise ValueError("not an object")
        except (ValueError, RecursionError):
            update = {"update_id": row.update_id}
        return self._dispatch(row.update_id, row.body, update)

    def _dispatch(self, update_id: int, text: str, update: Dict[str, Any]) -> bool:
        return self._chats.submit(chat_key(update), update_id, (text, update))

    def _start_update(self, key: Hashable, update_id: int, item: Any) -> None:
        if not self._workers.submit((key, update_id, item)):  # not started, or closed
            self._chats.done(key, update_id)

    def _run_update(self, key: Hashable, update_id: int, item: Any) -> None:
        try:
            if self._closed:
                self._turn_done(key, update_id, None)
            else:  # the flow passes the chat's turn on
                self._adapter.process(key, update_id, item[0], item[1])
        except BaseException:  # pragma: no cover - the flow never raises
            _LOGGER.exception(
                "unexpected error processing update %s", update_id, extra={"update_id": update_id}
            )
        finally:
            if self._refill and len(self._chats) == 0 and not self._closed:
                self._refill = False
                self._start_refill()

    def _turn_done(self, key: Hashable, update_id: int, outcome: Optional[Outcome]) -> None:
        """Pass the chat's turn on.

        Under ``strict_chat_order`` it first queues the chat's next update from the store
        (:meth:`StoreChatOrder.successor
        <ptb_fence.runtime._store_chat_order.StoreChatOrder.successor>`). An ``outcome`` of
        :obj:`None` means not claimed."""
        try:
            if not self._closed:
                waiting = self._chats.waiting(key)
                successor = self._runtime.chat_order.successor(key, outcome, waiting=waiting)
                if successor is not None:
                    self._dispatch_stored(successor)
        finally:
            self._chats.done(key, update_id)

    def _start_refill(self) -> None:
        """Sweep for the next page on a thread of its own (close() waits for it)."""

        def refill() -> None:
            try:
                self._sweep(include_fresh=True)
            finally:
                with self._lock:
                    self._refills.discard(thread)

        thread = threading.Thread(target=refill, name="ptb_fence-refill", daemon=True)
        with self._lock:
            if self._closed:
                return
            self._refills.add(thread)
        thread.start()

    def _retry_soon(self, update_id: int, delay: float, body: Optional[str]) -> None:
        if body is None:
            return  # the sweep takes it

        tries = [0]

        def wake() -> None:
            if not self._started or self._closed:
                return
            if not self._dispatch_stored(StoredUpdate(update_id=update_id, body=body)):
                # still finishing its failed attempt here: look again shortly
                again = recheck_delay(tries[0])
                tries[0] += 1
                if again is not None:
                    self._wakeups.call_later(again, wake)

        self._wakeups.call_later(retry_delay(delay), wake)

    def _record_group(self, items: List[Tuple[int, str, Hashable]]) -> List[Record]:
        return self._runtime.record_many(
            [(update_id, text) for update_id, text, _ in items],
            chats=[chat for _, _, chat in items],
        )

    def _claim_group(self, items: List[Tuple[int, str]]) -> List[Optional[Attempt]]:
        return self._runtime.claim_many([i for i, _ in items], [text for _, text in items])

    def _submit_exhaustion(self, exhaustion: Exhaustion) -> None:
        if self._delivery is not None:
            self._delivery.submit([exhaustion])
