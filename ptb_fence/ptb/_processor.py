"""DurableUpdateProcessor and FencedUpdateProcessor: ptb_fence inside a PTB Application.

The processor's life cycle (wiring with ``install``, ``initialize``, stopping, ``shutdown``)
and PTB's entry for one update (``process_update``/``do_process_update``). The update's own
sequence (the claim, the gate, the handler, the settlement, the chat's turn) is the runtime's
:class:`~ptb_fence.runtime._flow.UpdateFlow`, run by ``_flow_adapter``. Recording is in
``_ingest``, the sweep and the retry timers in ``_sweeper``, exhaustion delivery in
``_deliveries``, the state they share in ``_state``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from typing import Any, Awaitable, Callable, Iterable, Optional

from telegram import Update
from telegram.ext import BaseUpdateProcessor

from ptb_fence.contract import UpdateStore
from ptb_fence._errors import UsageError
from ptb_fence._values import OutboxEntry, StoredBroadcast
from ptb_fence.runtime._delivered import DeliveredExhaustion
from ptb_fence.ptb._application import FencedApplicationMixin
from ptb_fence.ptb._bodies import update_body
from ptb_fence.ptb._context import FencedCallbackContext
from ptb_fence.ptb._deliveries import AsyncDeliveries
from ptb_fence.ptb._flow_adapter import AsyncFlowAdapter
from ptb_fence.ptb._direct_sends import DirectSendWatch, unwatch_direct_sends, watch_direct_sends
from ptb_fence.ptb._handlers import RunningHandlers
from ptb_fence.ptb._ingest import Ingest
from ptb_fence.ptb._interfaces import ApplicationBinding
from ptb_fence.ptb._job_pump import JobPump
from ptb_fence.ptb._job_queue import FencedJobQueue, install_job_runner
from ptb_fence.ptb._queue import DurableUpdateQueue
from ptb_fence.ptb._request import unwrap_get_updates_request, wrap_get_updates_request
from ptb_fence.ptb._callback_data import outbox_preparer
from ptb_fence.ptb._sender import BotSender
from ptb_fence.ptb._state import SharedState
from ptb_fence.ptb._stopping import Stopping
from ptb_fence.ptb._sweeper import Sweeper
from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.ptb._wiring import (
    BuilderType,
    configure_builder,
    warn_non_blocking,
    warn_unfenced_persistence,
)
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._broadcasts import Broadcasts
from ptb_fence.runtime._durable_jobs import DurableJobs
from ptb_fence.runtime._held_call import HeldCall
from ptb_fence.runtime._hop import StoreHop
from ptb_fence.runtime._alarms import Health
from ptb_fence.runtime._runtime import FrontEndHooks, Runtime
from ptb_fence.runtime._options import RuntimeOptions
from ptb_fence.runtime._stats import Stats

__all__ = ["BaseFenceProcessor", "DurableUpdateProcessor", "FencedUpdateProcessor"]

_LOGGER = logging.getLogger("ptb_fence.ptb")


class BaseFenceProcessor(ApplicationBinding, BaseUpdateProcessor):
    """Shared machinery of :class:`DurableUpdateProcessor` and :class:`FencedUpdateProcessor`.

    Not used directly.
    """

    __slots__ = (
        "_adapter",
        "_application_ref",
        "_deliveries",
        "_durable_jobs",
        "_handle_exhaustion",
        "_handlers",
        "_ingest",
        "_job_pump",
        "_job_queue",
        "_queue",
        "_runtime",
        "_state",
        "_stopping",
        "_sweeper",
        "_threads",
        "_watch",
    )

    def __init__(
        self,
        store: UpdateStore,
        *,
        attempt_aware: bool,
        handle_exhaustion: Optional[Callable[[DeliveredExhaustion], Any]] = None,
        durable_jobs: bool = False,
        **options: Any,
    ) -> None:
        if handle_exhaustion is not None and not callable(handle_exhaustion):
            raise TypeError(f"handle_exhaustion must be callable, got {handle_exhaustion!r}")
        runtime_options = RuntimeOptions.from_options(type(self).__name__, options)
        runtime = self._runtime = Runtime(
            store,
            runtime_options,
            attempt_aware=attempt_aware,
            handle_exhaustion=handle_exhaustion is not None,
            component=type(self).__name__,
            hooks=FrontEndHooks(
                retry_soon=self._retry_soon,
                running_count=self._running_count,
                left_running_count=self._left_running_count,
                executor=self._executor,
                body_of=self._body_of,
            ),
        )
        super().__init__(runtime_options.max_concurrent)
        self._handle_exhaustion = handle_exhaustion
        self._watch: Optional[DirectSendWatch] = None  # a fenced handler's direct sends
        # weakly, as PTB's JobQueue holds it: the Application holds this processor
        self._application_ref: "Optional[weakref.ReferenceType[Any]]" = None
        self._threads = StoreThreads()
        self._handlers = RunningHandlers()
        self._stopping = Stopping(runtime, self._threads, self._handlers)
        self._state = SharedState(self._stopping.release_soon)
        self._ingest = Ingest(
            runtime,
            self._state,
            self._threads,
            self._get_application,
            self._redeliver,
            type(self).__name__,
        )
        self._queue = DurableUpdateQueue(self._ingest)
        self._deliveries = AsyncDeliveries(runtime, self._threads, handle_exhaustion)
        self._sweeper = Sweeper(
            runtime,
            self._state,
            self._threads,
            self._deliveries,
            self._get_application,
            self._redeliver,
        )
        # the per-update flow (runtime._flow), on this event loop
        self._adapter = AsyncFlowAdapter(
            runtime,
            self._state,
            self._threads,
            self._handlers,
            self._ingest,
            self._sweeper,
            self._deliveries,
        )
        self._state.parked = self._adapter.waiting_count
        self._durable_jobs: Optional[DurableJobs] = None
        self._job_queue: Optional[FencedJobQueue] = None
        self._job_pump: Optional[JobPump] = None
        if durable_jobs:
            if not runtime.port.has_jobs:
                raise TypeError(
                    f"{type(self).__name__}(durable_jobs=True) needs a store that keeps jobs: "
                    f"{type(store).__name__} does not declare StoreFeatures(jobs=True) "
                    "(SQLiteUpdateStore, PostgresUpdateStore and MemoryUpdateStore do)"
                )
            self._durable_jobs = DurableJobs(runtime.port, runtime.now_ms,
                                             runtime_options.strict_chat_order)
            self._job_queue = FencedJobQueue()
            self._job_pump = JobPump(self._durable_jobs, self._threads,
                                     self._sweeper.hand_over,
                                     runtime_options.sweep_every_seconds)

    # -- the runtime's hooks into this front end ---------------------------------------------
    def _retry_soon(self, update_id: int, delay: float, body: Optional[str]) -> None:
        self._sweeper.retry_soon(update_id, delay, body)

    @staticmethod
    def _body_of(attempt: Attempt) -> Optional[str]:
        # the update handled here is known to the attempt (what attempt.outbox answers)
        if attempt.body is None and isinstance(attempt.update, Update):
            return update_body(attempt.update)
        return attempt.body

    def _running_count(self) -> int:
        return self._adapter.running

    def _left_running_count(self) -> int:
        return self._handlers.left_running()

    def _executor(self) -> Optional[StoreHop]:
        return self._threads.executor

    # -- public properties ------------------------------------------------------------------
    @property
    def max_concurrent_updates(self) -> int:
        """:obj:`int`: Updates handled at once (``max_concurrent``)."""
        return self._runtime.options.max_concurrent

    @property
    def current_concurrent_updates(self) -> int:
        """:obj:`int`: Updates being handled right now (a snapshot)."""
        return self._adapter.running

    @property
    def queue(self) -> DurableUpdateQueue:
        """:class:`~ptb_fence.ptb.DurableUpdateQueue`: The durable ``update_queue`` to give
        the Application (``install`` does it)."""
        return self._queue

    @property
    def store(self) -> Any:
        """The update store."""
        return self._runtime.store

    @property
    def runtime(self) -> Runtime:
        """The shared runtime (options, lease keeper)."""
        return self._runtime

    async def call_store(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (a blocking store call) on this processor's store threads, as its
        own store calls run (:class:`~ptb_fence.ptb.FencedPersistence` reads through it)."""
        return await self._threads.call(fn, *args)

    def stats(self) -> Stats:
        """What this processor counted since it was created, and how things stand now: a
        frozen :class:`~ptb_fence.Stats` snapshot (cheap: no store call), for your own
        metrics system. :mod:`ptb_fence.metrics` exposes the same to Prometheus."""
        return self._runtime.snapshot()

    def outbox_call(self, call: "int | HeldCall") -> Optional[OutboxEntry]:
        """The outbox call ``call`` as stored now: its state, tries, last error and, once
        sent, the Bot API result (``json.loads(entry.result_json)["message_id"]``).

        ``call`` is what ``attempt.outbox`` returned: an outbox id, or a
        :class:`~ptb_fence.HeldCall` (:obj:`None` while its id is not known here). A blocking
        store read: from a handler use :meth:`outbox_call_async`.

        Raises:
            TypeError: ``call`` is neither.
        """
        return self._runtime.outbox_call(call)

    async def outbox_call_async(self, call: "int | HeldCall") -> Optional[OutboxEntry]:
        """:meth:`outbox_call` off the event loop."""
        return await self._threads.call(self._runtime.outbox_call, call)

    # -- broadcasts --------------------------------------------------------------------------
    def _broadcasts(self) -> Broadcasts:
        broadcasts = self._runtime.broadcasts
        if broadcasts is None:
            raise UsageError(
                f"{type(self).__name__}: {type(self._runtime.store).__name__} keeps no "
                "broadcasts: use a FencedUpdateProcessor on a store that declares "
                "StoreFeatures(outbox=True, broadcasts=True), such as SQLiteUpdateStore or "
                "PostgresUpdateStore")
        return broadcasts

    async def broadcast(self, name: str, chat_ids: Iterable[int], method: str = "sendMessage",
                        **params: Any) -> StoredBroadcast:
        """Send ``method(chat_id=..., **params)`` to every chat of ``chat_ids``, once each.

        The broadcast and one row per recipient are recorded in the store first, in batches.
        The broadcast senders of the bot's processes then send them at the store-wide pace.
        A crash or a deploy loses nothing: the rest is sent after it. Calling it again with
        the same ``name`` adds the chats it lacks. From a handler,
        :meth:`ptb_fence.Attempt.broadcast` starts one with the update's completion.

        Args:
            name (:obj:`str`): The broadcast's name, unique in the store (at most 200
                characters). Pause, resume and cancel go by it.
            chat_ids (Iterable[:obj:`int`]): The recipients' chat ids.
            method (:obj:`str`, optional): The Bot API method. Defaults to ``"sendMessage"``.
            **params: The call's other parameters, JSON values (send a file once and
                broadcast its ``file_id``).

        Returns:
            :class:`~ptb_fence.StoredBroadcast`: The broadcast, counted.

        Raises:
            UsageError: The store keeps no broadcasts, ``chat_id`` was passed, or ``name``
                exists with another call.
        """
        broadcasts = self._broadcasts()
        started = await self._threads.call(
            lambda: broadcasts.start(name, chat_ids, method, **params))
        sender = self._runtime.broadcast_sender
        if sender is not None:
            sender.wake()
        return started

    async def pause_broadcast(self, name: str) -> StoredBroadcast:
        """Send nothing more of the broadcast ``name`` until :meth:`resume_broadcast`.

        The sends the senders hold already go out, within about half a second."""
        return await self._threads.call(self._broadcasts().pause, name)

    async def resume_broadcast(self, name: str) -> StoredBroadcast:
        """Send the rest of the paused broadcast ``name``."""
        resumed = await self._threads.call(self._broadcasts().resume, name)
        if self._runtime.broadcast_sender is not None:
            self._runtime.broadcast_sender.wake()
        return resumed

    async def cancel_broadcast(self, name: str) -> StoredBroadcast:
        """Send nothing more of the broadcast ``name``, ever."""
        return await self._threads.call(self._broadcasts().cancel, name)

    async def get_broadcast(self, name: str) -> StoredBroadcast:
        """The broadcast ``name`` with its recipients counted per state.

        Raises:
            UsageError: There is none of that name.
        """
        return await self._threads.call(self._broadcasts().get, name)

    def healthy(self) -> Health:
        """Whether this processor is healthy now, for a readiness endpoint: running, the store
        answering, the lease keeper on time, a sweep recent, recording not failing. The
        :class:`~ptb_fence.Health` value is true when healthy and names each problem
        otherwise (no store call)."""
        return self._runtime.health()

    @property
    def application(self) -> Any:
        """The attached :class:`telegram.ext.Application`.

        It is :obj:`None` before ``build()`` and
        once the Application is gone (the processor holds it weakly, as PTB's ``JobQueue``
        does)."""
        return self._get_application()

    def _get_application(self) -> Any:
        ref = self._application_ref
        return None if ref is None else ref()

    def _redeliver(self, update: Update) -> bool:
        return self._queue.redeliver(update)

    # -- wiring -----------------------------------------------------------------------------
    def install(self, builder: BuilderType) -> BuilderType:
        """Configure ``builder`` for this processor and return it.

        Sets the processor (``concurrent_updates``), the durable ``update_queue``, a context
        type with ``context.attempt`` and an Application class that reports handler failures.
        An ``application_class`` or ``context_types`` you set *before* ``install`` is kept and
        extended. Hooks (``post_init``, ``post_stop``, ``post_shutdown``) are left to you.
        So a whole app is::

            app = processor.install(Application.builder().token(TOKEN)).build()

        Raises:
            RuntimeError: The builder already has an ``updater`` (whose queue would bypass
                the durable one): pass none. Polling and webhooks work as usual.
        """
        configured = configure_builder(builder, self, self._queue)
        if self._job_queue is not None:
            configured.job_queue(self._job_queue)
        return configured

    @property
    def job_queue(self) -> Optional[FencedJobQueue]:
        """:class:`~ptb_fence.ptb.FencedJobQueue` | :obj:`None`: The durable job queue
        (``durable_jobs=True``), also the Application's ``job_queue``."""
        return self._job_queue

    def attach(self, application: Any) -> None:
        """Bind this processor to ``application``.

        Called by :class:`~ptb_fence.ptb.FencedApplicationMixin`'s constructor (``build()``).
        Not needed in user code. The processor holds the Application weakly.

        Raises:
            RuntimeError: The processor belongs to another Application, or ``application``'s
                ``update_queue`` is not the processor's durable queue.
        """
        current = self._get_application()
        if current is not None and current is not application:
            raise RuntimeError(f"this {type(self).__name__} already belongs to another Application")
        if application.update_queue is not self._queue:
            raise RuntimeError(
                f"{type(self).__name__}: the Application's update_queue is not the processor's "
                "durable queue, so updates would be acknowledged before they are recorded. "
                "Was .update_queue(...) set on the builder after install()? Remove it: "
                "processor.install(builder) gives the Application its queue"
            )
        if self._job_queue is not None:
            if application.job_queue is not self._job_queue:
                raise RuntimeError(
                    f"{type(self).__name__}(durable_jobs=True): the Application's job_queue is "
                    "not the processor's FencedJobQueue, so jobs would live in memory. Was "
                    ".job_queue(...) set on the builder after install()? Remove it"
                )
            assert self._durable_jobs is not None
            self._job_queue.bind(self._durable_jobs)
            install_job_runner(application, self._job_queue)
        self._application_ref = weakref.ref(application)
        context_class = application.context_types.context
        if self._runtime.attempt_aware and not issubclass(context_class, FencedCallbackContext):
            _LOGGER.warning(
                "context type %s does not derive from FencedCallbackContext: handlers have no "
                "context.attempt (ptb_fence.current_attempt() still works)",
                context_class.__name__,
            )

    # -- lifecycle --------------------------------------------------------------------------
    async def initialize(self) -> None:
        """Start the lease keeper and the sweep. Idempotent, since PTB may call it twice.

        Raises:
            RuntimeError: The processor is not wired into its Application with
                :meth:`install` (updates would not be recorded before acknowledgement).
        """
        state = self._state
        if state.started:
            return
        application = self._get_application()
        if application is None or not isinstance(application, FencedApplicationMixin):
            raise RuntimeError(
                f"{type(self).__name__} is not wired into its Application: build it with "
                "processor.install(Application.builder()...).build() (an application_class "
                "set after install must derive from ptb_fence.ptb.FencedApplication)"
            )
        if application.update_queue is not self._queue:
            raise RuntimeError(
                f"{type(self).__name__}: the Application's update_queue is not the durable "
                "queue; wire it with processor.install(builder)"
            )
        warn_non_blocking(application)
        if self._runtime.attempt_aware:
            warn_unfenced_persistence(application)
        if self._runtime.attempt_aware and self._handle_exhaustion is None:
            _LOGGER.warning(
                "%s has no handle_exhaustion: an update whose last attempt fails is "
                "abandoned (and pruned after retain_seconds), not delivered anywhere; pass "
                "handle_exhaustion=... to be told",
                type(self).__name__,
            )
        self._runtime.probes.start()  # first: a port in use fails the start before anything ran
        # per Application: undone at shutdown. Refused if another running processor has it
        state.batch_ingest = wrap_get_updates_request(application.bot, self._ingest)
        self._threads.start(self._runtime.options.max_concurrent + 4)
        try:
            await self._bind_bot(application)
        except BaseException:
            self._runtime.probes.stop()
            self._threads.stop()
            unwrap_get_updates_request(application.bot, self._ingest)
            state.batch_ingest = False
            raise
        state.inflight.clear()
        state.stopping = False
        # this process's liveness signal: a sweep elsewhere may take over its claims at once
        # only when it is gone (the process died)
        await self._threads.call(self._runtime.recovery.hold_liveness)
        await self._threads.call(self._runtime.chat_order.key_unkeyed)  # before the first claim
        self._sweeper.bind_loop(asyncio.get_running_loop())
        self._runtime.jobs.start(taken_over=self._sweeper.sweep_soon)
        self._runtime.alarms.started()
        self._sweeper.start()
        if self._job_pump is not None:
            self._job_pump.start()
        self._start_outbox(application)
        if self._runtime.outbox is not None:  # attempt.outbox is the fix the WARNING names
            self._watch = watch_direct_sends(application.bot)
        state.started = True

    def _start_outbox(self, application: Any) -> None:
        """Send the outbox's calls through the Application's own Bot (its request settings
        and rate limiter apply), with the Bot's ``Defaults`` applied to queued calls."""
        outbox = self._runtime.outbox
        if outbox is None:
            return
        defaults = getattr(application.bot, "defaults", None)
        outbox.defaults = dict(defaults.api_defaults) if defaults is not None else {}
        # with arbitrary_callback_data a queued keyboard goes into the bot's cache as PTB
        # puts the keyboards it sends: the outbox keeps the ids (JSON), presses resolve
        bot = application.bot
        outbox.prepare = (
            outbox_preparer(bot) if getattr(bot, "callback_data_cache", None) is not None
            else None
        )
        loop = asyncio.get_running_loop()
        sender = BotSender(application.bot, loop, self._runtime.options.lease_seconds * 0.75)
        outbox.start(sender, loop=loop)
        if self._runtime.broadcast_sender is not None:
            self._runtime.broadcast_sender.start(sender, loop=loop)

    async def _stop_outbox(self) -> None:
        """Give back the calls claimed and not started, wait (bounded) for those in flight.
        Off the event loop, which the requests in flight still need."""
        outbox = self._runtime.outbox
        loop = asyncio.get_running_loop()
        if self._runtime.broadcast_sender is not None:
            await loop.run_in_executor(None, self._runtime.broadcast_sender.stop)
        if outbox is not None:
            await loop.run_in_executor(None, outbox.stop)

    async def _bind_bot(self, application: Any) -> None:
        """Tell a store that records its bot (``bind_bot``) which bot this is."""
        head = str(getattr(application.bot, "token", "")).split(":", 1)[0]
        if not head.isdigit():
            return
        await self._threads.call(self._runtime.port.bind_bot, int(head))

    async def application_stopping(self) -> None:
        """``Application.stop()`` began: queue nothing more, handle the updates already in
        the queue and let running handlers finish, within ``stop_timeout_seconds``. Then
        release what is left and cancel the handlers still running (see ``_stopping``).

        Called by :class:`~ptb_fence.ptb.FencedApplicationMixin`. Not needed in user code.
        """
        self._state.begin_stopping()
        await self._sweeper.stop()
        if self._job_pump is not None:
            await self._job_pump.stop()
        await self._stopping.stop(self._state)
        await self._stop_outbox()

    def application_started(self) -> None:
        """``Application.start()`` ran (again): resume queueing and sweeping.

        Called by :class:`~ptb_fence.ptb.FencedApplicationMixin`. Not needed in user code.
        """
        self._state.stopping = False
        if self._state.started:
            self._sweeper.start()
            if self._job_pump is not None:
                self._job_pump.start()
            application = self._get_application()
            if application is not None:
                self._start_outbox(application)

    async def shutdown(self) -> None:
        """Stop the sweep and the lease keeper, give back unstarted claims and this
        process's liveness signal, and release the thread pool.

        Attempts still running (``shutdown`` without ``stop``) are left to their lease.
        Nothing recorded is lost.
        """
        state = self._state
        if not state.started:
            return
        state.started = False
        state.stopping = True
        self._runtime.alarms.stopped()
        self._runtime.probes.stop()
        await self._sweeper.stop()
        if self._job_pump is not None:
            await self._job_pump.stop()
        await self._deliveries.cancel_all()  # unacknowledged: delivered at the next start
        unwrap_get_updates_request(self._get_application().bot, self._ingest)
        unwatch_direct_sends(self._get_application().bot, self._watch)
        self._watch = None
        state.batch_ingest = False
        state.release_preclaimed()
        self._handlers.report_left_running()
        await self._stop_outbox()
        await self._stopping.shutdown()  # bounded, also when the database does not answer
        self._threads.stop()
        state.inflight.clear()

    # -- sweep ------------------------------------------------------------------------------
    async def sweep(self, *, include_fresh: bool = False) -> int:
        """Run one sweep now: hand due updates back to the Application, start delivering
        due exhaustions (each in a task of its own), prune. Returns the number of updates
        handed over (none once ``Application.stop()`` began)."""
        return (await self._sweeper.sweep(include_fresh))[0]
    # -- processing -------------------------------------------------------------------------
    async def process_update(  # type: ignore[misc]  # PTB marks it @final. See below
        self, update: object, coroutine: "Awaitable[Any]"
    ) -> None:
        """Call :meth:`do_process_update` without PTB's semaphore.

        A chat waiting for its turn must not hold a concurrency permit. ptb_fence's own slots
        (taken only once it is the chat's turn) enforce ``max_concurrent``.

        Objects that are not :class:`telegram.Update` (e.g. a ``TypeHandler`` payload) take a
        slot too. So does the whole call when a subclass overrides :meth:`do_process_update`
        (everything the processor runs counts against ``max_concurrent``).
        """
        overridden = type(self).do_process_update is not BaseFenceProcessor.do_process_update
        if isinstance(update, Update) and not overridden:
            await self.do_process_update(update, coroutine)
            return
        await self._adapter.in_slot(lambda: self.do_process_update(update, coroutine))

    async def do_process_update(self, update: object, coroutine: "Awaitable[Any]") -> None:
        """Claim, handle and settle one update. Never raises (a raise would kill PTB's
        update fetcher in sequential mode)."""
        if not isinstance(update, Update):
            try:
                await coroutine
            except Exception:
                _LOGGER.exception("processing a non-update object failed")
            return
        awaited = False
        task = self._stopping.processing()
        try:
            awaited = await self._adapter.process(update, coroutine)
        except Exception:
            _LOGGER.exception(
                "unexpected error processing update %s; the lease and the sweep take care of it",
                update.update_id,
                extra={"update_id": update.update_id},
            )
        except asyncio.CancelledError:  # by the stop (its store call hung)? then end normally:
            if not self._stopping.end_abandoned(task):  # PTB's join() waits for task_done
                raise
        finally:
            self._stopping.processed(task)
            self._state.done(update.update_id)  # below: close a coroutine never run (no
            if not awaited and inspect.iscoroutine(coroutine):  # warning), not a task's
                if inspect.getcoroutinestate(coroutine) == inspect.CORO_CREATED:
                    coroutine.close()


