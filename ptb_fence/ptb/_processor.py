"""DurableUpdateProcessor and FencedUpdateProcessor: ptb_fence inside a PTB Application."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Dict, Hashable, Optional, Set, Tuple, TypeVar

from telegram import Update
from telegram.ext import ApplicationBuilder, BaseUpdateProcessor, ContextTypes

from ptb_fence._protocols import UpdateStore
from ptb_fence._values import Completed, Exhaustion
from ptb_fence.ptb._application import _STATE, FencedApplicationMixin, _UpdateState, fenced_application_class
from ptb_fence.ptb._chat_turns import ChatTurns
from ptb_fence.ptb._context import FencedCallbackContext
from ptb_fence.ptb._queue import DurableUpdateQueue, update_body
from ptb_fence.ptb._request import wrap_get_updates_request
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
        "_application",
        "_delivering",
        "_executor",
        "_handle_exhaustion",
        "_batch_ingest",
        "_inflight",
        "_ingested",
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
        self._application: Any = None
        self._executor: Optional[ThreadPoolExecutor] = None
        self._slots = asyncio.Semaphore(runtime_options.max_concurrent)
        self._turns = ChatTurns()
        self._inflight: Set[int] = set()
        self._delivering: Set[Any] = set()  # identities of exhaustions being delivered
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
        """The attached :class:`telegram.ext.Application`, or :obj:`None` before ``build()``."""
        return self._application

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
        context_types = _default_value(getattr(builder, "_context_types", None))
        if context_types is None:
            builder.context_types(ContextTypes(context=FencedCallbackContext))
        elif not issubclass(context_types.context, FencedCallbackContext):
            builder.context_types(
                ContextTypes(
                    context=_fenced_context_class(context_types.context),
                    bot_data=context_types.bot_data,
                    chat_data=context_types.chat_data,
                    user_data=context_types.user_data,
                )
            )
        app_class = _default_value(getattr(builder, "_application_class", None))
        kwargs = getattr(builder, "_application_kwargs", None) or {}
        from telegram.ext import Application

        builder.application_class(fenced_application_class(app_class or Application), kwargs)
        return builder

    def _attach(self, application: Any) -> None:
        if self._application is not None and self._application is not application:
            raise RuntimeError(f"this {type(self).__name__} already belongs to another Application")
        if application.update_queue is not self._queue:
            raise RuntimeError(
                f"{type(self).__name__}: the Application's update_queue is not the processor's "
                "durable queue, so updates would be acknowledged before they are recorded; "
                "wire it with processor.install(builder)"
            )
        self._application = application
        self._batch_ingest = wrap_get_updates_request(application.bot, self)
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
        self._executor = ThreadPoolExecutor(
            max_workers=self._runtime.options.max_concurrent + 4,
            thread_name_prefix="ptb_fence-store",
        )
        self._runtime.executor = self._executor
        self._inflight.clear()
        self._runtime.start_jobs()
        self._sweep_task = asyncio.get_running_loop().create_task(
            self._sweep_loop(), name="ptb_fence:sweep"
        )
        self._initialized = True

    async def shutdown(self) -> None:
        """Stop the sweep and the lease keeper, and release the thread pool.

        Attempts still running are left to their lease (another process, or the next start,
        takes them over); nothing recorded is lost.
        """
        if not self._initialized:
            return
        self._initialized = False
        task, self._sweep_task = self._sweep_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.get_running_loop().run_in_executor(None, self._runtime.stop_jobs)
        executor, self._executor = self._executor, None
        self._runtime.executor = None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=False)
        self._release_preclaimed()
        self._inflight.clear()

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
        items = []
        for raw in result:
            if isinstance(raw, dict):
                update_id = raw.get("update_id")
                if (
                    isinstance(update_id, int)
                    and not isinstance(update_id, bool)
                    and 0 <= update_id <= MAX_UPDATE_ID
                ):
                    items.append((update_id, json.dumps(raw, ensure_ascii=False)))
        if not items:
            return
        # anything left from an earlier batch was never put (PTB stopped or dropped it):
        # stop renewing it so its lease lapses and a sweep takes it
        self._release_preclaimed(ingested_only=True)
        try:
            outcome = await self._call(self._store_rows, self._rows(items))
        except Exception as exc:
            raise self._queue._fail(items[0][0], exc) from exc
        for (update_id, _), value in zip(items, outcome):
            self._ingested[update_id] = value

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
            outcome = await self._writer.submit(("add", (update.update_id, body)))
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
        """
        await self.do_process_update(update, coroutine)

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
        await self._turns.acquire(key, update.update_id)
        try:
            async with self._slots:
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
            if exhaustion is not None:
                await self._deliver(exhaustion)
            return True
        finally:
            self._turns.release(key)

    async def _deliver(self, exhaustion: Exhaustion) -> None:
        handler = self._handle_exhaustion
        if handler is None:
            return
        runtime = self._runtime
        identity = exhaustion.identity
        if identity in self._delivering:
            return  # a sweep found the row while the handler's own delivery is still running
        self._delivering.add(identity)
        try:
            try:
                if inspect.iscoroutinefunction(handler):
                    await handler(exhaustion)
                else:
                    result = await self._call(handler, exhaustion)
                    if inspect.isawaitable(result):
                        await result
            except Exception as exc:
                runtime.exhaustion_failed(exc, exhaustion)
                return
            await self._call(runtime.acknowledge, exhaustion)
        finally:
            self._delivering.discard(identity)

    # -- sweep ------------------------------------------------------------------------------
    async def sweep(self, *, include_fresh: bool = False) -> int:
        """Run one sweep now: hand due updates back to the Application, deliver
        exhaustions, prune. Returns the number of updates handed over."""
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
            try:
                bot = application.bot
                update = Update.de_json(json.loads(row.body), bot)
                if update is not None and getattr(bot, "callback_data_cache", None) is not None:
                    # a body recorded from getUpdates keeps the callback data id: resolve it
                    # from the bot's cache as PTB does on delivery (InvalidCallbackData if gone)
                    bot.insert_callback_data(update)
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
            self._queue.redeliver(update)
            handed += 1
        if self._handle_exhaustion is not None:
            try:
                page = await self._call(runtime.exhaustion_page)
            except Exception as exc:
                runtime.report_store_error(exc, "sweep")
                page = []
            for exhaustion in page:
                await self._deliver(exhaustion)
        try:
            await self._call(runtime.prune)
        except Exception as exc:
            runtime.report_store_error(exc, "sweep")
        if handed:
            _LOGGER.info("sweep handed %d update(s) back to the Application", handed)
        return handed, len(rows) >= _SWEEP_PAGE and handed > 0


def _cancel_requested() -> bool:
    """Whether the current task is being cancelled (as opposed to code raising CancelledError).

    Python 3.10 cannot tell the two apart: there every CancelledError counts as a cancel.
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 0


def _default_value(value: Any) -> Any:
    """The user's value of a builder setting, or None if it still has PTB's default."""
    from telegram._utils.defaultvalue import DefaultValue

    if value is None or isinstance(value, DefaultValue):
        return None
    return value


def _fenced_context_class(cls: type) -> type:
    return type(f"Fenced{cls.__name__}", (cls, FencedCallbackContext), {"__slots__": ()})


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
