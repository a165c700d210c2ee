"""PTB's public API where it exists, guards on the private internals that remain, and
PTB-like behaviour where users can see it.

The guards check the installed python-telegram-bot itself: when one fails, a PTB release
changed an internal listed in ``ptb_fence/ptb/_ptb_internals.py``; the assertion message names
it. Nothing here patches ptb_fence.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import pathlib
import warnings
import weakref
from typing import Any, List, Optional, Tuple

import pytest
from telegram import Bot
from telegram.ext import (
    Application,
    ApplicationBuilder,
    CallbackContext,
    ContextTypes,
    ExtBot,
)
from telegram.request import BaseRequest, RequestData

from ptb_fence import MemoryUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor
from ptb_fence.ptb import _ptb_internals as internals

TOKEN = "123456:ABCdef"
PTB_PACKAGE = pathlib.Path(__import__("ptb_fence").ptb.__file__).parent


def _fenced_app(builder: Optional[ApplicationBuilder[Any, Any, Any, Any, Any, Any]] = None) -> Any:
    processor = FencedUpdateProcessor(MemoryUpdateStore())
    return processor.install(builder or Application.builder().token(TOKEN)).build()


# -- public API where it exists --------------------------------------------------------------


def test_only_the_internals_module_touches_private_ptb_modules() -> None:
    offenders = []
    for path in sorted(PTB_PACKAGE.glob("*.py")):
        if path.name == "_ptb_internals.py":
            continue
        text = path.read_text(encoding="utf-8")
        needles = ["telegram._", "telegram.ext._", '"_request"', "bot._request"]
        for name in ("_context_types", "_application_class", "_application_kwargs"):
            needles += [f".{name}", f'"{name}"']
        for needle in needles:
            if needle in text:
                offenders.append(f"{path.name}: {needle}")
    assert offenders == [], (
        "private PTB internals used outside ptb_fence/ptb/_ptb_internals.py: "
        + ", ".join(offenders)
    )


class _MyContext(CallbackContext[Any, Any, Any, Any]):
    __slots__ = ()


def test_context_types_set_after_install_still_get_attempts() -> None:
    # install() no longer reads the builder's private _context_types: the Application
    # adapts the context_types PTB passes to its constructor, whenever they were set
    processor = FencedUpdateProcessor(MemoryUpdateStore())
    builder = processor.install(Application.builder().token(TOKEN))
    app = builder.context_types(ContextTypes(context=_MyContext, bot_data=list)).build()
    assert issubclass(app.context_types.context, _MyContext)
    assert issubclass(app.context_types.context, FencedCallbackContext)
    assert app.context_types.bot_data is list
    assert app.bot_data == []


def test_context_types_set_before_install_are_kept_and_fenced() -> None:
    builder = Application.builder().token(TOKEN).context_types(
        ContextTypes(context=_MyContext, user_data=list)
    )
    app = _fenced_app(builder)
    assert issubclass(app.context_types.context, _MyContext)
    assert issubclass(app.context_types.context, FencedCallbackContext)
    assert app.context_types.user_data is list


# -- guards on the private internals that remain ----------------------------------------------


class _SubApplication(Application[Any, Any, Any, Any, Any, Any]):
    __slots__ = ("extra",)

    def __init__(self, *, extra: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.extra = extra


def test_guard_builder_application_class_and_kwargs() -> None:
    """Internals 1 and 2: ApplicationBuilder._application_class / _application_kwargs."""
    fresh = ApplicationBuilder()
    for name in ("_application_class", "_application_kwargs"):
        assert hasattr(fresh, name), f"PTB changed ApplicationBuilder.{name} (see _ptb_internals 1)"
    assert internals.builder_application_class(fresh) == (None, {}), (
        "PTB changed how ApplicationBuilder marks an unset application_class "
        "(DefaultValue, see _ptb_internals 2)"
    )
    fresh.application_class(_SubApplication, {"extra": 7})
    assert internals.builder_application_class(fresh) == (_SubApplication, {"extra": 7}), (
        "PTB changed ApplicationBuilder._application_class/_application_kwargs"
    )
    # and install() builds on it
    app = _fenced_app(Application.builder().token(TOKEN).application_class(_SubApplication, {"extra": 7}))
    assert isinstance(app, _SubApplication) and app.extra == 7


class _ScriptedRequest(BaseRequest):
    """Answers getMe and getUpdates from memory; remembers the methods it was asked."""

    def __init__(self, updates: List[Any]) -> None:
        self.updates = updates
        self.methods: List[str] = []

    @property
    def read_timeout(self) -> Optional[float]:
        return None

    async def initialize(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: Optional[RequestData] = None,
        read_timeout: Any = internals.REQUEST_DEFAULT,
        write_timeout: Any = internals.REQUEST_DEFAULT,
        connect_timeout: Any = internals.REQUEST_DEFAULT,
        pool_timeout: Any = internals.REQUEST_DEFAULT,
    ) -> Tuple[int, bytes]:
        name = url.rsplit("/", 1)[-1]
        self.methods.append(name)
        if name == "getMe":
            result: Any = {"id": 123456, "is_bot": True, "first_name": "b", "username": "b"}
        else:
            result = self.updates
        return 200, json.dumps({"ok": True, "result": result}).encode()


def test_guard_bot_request_pair_routes_get_updates() -> None:
    """Internal 3: Bot._request is (getUpdates request, other request) and replacing its
    first element reroutes getUpdates."""
    other = _ScriptedRequest([])
    original = _ScriptedRequest([])
    replacement = _ScriptedRequest([{"update_id": 5}])
    for bot in (Bot(TOKEN, request=other, get_updates_request=original),
                ExtBot(TOKEN, request=other, get_updates_request=original)):
        pair = internals.get_updates_request(bot)
        assert pair is not None, "PTB changed Bot._request (see _ptb_internals 3)"
        assert pair == (original, other), "PTB changed the order of Bot._request"
        assert internals.set_get_updates_request(bot, replacement)

        async def fetch() -> Any:
            async with bot:
                return await bot.get_updates()

        updates = asyncio.run(asyncio.wait_for(fetch(), 10))
        assert [u.update_id for u in updates] == [5]
        assert replacement.methods == ["getUpdates"], (
            "replacing Bot._request[0] no longer reroutes getUpdates (see _ptb_internals 3)"
        )
        assert "getUpdates" not in original.methods + other.methods
        replacement.methods.clear()
        other.methods.clear()


def test_guard_request_default_is_what_ptb_passes_for_not_given() -> None:
    for name in ("read_timeout", "write_timeout", "connect_timeout", "pool_timeout"):
        assert inspect.signature(BaseRequest.post).parameters[name].default is (
            internals.REQUEST_DEFAULT
        ), "PTB changed BaseRequest's 'not given' default"


class _CountingHandlers(dict):  # type: ignore[type-arg]
    def __init__(self, handlers: Any, substitute: Any) -> None:
        super().__init__(handlers)
        self.reads = 0
        self.substitute = substitute

    def items(self) -> Any:
        self.reads += 1
        return [(self.substitute, block) for _, block in super().items()]


def test_guard_process_error_reads_error_handlers_items() -> None:
    """Internal 4: plain PTB's process_error runs what error_handlers.items() hands out,
    blocking and as a task."""
    ran: List[str] = []

    async def registered(update: object, context: Any) -> None:
        ran.append("registered")

    async def substitute(update: object, context: Any) -> None:
        ran.append("substitute")

    async def scenario() -> None:
        request = _ScriptedRequest([])
        app = Application.builder().bot(ExtBot(TOKEN, request=request)).build()
        await app.bot.initialize()  # PTB names the error handler's task after the bot's id
        app.add_error_handler(registered, block=True)
        app.error_handlers = _CountingHandlers(app.error_handlers, substitute)
        await app.process_error(None, RuntimeError("x"))
        app.error_handlers = _CountingHandlers({registered: False}, substitute)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not running" task warning
            await app.process_error(None, RuntimeError("y"))
        for _ in range(20):
            await asyncio.sleep(0)

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert ran == ["substitute", "substitute"], (
        "PTB's Application.process_error no longer takes its handlers from "
        "error_handlers.items() (see _ptb_internals 4)"
    )


# -- behave like PTB where users can see it ---------------------------------------------------


async def _idle() -> None:
    return None


def _create_task_warnings(app: Any) -> List[warnings.WarningMessage]:
    async def scenario() -> List[warnings.WarningMessage]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            task = app.create_task(_idle())  # the line the warning must point at
        await task
        return list(caught)

    result: List[warnings.WarningMessage] = asyncio.run(asyncio.wait_for(scenario(), 10))
    return result


@pytest.mark.parametrize("fenced", [False, True], ids=["plain PTB", "install()"])
def test_create_task_warning_points_at_the_caller(fenced: bool) -> None:
    app = _fenced_app() if fenced else Application.builder().token(TOKEN).build()
    caught = [w for w in _create_task_warnings(app) if "automatically awaited" in str(w.message)]
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert (caught[0].filename, caught[0].lineno) == (
        __file__,
        inspect.getsourcelines(_create_task_warnings)[1] + 4,
    ), f"the warning points at {caught[0].filename}:{caught[0].lineno}, not at the caller"


def test_create_task_warning_obeys_the_callers_filters() -> None:
    app = _fenced_app()

    async def scenario() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            coro = _idle()
            with pytest.raises(UserWarning, match="automatically awaited"):
                app.create_task(coro)
        await asyncio.sleep(0)

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_processor_holds_its_application_weakly() -> None:
    processor = FencedUpdateProcessor(MemoryUpdateStore())
    app = processor.install(Application.builder().token(TOKEN)).build()
    assert processor.application is app
    ours = [
        ref for ref in gc.get_referrers(app)
        if type(ref).__module__.startswith("ptb_fence")
    ]
    assert ours == [], f"ptb_fence objects hold the Application strongly: {ours!r}"
    ref = weakref.ref(app)
    del app
    gc.collect()
    assert ref() is None
    assert processor.application is None


def test_deleting_the_application_frees_it_like_plain_ptb() -> None:
    """Without the cyclic GC, an Application built with install() is freed exactly when a
    plain PTB Application built the same way is."""

    def freed_without_gc(build: Any) -> bool:
        gc.collect()
        gc.disable()
        try:
            app = build()
            ref = weakref.ref(app)
            del app
            return ref() is None
        finally:
            gc.enable()
            gc.collect()

    plain = freed_without_gc(lambda: Application.builder().token(TOKEN).build())
    fenced = freed_without_gc(_fenced_app)
    assert fenced == plain


@pytest.mark.parametrize(
    "method", ["run_polling", "run_webhook", "create_task", "process_error", "initialize", "stop"]
)
def test_overridden_methods_keep_ptbs_signature(method: str) -> None:
    plain = Application.builder().token(TOKEN).build()
    fenced = _fenced_app()

    def shape(bound: Any) -> List[Tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(bound).parameters.values()]

    expected = shape(getattr(plain, method))
    if method == "run_webhook":  # and the opt-out of the secret token, by name
        expected.append(("allow_no_secret_token", inspect.Parameter.KEYWORD_ONLY, False))
    assert shape(getattr(fenced, method)) == expected


class PytestApplication(Application[Any, Any, Any, Any, Any, Any]):
    __slots__ = ()


def test_an_application_class_of_the_user_keeps_its_name_in_repr() -> None:
    app = _fenced_app(Application.builder().token(TOKEN).application_class(PytestApplication))
    assert isinstance(app, PytestApplication)
    assert type(app).__name__ == "PytestApplication"
    assert repr(app).startswith("PytestApplication[bot=")


# -- install() refuses a PTB that lacks an internal without fallback ------------------------------


class _BuilderWithoutApplicationClass(ApplicationBuilder):  # type: ignore[type-arg]
    """A builder of a PTB release that keeps its application class elsewhere."""

    def __getattribute__(self, name: str) -> Any:
        if name == "_application_class":
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_install_names_a_missing_internal_and_the_ptb_version() -> None:
    import telegram

    processor = FencedUpdateProcessor(MemoryUpdateStore())
    with pytest.raises(RuntimeError) as raised:
        processor.install(_BuilderWithoutApplicationClass().token(TOKEN))
    message = str(raised.value)
    assert "ApplicationBuilder._application_class" in message
    assert telegram.__version__ in message
    assert "Install a python-telegram-bot version ptb_fence supports" in message


def test_the_installed_ptb_has_every_internal_without_fallback() -> None:
    assert internals.missing_internals(ApplicationBuilder()) == []


# -- internals 6 to 8: conversation states (FencedPersistence) -----------------------------------
def _booking() -> Any:
    from telegram.ext import CommandHandler, ConversationHandler, MessageHandler, filters

    async def noop(update: Any, context: Any) -> None:
        return None

    return ConversationHandler(
        entry_points=[CommandHandler("book", noop)],
        states={1: [MessageHandler(filters.TEXT, noop)]},
        fallbacks=[], name="booking", persistent=True,
    )


def test_guard_conversation_states_are_what_check_update_reads() -> None:
    from telegram import Update

    from ptb_fence.testing import make_message_update

    bot = Bot(TOKEN)
    handler = _booking()
    update = Update.de_json(make_message_update(1, 5, "hello", user_id=7), bot)
    key = internals.conversation_key(handler, update)
    assert key == (5, 7), "ConversationHandler._get_key (internal 7) changed"
    assert handler.check_update(update) is None  # no conversation: "hello" is no entry point
    internals.conversation_states(handler)[key] = 1
    checked = handler.check_update(update)
    assert checked is not None and checked[0] == 1, (
        "ConversationHandler.check_update no longer reads _conversations (internal 6)")
    internals.conversation_states(handler).pop(key)
    assert handler.check_update(update) is None
    channel = Update.de_json({"update_id": 2, "channel_post": {
        "message_id": 1, "date": 0, "chat": {"id": -100, "type": "channel"}, "text": "x"}}, bot)
    assert internals.conversation_key(handler, channel) is None  # no user: no key
    assert internals.missing_conversation_internals() == []


def test_guard_pending_state_of_a_non_blocking_callback() -> None:
    from telegram.ext._handlers.conversationhandler import PendingState

    async def scenario() -> None:
        gate = asyncio.Event()

        async def later() -> int:
            await gate.wait()
            return 2

        task = asyncio.ensure_future(later())
        pending = PendingState(old_state=1, task=task)
        assert internals.pending_state(pending) == (False, None)
        gate.set()
        await task
        assert internals.pending_state(pending) == (True, 2), "PendingState (internal 8) changed"
        assert internals.pending_state(1) is None

    asyncio.run(scenario())


def test_guard_keyboards_the_bot_sends_reach_the_fenced_cache() -> None:
    """Internal 9: ExtBot hands every inline keyboard it sends to its cache's
    process_keyboard, and the cache's class can be replaced by a subclass."""
    from telegram import InlineKeyboardButton, InlineKeyboardMarkup
    from telegram.ext import CallbackDataCache

    bot = ExtBot(TOKEN, arbitrary_callback_data=True)
    cache = bot.callback_data_cache
    assert isinstance(cache, CallbackDataCache)
    seen: List[Tuple[Any, Any]] = []
    assert internals.fence_keyboard_cache(cache, lambda original, sent: seen.append((original, sent)))
    assert isinstance(bot.callback_data_cache, CallbackDataCache) and bot.callback_data_cache is cache
    markup = InlineKeyboardMarkup([[InlineKeyboardButton("a", callback_data=object())]])
    sent = getattr(bot, "_replace_keyboard")(markup)  # what ExtBot's send methods call
    assert seen == [(markup, sent)], (
        "ExtBot no longer sends keyboards through callback_data_cache.process_keyboard "
        "(internal 9)")
    assert isinstance(sent.inline_keyboard[0][0].callback_data, str)
    # a markup without callback data inserts nothing and is not reported
    plain = InlineKeyboardMarkup([[InlineKeyboardButton("u", url="https://example.org")]])
    assert cache.process_keyboard(plain) is plain and len(seen) == 1
    # fencing again only changes the recorder
    assert internals.fence_keyboard_cache(cache, lambda original, sent: None)
    cache.process_keyboard(markup)
    assert len(seen) == 1
    assert not internals.fence_keyboard_cache(object(), lambda original, sent: None)