class DurableUpdateProcessor(BaseFenceProcessor):
    """A :class:`telegram.ext.BaseUpdateProcessor` that makes a PTB Application lose nothing.

    Unary: plain PTB handlers, any base :class:`~ptb_fence.UpdateStore` (including a legacy
    PostgreSQL table). Each update is recorded before Telegram is told it was received,
    claimed under a lease, handled and settled. Failures are retried with backoff.
    Handlers get no :class:`~ptb_fence.Attempt` (``context.attempt`` and
    :func:`ptb_fence.current_attempt` are :obj:`None`), also with ``handle_exhaustion``: for
    fenced writes and ``attempt.outbox`` use :class:`FencedUpdateProcessor`.

    Args:
        store: An update store.
        handle_exhaustion: ``handle_exhaustion(exhaustion)`` (sync or async), as for
            :class:`FencedUpdateProcessor`. Needs a fenced and durable store.
        **options: The options of :class:`ptb_fence.RuntimeOptions` (``max_attempts``,
            ``lease_seconds``, ``sweep_every_seconds``, ``pending_grace_seconds``,
            ``retain_seconds``, ``max_concurrent``, ``retry``, ``on_failure``,
            ``on_exhaustion_failure``, ``on_store_error``, ``clock``).
    """

    __slots__ = ()

    def __init__(
        self,
        store: UpdateStore,
        *,
        handle_exhaustion: Optional[Callable[[DeliveredExhaustion], Any]] = None,
        **options: Any,
    ) -> None:
        super().__init__(
            store, attempt_aware=False, handle_exhaustion=handle_exhaustion, **options
        )


