"""FencedApplication: the Application subclass that reports handler failures to the attempt."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from telegram.ext import Application, ApplicationHandlerStop, ContextTypes, Updater

from ptb_fence.ptb._context import fenced_context_types, warn_if_unmatched_rerun
from ptb_fence.ptb._handling import leave_attempt, outside_attempt, update_state
from ptb_fence.ptb._interfaces import ApplicationBinding
from ptb_fence.ptb._persistence import FencedPersistence
from ptb_fence.runtime._attempt import current_attempt

_LOGGER = logging.getLogger("ptb_fence.ptb")

__all__ = [
    "FencedApplication",
    "FencedApplicationMixin",
    "FencedUpdater",
    "fenced_application_class",
]


_IN_PROCESS_ERROR: "contextvars.ContextVar[bool]" = contextvars.ContextVar(
    "ptb_fence_in_process_error", default=False
)

_DROP_WARNED: "contextvars.ContextVar[bool]" = contextvars.ContextVar(
    "ptb_fence_drop_pending_warned", default=False
)
"""Set while ``run_polling``/``run_webhook`` runs: they warned already, their updater does
not warn again (its tasks inherit the context)."""

_NO_SECRET_ALLOWED: "contextvars.ContextVar[bool]" = contextvars.ContextVar(
    "ptb_fence_no_secret_allowed", default=False
)
"""Set while ``run_webhook(allow_no_secret_token=True)`` runs: its updater's
``start_webhook`` (in a task that inherits the context) takes the opt-out too."""

NO_SECRET_TOKEN = (
    "{name}() without secret_token: anyone who finds the webhook's URL can post forged "
    "updates, and they would be recorded and handled. Pass secret_token=... (1-256 characters "
    "of A-Z, a-z, 0-9, _ and -, e.g. secrets.token_urlsafe(32)): PTB gives it to setWebhook "
    "and answers 403 to a request that does not carry it. Behind a proxy that checks the "
    "requests itself, pass allow_no_secret_token=True to {name}() instead"
)
"""The refusal of a webhook started without a secret token (``{name}``: the call)."""

if TYPE_CHECKING:
    # The mix-in only ever sits in front of an Application. Tell the type checker so, so that
    # its overrides and ``super()`` calls are checked against PTB's signatures.
    _MixinBase = Application[Any, Any, Any, Any, Any, Any]
else:
    _MixinBase = object


def _outside_attempt_in_own_task(callback: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap an error handler so that it runs outside the attempt when PTB runs it as a task.

    PTB decides (``block`` and ``Defaults(block=...)``). The wrapper only looks at where it
    runs: in the task that reports the error (blocking: inside the attempt) or in a task of
    its own (outside it).
    """
    reporting_task = asyncio.current_task()

    @functools.wraps(callback)
    async def run(update: object, context: Any) -> Any:
        if asyncio.current_task() is reporting_task:
            return await callback(update, context)
        # a task of its own runs in its own copy of the context: clearing is local to it
        leave_attempt()
        return await callback(update, context)

    return run


class _ErrorHandlers(Dict[Any, Any]):
    """The Application's ``error_handlers`` dict (see ``_ptb_internals``, internal 4).

    PTB starts non-blocking error handlers with its private ``__create_task``, which
    :meth:`FencedApplicationMixin.create_task` cannot see, so the task would inherit the
    attempt. While PTB's ``process_error`` reads this dict, the handlers are handed out
    wrapped so that those run in a task of their own run outside the attempt. Everything
    else sees the plain dict.
    """

    __slots__ = ()

    def items(self) -> Any:
        if not _IN_PROCESS_ERROR.get():
            return super().items()
        result: List[Tuple[Any, Any]] = []
        for callback, block in super().items():
            result.append((_outside_attempt_in_own_task(callback), block))
        return result


def _warn_drop_pending(
    method: Callable[..., Any], name: str, owner: Any, args: Any, kwargs: Any
) -> None:
    try:
        arguments = inspect.signature(method).bind(owner, *args, **kwargs).arguments
    except TypeError:
        return  # PTB reports the bad call itself
    if arguments.get("drop_pending_updates"):
        _LOGGER.warning(
            "%s(drop_pending_updates=True) with a ptb_fence processor: Telegram discards "
            "every update it still holds at each start, before ptb_fence can record them "
            "(they are lost); remove the argument",
            name,
        )


