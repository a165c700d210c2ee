"""BotSender: the PTB front end's way to send an outbox call, through the Application's Bot."""

from __future__ import annotations

import asyncio
import concurrent.futures
import warnings
from typing import Any, Dict

__all__ = ["BotSender"]


class BotSender:
    """``send(method, params)`` for the outbox dispatcher: ``await bot.do_api_request(method,
    api_kwargs=params)`` on the Application's event loop, so the Bot's request settings and an
    ``AIORateLimiter`` set on the builder apply. Called on a dispatcher thread (blocking).

    Args:
        bot: The Application's ``Bot`` (an ``ExtBot``).
        loop: The Application's running event loop.
        timeout: The longest wait for one call (a rate limiter may hold it long). Then it
            counts as left without an answer (``TimedOut``).
    """

    __slots__ = ("_bot", "_loop", "_timeout")

    def __init__(self, bot: Any, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._bot = bot
        self._loop = loop
        self._timeout = timeout
        # PTB suggests Bot.send_message over do_api_request("sendMessage"). The outbox sends
        # JSON it already holds, on purpose: hide that hint for this module's calls only
        warnings.filterwarnings(
            "ignore", message=r"Please use 'Bot\.", module=r"ptb_fence\.ptb\._sender"
        )

    async def _request(self, method: str, params: Dict[str, Any]) -> Any:
        return await self._bot.do_api_request(method, api_kwargs=params)

    def __call__(self, method: str, params: Dict[str, Any]) -> Any:
        """Send one call. Its result (the Bot API's ``result``), or the ``telegram.error``
        PTB raised."""
        future = asyncio.run_coroutine_threadsafe(self._request(method, params), self._loop)
        try:
            return future.result(self._timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            from telegram.error import TimedOut

            raise TimedOut(
                f"no answer to {method} within {self._timeout:g} s (the request may have left)"
            ) from None
