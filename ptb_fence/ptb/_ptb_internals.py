"""The private python-telegram-bot internals ptb_fence still relies on, in one place.

Everything else in ``ptb_fence.ptb`` uses PTB's public API. Each remaining reliance goes
through a function of this module. ``tests/unit/test_ptb_internals.py`` checks each one against
the installed PTB and names the internal a PTB release changed. The comments after the imports
number the internals and give the reason for each.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Dict, Optional, Tuple

from telegram.request import BaseRequest

# 1. ``ApplicationBuilder._application_class`` and ``ApplicationBuilder._application_kwargs``
#    (read by ``install()``): the builder has public setters but no getters. ``install()`` must
#    keep an ``application_class`` (and its kwargs) set *before* it and mix
#    :class:`~ptb_fence.ptb.FencedApplicationMixin` into it. Reading the builder is the only way
#    to learn it. (``context_types`` is not read from the builder any more: the mix-in adapts
#    the ``context_types`` argument PTB passes to the Application's constructor.)
# 2. ``telegram._utils.defaultvalue.DefaultValue``: how the builder marks the setting of 1. as
#    "not set by the user" (its value is then PTB's default ``Application``).
# 3. ``Bot._request``, a ``(getUpdates request, other request)`` tuple, replaced with
#    ``object.__setattr__`` (``Bot`` refuses plain attribute assignment after ``__init__``):
#    ``initialize()`` wraps the getUpdates request in a
#    :class:`~ptb_fence.ptb._request.RecordingRequest` (a whole batch recorded in one commit) and
#    ``shutdown()`` unwraps it. PTB's public ``ApplicationBuilder.get_updates_request()`` cannot
#    do this: the builder has no getter, so ``install()`` could not wrap the request or keep the
#    ``get_updates_*`` settings (timeouts, proxy, pool size) the user gave before ``install()``.
#    Once it is set PTB refuses every later ``get_updates_*`` setter and ``.bot(...)``. And a
#    ``Bot`` shared by Applications built one after another must record for the one that runs.
#    If the tuple is not there, ptb_fence records update by update (slower, equally durable).
#    The other request of the tuple is wrapped the same way by a FencedUpdateProcessor, to see
#    a handler's direct sends (:class:`~ptb_fence.ptb._direct_sends.DirectSendWatch`). Without
#    the tuple that WARNING is not given.
# 4. ``Application.process_error`` takes the handlers it runs from
#    ``application.error_handlers.items()`` (a public attribute, but *how* PTB reads it is
#    not documented). PTB runs non-blocking error handlers as tasks with its private
#    ``__create_task``, which an override of the public ``create_task`` cannot see, so they
#    would inherit the attempt. ``error_handlers`` is a ``dict`` subclass that, while
#    ``process_error`` reads it, hands out each callback wrapped so that it runs outside the
#    attempt when it runs in a task of its own. If PTB stops reading ``items()``, error
#    handlers run as tasks would see ``context.attempt`` (the guard test says so).
# 5. ``BaseUpdateProcessor.process_update`` is marked ``@final`` and is overridden (see
#    ``_processor.py``): PTB holds its semaphore for a whole update, including a chat's wait
#    for its turn. Guarded by the tests that handle updates concurrently.
#
# 6. ``ConversationHandler._conversations``, the handler's ``{conversation key: state}`` dict
#    that its ``check_update`` reads and ``handle_update`` writes. PTB loads it from the
#    persistence once, at ``initialize()``, and never reads it again (its maintainers: there is
#    no public way to re-read a conversation's state), so
#    :class:`~ptb_fence.ptb.FencedPersistence` sets the committed state of the update's keys in
#    it before each update is handled, reads the new state after, and puts the committed state
#    back when an attempt fails.
# 7. ``ConversationHandler._get_key(update)``: the conversation key of an update (per chat,
#    user, message, as the handler is configured), to know which keys an update touches before
#    PTB handles it. If it is missing, FencedPersistence refuses to start.
# 8. ``telegram.ext._handlers.conversationhandler.PendingState``: the state a ``block=False``
#    callback leaves until its task ends (``done()``, ``resolve()``). FencedPersistence writes
#    the resolved state when the task has ended by the completion, else leaves the committed
#    one.
#
# 9. ``ExtBot._replace_keyboard`` hands every inline keyboard the bot sends or edits (with
#    ``arbitrary_callback_data``) to ``bot.callback_data_cache.process_keyboard``, and that
#    instance's class can be replaced by a subclass (``__class__`` assignment, the subclass
#    adds no slots). With the callback-data cache fenced, the cache is given a subclass whose
#    ``process_keyboard`` also tells the update being handled which keyboard it inserted, so
#    its completion writes the keyboard. PTB has no public hook for "a keyboard was cached".
#    If this changes, keyboards sent with ``context.bot`` are not written (the guard test
#    says so). Those queued through ``attempt.outbox`` are.
# 10. ``TelegramObject._unfrozen()``: PTB's own way (``CallbackDataCache.process_callback_query``)
#     to set ``CallbackQuery.data`` on a frozen object. A press of a keyboard this process's
#     cache does not hold (sent by another process, or before a restart) arrives as
#     ``InvalidCallbackData``. FencedPersistence reads the keyboard from the store and sets the
#     data to the original object as PTB would have (buttons use the public
#     ``InlineKeyboardButton.update_callback_data``).
# 11. ``CallbackContext._chat_id`` and ``CallbackContext._user_id``: the chat and the user
#     whose ``chat_data`` and ``user_data`` a context hands out. PTB's ``from_job`` sets them
#     for a job. A durable job's run reaches its handler as an update without a chat, so
#     :class:`~ptb_fence.ptb.JobRunHandler` sets them to the job's chat and user.
# 12. ``ConversationHandler._trigger_timeout``: the bound method a ``ConversationHandler``
#     schedules with ``job_queue.run_once`` for its ``conversation_timeout``, with PTB's private
#     ``_ConversationTimeoutContext`` as its data. A :class:`~ptb_fence.ptb.FencedJobQueue`
#     keeps it as a durable job of the handler's name and conversation key (a bound method and
#     that data cannot be kept), and runs the handler's ``TIMEOUT`` handlers itself.
# 13. ``ConversationHandler._schedule_job(new_state, application, update, context,
#     conversation_key)``: how PTB schedules that timeout once a callback returned.
#     ``context.next_conversation_state`` calls it earlier, while the attempt has not completed,
#     so the timeout commits with the state. If this changes, the timeout is scheduled only
#     when the callback returns, right after the commit (the guard test says so).
#
# Not private, listed because their identity matters: the defaults of the public
# ``BaseRequest.do_request`` signature (PTB's "not given" marker), read with :mod:`inspect`.

__all__ = [
    "REQUEST_DEFAULT",
    "fence_keyboard_cache",
    "set_callback_query_data",
    "set_context_chat_and_user",
    "timed_out_conversation",
    "schedule_conversation_timeout",
    "conversation_key",
    "conversation_states",
    "missing_conversation_internals",
    "pending_state",
    "missing_internals",
    "require_internals",
    "builder_application_class",
    "get_updates_request",
    "set_bot_request",
    "set_get_updates_request",
]

REQUEST_DEFAULT: Any = inspect.signature(BaseRequest.do_request).parameters["read_timeout"].default
"""The default of ``BaseRequest.do_request``'s timeouts ("not given": use the request's own)."""


def _is_unset(value: Any) -> bool:
    """Whether a builder setting still holds PTB's default marker (internal 2.)."""
    from telegram._utils.defaultvalue import DefaultValue

    return value is None or isinstance(value, DefaultValue)


