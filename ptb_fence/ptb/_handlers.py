"""RunningHandlers: the handlers running in this processor, each in a scope that can be ended.

A handler runs inside a :class:`HandlerRun` (``async with``). The run ends it by cancelling its
task when ``attempt_timeout_seconds`` passed (:attr:`HandlerRun.timed_out`) or when a stop
gave up waiting for it (:attr:`HandlerRun.released`: its attempt was released first). The
cancellation is swallowed at the end of the scope, so the processor's own code (settling,
PTB's ``task_done``) goes on normally in the same task, in sequential mode too.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from typing import Any, Awaitable, List, Optional, Set

from ptb_fence.runtime._attempt import Attempt

__all__ = ["HandlerRun", "RunningHandlers", "cancel_requested", "run_handler"]

_RAISED_BY_HANDLER: "contextvars.ContextVar[bool]" = contextvars.ContextVar(
    "ptb_fence_cancel_raised_by_handler", default=False
)
"""Python 3.10: set by :func:`run_handler` when the CancelledError it raises came from the
handler's own code (its task was not cancelled); read once by :func:`cancel_requested`."""


def cancel_requested() -> bool:
    """Whether the current task is being cancelled (as opposed to code raising CancelledError).

    Call it where a CancelledError from :func:`run_handler` is caught. Python 3.11+ asks the
    task (``cancelling()``); on Python 3.10, which has no such count, :func:`run_handler` ran the
    handler in a task of its own and marked a CancelledError that the handler raised itself.
    """
    if sys.version_info >= (3, 11):  # tasks count cancel requests
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0
    raised_by_handler = _RAISED_BY_HANDLER.get()
    _RAISED_BY_HANDLER.set(False)
    return not raised_by_handler


async def run_handler(coroutine: Awaitable[Any]) -> Any:
    """Await a handler's coroutine in the current task (Python 3.11+).

    Python 3.10 cannot tell a cancellation of the current task from a CancelledError that the
    handler's code raised (a task there keeps no count of cancel requests), so there the
    handler runs in a child task (same context) awaited with :func:`asyncio.wait`, which
    raises only when the current task itself is cancelled: the child is then cancelled too and
    awaited (its cleanup runs first) before the cancellation goes on. A child that ended
    cancelled while the current task was not raised CancelledError itself:
    :func:`cancel_requested` then says so.
    """
    if sys.version_info >= (3, 11):
        return await coroutine
    child = asyncio.ensure_future(coroutine)
    try:
        await asyncio.wait((child,))
    except asyncio.CancelledError:
        child.cancel()
        await asyncio.wait((child,))
        raise
    if child.cancelled():
        _RAISED_BY_HANDLER.set(True)
    return child.result()


_TIMEOUT = "timeout"
_STOP = "stop"


class HandlerRun:
    """The scope of one handler run (see the module docstring).

    Args:
        registry: The processor's running handlers.
        attempt: The attempt the handler runs.
        timeout: ``attempt_timeout_seconds`` (:obj:`None`: no limit).
    """

    __slots__ = ("_done", "_registry", "_task", "_timeout", "_timer", "attempt", "reason")

    def __init__(
        self, registry: "RunningHandlers", attempt: Attempt, timeout: Optional[float]
    ) -> None:
        self._registry = registry
        self._timeout = timeout
        self._task: "Optional[asyncio.Task[Any]]" = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self._done = False
        self.attempt = attempt
        self.reason: Optional[str] = None

    @property
    def timed_out(self) -> bool:
        """:obj:`bool`: Ended because ``attempt_timeout_seconds`` passed."""
        return self.reason == _TIMEOUT

    @property
    def released(self) -> bool:
        """:obj:`bool`: Ended by a stop (its attempt was released)."""
        return self.reason == _STOP

    async def __aenter__(self) -> "HandlerRun":
        self._task = asyncio.current_task()
        if self._timeout is not None:
            self._timer = asyncio.get_running_loop().call_later(
                self._timeout, self.end, _TIMEOUT
            )
        self._registry.add(self)
        return self

    def end(self, reason: str) -> None:
        """End the handler now (on the event loop); no-op once it returned."""
        if self._done or self.reason is not None or self._task is None:
            return
        self.reason = reason
        self._task.cancel()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
        self._registry.discard(self)
        if self.reason is None:
            return False
        if sys.version_info >= (3, 11) and self._task is not None:
            self._task.uncancel()
        # our own cancellation ends here; anything else propagates
        return exc_type is not None and issubclass(exc_type, asyncio.CancelledError)


class RunningHandlers:
    """The :class:`HandlerRun` s of one processor (used on the event loop only)."""

    __slots__ = ("_idle", "_runs")

    def __init__(self) -> None:
        self._runs: Set[HandlerRun] = set()
        self._idle: Optional[asyncio.Event] = None

    def __len__(self) -> int:
        return len(self._runs)

    def run(self, attempt: Attempt, timeout: Optional[float]) -> HandlerRun:
        """A scope for the handler of ``attempt``."""
        return HandlerRun(self, attempt, timeout)

    def add(self, run: HandlerRun) -> None:
        """Called by :meth:`HandlerRun.__aenter__`."""
        self._runs.add(run)

    def discard(self, run: HandlerRun) -> None:
        """Called by :meth:`HandlerRun.__aexit__`."""
        self._runs.discard(run)
        if not self._runs and self._idle is not None:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no handler runs; :obj:`True` when none does."""
        if not self._runs:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return not self._runs
        finally:
            self._idle = None
        return True

    def snapshot(self) -> List[HandlerRun]:
        """The runs still going."""
        return list(self._runs)

    @staticmethod
    def end_released(runs: List[HandlerRun]) -> None:
        """End the handlers of ``runs``, whose attempts were released."""
        for run in runs:
            run.end(_STOP)
