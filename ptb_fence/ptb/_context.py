"""FencedCallbackContext: a CallbackContext that carries the current attempt."""

from __future__ import annotations

from typing import Optional

from telegram.ext import CallbackContext

from ptb_fence.runtime._attempt import Attempt, current_attempt

__all__ = ["FencedCallbackContext"]


class FencedCallbackContext(CallbackContext):  # type: ignore[type-arg]
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