def builder_application_class(builder: Any) -> Tuple[Optional[type], Dict[str, Any]]:
    """The ``application_class`` and kwargs set on ``builder`` (internal 1.).

    Returns:
        ``(None, {})`` when the user set none. Else the class and its kwargs.
    """
    cls = getattr(builder, "_application_class", None)
    kwargs = getattr(builder, "_application_kwargs", None)
    if _is_unset(kwargs):
        kwargs = {}
    return (None if _is_unset(cls) else cls), dict(kwargs or {})


def get_updates_request(bot: Any) -> Optional[Tuple[Any, Any]]:
    """The ``(getUpdates request, other request)`` pair of ``bot`` (internal 3.), or
    :obj:`None` if this PTB keeps them otherwise."""
    requests = getattr(bot, "_request", None)
    if isinstance(requests, tuple) and len(requests) == 2:
        return requests
    return None


def set_get_updates_request(bot: Any, request: BaseRequest) -> bool:
    """Make ``bot`` send ``getUpdates`` through ``request`` (internal 3.).

    Returns:
        :obj:`False` (changing nothing) if this PTB keeps the requests otherwise.
    """
    requests = get_updates_request(bot)
    if requests is None:
        return False
    try:
        object.__setattr__(bot, "_request", (request, requests[1]))
    except (AttributeError, TypeError):  # pragma: no cover - a PTB we do not know
        return False
    return True


