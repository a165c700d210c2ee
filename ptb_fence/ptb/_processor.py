"""DurableUpdateProcessor and FencedUpdateProcessor: ptb_fence inside a PTB Application."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import logging
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Dict, Hashable, Optional, Set, Tuple, TypeVar

from telegram import Update
from telegram.ext import ApplicationBuilder, BaseUpdateProcessor

from ptb_fence._protocols import UpdateStore
from ptb_fence._values import Completed, Exhaustion
from ptb_fence.ptb._application import _STATE, FencedApplicationMixin, _UpdateState, fenced_application_class
from ptb_fence.ptb._chat_turns import ChatTurns
from ptb_fence.ptb._context import FencedCallbackContext
from ptb_fence.ptb._ptb_internals import builder_application_class
from ptb_fence.ptb._queue import DurableUpdateQueue, update_body
from ptb_fence.ptb._request import unwrap_get_updates_request, wrap_get_updates_request
from ptb_fence.ptb._group_commit import GroupCommit
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._attempt import _CURRENT
from ptb_fence.runtime._core import Runtime
from ptb_fence.runtime._ingest import MAX_UPDATE_ID
from ptb_fence.runtime._options import RuntimeOptions

__all__ = ["BaseFenceProcessor", "DurableUpdateProcessor", "FencedUpdateProcessor"]

_LOGGER = logging.getLogger("ptb_fence.ptb")

T = TypeVar("T")
BuilderType = TypeVar("BuilderType", bound="ApplicationBuilder[Any, Any, Any, Any, Any, Any]")

_SWEEP_PAGE = 500
_MAX_DELIVERIES = 8  # exhaustion deliveries running at once in one process
# PTB's BaseUpdateProcessor.process_update holds its semaphore for all of do_process_update,
# including a chat's wait for its turn, so process_update is overridden to skip it; ptb_fence's
# own slots enforce max_concurrent. (The semaphore cannot just be made large: PTB sizes it from
# the max_concurrent_updates property, which reports max_concurrent.)


def _chat_key(update: Update) -> Hashable:
    chat = update.effective_chat
    if chat is not None:
        return chat.id
    user = update.effective_user
    if user is not None:
        return user.id
    return ("update", update.update_id)


class BaseFenceProcessor(BaseUpdateProcessor):
    """Shared machinery of :class:`DurableUpdateProcessor` and :class:`FencedUpdateProcessor`.

    Not used directly.
    """

    __slots__ = (
        "_application_ref",
        "_delivering",
        "_delivery_tasks",
        "_executor",
        "_handle_exhaustion",
        "_batch_ingest",
        "_inflight",
        "_ingested",
        "_loop",
        "_retry_timers",
        "_combined_write",
        "_fast_claim",
        "_fast_settle",
        "_initialized",
        "_preclaimed",
        "_writer",
        "_queue",
        "_running",
        "_runtime",
        "_slots",
        "_stopping",
        "_sweep_task",
        "_turns",
    )

    def __init__(
        self,
        store: UpdateStore,
        *,
        attempt_aware: bool,
        handle_exhaustion: Optional[Callable[[Exhaustion], Any]] = None,
        **options: Any,
    ) -> None:
        if handle_exhaustion is not None and not callable(handle_exhaustion):
            raise TypeError(f"handle_exhaustion must be callable, got {handle_exhaustion!r}")
        runtime_options = RuntimeOptions.from_options(type(self).__name__, options)
        self._runtime = Runtime(
            store,
            runtime_options,
            attempt_aware=attempt_aware,
            handle_exhaustion=handle_exhaustion is not None,
            component=type(self).__name__,
        )
        super().__init__(runtime_options.max_concurrent)
        self._handle_exhaustion = handle_exhaustion
        self._queue = DurableUpdateQueue(self)
        # weakly, as PTB's JobQueue holds it: the Application holds this processor
        self._application_ref: "Optional[weakref.ReferenceType[Any]]" = None
        self._executor: Optional[ThreadPoolExecutor] = None
        self._slots = asyncio.Semaphore(runtime_options.max_concurrent)
        self._turns = ChatTurns()
        self._inflight: Set[int] = set()
        self._delivering: Set[Any] = set()  # identities of exhaustions being delivered
        self._delivery_tasks: "Set[asyncio.Future[None]]" = set()
        self._stopping = False  # Application.stop() began: nothing is queued any more
        # fast path: a getUpdates batch recorded (and claimed) before PTB puts its updates;
        # update_id -> the pre-claimed Attempt, True (recorded) or False (a duplicate)
        self._ingested: Dict[int, Any] = {}
        self._preclaimed: Dict[int, Attempt] = {}
        self._batch_ingest = False
        # group commits: updates put at the same time (webhook) are recorded together, and
        # completions that arrive together are settled together
        # (fresh updates and completions that arrive together share one commit when the store
        # can do both in one transaction: add_claimed_and_settle_many)
        self._writer: GroupCommit[Tuple[str, Any], Any] = GroupCommit(
            self._write_many, "ptb_fence:write"
        )
        # which optional store capabilities the hot path uses (decided once)
        fenced = self._runtime.uses_claim_ids
        self._fast_settle = fenced and callable(getattr(store, "settle_owned_many", None))
        self._fast_claim = fenced and callable(getattr(store, "add_claimed_many", None))
        self._combined_write = self._fast_claim and callable(
            getattr(store, "add_claimed_and_settle_many", None)
        )
        self._initialized = False
        self._sweep_task: Optional["asyncio.Task[None]"] = None
        self._running = 0
        # a retry due before the next sweep is handed back at its time (same fenced claim)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._retry_timers: "Set[asyncio.TimerHandle]" = set()
        self._runtime.retry_soon = self._retry_soon

    # -- public properties ------------------------------------------------------------------
    @property
    def max_concurrent_updates(self) -> int:
        """:obj:`int`: Updates handled at once (``max_concurrent``)."""
        return self._runtime.options.max_concurrent

    @property
    def current_concurrent_updates(self) -> int:
        """:obj:`int`: Updates being handled right now (a snapshot)."""
        return self._running

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

    @property
    def application(self) -> Any:
        """The attached :class:`telegram.ext.Application`; :obj:`None` before ``build()`` and
        once the Application is gone (the processor holds it weakly, as PTB's ``JobQueue``
        does)."""
        return self._application

    @property
    def _application(self) -> Any:
        ref = self._application_ref
        return None if ref is None else ref()

    # -- wiring -----------------------------------------------------------------------------
    def install(self, builder: BuilderType) -> BuilderType:
        """Configure ``builder`` for this processor and return it.

        Sets the processor (``concurrent_updates``), the durable ``update_queue``, a context
        type with ``context.attempt`` and an Application class that reports handler failures.
        An ``application_class`` or ``context_types`` you set *before* ``install`` is kept and
        extended; hooks (``post_init``, ``post_stop``, ``post_shutdown``) are left to you.
        So a whole app is::

            app = processor.install(Application.builder().token(TOKEN)).build()

        Raises:
            RuntimeError: The builder already has an ``updater`` (whose queue would bypass
                the durable one): pass none; polling and webhooks work as usual.
        """
        if not isinstance(builder, ApplicationBuilder):
            raise TypeError(f"install() needs a telegram.ext.ApplicationBuilder, got {builder!r}")
        builder.concurrent_updates(self)
        try:
            builder.update_queue(self._queue)
        except RuntimeError as exc:
            raise RuntimeError(
                f"{type(self).__name__}.install(): the builder has a custom updater, whose "
                "update_queue would bypass durable recording; remove .updater(...)"
            ) from exc
        # the context type is made fenced by the Application class itself, from the
        # context_types PTB passes it (set before or after install())
        app_class, kwargs = builder_application_class(builder)
        from telegram.ext import Application

        builder.application_class(fenced_application_class(app_class or Application), kwargs)
        return builder

    def _attach(self, application: Any) -> None:
        if self._application is not None and self._application is not application:
            raise RuntimeError(f"this {type(self).__name__} already belongs to another Application")
        if application.update_queue is not self._queue:
            raise RuntimeError(
                f"{type(self).__name__}: the Application's update_queue is not the processor's "
                "durable queue, so updates would be acknowledged before they are recorded. "
                "Was .update_queue(...) set on the builder after install()? Remove it: "
                "processor.install(builder) gives the Application its queue"
            )
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
        """Start the lease keeper and the sweep (idempotent; PTB may call it twice).

        Raises:
            RuntimeError: The processor is not wired into its Application with
                :meth:`install` (updates would not be recorded before acknowledgement).
        """
        if self._initialized:
            return
        application = self._application
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
        self._warn_non_blocking(application)
        if self._runtime.attempt_aware and self._handle_exhaustion is None:
            _LOGGER.warning(
                "%s has no handle_exhaustion: an update whose last attempt fails is "
                "abandoned (and pruned after retain_seconds), not delivered anywhere; pass "
                "handle_exhaustion=... to be told",
                type(self).__name__,
            )
        # per Application: undone at shutdown; refused if another running processor has it
        self._batch_ingest = wrap_get_updates_request(application.bot, self)
        self._executor = ThreadPoolExecutor(
            max_workers=self._runtime.options.max_concurrent + 4,
            thread_name_prefix="ptb_fence-store",
        )
        self._runtime.executor = self._executor
        try:
            await self._bind_bot(application)
        except BaseException:
            executor, self._executor = self._executor, None
            self._runtime.executor = None
            executor.shutdown(wait=False)
            unwrap_get_updates_request(application.bot, self)
            self._batch_ingest = False
            raise
        self._inflight.clear()
        self._stopping = False
        self._loop = asyncio.get_running_loop()
        self._runtime.start_jobs()
        self._start_sweep()
        self._initialized = True

    async def _bind_bot(self, application: Any) -> None:
        """Tell a store that records its bot (``bind_bot``) which bot this is."""
        bind = getattr(self._runtime.store, "bind_bot", None)
        if not callable(bind):
            return
        head = str(getattr(application.bot, "token", "")).split(":", 1)[0]
        if not head.isdigit():
            return
        await self._call(bind, int(head))

    def _start_sweep(self) -> None:
        if self._sweep_task is None or self._sweep_task.done():
            self._sweep_task = asyncio.get_running_loop().create_task(
                self._sweep_loop(), name="ptb_fence:sweep"
            )

    async def _stop_sweep(self) -> None:
        task, self._sweep_task = self._sweep_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _begin_stop(self) -> None:
        """``Application.stop()`` began: queue nothing more (PTB's ``update_queue.join()``
        would wait for it forever); recorded updates stay in the store for the next start."""
        self._stopping = True
        self._cancel_retry_timers()
        await self._stop_sweep()

    def _end_stop(self) -> None:
        """``Application.start()`` ran (again): resume queueing and sweeping."""
        self._stopping = False
        if self._initialized:
            self._start_sweep()

    async def shutdown(self) -> None:
        """Stop the sweep and the lease keeper, and release the thread pool.

        Attempts still running are left to their lease (another process, or the next start,
        takes them over); nothing recorded is lost.
        """
        if not self._initialized:
            return
        self._initialized = False
        self._stopping = True
        self._cancel_retry_timers()
        await self._stop_sweep()
        deliveries = list(self._delivery_tasks)
        for delivery in deliveries:
            delivery.cancel()  # unacknowledged: delivered again at the next start
        if deliveries:
            await asyncio.gather(*deliveries, return_exceptions=True)
        unwrap_get_updates_request(self._application.bot, self)
        self._batch_ingest = False
        await asyncio.get_running_loop().run_in_executor(None, self._runtime.stop_jobs)
        executor, self._executor = self._executor, None
        self._runtime.executor = None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=False)
        self._release_preclaimed()
        self._inflight.clear()

    # -- retries due before the next sweep ---------------------------------------------------
    def _retry_soon(self, update_id: int, delay: float, body: Optional[str]) -> None:
        """Called by the runtime (on a store thread) for a retry due before the next sweep."""
        loop = self._loop
        if body is None or loop is None or self._stopping:
            return  # the sweep takes it
        try:
            loop.call_soon_threadsafe(self._start_retry_timer, update_id, delay, body)
        except RuntimeError:  # the loop is closed: the next start's sweep takes it
            pass

    def _start_retry_timer(self, update_id: int, delay: float, body: str, tries: int = 0) -> None:
        if self._stopping or not self._initialized or self._loop is None:
            return
        handle: "list[asyncio.TimerHandle]" = []

        def fire() -> None:
            self._retry_timers.discard(handle[0])
            self._retry_now(update_id, body, tries)

        # a few ms late, so the store sees the retry time as come (due_at <= now)
        handle.append(self._loop.call_later(delay + 0.005, fire))
        self._retry_timers.add(handle[0])

    def _retry_now(self, update_id: int, body: str, tries: int) -> None:
        if self._stopping or not self._initialized:
            return  # stays due in the store
        if update_id in self._inflight:
            # its failed attempt is still finishing here: look again shortly
            if tries < 200:
                self._start_retry_timer(update_id, 0.05, body, tries + 1)
            return
        try:
            update = self._parse(json.loads(body), self._application.bot)
        except Exception:
            return  # the sweep reports it
        if update is None:
            return
        self._inflight.add(update_id)
        if not self._queue.redeliver(update):
            self._inflight.discard(update_id)

    def _cancel_retry_timers(self) -> None:
        timers, self._retry_timers = self._retry_timers, set()
        for timer in timers:
            timer.cancel()  # the retries stay due in the store

    def _warn_non_blocking(self, application: Any) -> None:
        defaults = getattr(application.bot, "defaults", None)
        default_block = True if defaults is None else bool(defaults.block)
        for group, handlers in application.handlers.items():
            for handler in handlers:
                block = handler.block
                non_blocking = (block is False) or (
                    not isinstance(block, bool) and not default_block
                )
                if non_blocking:
                    _LOGGER.warning(
                        "handler %r (group %s) runs with block=False: it runs OUTSIDE the "
                        "attempt (no fencing, its failures are not retried, context.attempt "
                        "is None)",
                        handler,
                        group,
                    )

    # -- blocking work off the event loop ---------------------------------------------------
    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        executor = self._executor
        if kwargs:
            return await loop.run_in_executor(executor, lambda: fn(*args, **kwargs))
        return await loop.run_in_executor(executor, fn, *args)

    # -- ingest -----------------------------------------------------------------------------
    def _rows(self, items: "list[tuple[int, str]]") -> "list[tuple[int, str, int]]":
        now = self._runtime.options.now_ms()
        return [(update_id, body, now) for update_id, body in items]

    def _store_rows(self, rows: "list[tuple[int, str, int]]") -> "list[Any]":
        """Record rows (blocking): per row the pre-claimed Attempt, True, or False (exists)."""
        runtime = self._runtime
        store = runtime.store
        if self._fast_claim:
            lease_until = runtime.options.now_ms() + runtime.options.lease_ms
            return self._adopt(store.add_claimed_many(rows, lease_until=lease_until), rows, lease_until)
        if len(rows) > 1 and callable(getattr(store, "add_many", None)):
            return [bool(added) for added in store.add_many(rows)]
        return [bool(store.add(*row)) for row in rows]

    async def _record_batch(self, result: "list[Any]") -> None:
        """Record a whole getUpdates answer in one commit (called by RecordingRequest)."""
        updater = getattr(self._application, "updater", None)
        if updater is not None and not updater.running:
            # not the Updater's polling (e.g. its last getUpdates in Updater.stop(), or a
            # manual call): PTB puts none of these, and Telegram keeps them (they are not
            # confirmed), so recording (and claiming) them would only strand them for a lease
            return
        items = []
        raws: "list[Any]" = []
        for raw in result:
            if isinstance(raw, dict):
                update_id = raw.get("update_id")
                if (
                    isinstance(update_id, int)
                    and not isinstance(update_id, bool)
                    and 0 <= update_id <= MAX_UPDATE_ID
                ):
                    items.append((update_id, _raw_body(raw)))
                    raws.append(raw)
        if not items:
            return
        # anything left from an earlier batch was never put (PTB stopped or dropped it):
        # stop renewing it so its lease lapses and a sweep takes it
        self._release_preclaimed(ingested_only=True)
        try:
            outcome = await self._call_handing_on(
                lambda: self._store_rows(self._rows(items)),
                lambda landed: self._hand_on_batch(raws, landed),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise self._queue._fail([update_id for update_id, _ in items], exc) from exc
        for (update_id, _), value in zip(items, outcome):
            self._ingested[update_id] = value

    async def _call_handing_on(
        self, fn: Callable[[], T], on_orphan: Callable[[T], None]
    ) -> T:
        """Run ``fn`` on the store threads; if the caller is cancelled while it runs, its
        result (a write that still lands) goes to ``on_orphan`` instead of being lost."""
        loop = asyncio.get_running_loop()
        inner = loop.run_in_executor(self._executor, fn)
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:

            def orphaned(future: "asyncio.Future[T]") -> None:
                if not future.cancelled() and future.exception() is None:
                    on_orphan(future.result())

            inner.add_done_callback(orphaned)
            raise

    def _hand_on_batch(self, raws: "list[Any]", outcomes: "list[Any]") -> None:
        """A getUpdates batch landed but its caller was cancelled (``Updater.stop()``)."""
        bot = self._application.bot if self._application is not None else None
        for raw, outcome in zip(raws, outcomes):
            update = None
            if outcome is not False and bot is not None:
                try:
                    update = self._parse(raw, bot)
                except Exception:
                    _LOGGER.exception("recorded update %s cannot be parsed", raw.get("update_id"))
            if update is None:
                if isinstance(outcome, Attempt):
                    self._runtime.end(outcome)  # its lease lapses; a sweep takes it
                continue
            self._hand_on(update, outcome)

    def _hand_on(self, update: Update, outcome: Any) -> None:
        """A recorded update whose recorder was cancelled: queue it (it is ours to handle),
        or, while stopping, release it to its lease and the sweep."""
        if outcome is False or isinstance(outcome, BaseException):
            return
        if self._stopping or not self._initialized:
            if isinstance(outcome, Attempt):
                self._runtime.end(outcome)
            return
        _LOGGER.info(
            "update %s was recorded while its ingest was cancelled: handing it on",
            update.update_id,
            extra={"update_id": update.update_id},
        )
        self._consume(update.update_id, outcome)
        if not self._queue.redeliver(update):
            self._unqueue(update.update_id)

    def _unqueue(self, update_id: int) -> None:
        """A booked update that will not be queued after all (stopping): release it."""
        attempt = self._preclaimed.pop(update_id, None)
        if attempt is not None:
            self._runtime.end(attempt)
        self._inflight.discard(update_id)

    @staticmethod
    def _parse(data: Any, bot: Any) -> Optional[Update]:
        update = Update.de_json(data, bot)
        if update is not None and getattr(bot, "callback_data_cache", None) is not None:
            # a body recorded from getUpdates keeps the callback data id: resolve it from the
            # bot's cache as PTB does on delivery (InvalidCallbackData if gone)
            bot.insert_callback_data(update)
        return update

    def _consume(self, update_id: int, outcome: Any) -> bool:
        """Book one recorded update for processing; False for a duplicate."""
        if outcome is False:
            return False
        if isinstance(outcome, Attempt):
            self._preclaimed[update_id] = outcome
        self._inflight.add(update_id)
        return True

    def _release_preclaimed(self, *, ingested_only: bool = False) -> None:
        stale = [v for v in self._ingested.values() if isinstance(v, Attempt)]
        self._ingested.clear()
        if not ingested_only:
            stale += list(self._preclaimed.values())
            self._preclaimed.clear()
        for attempt in stale:
            self._runtime.end(attempt)

    async def _write_many(self, items: "list[Tuple[str, Any]]") -> "list[Any]":
        """One group of writes: ``("add", (update_id, body))`` records a fresh update (result:
        as :meth:`_store_rows`, or the exception to raise to ``put``), ``("done", attempt)``
        completes an attempt (result: the outcome). One commit where the store can do both."""
        runtime = self._runtime
        store = runtime.store
        adds = [(i, payload) for i, (kind, payload) in enumerate(items) if kind == "add"]
        dones = [(i, payload) for i, (kind, payload) in enumerate(items) if kind == "done"]
        results: "list[Any]" = [None] * len(items)
        rows = self._rows([payload for _, payload in adds])
        at = runtime.options.now_ms()
        settlements = [(attempt.identity, Completed(at)) for _, attempt in dones]
        if adds and dones and self._combined_write:
            lease_until = at + runtime.options.lease_ms

            def both() -> "Tuple[list[Any], list[bool]]":
                added, landed = store.add_claimed_and_settle_many(
                    rows, lease_until=lease_until, settlements=settlements
                )
                return self._adopt(added, rows, lease_until), landed

            try:
                recorded, landed = await self._call(both)
            except Exception as exc:
                for i, _ in adds:
                    results[i] = exc
                for i, attempt in dones:
                    results[i] = runtime.completion_failed(attempt, exc)
                return results
            for (i, _), value in zip(adds, recorded):
                results[i] = value
            for (i, attempt), ok in zip(dones, landed):
                results[i] = runtime.completion_landed(attempt, bool(ok))
            return results
        if adds:
            try:
                recorded = await self._call(self._store_rows, rows)
            except Exception as exc:
                recorded = [exc] * len(adds)
            for (i, _), value in zip(adds, recorded):
                results[i] = value
        if dones:
            try:
                landed = await self._call(store.settle_owned_many, settlements)
            except Exception as exc:
                for i, attempt in dones:
                    results[i] = runtime.completion_failed(attempt, exc)
            else:
                for (i, attempt), ok in zip(dones, landed):
                    results[i] = runtime.completion_landed(attempt, bool(ok))
        return results

    def _adopt(
        self, identities: "list[Any]", rows: "list[tuple[int, str, int]]", lease_until: int
    ) -> "list[Any]":
        """Per row: the pre-claimed Attempt (registered with the lease keeper) or False."""
        return [
            False if identity is None else self._runtime.adopt(identity, lease_until, row[1])
            for identity, row in zip(identities, rows)
        ]

    @staticmethod
    def _valid_id(update: Update) -> bool:
        update_id = update.update_id
        if isinstance(update_id, int) and not isinstance(update_id, bool):
            if 0 <= update_id <= MAX_UPDATE_ID:
                return True
        _LOGGER.warning(
            "dropped an update whose update_id %r is not an integer from 0 to 2**63-1: it is "
            "not a Telegram update (nothing recorded)",
            update_id,
        )
        return False

    async def _record(self, update: Update) -> bool:
        if not self._valid_id(update):
            return False
        known = self._ingested.pop(update.update_id, None)
        if known is not None:
            return self._consume(update.update_id, known)
        try:
            body = update_body(update)
            outcome = await self._writer.submit(
                ("add", (update.update_id, body)),
                orphan=lambda landed: self._hand_on(update, landed),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise self._queue._fail(update.update_id, exc) from exc
        return self._consume(update.update_id, outcome)

    def _record_blocking(self, update: Update) -> bool:
        if not self._valid_id(update):
            return False
        known = self._ingested.pop(update.update_id, None)
        if known is not None:
            return self._consume(update.update_id, known)
        try:
            outcome = self._store_rows(self._rows([(update.update_id, update_body(update))]))
        except Exception as exc:
            raise self._queue._fail(update.update_id, exc) from exc
        return self._consume(update.update_id, outcome[0])

    # -- processing -------------------------------------------------------------------------
    async def process_update(  # type: ignore[misc]  # PTB marks it @final; see below
        self, update: object, coroutine: "Awaitable[Any]"
    ) -> None:
        """Call :meth:`do_process_update` without PTB's semaphore.

        A chat waiting for its turn must not hold a concurrency permit; ptb_fence's own slots
        (taken only once it is the chat's turn) enforce ``max_concurrent``. In sequential mode
        (``max_concurrent=1``) PTB awaits one update at a time anyway.

        Objects that are not :class:`telegram.Update` (e.g. a ``TypeHandler`` payload) take a
        slot too; so does the whole call when a subclass overrides :meth:`do_process_update`
        (everything the processor runs counts against ``max_concurrent``).
        """
        overridden = type(self).do_process_update is not BaseFenceProcessor.do_process_update
        if isinstance(update, Update) and not overridden:
            await self.do_process_update(update, coroutine)
            return
        async with self._slots:
            token = _HOLDING_SLOT.set(True)
            try:
                await self.do_process_update(update, coroutine)
            finally:
                _HOLDING_SLOT.reset(token)

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
        try:
            awaited = await self._process(update, coroutine)
        except Exception:
            _LOGGER.exception(
                "unexpected error processing update %s; the lease and the sweep take care of it",
                update.update_id,
                extra={"update_id": update.update_id},
            )
        finally:
            self._inflight.discard(update.update_id)
            if not awaited and inspect.iscoroutine(coroutine):
                coroutine.close()

    async def _process(self, update: Update, coroutine: "Awaitable[Any]") -> bool:
        runtime = self._runtime
        key = _chat_key(update)
        exhaustion: Optional[Exhaustion] = None
        await self._turns.acquire(key, update.update_id)
        try:
            # the slot may already be held for the whole call (see process_update)
            slot = contextlib.nullcontext() if _HOLDING_SLOT.get() else self._slots
            async with slot:
                attempt = self._preclaimed.pop(update.update_id, None)
                if attempt is None:
                    attempt = await self._call(runtime.claim, update.update_id)
                if attempt is None:
                    return False
                self._running += 1
                state = _UpdateState(update)
                state_token = _STATE.set(state)
                attempt_token = _CURRENT.set(attempt if attempt.fenced else None)
                try:
                    try:
                        await coroutine
                    except Exception as exc:
                        state.error = exc
                    except asyncio.CancelledError as exc:
                        if _cancel_requested():
                            raise
                        # raised by handler code while this task was not cancelled: a failure
                        # (propagating it would kill PTB's update fetcher in sequential mode)
                        state.error = exc
                    finally:
                        _CURRENT.reset(attempt_token)
                        _STATE.reset(state_token)
                    if state.error is not None or attempt.exhausted:
                        attempt._body = update_body(update)
                    if (
                        self._fast_settle
                        and state.error is None
                        and attempt.fenced
                        and not attempt.completed
                        and not attempt.exhausted
                    ):
                        # grouped with the completions of other updates: one commit for all
                        attempt._settling = True
                        exhaustion = None
                        await self._writer.submit(("done", attempt))
                    else:
                        _, exhaustion = await self._call(runtime.finish, attempt, state.error)
                finally:
                    # also when cancelled: stop renewing, so the lease lapses and a sweep
                    # retries the update (a renewed-forever lease would strand it)
                    runtime.end(attempt)
                    self._running -= 1
            return True
        finally:
            self._turns.release(key)
            if exhaustion is not None:
                # in its own task, after the chat's turn is released: a slow or hanging
                # exhaustion handler holds neither the chat nor the sweep
                self._start_delivery(exhaustion)

    def _start_delivery(self, exhaustion: Exhaustion) -> None:
        """Deliver ``exhaustion`` in a task of its own, unless it is being delivered already
        (at most one delivery of one exhaustion at a time in this process)."""
        if self._handle_exhaustion is None or exhaustion.identity in self._delivering:
            return
        if len(self._delivering) >= _MAX_DELIVERIES:
            return  # it stays due: a later sweep starts it once a delivery has finished
        self._delivering.add(exhaustion.identity)
        task = asyncio.get_running_loop().create_task(
            self._deliver(exhaustion), name=f"ptb_fence:exhaustion:{exhaustion.update_id}"
        )
        self._delivery_tasks.add(task)
        task.add_done_callback(self._delivery_tasks.discard)

    async def _deliver(self, exhaustion: Exhaustion) -> None:
        handler = self._handle_exhaustion
        identity = exhaustion.identity
        if handler is None:
            self._delivering.discard(identity)
            return
        runtime = self._runtime
        try:
            try:
                if inspect.iscoroutinefunction(handler):
                    await handler(exhaustion)
                else:
                    result = await _in_daemon_thread(handler, exhaustion)
                    if inspect.isawaitable(result):
                        await result
            except Exception as exc:
                runtime.exhaustion_failed(exc, exhaustion)
                return
            try:
                await self._call(runtime.acknowledge, exhaustion)
            except Exception as exc:  # stays due: delivered again by a later sweep
                runtime.report_store_error(exc, "sweep")
        finally:
            self._delivering.discard(identity)

    # -- sweep ------------------------------------------------------------------------------
    async def sweep(self, *, include_fresh: bool = False) -> int:
        """Run one sweep now: hand due updates back to the Application, start delivering
        due exhaustions (each in a task of its own), prune. Returns the number of updates
        handed over (none once ``Application.stop()`` began)."""
        return (await self._sweep_once(include_fresh))[0]

    async def _sweep_loop(self) -> None:
        include_fresh = True  # the first sweep takes every pending row at once
        interval = self._runtime.options.sweep_every_seconds
        while True:
            full = False
            try:
                _, full = await self._sweep_once(include_fresh)
            except asyncio.CancelledError:
                raise
            except Exception:
                _LOGGER.exception("sweep failed; trying again at the next interval")
            if full:
                # more rows are waiting: fetch the next page once these are done
                await self._wait_drained(interval)
                continue
            include_fresh = False
            await asyncio.sleep(interval)

    async def _wait_drained(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        threshold = max(1, self._runtime.options.max_concurrent)
        while len(self._inflight) > threshold and loop.time() < deadline:
            await asyncio.sleep(0.01)

    async def _sweep_once(self, include_fresh: bool) -> "tuple[int, bool]":
        runtime = self._runtime
        application = self._application
        handed = 0
        try:
            rows = await self._call(runtime.due_page, limit=_SWEEP_PAGE, include_fresh=include_fresh)
        except Exception as exc:
            runtime.report_store_error(exc, "sweep")
            rows = []
        for row in rows:
            if row.update_id in self._inflight:
                continue
            if self._stopping:
                break  # Application.stop() began: the rows stay due for the next start
            try:
                update = self._parse(json.loads(row.body), application.bot)
            except Exception:
                _LOGGER.exception(
                    "stored update %s cannot be parsed; left as it is",
                    row.update_id,
                    extra={"update_id": row.update_id},
                )
                continue
            if update is None:
                continue
            self._inflight.add(row.update_id)
            if not self._queue.redeliver(update):
                self._inflight.discard(row.update_id)
                break
            handed += 1
        if self._handle_exhaustion is not None and not self._stopping:
            try:
                page = await self._call(runtime.exhaustion_page)
            except Exception as exc:
                runtime.report_store_error(exc, "sweep")
                page = []
            for exhaustion in page:
                self._start_delivery(exhaustion)
        try:
            await self._call(runtime.prune)
        except Exception as exc:
            runtime.report_store_error(exc, "sweep")
        if handed:
            _LOGGER.info("sweep handed %d update(s) back to the Application", handed)
        return handed, len(rows) >= _SWEEP_PAGE and handed > 0


_HOLDING_SLOT: "contextvars.ContextVar[bool]" = contextvars.ContextVar(
    "ptb_fence_holding_slot", default=False
)


def _raw_body(raw: Any) -> str:
    """The stored JSON text of a raw update: UTF-8 text, or ASCII escapes when the update
    holds a lone UTF-16 surrogate (valid JSON that no store can encode as UTF-8)."""
    body = json.dumps(raw, ensure_ascii=False)
    try:
        body.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(raw)  # lossless: the escapes decode to the same strings
    return body


async def _in_daemon_thread(fn: Callable[[Any], T], arg: Any) -> T:
    """Run a blocking ``fn(arg)`` in a daemon thread (a hanging one blocks neither the store
    threads nor interpreter exit)."""
    loop = asyncio.get_running_loop()
    future: "asyncio.Future[T]" = loop.create_future()

    def settle(value: Any, error: Optional[BaseException]) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def work() -> None:
        try:
            value = fn(arg)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(settle, None, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, value, None)

    threading.Thread(target=work, name="ptb_fence-exhaustion", daemon=True).start()
    return await future


def _cancel_requested() -> bool:
    """Whether the current task is being cancelled (as opposed to code raising CancelledError).

    Python 3.10 cannot tell the two apart: there every CancelledError counts as a cancel.
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 0


class DurableUpdateProcessor(BaseFenceProcessor):
    """A :class:`telegram.ext.BaseUpdateProcessor` that makes a PTB Application lose nothing.

    Unary: plain PTB handlers, any base :class:`~ptb_fence.UpdateStore` (including a legacy
    PostgreSQL table). Each update is recorded before Telegram is told it was received,
    claimed under a lease, handled and settled; failures are retried with backoff.

    Args:
        store: An update store.
        **options: The options of :class:`ptb_fence.RuntimeOptions` (``max_attempts``,
            ``lease_seconds``, ``sweep_every_seconds``, ``pending_grace_seconds``,
            ``retain_seconds``, ``max_concurrent``, ``retry``, ``on_failure``,
            ``on_exhaustion_failure``, ``on_store_error``, ``clock``).
    """

    __slots__ = ()

    def __init__(self, store: UpdateStore, **options: Any) -> None:
        super().__init__(store, attempt_aware=False, **options)


class FencedUpdateProcessor(BaseFenceProcessor):
    """A :class:`telegram.ext.BaseUpdateProcessor` with attempt-aware, fenced handling.

    Handlers get the :class:`ptb_fence.Attempt` as ``context.attempt`` and from
    :func:`ptb_fence.current_attempt`; fenced writes go through
    ``await context.attempt.run_in_transaction(fn, complete=...)``.

    Args:
        store: A fenced store (:class:`~ptb_fence.FencedUpdateStore`).
        handle_exhaustion: ``handle_exhaustion(exhaustion)`` (sync or async), called at least
            once per exhaustion; needs a durable store.
        **options: As for :class:`DurableUpdateProcessor`.

    Raises:
        TypeError: The store is not fenced (or not durable with ``handle_exhaustion``); the
            message names the missing methods.
    """

    __slots__ = ()

    def __init__(
        self,
        store: UpdateStore,
        *,
        handle_exhaustion: Optional[Callable[[Exhaustion], Any]] = None,
        **options: Any,
    ) -> None:
        super().__init__(store, attempt_aware=True, handle_exhaustion=handle_exhaustion, **options)
