"""FencedApplication: the Application subclass that reports handler failures to the attempt."""

from __future__ import annotations

import contextvars
from typing import Any, Optional

from telegram.ext import Application, ApplicationHandlerStop

from ptb_fence.runtime._attempt import _CURRENT

__all__ = ["FencedApplication", "FencedApplicationMixin", "fenced_application_class"]


class _UpdateState:
    """What the processor learns about one update while PTB handles it."""

    __slots__ = ("error", "update")

    def __init__(self, update: object) -> None:
        self.update = update
        self.error: Optional[BaseException] = None


_STATE: "contextvars.ContextVar[Optional[_UpdateState]]" = contextvars.ContextVar(
    "ptb_fence_update_state", default=None
)


class FencedApplicationMixin:
    """Mix-in for :class:`telegram.ext.Application` subclasses used with a ptb_fence processor.

    - Attaches the application to its :class:`~ptb_fence.ptb.DurableUpdateProcessor` /
      :class:`~ptb_fence.ptb.FencedUpdateProcessor` (the processor refuses to start without it).
    - Marks the attempt failed when a handler raises: PTB routes handler exceptions to
      :meth:`process_error` (the processor would otherwise see success). This happens before
      any error handler runs, so user error handlers and ``Defaults(block=False)`` do not hide
      failures. :class:`telegram.ext.ApplicationHandlerStop` is not a failure.
    - Runs tasks made with :meth:`create_task` (``block=False`` handlers among them) outside
      the attempt: ``current_attempt()`` and ``context.attempt`` are :obj:`None` there.

    :meth:`ptb_fence.ptb.FencedUpdateProcessor.install` applies it for you, also to an
    ``application_class`` you set on the builder *before* ``install``. If you set one after,
    derive it from :class:`FencedApplication` (or put this mix-in first in its bases).
    """

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from ptb_fence.ptb._processor import BaseFenceProcessor

        processor = getattr(self, "update_processor", None)
        if isinstance(processor, BaseFenceProcessor):
            processor._attach(self)  # type: ignore[arg-type]

    async def process_error(  # type: ignore[override]
        self,
        update: Optional[object],
        error: Exception,
        job: Any = None,
        coroutine: Any = None,
    ) -> bool:
        """Mark the current attempt failed, then run PTB's error handling."""
        state = _STATE.get()
        if (
            state is not None
            and update is state.update
            and state.error is None
            and not isinstance(error, ApplicationHandlerStop)
        ):
            state.error = error
        return await super().process_error(  # type: ignore[misc]
            update=update, error=error, job=job, coroutine=coroutine
        )

    def create_task(self, coroutine: Any, update: Optional[object] = None, *, name: Optional[str] = None) -> Any:  # type: ignore[override]
        """Create a task that runs outside the current attempt."""
        state_token = _STATE.set(None)
        attempt_token = _CURRENT.set(None)
        try:
            return super().create_task(coroutine, update=update, name=name)  # type: ignore[misc]
        finally:
            _CURRENT.reset(attempt_token)
            _STATE.reset(state_token)


class FencedApplication(FencedApplicationMixin, Application):  # type: ignore[type-arg]
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
    return type(f"Fenced{cls.__name__}", (FencedApplicationMixin, cls), {"__slots__": ()})
