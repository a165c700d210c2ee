"""A webhook endpoint for your own web framework (Starlette, FastAPI, aiohttp, ...)."""

from typing import Any, Dict, Optional

from telegram import Update
from telegram.ext import Application


async def on_webhook(application: Application,  # type: ignore[type-arg]
                     secret: str, header: Optional[str], body: Dict[str, Any]) -> int:
    """Record one POST from Telegram. Returns the HTTP status to answer."""
    if header != secret:  # the X-Telegram-Bot-Api-Secret-Token header
        return 403
    update = Update.de_json(body, application.bot)
    # ptb_fence's queue commits the update before put() returns, and raises if it cannot.
    # Answer 200 only after that. An exception answers 500, and Telegram delivers it again.
    await application.update_queue.put(update)
    return 200