def set_bot_request(bot: Any, request: BaseRequest) -> bool:
    """Make ``bot`` send every method but ``getUpdates`` through ``request`` (internal 3.).

    Returns:
        :obj:`False` (changing nothing) if this PTB keeps the requests otherwise.
    """
    requests = get_updates_request(bot)
    if requests is None:
        return False
    try:
        object.__setattr__(bot, "_request", (requests[0], request))
    except (AttributeError, TypeError):  # pragma: no cover - a PTB we do not know
        return False
    return True


def missing_internals(builder: Any) -> "list[str]":
    """The internals above that this PTB lacks and that have no fallback, one line each.

    Internal 3 records update by update without its tuple and 4 only changes where an error
    handler running as a task sees ``context.attempt``, so they are guarded by the tests
    only. 1, 2 and 5 decide whether ``install()`` can fence the Application at all.
    """
    from telegram.ext import BaseUpdateProcessor

    missing = [
        f"ApplicationBuilder.{name} (internal 1)"
        for name in ("_application_class", "_application_kwargs")
        if not hasattr(builder, name)
    ]
    try:
        from telegram._utils.defaultvalue import DefaultValue  # noqa: F401
    except ImportError:
        missing.append("telegram._utils.defaultvalue.DefaultValue (internal 2)")
    if not inspect.iscoroutinefunction(getattr(BaseUpdateProcessor, "process_update", None)):
        missing.append("BaseUpdateProcessor.process_update as a coroutine (internal 5)")
    return missing


def require_internals(builder: Any) -> None:
    """Refuse to wire ``builder`` when this PTB lacks an internal that has no fallback.

    Raises:
        RuntimeError: Naming each missing internal and the installed PTB version: install a
            python-telegram-bot version ptb_fence supports, or a ptb_fence that supports it.
    """
    missing = missing_internals(builder)
    if missing:
        import telegram

        raise RuntimeError(
            f"python-telegram-bot {telegram.__version__} lacks what ptb_fence relies on: "
            + "; ".join(missing)
            + ". Install a python-telegram-bot version ptb_fence supports (22.x, see setup.cfg) "
            "or a ptb_fence release that supports this one (ptb_fence/ptb/_ptb_internals.py "
            "lists each reliance)"
        )


def conversation_states(handler: Any) -> Any:
    """The ``{conversation key: state}`` dict of a ``ConversationHandler`` (internal 6)."""
    return getattr(handler, "_conversations")


def conversation_key(handler: Any, update: Any) -> Optional[Tuple[Any, ...]]:
    """The conversation key ``handler`` gives ``update`` (internal 7), or :obj:`None` when the
    handler builds none for it (no chat, user or callback query where it needs one)."""
    try:
        key = getattr(handler, "_get_key")(update)
    except (RuntimeError, AttributeError):
        return None
    return key if type(key) is tuple else tuple(key)


@functools.lru_cache(maxsize=None)
def _pending_state_class() -> Any:
    """PTB's ``PendingState`` class, imported once (asked once per update)."""
    from telegram.ext._handlers.conversationhandler import PendingState

    return PendingState


