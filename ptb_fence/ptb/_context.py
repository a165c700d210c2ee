"""FencedCallbackContext: a CallbackContext that carries the current attempt."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional, TypeVar

from telegram.ext import CallbackContext, ContextTypes

from ptb_fence.ptb._handling import UpdateState, leave_attempt, update_state
from ptb_fence.ptb._ptb_internals import schedule_conversation_timeout
from ptb_fence.ptb._state_session import NOT_HELD, active_session
from ptb_fence.runtime._attempt import Attempt, current_attempt
from ptb_fence.runtime._outcome import ids

if TYPE_CHECKING:
    from telegram.ext import JobQueue

__all__ = [
    "AttemptUnavailable",
    "FencedCallbackContext",
    "fenced_context_types",
    "warn_if_unmatched_rerun",
]

_LOGGER = logging.getLogger("ptb_fence.ptb")

_Context = TypeVar("_Context", bound="FencedCallbackContext")


class AttemptUnavailable(RuntimeError):
    """:meth:`FencedCallbackContext.require_attempt` was called where no attempt exists. The
    message names the cause."""

    __slots__ = ()


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

    if TYPE_CHECKING:
        # PTB types CallbackContext.job_queue as JobQueue[ST] with ST bound to nothing here,
        # which a type checker reads as a queue of plain CallbackContexts: a job callback
        # taking this class (or a subclass) would be refused. The queue holds callbacks
        # called with this very context class (PTB builds every context from the
        # Application's one), so type it so. Nothing changes at run time.
        @property
        def job_queue(  # type: ignore[override]  # narrower than PTB's unbound JobQueue[ST]
            self: _Context,
        ) -> "Optional[JobQueue[_Context]]": ...

    @property
    def attempt(self) -> Optional[Attempt]:
        """:class:`ptb_fence.Attempt` | :obj:`None`: The attempt handling the current update.

        :obj:`None` in handlers that run outside an attempt: ``block=False`` handlers (and
        handlers made non-blocking by ``Defaults(block=False)``), jobs, error handlers run as
        tasks, and updates handled by a unary :class:`~ptb_fence.ptb.DurableUpdateProcessor`.
        """
        return current_attempt()

    def require_attempt(self) -> Attempt:
        """The :class:`ptb_fence.Attempt` handling the current update. Never :obj:`None`.

        Returns:
            The current attempt.

        Raises:
            AttemptUnavailable: (a :exc:`RuntimeError`) There is none here. The message says
                why: the Application uses the unary
                :class:`~ptb_fence.ptb.DurableUpdateProcessor` (use
                :class:`~ptb_fence.ptb.FencedUpdateProcessor`), or this code runs in a job,
                or outside the update's handling (a ``block=False`` handler, a task made with
                ``create_task``, an error handler run as a task).
        """
        attempt = current_attempt()
        if attempt is not None:
            return attempt
        if self.job is not None:
            cause = (
                "this code runs in a job (JobQueue), which handles no update; jobs have no "
                "attempt"
            )
        else:
            processor = getattr(self.application, "update_processor", None)
            runtime = getattr(processor, "runtime", None)
            if runtime is not None and not runtime.attempt_aware:
                cause = (
                    f"the Application's processor is {type(processor).__name__}, which is "
                    "unary (no attempts): use FencedUpdateProcessor"
                )
            else:
                cause = (
                    "this code runs outside the update's attempt: in a handler registered "
                    "with block=False (or made non-blocking by Defaults(block=False)), in a "
                    "task made with create_task, or in an error handler run as a task; run "
                    "it in a blocking handler"
                )
        raise AttemptUnavailable(f"context.require_attempt(): no attempt here: {cause}")

    @classmethod
    def from_update(cls, update: object, application: Any) -> Any:
        """Build the context of a handler of ``update`` (PTB does so once a handler matched
        it). The processor learns that the update did not go unhandled."""
        state = update_state()
        if state is not None and state.update is update:
            state.matched = True
        context = super().from_update(update, application)
        session = active_session()
        if session is not None:
            session.note_context(update, context)
        return context

    def next_conversation_state(self, state: object, *, name: Optional[str] = None) -> None:
        """With :class:`~ptb_fence.ptb.FencedPersistence`: the persistent conversation of
        this update goes to ``state`` (the value the callback will return). Call it before a
        ``transaction(complete=True)`` in a conversation callback, so that the new state
        commits with the update: PTB sets it only when the callback returns, after that
        commit. Not needed without such a transaction (the grouped completion comes after
        the return). With durable jobs, the handler's ``conversation_timeout`` is scheduled
        here too, so it commits with the state.

        Args:
            state: The next state (``ConversationHandler.END`` ends the conversation).
            name (:obj:`str`, optional): The ``ConversationHandler``'s name, needed only when
                the update belongs to several persistent conversations.

        Raises:
            RuntimeError: No FencedPersistence handles this update here.
            ValueError: No (or more than one, without ``name``) persistent conversation has
                this update.
        """
        session = active_session()
        if session is None or not session.owns_context(self):
            raise RuntimeError(
                "context.next_conversation_state(): no FencedPersistence handles this update "
                "here (set .persistence(FencedPersistence(store)) with a FencedUpdateProcessor, "
                "and call it in a blocking handler of the update)"
            )
        handler, conversation, _ = session.declare(state, name)
        # PTB schedules a conversation_timeout once the callback returns, after that commit.
        # A durable one is scheduled now instead, so it commits with the state it belongs to.
        if getattr(handler, "conversation_timeout", None) and state != handler.END:
            from ptb_fence.ptb._job_queue import FencedJobQueue

            if isinstance(self.application.job_queue, FencedJobQueue):
                schedule_conversation_timeout(handler, state, self.application,
                                              session.update, self, conversation)

    # With FencedPersistence, a handler of the update works on the attempt's private copies
    # of the data (committed with its completion, dropped when it fails). Elsewhere, PTB's.
    @property
    def user_data(self) -> Any:
        """As PTB's :attr:`telegram.ext.CallbackContext.user_data`. With
        :class:`~ptb_fence.ptb.FencedPersistence`, the attempt's copy while it handles the
        update."""
        return self._data_of("user", CallbackContext.user_data)

    @user_data.setter
    def user_data(self, value: object) -> None:
        CallbackContext.user_data.fset(self, value)  # type: ignore[attr-defined]

    @property
    def chat_data(self) -> Any:
        """As PTB's :attr:`telegram.ext.CallbackContext.chat_data`. With
        :class:`~ptb_fence.ptb.FencedPersistence`, the attempt's copy while it handles the
        update."""
        return self._data_of("chat", CallbackContext.chat_data)

    @chat_data.setter
    def chat_data(self, value: object) -> None:
        CallbackContext.chat_data.fset(self, value)  # type: ignore[attr-defined]

    @property
    def bot_data(self) -> Any:
        """As PTB's :attr:`telegram.ext.CallbackContext.bot_data`. With
        :class:`~ptb_fence.ptb.FencedPersistence`, the attempt's copy while it handles the
        update."""
        return self._data_of("bot", CallbackContext.bot_data)

    @bot_data.setter
    def bot_data(self, value: object) -> None:
        CallbackContext.bot_data.fset(self, value)  # type: ignore[attr-defined]

    def _data_of(self, kind: str, ptb_property: Any) -> Any:
        """The attempt's copy of the ``kind`` data while it handles the update, else PTB's."""
        session = active_session()
        held = NOT_HELD if session is None else session.data_of(self, kind)
        return ptb_property.fget(self) if held is NOT_HELD else held

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
        leave_attempt()
        return super().from_job(job, application)


def fenced_context_types(context_types: "ContextTypes[Any, Any, Any, Any]") -> Any:
    """``context_types`` whose context class derives from :class:`FencedCallbackContext`.

    Returned unchanged if it already does. Else the same ``bot_data``/``chat_data``/
    ``user_data`` types with a context class derived from both the user's class and
    :class:`FencedCallbackContext`.
    """
    context = context_types.context
    if issubclass(context, FencedCallbackContext):
        return context_types
    if context is CallbackContext:
        fenced: type = FencedCallbackContext
    else:
        fenced = type(f"Fenced{context.__name__}", (context, FencedCallbackContext), {"__slots__": ()})
    return ContextTypes(
        context=fenced,
        bot_data=context_types.bot_data,
        chat_data=context_types.chat_data,
        user_data=context_types.user_data,
    )


def warn_if_unmatched_rerun(handled: UpdateState, application: Any) -> None:
    """If the update of ``handled`` ran before, here or elsewhere (a retry, or a takeover after
    a crash, see :attr:`~ptb_fence.Attempt.suspicion`), and PTB's ``process_update`` just matched no
    handler for it, log it at WARNING: it counts as handled and is settled completed, and the
    likely cause is state that lived in the process that ran it before.

    Nothing is logged unless ``application``'s context class derives from
    :class:`FencedCallbackContext`: matching is seen through its ``from_update``.
    """
    attempt = handled.attempt
    if handled.matched or handled.error is not None or attempt is None:
        return
    if attempt.attempt < 2 and not attempt.suspicion:  # its first run anywhere
        return
    context_class = getattr(getattr(application, "context_types", None), "context", None)
    if not (isinstance(context_class, type) and issubclass(context_class, FencedCallbackContext)):
        return
    _LOGGER.warning(
        "update %s attempt %s matched no handler, so it counts as handled (completed): it ran "
        "before (a retry, or taken over after a crash or a lapsed lease), so conversation "
        "or persistence state kept per process (ConversationHandler states; user_data, "
        "chat_data, bot_data without a persistence every process shares) may be stale here: "
        "it may belong to a conversation step this process never saw",
        attempt.update_id,
        attempt.attempt,
        extra=ids(attempt),
    )