def test_guard_callback_query_data_can_be_set_on_a_frozen_query() -> None:
    """Internal 10: TelegramObject._unfrozen() lets CallbackQuery.data be set."""
    from telegram import CallbackQuery, User

    query = CallbackQuery("1", User(1, "u", False), "chat", data="x")
    with pytest.raises(AttributeError):
        query.data = "y"  # type: ignore[misc]
    internals.set_callback_query_data(query, {"any": "object"})
    assert query.data == {"any": "object"}, "TelegramObject._unfrozen (internal 10) changed"


def test_guard_callback_context_chat_and_user_ids_give_the_data() -> None:
    """Internal 11: setting ``_chat_id``/``_user_id`` makes ``chat_data``/``user_data`` those
    of that chat and user, as ``from_job`` does."""
    from telegram.ext import Application, CallbackContext

    from ptb_fence.ptb._ptb_internals import set_context_chat_and_user

    app = Application.builder().token("123:ABC").build()
    app.chat_data[5]["seen"] = True
    app.user_data[9]["name"] = "ann"
    context = CallbackContext(app)
    assert context.chat_data is None and context.user_data is None
    set_context_chat_and_user(context, 5, 9)
    assert context.chat_data == {"seen": True} and context.user_data == {"name": "ann"}


def test_guard_conversation_timeout_job_is_the_handlers_trigger_timeout() -> None:
    """Internal 12: a ConversationHandler schedules its timeout as its bound
    ``_trigger_timeout``, and nothing else is taken for one."""
    from telegram.ext import CommandHandler, ConversationHandler

    from ptb_fence.ptb._ptb_internals import timed_out_conversation

    async def start(update: object, context: object) -> int:
        return 0

    handler = ConversationHandler(entry_points=[CommandHandler("a", start)], states={},
                                  fallbacks=[], conversation_timeout=5)
    assert timed_out_conversation(getattr(handler, "_trigger_timeout")) is handler
    assert timed_out_conversation(start) is None
    assert timed_out_conversation(handler.check_update) is None