def _require_secret(
    method: Callable[..., Any], name: str, owner: Any, args: Any, kwargs: Any, allowed: bool
) -> None:
    """Refuse a webhook started without ``secret_token`` unless ``allowed``."""
    if allowed or _NO_SECRET_ALLOWED.get():
        return
    try:
        arguments = inspect.signature(method).bind(owner, *args, **kwargs).arguments
    except TypeError:
        return  # PTB reports the bad call itself
    if not arguments.get("secret_token"):
        raise ValueError(NO_SECRET_TOKEN.format(name=name))


def _with_opt_out(method: Callable[..., Any]) -> inspect.Signature:
    """PTB's signature of ``method`` and the keyword ``allow_no_secret_token=False``."""
    signature = inspect.signature(method)
    opt_out = inspect.Parameter(
        "allow_no_secret_token", inspect.Parameter.KEYWORD_ONLY, default=False
    )
    return signature.replace(parameters=[*signature.parameters.values(), opt_out])


class FencedUpdater(Updater):
    """PTB's :class:`telegram.ext.Updater`, warning about ``drop_pending_updates=True`` in
    :meth:`start_polling` and :meth:`start_webhook` as ``run_polling`` does (the
    ``async with app: await app.updater.start_polling(...)`` form). The Application of a
    ptb_fence processor gets one in place of the plain one the builder made."""

    __slots__ = ()

    async def start_polling(self, *args: Any, **kwargs: Any) -> Any:
        """PTB's :meth:`~telegram.ext.Updater.start_polling`. Warns about
        ``drop_pending_updates=True``."""
        if not _DROP_WARNED.get():
            _warn_drop_pending(Updater.start_polling, "updater.start_polling", self, args, kwargs)
        return await super().start_polling(*args, **kwargs)

    async def start_webhook(
        self, *args: Any, allow_no_secret_token: bool = False, **kwargs: Any
    ) -> Any:
        """PTB's :meth:`~telegram.ext.Updater.start_webhook`. Warns about
        ``drop_pending_updates=True``.

        Raises:
            ValueError: No ``secret_token`` is given (forged updates would be handled), and
                ``allow_no_secret_token=True`` (a proxy in front checks the requests) is not.
        """
        _require_secret(
            Updater.start_webhook, "updater.start_webhook", self, args, kwargs,
            allow_no_secret_token,
        )
        if not _DROP_WARNED.get():
            _warn_drop_pending(Updater.start_webhook, "updater.start_webhook", self, args, kwargs)
        return await super().start_webhook(*args, **kwargs)

    # the overrides take *args/**kwargs. Show PTB's parameters (help(), IDEs, inspect)
    setattr(start_polling, "__signature__", inspect.signature(Updater.start_polling))
    setattr(start_webhook, "__signature__", _with_opt_out(Updater.start_webhook))


