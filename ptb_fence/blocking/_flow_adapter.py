"""ThreadFlowAdapter: UpdateIntake's hooks into the per-update flow, for worker threads.

The sequence and its decisions are :class:`~ptb_fence.runtime._flow.UpdateFlow`, shared with
the PTB processor (whose twin is :class:`ptb_fence.ptb._flow_adapter.AsyncFlowAdapter`).
Here are only the thread parts: the worker thread is the slot, store calls block it, and a
handler runs on it as a run that a timeout or ``close()`` may end (``_intake_runs``). The
hooks the flow awaits are coroutines that block and never suspend (see ``run_blocking``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Hashable, Optional, Tuple, TypeVar

from ptb_fence._values import Exhaustion
from ptb_fence.blocking._group_commit import ThreadGroupCommit
from ptb_fence.blocking._intake_runs import IntakeRuns
from ptb_fence.blocking._isolation import ThreadIsolationGate
from ptb_fence.runtime._attempt import Attempt, enter_attempt, exit_attempt
from ptb_fence.runtime._flow import RETURNED, Ran, UpdateFlow, run_blocking
from ptb_fence.runtime._outcome import Outcome
from ptb_fence.runtime._runtime import Runtime

__all__ = ["ThreadFlowAdapter"]

T = TypeVar("T")


class ThreadFlowAdapter:
    """Runs the updates of one intake through the flow, each on its worker thread.

    Args:
        runtime: The intake's runtime.
        gate: The isolation gate.
        runs: The runs on the worker threads (a timeout or ``close()`` ends one).
        claims: Claims of the workers that start together (:obj:`None`: one by one).
        completions: Completions of the workers that finish together.
        handle: ``handle(update_dict)`` or ``handle(update_dict, attempt)``.
        attempt_aware: ``handle`` takes the attempt.
        turn_done: ``turn_done(key, update_id, outcome)``: pass the chat's turn on.
        deliver: ``deliver(exhaustion)``: hand an exhaustion to its delivery.
    """

    __slots__ = (
        "_aware",
        "_claims",
        "_completions",
        "_flow",
        "_gate",
        "_handle",
        "_runs",
        "_runtime",
        "deliver",
        "enter_now",
        "leave",
        "pass_turn",
    )

    def __init__(
        self,
        runtime: Runtime,
        gate: ThreadIsolationGate,
        runs: IntakeRuns,
        claims: "Optional[ThreadGroupCommit[Tuple[int, str], Optional[Attempt]]]",
        completions: "ThreadGroupCommit[Attempt, Outcome]",
        handle: Callable[..., Any],
        attempt_aware: bool,
        turn_done: Callable[[Hashable, int, Optional[Outcome]], None],
        deliver: Callable[[Exhaustion], None],
    ) -> None:
        self._runtime = runtime
        self._gate = gate
        self.enter_now = gate.enter_now  # the flow's gate hooks are the gate's own
        self.leave = gate.leave
        self._runs = runs
        self._claims = claims
        self._completions = completions
        self._handle = handle
        self._aware = attempt_aware
        self.pass_turn = turn_done
        self.deliver = deliver
        self._flow = UpdateFlow(runtime, self)

    def process(self, key: Hashable, update_id: int, text: str, update: Dict[str, Any]) -> bool:
        """Run ``update``'s flow on this worker thread (it holds the chat's turn).

        Returns:
            Whether its handler was started.
        """
        return run_blocking(self._flow.process(key, update_id, update, text))

    # -- the flow's hooks ---------------------------------------------------------------------
    async def enter(self, attempt: Attempt) -> Tuple[bool, Optional[Attempt]]:
        """Wait at the isolation gate, blocking this thread."""
        return self._gate.enter(attempt)

    @staticmethod
    async def hold_slot() -> None:
        """Nothing: the worker thread is the slot."""

    @staticmethod
    def free_slot() -> None:
        """Nothing: the worker thread is the slot."""

    async def claim(self, update_id: int, text: str) -> Optional[Attempt]:
        """Claim ``update_id`` with the workers that start at the same time (one commit)."""
        claims = self._claims
        if claims is None:
            return self._runtime.claim(update_id, text)
        return claims.submit((update_id, text))

    @staticmethod
    async def call_store(fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on this worker thread."""
        return fn(*args)

    async def run(
        self, key: Hashable, attempt: Attempt, aware: bool, update: Any, job: Any
    ) -> Ran:
        """Run the handler on this thread, as a run a timeout or ``close()`` may end first."""
        runtime = self._runtime
        run = self._runs.begin(key, attempt.update_id, attempt)  # counted as running
        token = enter_attempt(attempt) if aware else None
        error: Optional[BaseException] = None
        started = time.perf_counter()
        try:
            if self._aware:
                self._handle(update, attempt)
            else:
                self._handle(update)
        except BaseException as exc:  # noqa: B036 - SystemExit, CancelledError, … fail the
            error = exc  # attempt too. Re-raising would skip settle and end (renewed forever).
        finally:
            if token is not None:
                exit_attempt(token)
            runtime.stats.handler_time(time.perf_counter() - started)
        if not self._runs.returned(run):
            # timed out (settled, the turn passed on) or released by close() meanwhile
            return Ran(ended_elsewhere=True, cleaned_up=True, turn_passed=run.timed_out)
        return RETURNED if error is None else Ran(error)

    @staticmethod
    def ended(attempt: Attempt) -> None:
        """Nothing: the runs count what runs here."""

    @staticmethod
    def body(update: Any) -> Optional[str]:
        """:obj:`None`: the attempt was claimed with the update's text."""
        return None

    async def complete(self, attempt: Attempt) -> Outcome:
        """Complete ``attempt`` with the workers that finish at the same time, and end it."""
        try:
            return self._completions.submit(attempt)
        finally:
            self._runtime.end(attempt)
