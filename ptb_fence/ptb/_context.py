"""FencedCallbackContext: a CallbackContext that carries the current attempt."""

from __future__ import annotations

from typing import Any, Optional

from telegram.ext import CallbackContext

from ptb_fence.ptb._application import _STATE
from ptb_fence.runtime._attempt import _CURRENT, Attempt, current_attempt

__all__ = ["FencedCallbackContext"]


# Not generic on purpose: handlers annotate ``context: FencedCallbackContext`` (also under
# mypy --strict), and a context class derived from it may narrow bot, user_data, chat_data and
# bot_data (install() mixes it into a user's own ContextTypes context at run time).
class FencedCallbackContext(CallbackContext[Any, Any, Any, Any]):
    """A :class:`telegram.ext.CallbackContext` with :attr:`attempt`.

    :meth:`ptb_fence.ptb.FencedUpdateProcessor.install` sets it as the context type. If you use
    your own ``ContextTypes``, derive your context class from this one::

        class MyContext(FencedCallbackContext):
            ...

        builder.context_types(ContextTypes(context=MyContext))
    """

    __slots__ = ()

    @property
    def attempt(self) -> Optional[Attempt]:
        """:class:`ptb_fence.Attempt` | :obj:`None`: The attempt handling the current update.

        :obj:`None` in handlers that run outside an attempt: ``block=False`` handlers (and
        handlers made non-blocking by ``Defaults(block=False)``), jobs, error handlers run as
        tasks, and updates handled by a unary :class:`~ptb_fence.ptb.DurableUpdateProcessor`.
        """
        return current_attempt()

    @classmethod
    def from_job(cls, job: Any, application: Any) -> Any:
        """Build the context of a job, which runs outside any attempt.

        A job's task can inherit the context of the handler that scheduled it (APScheduler
        arms its timer with :meth:`asyncio.loop.call_later` from wherever a job was added, and
        every later job run descends from that callback). PTB builds the job's context inside
        the job's own task, so clearing the attempt here makes ``context.attempt`` and
        :func:`ptb_fence.current_attempt` :obj:`None` for the whole job, without touching the
        handler.
        """
        _CURRENT.set(None)
        _STATE.set(None)
        return super().from_job(job, application)
