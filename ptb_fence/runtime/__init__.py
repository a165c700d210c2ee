"""The core shared by both front ends (the PTB processors and the blocking UpdateIntake).

Public here: what a user of attempt-aware handlers needs. The
machinery (``Runtime``, ``LeaseKeeper``, ``Outcome``, ``chat_key``, ``parse_update_body``, the
store port) lives in the private modules of this package and is not public API.
"""

from ptb_fence.runtime._attempt import Attempt, current_attempt
from ptb_fence.runtime._options import RuntimeOptions
from ptb_fence.runtime._recovery import AttemptTimeout
from ptb_fence.runtime._retry import default_retry, is_permanent_telegram_error

__all__ = [
    "Attempt",
    "AttemptTimeout",
    "RuntimeOptions",
    "current_attempt",
    "default_retry",
    "is_permanent_telegram_error",
]
