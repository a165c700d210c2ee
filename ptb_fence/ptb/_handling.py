"""The update being handled in the current task: its state and its attempt (context vars).

The flow adapter enters an update with :func:`handling`. The Application mix-in and the context
read :func:`update_state` and leave the attempt (:func:`outside_attempt`, :func:`leave_attempt`)
for code that runs outside the update's handling (tasks, jobs, error handlers run as tasks).
"""

from __future__ import annotations

import contextvars
from typing import Optional

from ptb_fence.runtime._attempt import Attempt, enter_attempt, exit_attempt

__all__ = ["UpdateState", "handling", "leave_attempt", "outside_attempt", "update_state"]


class UpdateState:
    """What the processor learns about one update while PTB handles it under ``attempt``:
    ``error`` is the first failure reported for it (a handler's exception routed to
    ``process_error``). ``matched`` whether a handler took it (PTB built a context for it: it
    does so only for a handler whose ``check_update`` matched, or to report an error)."""

    __slots__ = ("attempt", "error", "matched", "update")

    def __init__(self, update: object, attempt: Optional[Attempt] = None) -> None:
        self.update = update
        self.attempt = attempt
        self.error: Optional[BaseException] = None
        self.matched = False


_STATE: "contextvars.ContextVar[Optional[UpdateState]]" = contextvars.ContextVar(
    "ptb_fence_update_state", default=None
)


def update_state() -> Optional[UpdateState]:
    """The state of the update handled in this task, or :obj:`None` outside its handling."""
    return _STATE.get()


class handling:  # noqa: N801 - used like a function: ``with handling(state, attempt):``
    """Within the ``with`` block, this task handles ``state.update`` under ``attempt``
    (:obj:`None` for a unary processor, both :obj:`None` for no update). Both are reset on
    the way out. (A class, not a generator: it runs twice per update on the hot path.)"""

    __slots__ = ("_attempt", "_attempt_token", "_state", "_state_token")

    def __init__(self, state: Optional[UpdateState], attempt: Optional[Attempt]) -> None:
        self._state = state
        self._attempt = attempt

    def __enter__(self) -> None:
        self._state_token = _STATE.set(self._state)
        self._attempt_token = enter_attempt(self._attempt)

    def __exit__(self, *exc_info: object) -> None:
        exit_attempt(self._attempt_token)
        _STATE.reset(self._state_token)


def outside_attempt() -> handling:
    """Within the ``with`` block, no update is handled and there is no attempt (then
    restored)."""
    return handling(None, None)


def leave_attempt() -> None:
    """From here on, this context (a task of its own, a job) has no update and no attempt."""
    enter_attempt(None)
    _STATE.set(None)
