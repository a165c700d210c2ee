"""RunningHandlers: the handlers running in this processor, each in a run that can be ended.

A handler (PTB's ``process_update`` for one update) runs in a task of its own. The run cancels
that task when ``attempt_timeout_seconds`` passed (:attr:`HandlerRun.timed_out`) or when a stop
gave up waiting for it (:attr:`HandlerRun.released`). A cancelled handler gets
:data:`CANCEL_GRACE_SECONDS` to end. One still running then is left to run on, detached and
named in a WARNING. Its attempt is settled or released, and its fenced writes are refused.
So neither a timeout nor a stop waits for a handler's cooperation longer than the grace. The
own task also tells a cancellation of the processor from a ``CancelledError`` the handler raised.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, List, Optional, Set

from ptb_fence._durations import format_duration
from ptb_fence.runtime._attempt import Attempt

__all__ = ["CANCEL_GRACE_SECONDS", "HandlerRun", "RunningHandlers"]

_LOGGER = logging.getLogger("ptb_fence.ptb")

CANCEL_GRACE_SECONDS = 1.0
"""How long a cancelled handler (attempt timeout, stop) gets to end before the processor goes
on without it."""

_TIMEOUT = "timeout"
_STOP = "stop"
_WHY = {_TIMEOUT: "attempt_timeout_seconds passed", _STOP: "the stop released its update"}


class HandlerRun:
    """One handler run (see the module docstring).

    Args:
        registry: The processor's running handlers.
        attempt: The attempt the handler runs.
        timeout: ``attempt_timeout_seconds`` (:obj:`None`: no limit).
    """

    __slots__ = (
        "_grace",
        "_outcome",
        "_registry",
        "_returned",
        "_task",
        "_timeout",
        "_timer",
        "_wake",
        "attempt",
        "reason",
    )

    def __init__(
        self, registry: "RunningHandlers", attempt: Attempt, timeout: Optional[float]
    ) -> None:
        self._registry = registry
        self._timeout = timeout
        self._task: "Optional[asyncio.Task[Any]]" = None
        self._wake: "Optional[asyncio.Future[None]]" = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self._grace: Optional[asyncio.TimerHandle] = None
        self._returned = False  # the handler's coroutine ended (see _guarded)
        self._outcome: Optional[BaseException] = None  # what it raised
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

    async def handle(self, coroutine: Awaitable[Any]) -> Optional[BaseException]:
        """Run ``coroutine`` in a task of its own (the current context is copied into it) and
        wait until it ends, or until it was ended and did not end within the grace.

        Returns:
            What the handler raised (an :class:`Exception`, or a ``CancelledError`` that its own
            code raised): a failure. :obj:`None` when it returned, was ended (see
            :attr:`reason`) or left running.

        Raises:
            asyncio.CancelledError: The processor's own task was cancelled (the handler is
                cancelled too and gets the grace first).
        """
        loop = asyncio.get_running_loop()
        wake = self._wake = loop.create_future()
        attempt = self.attempt
        task = self._task = loop.create_task(
            self._guarded(coroutine),
            name=f"ptb_fence:update {attempt.update_id} attempt {attempt.attempt}",
        )
        # no done callback here: _guarded wakes the processor itself. One that never ran
        # (cancelled before its first step) is one end() cancelled, which adds it
        if self._timeout is not None:
            self._timer = loop.call_later(self._timeout, self.end, _TIMEOUT)
        self._registry.add(self)
        try:
            await wake
        except asyncio.CancelledError:
            if not task.done():
                task.cancel()
                await asyncio.wait((task,), timeout=CANCEL_GRACE_SECONDS)
                if not task.done():
                    self._registry.detach(self, task, "the processor's task was cancelled")
            raise
        finally:
            for timer in (self._timer, self._grace):
                if timer is not None:
                    timer.cancel()
            self._registry.discard(self)
        if self._returned:
            error = self._outcome
            if isinstance(error, asyncio.CancelledError):
                # our own cancellation ended it, or its code raised it itself (a failure)
                return None if self.reason is not None else error
            if error is not None and not isinstance(error, Exception):
                raise error  # SystemExit, KeyboardInterrupt: not a handler failure
            return error
        if not task.done():  # ended, and still running after the grace
            self._registry.detach(self, task, _WHY[self.reason or _STOP])
            return None
        if task.cancelled():  # cancelled before its first step
            if self.reason is not None:
                return None  # our own cancellation ended it
            try:
                task.result()
            except asyncio.CancelledError as exc:  # raised by the handler's own code
                return exc
        error = task.exception()
        if error is not None and not isinstance(error, Exception):
            raise error  # SystemExit, KeyboardInterrupt: not a handler failure
        return error

    async def _guarded(self, coroutine: Awaitable[Any]) -> None:
        """The handler's task: run ``coroutine``, note how it ended and wake the processor
        from inside the task. Woken by the task's end instead, the processor would resume a
        loop iteration later than the code the handler woke (e.g. the next ``update_queue.put``
        of a webhook), and that code would go to the store before this update's completion
        could join it in one commit."""
        try:
            await coroutine
        except asyncio.CancelledError as exc:
            self._outcome = exc
            raise
        except BaseException as exc:  # noqa: B036 - handed to handle(), which decides
            self._outcome = exc
        finally:
            self._returned = True
            self._ended(None)

    def _ended(self, task: "Optional[asyncio.Task[Any]]") -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def end(self, reason: str) -> None:
        """End the handler now (on the event loop): cancel it and give it
        :data:`CANCEL_GRACE_SECONDS`. No-op once it ended."""
        task = self._task
        if self.reason is not None or task is None or task.done():
            return
        self.reason = reason
        task.add_done_callback(self._ended)  # also if it never runs (see handle)
        task.cancel()
        self._grace = asyncio.get_running_loop().call_later(
            CANCEL_GRACE_SECONDS, self._ended, task
        )


class RunningHandlers:
    """The :class:`HandlerRun` s of one processor and the handler tasks left running (used on
    the event loop only)."""

    __slots__ = ("_detached", "_idle", "_runs")

    def __init__(self) -> None:
        self._runs: Set[HandlerRun] = set()
        self._idle: Optional[asyncio.Event] = None
        # tasks that ignored their cancellation, kept referenced until they end
        self._detached: "Set[asyncio.Task[Any]]" = set()

    def __len__(self) -> int:
        return len(self._runs)

    def run(self, attempt: Attempt, timeout: Optional[float]) -> HandlerRun:
        """A run for the handler of ``attempt``."""
        return HandlerRun(self, attempt, timeout)

    def add(self, run: HandlerRun) -> None:
        """Called by :meth:`HandlerRun.handle`."""
        self._runs.add(run)

    def discard(self, run: HandlerRun) -> None:
        """Called by :meth:`HandlerRun.handle`."""
        self._runs.discard(run)
        if not self._runs and self._idle is not None:
            self._idle.set()

    def detach(self, run: HandlerRun, task: "asyncio.Task[Any]", why: str) -> None:
        """Leave ``task`` (``run``'s handler, cancelled) running. The processor goes on."""
        attempt = run.attempt
        _LOGGER.warning(
            "update %s attempt %s: its handler was cancelled (%s) but ignored its cancellation "
            "for %s and still runs; the processor goes on without it (the attempt is ended: "
            "its fenced writes are refused); %d such handler(s) still run",
            attempt.update_id,
            attempt.attempt,
            why,
            format_duration(CANCEL_GRACE_SECONDS),
            len(self._detached) + 1,
            extra={"update_id": attempt.update_id, "attempt": attempt.attempt},
        )
        self._detached.add(task)
        since = time.monotonic()

        def ended(done: "asyncio.Task[Any]") -> None:
            self._detached.discard(done)
            if not done.cancelled():
                done.exception()  # retrieved: no "exception was never retrieved"
            _LOGGER.info(
                "the handler of update %s attempt %s that ignored its cancellation ended %s "
                "later",
                attempt.update_id,
                attempt.attempt,
                format_duration(time.monotonic() - since),
            )

        task.add_done_callback(ended)

    def left_running(self) -> int:
        """How many handler tasks ignored their cancellation and still run (read from any
        thread: a gauge)."""
        return len(self._detached)

    def report_left_running(self) -> None:
        """At shutdown: name the handler tasks that ignored their cancellation and still run
        (they are abandoned with the event loop)."""
        if self._detached:
            _LOGGER.warning(
                "shutdown: %d handler task(s) that ignored their cancellation still run and are "
                "abandoned (their attempts were settled or released; their fenced writes are "
                "refused): %s",
                len(self._detached),
                ", ".join(sorted(task.get_name() for task in self._detached)),
            )

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no handler runs.

        Returns :obj:`True` when none does."""
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
