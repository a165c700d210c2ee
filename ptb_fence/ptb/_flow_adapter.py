"""AsyncFlowAdapter: the processor's hooks into the per-update flow, for asyncio.

The sequence and its decisions are :class:`~ptb_fence.runtime._flow.UpdateFlow`, shared with
``UpdateIntake`` (whose twin is :class:`ptb_fence.blocking._flow_adapter.ThreadFlowAdapter`).
Here are only the asyncio parts: the chat's turn and a slot are awaited, store calls hop to
the store threads, a handler runs in a task of its own (``_handlers``) and an exhaustion is
delivered in a task.
"""

from __future__ import annotations

import contextvars
import time
from typing import Any, Awaitable, Callable, Hashable, Optional, TypeVar

from telegram import Update

from ptb_fence._values import Exhaustion
from ptb_fence.ptb._bodies import update_body
from ptb_fence.ptb._chat_turns import ChatTurns
from ptb_fence.ptb._deliveries import AsyncDeliveries
from ptb_fence.ptb._handlers import RunningHandlers
from ptb_fence.ptb._handling import UpdateState, handling
from ptb_fence.ptb._ingest import Ingest
from ptb_fence.ptb._isolation import AsyncIsolationGate
from ptb_fence.ptb._slots import Slots
from ptb_fence.ptb._state import SharedState
from ptb_fence.ptb._sweeper import Sweeper
from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._chats import update_chat_key
from ptb_fence.runtime._flow import RELEASED, RETURNED, Ran, UpdateFlow
from ptb_fence.runtime._outcome import Outcome
from ptb_fence.runtime._recovery import AttemptTimeout
from ptb_fence.runtime._runtime import Runtime

__all__ = ["AsyncFlowAdapter"]

T = TypeVar("T")

_HOLDING_SLOT: "contextvars.ContextVar[bool]" = contextvars.ContextVar(
    "ptb_fence_holding_slot", default=False
)


class AsyncFlowAdapter:
    """Runs the updates of one processor through the flow, on its event loop.

    Args:
        runtime: The processor's runtime.
        state: The state shared with the processor and its sweeper.
        threads: The store threads.
        handlers: The running handler tasks.
        ingest: Claims and grouped completions.
        sweeper: Queues a chat's next update from the store (``strict_chat_order``).
        deliveries: Exhaustion deliveries.
    """

    __slots__ = (
        "_deliveries",
        "_flow",
        "_handlers",
        "_ingest",
        "_runtime",
        "_slots",
        "_state",
        "_sweeper",
        "_threads",
        "_turns",
        "enter",
        "enter_now",
        "leave",
        "running",
    )

    def __init__(
        self,
        runtime: Runtime,
        state: SharedState,
        threads: StoreThreads,
        handlers: RunningHandlers,
        ingest: Ingest,
        sweeper: Sweeper,
        deliveries: AsyncDeliveries,
    ) -> None:
        self._runtime = runtime
        self._state = state
        self._threads = threads
        self._handlers = handlers
        self._ingest = ingest
        self._sweeper = sweeper
        self._deliveries = deliveries
        self._slots = Slots(runtime.options.max_concurrent)
        self._turns = ChatTurns()
        gate = AsyncIsolationGate(lambda u: not state.may_start(u))
        self.enter_now = gate.enter_now  # the flow's gate hooks are the gate's own
        self.enter = gate.enter
        self.leave = gate.leave
        self.running = 0  # handlers started and their attempts not ended
        self._flow = UpdateFlow(runtime, self)

    def waiting_count(self) -> int:
        """How many updates wait for their chat's turn."""
        return self._turns.waiting_count()

    async def process(self, update: Update, coroutine: "Awaitable[Any]") -> bool:
        """Take the chat's turn, then run ``update``'s flow with ``coroutine`` as its handler.

        Returns:
            Whether ``coroutine`` was handed to a task (:obj:`False`: not run here).
        """
        key = update_chat_key(update)
        if not await self._turns.acquire(key, update.update_id):
            return False  # already waiting or running here
        return await self._flow.process(key, update.update_id, update, coroutine)

    async def in_slot(self, call: Callable[[], "Awaitable[Any]"]) -> None:
        """Await ``call()`` holding a slot for the whole call (its update takes no second)."""
        await self._slots.acquire()
        try:
            token = _HOLDING_SLOT.set(True)
            try:
                await call()
            finally:
                _HOLDING_SLOT.reset(token)
        finally:
            self._slots.release()

    # -- the flow's hooks ---------------------------------------------------------------------
    async def hold_slot(self) -> None:
        """Take a slot, unless this task holds one for the whole call (see :meth:`in_slot`)."""
        if not _HOLDING_SLOT.get():
            await self._slots.acquire()

    def free_slot(self) -> None:
        """Give back the slot :meth:`hold_slot` took."""
        if not _HOLDING_SLOT.get():
            self._slots.release()

    async def claim(self, update_id: int, job: Any) -> Optional[Attempt]:
        """The attempt claimed at ingest, else a claim (none while the stop refuses it)."""
        attempt = self._state.take_preclaimed(update_id)
        if attempt is None and self._state.may_start(update_id):
            return await self._ingest.claim(update_id)
        return attempt

    def call_store(self, fn: Callable[..., T], *args: Any) -> "Awaitable[T]":
        """``fn(*args)`` on a store thread."""
        return self._threads.call(fn, *args)

    async def run(
        self, key: Hashable, attempt: Attempt, aware: bool, update: Any, job: Any
    ) -> Ran:
        """Run the handler coroutine ``job`` in a task of its own, which a timeout or a stop
        ends (bounded, see ``_handlers``). A ``CancelledError`` its code raised is a failure
        (raising it would kill PTB's update fetcher in sequential mode)."""
        runtime = self._runtime
        self.running += 1
        runtime.stats.handler_began()
        returned = False
        handled = UpdateState(update, attempt)
        timeout = runtime.options.attempt_timeout_seconds
        try:
            run = self._handlers.run(attempt, timeout)
            started = time.perf_counter()
            with handling(handled, attempt if aware else None):
                error = await run.handle(job)
            returned = True  # before its end may be counted
            runtime.stats.handler_gone(time.perf_counter() - started)
        finally:
            if not returned:  # cancelled while its handler ran
                runtime.stats.handler_gone()
        if error is not None and handled.error is None:
            handled.error = error
        if run.released:
            return RELEASED  # released by the stop: nothing to settle
        if run.timed_out:
            assert timeout is not None
            return Ran(AttemptTimeout(attempt.update_id, attempt.attempt, timeout))
        return RETURNED if handled.error is None else Ran(handled.error)

    def ended(self, attempt: Attempt) -> None:
        """The attempt no longer counts as running."""
        self.running -= 1

    @staticmethod
    def body(update: Any) -> Optional[str]:
        """The update as stored, for a failed attempt."""
        body: Optional[str] = update_body(update)
        return body

    def complete(self, attempt: Attempt) -> "Awaitable[Outcome]":
        """Complete ``attempt`` with the completions that arrive at the same time, and end it."""
        completed: "Awaitable[Outcome]" = self._ingest.complete(attempt)
        return completed

    def pass_turn(self, key: Hashable, update_id: int, outcome: Optional[Outcome]) -> None:
        """Pass the chat's turn on (``strict_chat_order``: its next update comes from the
        store, in a task)."""
        self._sweeper.chat_successor_soon(key, outcome, self._turns.waiting(key))
        self._turns.release(key, update_id)

    def deliver(self, exhaustion: Exhaustion) -> None:
        """Deliver ``exhaustion`` in a task of its own."""
        self._deliveries.start(exhaustion)