def test_guard_schedule_conversation_timeout_calls_run_once_with_the_trigger() -> None:
    """Internal 13: ``ConversationHandler._schedule_job`` schedules the timeout through the
    Application's job queue with ``run_once(_trigger_timeout, conversation_timeout, data=...)``,
    and nothing for the END state."""
    from telegram.ext import CommandHandler, ConversationHandler

    from ptb_fence.ptb._ptb_internals import (
        schedule_conversation_timeout,
        timed_out_conversation,
    )

    async def start(update: object, context: object) -> int:
        return 0

    scheduled: List[Any] = []

    class Queue:
        def run_once(self, callback: Any, when: Any, data: Any = None) -> str:
            scheduled.append((callback, when, data))
            return "job"

    class App:
        job_queue = Queue()

    handler = ConversationHandler(entry_points=[CommandHandler("a", start)], states={},
                                  fallbacks=[], conversation_timeout=5)
    assert schedule_conversation_timeout(handler, 0, App(), "update", "context", (1, 2))
    assert schedule_conversation_timeout(handler, handler.END, App(), "update", "context", (1, 3))
    assert len(scheduled) == 1
    callback, when, data = scheduled[0]
    assert timed_out_conversation(callback) is handler and when == 5
    assert (data.conversation_key, data.update, data.callback_context) == ((1, 2), "update",
                                                                           "context")
    assert handler.timeout_jobs[(1, 2)] == "job"
