"""DirectSendWatch: a WARNING for a Bot API call a fenced handler sends itself.

``await context.bot.send_message(...)`` (or ``update.message.reply_text(...)``) in a handler
of a :class:`~ptb_fence.ptb.FencedUpdateProcessor` goes out at once, whatever becomes of the
attempt: a handler that fails after it and runs again sends it again, a stale attempt sends
it too. ``attempt.outbox`` sends it iff the update's commit lands. The watch sits on the
Bot's request for every method but ``getUpdates`` and says so once per handler and method.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
from types import CodeType, FrameType
from typing import Any, Optional, Set, Tuple

from telegram.request import BaseRequest, RequestData

from ptb_fence.ptb._ptb_internals import REQUEST_DEFAULT, get_updates_request, set_bot_request
from ptb_fence.ptb._wrapped_request import WrappedRequest
from ptb_fence.runtime._attempt import current_attempt

__all__ = ["DIRECT_CALLS", "DirectSendWatch", "unwatch_direct_sends", "watch_direct_sends"]

_LOGGER = logging.getLogger("ptb_fence.ptb")

DIRECT_CALLS = frozenset({
    # the README recommends answering these directly ("Calls with a deadline": feedback for
    # the user now, right whatever becomes of the attempt). Not answerPreCheckoutQuery, whose
    # ok=True is a promise that belongs in the outbox with the reservation
    "answercallbackquery",
    "answerinlinequery",
    # a typing indicator: nothing the user keeps, harmless when repeated
    "sendchataction",
})
"""Methods (lower case) a fenced handler may send directly without a WARNING. So may every
``get*`` method (reads)."""

# frames of these packages are the call's way to the request, not the handler that made it
_LIBRARY_DIRS = tuple(
    os.path.dirname(module.__file__) + os.sep
    for module in (sys.modules["telegram"], sys.modules["ptb_fence"], sys.modules["asyncio"])
    if module.__file__
)
_HTTPX = os.sep + "httpx" + os.sep


def _caller() -> Tuple[Optional[CodeType], str]:
    """The code of the first frame outside PTB, ptb_fence, asyncio and httpx (the handler
    that made the call) and where it is, ``file:line``."""
    frame: Optional[FrameType] = inspect.currentframe()
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_LIBRARY_DIRS) and _HTTPX not in filename:
            return frame.f_code, f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None, "?"


class DirectSendWatch(WrappedRequest):
    """Wraps the Bot's request for every method but ``getUpdates``: a call that changes
    something for a user (not a ``get*`` read, not one of :data:`DIRECT_CALLS`), made while a
    fenced attempt is current, is logged at WARNING once per handler and method. Everything
    is delegated unchanged. The outbox's own sends run outside any attempt.
    """

    __slots__ = ("_lock", "_warned")

    def __init__(self, inner: BaseRequest) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._warned: Set[Tuple[Optional[CodeType], str]] = set()

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: Optional[RequestData] = None,
        read_timeout: Any = REQUEST_DEFAULT,
        write_timeout: Any = REQUEST_DEFAULT,
        connect_timeout: Any = REQUEST_DEFAULT,
        pool_timeout: Any = REQUEST_DEFAULT,
    ) -> Tuple[int, bytes]:
        """Send the request. First log a fenced handler's direct send (see the class)."""
        attempt = current_attempt()
        if attempt is not None and attempt.fenced:
            self._note(url.rsplit("/", 1)[-1])
        return await self._inner.do_request(
            url,
            method,
            request_data=request_data,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            connect_timeout=connect_timeout,
            pool_timeout=pool_timeout,
        )

    def _note(self, api_method: str) -> None:
        name = api_method.lower()
        if name.startswith("get") or name in DIRECT_CALLS:
            return
        code, where = _caller()
        key = (code, name)
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        _LOGGER.warning(
            "%s (%s) sent %s directly inside a fenced attempt: it went out at once, whatever "
            "becomes of the attempt (sent again when the handler fails and runs again, sent by "
            "a stale attempt too). Queue it with context.attempt.outbox instead "
            "(attempt.outbox.reply_text(...), or attempt.outbox.call(%r, ...)): sent iff the "
            "update's commit lands. Said once per handler and method",
            getattr(code, "co_qualname", getattr(code, "co_name", "a handler")),
            where,
            api_method,
            api_method,
        )


def watch_direct_sends(bot: Any) -> Optional[DirectSendWatch]:
    """Wrap ``bot``'s request for every method but ``getUpdates`` in a
    :class:`DirectSendWatch`. Returns :obj:`None` (nothing changed) if the bot does not look as
    expected, or it is watched already."""
    requests = get_updates_request(bot)
    if requests is None or not isinstance(requests[1], BaseRequest):
        return None
    if isinstance(requests[1], DirectSendWatch):
        return None
    watch = DirectSendWatch(requests[1])
    return watch if set_bot_request(bot, watch) else None


def unwatch_direct_sends(bot: Any, watch: Optional[DirectSendWatch]) -> None:
    """Undo :func:`watch_direct_sends` (at shutdown)."""
    requests = get_updates_request(bot)
    if watch is not None and requests is not None and requests[1] is watch:
        set_bot_request(bot, watch.inner)