def pending_state(value: Any) -> Optional[Tuple[bool, Any]]:
    """For a ``block=False`` callback's pending state (internal 8): ``(done, state)`` with
    the resolved state once its task ended (``state`` is :obj:`None` while not done).
    Returns :obj:`None` for any other value."""
    if not isinstance(value, _pending_state_class()):
        return None
    if not value.done():
        return False, None
    return True, value.resolve()


def missing_conversation_internals() -> "list[str]":
    """The internals 6 to 8 that this PTB lacks, one line each (FencedPersistence needs all)."""
    from telegram.ext import ConversationHandler

    missing = []
    if not callable(getattr(ConversationHandler, "_get_key", None)):
        missing.append("ConversationHandler._get_key (internal 7)")
    if "_conversations" not in getattr(ConversationHandler, "__slots__", ()):
        missing.append("ConversationHandler._conversations (internal 6)")
    try:
        from telegram.ext._handlers.conversationhandler import PendingState
    except ImportError:
        missing.append("telegram.ext._handlers.conversationhandler.PendingState (internal 8)")
    else:
        if not (callable(getattr(PendingState, "done", None))
                and callable(getattr(PendingState, "resolve", None))):
            missing.append("PendingState.done/resolve (internal 8)")
    return missing


def fence_keyboard_cache(cache: Any, on_keyboard: Any) -> bool:
    """Make ``cache`` (a bot's ``CallbackDataCache``) call ``on_keyboard(original, sent)``
    after each keyboard its ``process_keyboard`` inserted (internal 9): ``original`` the
    markup given, ``sent`` the one with the buttons' data replaced by their ids.

    Returns:
        :obj:`False` (changing nothing) if this PTB keeps its cache otherwise.
    """
    from telegram.ext import CallbackDataCache

    if not isinstance(cache, CallbackDataCache):
        return False
    cls = type(cache)
    if getattr(cls, "ptb_fence_recorder", None) is not None:
        fenced: Any = cls
    else:
        def process_keyboard(self: Any, reply_markup: Any) -> Any:
            sent = super(fenced, self).process_keyboard(reply_markup)
            if sent is not reply_markup:
                fenced.ptb_fence_recorder(reply_markup, sent)
            return sent

        fenced = type(f"Fenced{cls.__name__}", (cls,), {
            "__slots__": (), "process_keyboard": process_keyboard,
            "ptb_fence_recorder": None,
        })
    fenced.ptb_fence_recorder = staticmethod(on_keyboard)
    try:
        cache.__class__ = fenced
    except TypeError:  # pragma: no cover - a PTB we do not know
        return False
    return True


def set_callback_query_data(query: Any, data: Any) -> None:
    """Set ``query.data`` (a frozen ``CallbackQuery``) as PTB's cache does (internal 10)."""
    with getattr(query, "_unfrozen")():
        query.data = data


def set_context_chat_and_user(context: Any, chat_id: Optional[int], user_id: Optional[int]) -> None:
    """Make ``context.chat_data`` and ``context.user_data`` those of ``chat_id`` and
    ``user_id``, as PTB's ``CallbackContext.from_job`` does for a job (internal 11)."""
    setattr(context, "_chat_id", chat_id)  # PTB's own attributes, set as from_job sets them
    setattr(context, "_user_id", user_id)


def timed_out_conversation(callback: Any) -> Any:
    """The ``ConversationHandler`` whose ``conversation_timeout`` job ``callback`` is, or
    :obj:`None` (internal 12)."""
    from telegram.ext import ConversationHandler

    handler = getattr(callback, "__self__", None)
    trigger = getattr(ConversationHandler, "_trigger_timeout", None)
    if isinstance(handler, ConversationHandler) and getattr(callback, "__func__", None) is trigger:
        return handler
    return None


def schedule_conversation_timeout(handler: Any, state: object, application: Any, update: Any,
                                  context: Any, conversation: Any) -> bool:
    """Schedule ``handler``'s ``conversation_timeout`` for a conversation going to ``state``,
    as PTB does once a callback returned (internal 13). Whether PTB's method was there."""
    schedule = getattr(handler, "_schedule_job", None)
    if not callable(schedule):  # pragma: no cover - a PTB we do not know
        return False
    schedule(new_state=state, application=application, update=update, context=context,
             conversation_key=conversation)
    return True