class FencedUpdateProcessor(BaseFenceProcessor):
    """A :class:`telegram.ext.BaseUpdateProcessor` with attempt-aware, fenced handling.

    Handlers get the :class:`ptb_fence.Attempt` as ``context.attempt`` and from
    :func:`ptb_fence.current_attempt`. Fenced writes go through
    ``await context.attempt.run_in_transaction(fn, complete=...)``.

    Args:
        store: A fenced store (:class:`~ptb_fence.FencedUpdateStore`).
        handle_exhaustion: ``handle_exhaustion(exhaustion)`` (sync or async), called at least
            once per exhaustion. Needs a durable store.
        durable_jobs (:obj:`bool`, optional): Keep the Application's jobs in the store:
            :meth:`install` sets a :class:`~ptb_fence.ptb.FencedJobQueue`. Each run is
            handled once across processes, as a fenced update. Defaults to :obj:`False`.
        **options: As for :class:`DurableUpdateProcessor`.

    Raises:
        TypeError: The store is not fenced (or not durable with ``handle_exhaustion``), or
            keeps no jobs with ``durable_jobs=True``. The message names what is missing.
    """

    __slots__ = ()

    def __init__(
        self,
        store: UpdateStore,
        *,
        handle_exhaustion: Optional[Callable[[DeliveredExhaustion], Any]] = None,
        durable_jobs: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(store, attempt_aware=True, handle_exhaustion=handle_exhaustion,
                         durable_jobs=durable_jobs, **options)
