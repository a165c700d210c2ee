"""The blocking front end: :class:`UpdateIntake` (threads, no asyncio) and its WSGI webhook.

It only waits, runs handlers on threads and hands updates over; every decision (claims, leases,
retries, exhaustions, chat order) is the runtime's (:mod:`ptb_fence.runtime`).
"""

from ptb_fence.blocking._intake import UpdateIntake
from ptb_fence.blocking._webhook import webhook_app

__all__ = ["UpdateIntake", "webhook_app"]
