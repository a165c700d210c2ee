"""The blocking front end: :class:`UpdateIntake` (threads, no asyncio) and its WSGI webhook.

It only waits, runs handlers on threads and hands updates over. Every decision (claims, leases,
retries, exhaustions, chat order) is the runtime's (:mod:`ptb_fence.runtime`).
"""

from ptb_fence.blocking._intake import UpdateIntake
from ptb_fence.blocking._jobs import IntakeJob, IntakeJobQueue
from ptb_fence.blocking._webhook import webhook_app

__all__ = ["IntakeJob", "IntakeJobQueue", "UpdateIntake", "webhook_app"]
