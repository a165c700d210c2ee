"""The runtime shared by the PTB processors and the blocking UpdateIntake."""

from ptb_fence.runtime._attempt import Attempt, current_attempt
from ptb_fence.runtime._chats import chat_key
from ptb_fence.runtime._core import Outcome, Runtime
from ptb_fence.runtime._ingest import InvalidUpdate, parse_update_body
from ptb_fence.runtime._intake import UpdateIntake
from ptb_fence.runtime._lease_keeper import LeaseKeeper
from ptb_fence.runtime._options import RuntimeOptions
from ptb_fence.runtime._retry import default_retry, is_permanent_telegram_error
from ptb_fence.runtime._webhook import webhook_app

__all__ = [
    "Attempt",
    "InvalidUpdate",
    "LeaseKeeper",
    "Outcome",
    "Runtime",
    "RuntimeOptions",
    "UpdateIntake",
    "chat_key",
    "current_attempt",
    "default_retry",
    "is_permanent_telegram_error",
    "parse_update_body",
    "webhook_app",
]