class FencedApplicationMixin(_MixinBase):
    """Mix-in for :class:`telegram.ext.Application` subclasses used with a ptb_fence processor.

    - It gives handlers ``context.attempt``. The ``context_types`` PTB passes to the
      constructor get a context class derived from the user's one and
      :class:`~ptb_fence.ptb.FencedCallbackContext`. The data types are kept.
    - It attaches the application to its :class:`~ptb_fence.ptb.DurableUpdateProcessor` or
      :class:`~ptb_fence.ptb.FencedUpdateProcessor`. The processor refuses to start without it.
    - It marks the attempt failed when a handler raises, before any error handler runs. So
      user error handlers and ``Defaults(block=False)`` do not hide failures.
      :class:`telegram.ext.ApplicationHandlerStop` is not a failure.
    - It runs tasks made with :meth:`create_task` and error handlers that PTB runs as tasks
      outside the attempt. ``current_attempt()`` and ``context.attempt`` are :obj:`None` there.
      Blocking error handlers run inside it.

    :meth:`ptb_fence.ptb.FencedUpdateProcessor.install` applies it for you, also to an
    ``application_class`` you set on the builder *before* ``install``. If you set one after,
    derive it from :class:`FencedApplication` (or put this mix-in first in its bases).
    """

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        context_types = kwargs.get("context_types")
        if isinstance(context_types, ContextTypes):
            kwargs["context_types"] = fenced_context_types(context_types)
        updater = kwargs.get("updater")
        if type(updater) is Updater:  # the one the builder made (install refuses one of yours)
            kwargs["updater"] = FencedUpdater(bot=updater.bot, update_queue=updater.update_queue)
        super().__init__(*args, **kwargs)
        application: Any = self
        application.error_handlers = _ErrorHandlers(application.error_handlers)
        processor = self._fence_processor()
        if processor is not None:
            processor.attach(self)

    async def initialize(self) -> None:
        """Check that the ptb_fence processor and durable queue are in place, then initialize.

        Raises:
            RuntimeError: The Application's update processor is not a ptb_fence processor
                (``.concurrent_updates(...)`` was set on the builder after ``install()``), or
                its ``update_queue`` is not the processor's durable queue, or its
                :class:`~ptb_fence.ptb.FencedPersistence` cannot be fenced here (see
                :meth:`~ptb_fence.ptb.FencedPersistence.attach`).
        """
        processor = getattr(self, "update_processor", None)
        if not isinstance(processor, ApplicationBinding):
            raise RuntimeError(
                f"{type(self).__name__}: the update processor is {type(processor).__name__}, "
                "not a ptb_fence processor, so updates would be handled without being "
                "recorded or fenced. Was .concurrent_updates(...) set on the builder after "
                "install()? Remove it and pass max_concurrent=... to the processor instead"
            )
        if self.update_queue is not processor.queue:
            raise RuntimeError(
                f"{type(self).__name__}: the update_queue is not the processor's durable queue. "
                "Was .update_queue(...) set on the builder after install()? Remove it"
            )
        if isinstance(self.persistence, FencedPersistence):
            self.persistence.attach(self)  # refused here, before PTB loads anything
        await super().initialize()

    async def start(self) -> None:
        """Start the Application. The processor resumes handing due updates over."""
        await super().start()
        processor = self._fence_processor()
        if processor is not None:
            processor.application_started()

    async def stop(self) -> None:
        """Stop the Application in bounded time.

        Before PTB's ``stop()`` waits for the update queue to drain, the processor stops its
        sweep and queues nothing more (updates put from now on are recorded and left to the
        next start or another process). The updates already in the queue are handled and
        running handlers finish, within ``stop_timeout_seconds``. Then what is claimed but not
        started is released in one call (claimable at once by any process, the attempt not
        counted) and the handlers still running are cancelled and their attempts released the
        same way (their open fenced transactions on PostgreSQL are rolled back first). Every
        store call of the stop is bounded, also when the database does not answer.
        """
        processor = self._fence_processor()
        if processor is not None and self.running:
            await processor.application_stopping()
        await super().stop()

    def run_polling(self, *args: Any, **kwargs: Any) -> None:
        """PTB's :meth:`~telegram.ext.Application.run_polling`. Warns about
        ``drop_pending_updates=True``, which makes Telegram discard every update it still
        holds at each start."""
        _warn_drop_pending(Application.run_polling, "run_polling", self, args, kwargs)
        token = _DROP_WARNED.set(True)
        try:
            super().run_polling(*args, **kwargs)
        finally:
            _DROP_WARNED.reset(token)

    def run_webhook(
        self, *args: Any, allow_no_secret_token: bool = False, **kwargs: Any
    ) -> None:
        """PTB's :meth:`~telegram.ext.Application.run_webhook`. Warns about
        ``drop_pending_updates=True`` as :meth:`run_polling` does.

        Raises:
            ValueError: No ``secret_token`` is given (forged updates would be recorded and
                handled), and ``allow_no_secret_token=True`` (a proxy in front checks the
                requests) is not. It is raised before anything starts.
        """
        if self.updater is not None:  # else PTB says that run_webhook needs an Updater
            _require_secret(
                Application.run_webhook, "run_webhook", self, args, kwargs, allow_no_secret_token
            )
        _warn_drop_pending(Application.run_webhook, "run_webhook", self, args, kwargs)
        token = _DROP_WARNED.set(True)
        allowed = _NO_SECRET_ALLOWED.set(allow_no_secret_token)
        try:
            super().run_webhook(*args, **kwargs)
        finally:
            _NO_SECRET_ALLOWED.reset(allowed)
            _DROP_WARNED.reset(token)

    # the overrides take *args/**kwargs. Show PTB's parameters (help(), IDEs, inspect)
    setattr(run_polling, "__signature__", inspect.signature(Application.run_polling))
    setattr(run_webhook, "__signature__", _with_opt_out(Application.run_webhook))

    def drop_user_data(self, user_id: int) -> None:
        """PTB's :meth:`~telegram.ext.Application.drop_user_data`. With
        :class:`~ptb_fence.ptb.FencedPersistence`, called by a handler of an update of that
        user, the drop is written with the update's completion (and the handler's
        ``context.user_data`` is empty from here on). Elsewhere PTB's next flush deletes the
        stored data."""
        if isinstance(self.persistence, FencedPersistence):
            self.persistence.dropping(self, "user", user_id)
        super().drop_user_data(user_id)

    def drop_chat_data(self, chat_id: int) -> None:
        """PTB's :meth:`~telegram.ext.Application.drop_chat_data`, fenced as
        :meth:`drop_user_data` is."""
        if isinstance(self.persistence, FencedPersistence):
            self.persistence.dropping(self, "chat", chat_id)
        super().drop_chat_data(chat_id)

    def _fence_processor(self) -> Optional[ApplicationBinding]:
        processor = getattr(self, "update_processor", None)
        return processor if isinstance(processor, ApplicationBinding) else None

    async def process_update(self, update: object) -> None:
        """PTB's :meth:`~telegram.ext.Application.process_update`. When it ran an update that
        ran before (attempt 2 or later) and no handler matched it, a WARNING says that per
        process state (a conversation's) may be stale.

        With :class:`~ptb_fence.ptb.FencedPersistence`, the update's committed state is read
        first and its handlers' changes are handed to the attempt's completion after."""
        persistence = self.persistence
        session = None
        if isinstance(persistence, FencedPersistence):
            session = await persistence.open_session(self, update)
        if session is None:
            await super().process_update(update)
        else:
            session.activate()
            try:
                await super().process_update(update)
            except BaseException:
                session.end((), False)
                raise
            finally:
                session.deactivate()
            state = update_state()
            failed = state is not None and state.update is update and state.error is not None
            await persistence.handled(self, session, failed)  # type: ignore[union-attr]
        state = update_state()
        if state is not None and state.update is update:
            warn_if_unmatched_rerun(state, self)

    async def process_error(
        self,
        update: Optional[object],
        error: Exception,
        job: Any = None,
        coroutine: Any = None,
    ) -> bool:
        """Mark the current attempt failed, then run PTB's error handling."""
        state = update_state()
        if (
            state is not None
            and update is state.update
            and state.error is None
            and not isinstance(error, ApplicationHandlerStop)
        ):
            state.error = error
            if state.attempt is not None:  # what attempt.retry_follows reads
                state.attempt.report_failure(error)
            if not self.error_handlers:
                attempt = current_attempt()
                if attempt is None or not attempt.completed:
                    # PTB would log "No error handlers are registered" with the whole
                    # traceback for every failed attempt. ptb_fence logs the failure once
                    # (WARNING, with update id, attempt, claim id, the error's type and message)
                    # when it settles the attempt, so the traceback goes to DEBUG here (for an
                    # attempt that completed already the settle logs it, also at DEBUG)
                    _LOGGER.debug(
                        "handler of update %s raised (traceback; the attempt's outcome is "
                        "logged when it settles)",
                        getattr(update, "update_id", None),
                        exc_info=error,
                    )
                return False
        token = _IN_PROCESS_ERROR.set(True)
        try:
            return await super().process_error(
                update=update, error=error, job=job, coroutine=coroutine
            )
        finally:
            _IN_PROCESS_ERROR.reset(token)

    def create_task(
        self, coroutine: Any, update: Optional[object] = None, *, name: Optional[str] = None
    ) -> Any:
        """PTB's :meth:`~telegram.ext.Application.create_task`. The task runs outside the
        current attempt.

        PTB's own warnings (a task created while the Application is not running) point at the
        caller's line, as with a plain Application.
        """
        if self.running:  # PTB warns only when not running: no warning to re-aim (and
            # catch_warnings, per update on PTB's fetcher path, costs more than the task)
            with outside_attempt():
                return super().create_task(coroutine, update=update, name=name)
        with outside_attempt(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            task = super().create_task(coroutine, update=update, name=name)
        for warning in caught:
            if warning.filename == __file__:
                # PTB's stacklevel counts one frame too few through this override
                warnings.warn(warning.message, warning.category, stacklevel=2)
            else:
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
        return task


class FencedApplication(FencedApplicationMixin, Application[Any, Any, Any, Any, Any, Any]):
    """A :class:`telegram.ext.Application` wired for ptb_fence (see
    :class:`FencedApplicationMixin`)."""

    __slots__ = ()


def fenced_application_class(cls: type) -> type:
    """Return ``cls`` if it already carries :class:`FencedApplicationMixin`, else a subclass
    of ``cls`` that does."""
    if issubclass(cls, FencedApplicationMixin):
        return cls
    if cls is Application:
        return FencedApplication
    # named like the user's class: it stands in for it (repr, logs), and is a subclass of it
    return type(
        cls.__name__,
        (FencedApplicationMixin, cls),
        {"__slots__": (), "__qualname__": cls.__qualname__, "__module__": cls.__module__},
    )
