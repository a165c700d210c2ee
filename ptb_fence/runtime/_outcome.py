"""How an attempt ended (:class:`Outcome`) and the log fields naming an attempt."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

from ptb_fence._values import Exhaustion

if TYPE_CHECKING:
    from ptb_fence.runtime._attempt import Attempt

__all__ = ["Outcome", "error_text", "exhaustion_ids", "ids"]


class Outcome(str, Enum):
    """How an attempt ended. A :obj:`str` enum: ``Outcome.COMPLETED == "completed"``."""

    COMPLETED = "completed"
    RETRYING = "retrying"
    ABANDONED = "abandoned"
    EXHAUSTED = "exhausted"
    LOST = "lost"
    CONFLICTED = "conflicted"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


def error_text(error: BaseException) -> str:
    """The stored and logged text of an error: ``Name: message``, at most 2000 characters."""
    name = type(error).__name__
    message = str(error)
    if not message:
        text = name
    elif message.startswith(name):  # e.g. PTB's "Forbidden: bot was blocked by the user"
        text = message
    else:
        text = f"{name}: {message}"
    return text[:2000]


def ids(attempt: "Attempt") -> "dict[str, Any]":
    """The ``extra`` log fields naming an attempt."""
    return {
        "update_id": attempt.update_id,
        "attempt": attempt.attempt,
        "claim_id": attempt.claim_id or None,
    }


def exhaustion_ids(exhaustion: Exhaustion) -> "dict[str, Any]":
    """The ``extra`` log fields naming an exhaustion."""
    return {
        "update_id": exhaustion.update_id,
        "attempt": exhaustion.attempt,
        "claim_id": exhaustion.claim_id,
    }
