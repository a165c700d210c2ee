"""The runtime shared by the PTB processors and the blocking UpdateIntake.

Public here: what a user of :class:`UpdateIntake` or of attempt-aware handlers needs. The
machinery (``Runtime``, ``LeaseKeeper``, ``Outcome``, ``chat_key``, ``parse_update_body``, the
store port) lives in the private modules of this package and is not public API.
"""

from ptb_fence.runtime._attempt import Attempt, current_attempt
from ptb_fence.runtime._intake import UpdateIntake
from ptb_fence.runtime._options import RuntimeOptions
from ptb_fence.runtime._recovery import AttemptTimeout
from ptb_fence.runtime._retry import default_retry, is_permanent_telegram_error
from ptb_fence.runtime._webhook import webhook_app

__all__ = [
    "Attempt",
    "AttemptTimeout",
    "RuntimeOptions",
    "UpdateIntake",
    "current_attempt",
    "default_retry",
    "is_permanent_telegram_error",
    "webhook_app",
]
