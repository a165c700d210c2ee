"""UpdateFlow: the life of one update, written once for both front ends.

It claims the update (unless ingest claimed it), passes the isolation gate, runs the handler,
settles it (or hands its completion to the group commit), passes the chat's turn on and hands
an exhaustion to delivery. It is a coroutine over the front end's :class:`FlowAdapter`. With
asyncio the processor awaits it (``AsyncFlowAdapter``). ``ThreadFlowAdapter``'s hooks block
their worker thread and never suspend, so :func:`run_blocking` runs the flow to its end in one
step. The adapters keep only what differs: how a handler runs, how they wait and how they hop
to a store thread.
"""

from __future__ import annotations

from typing import (
    Any,
    Awaitable,
    Callable,
    Coroutine,
    Hashable,
    NamedTuple,
    Optional,
    Protocol,
    Tuple,
    TypeVar,
)

from ptb_fence._values import Exhaustion
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._outcome import Outcome
from ptb_fence.runtime._runtime import Runtime

__all__ = ["RELEASED", "RETURNED", "FlowAdapter", "Ran", "UpdateFlow", "run_blocking"]

T = TypeVar("T")


class Ran(NamedTuple):
    """How a handler's run ended.

    Attributes:
        error: What it raised (the attempt failed), or :obj:`None`.
        ended_elsewhere: It was ended elsewhere (a stop released it, or a timeout settled it):
            nothing is settled here.
        cleaned_up: Whoever ended it also left the isolation gate and ended the attempt.
        turn_passed: Whoever ended it also passed the chat's turn on.
    """

    error: Optional[BaseException] = None
    ended_elsewhere: bool = False
    cleaned_up: bool = False
    turn_passed: bool = False


RETURNED = Ran()
"""The handler returned: the attempt is settled (or completed) here."""

RELEASED = Ran(ended_elsewhere=True)
"""Released by the stop while its handler ran: the flow still leaves the gate and ends it."""


class FlowAdapter(Protocol):
    """The hooks of a front end. The awaited ones are where it waits."""

    def enter_now(self, attempt: Attempt) -> bool:
        """Pass the isolation gate at once if no wait is needed. :obj:`False`: call
        :meth:`enter`."""

    def enter(self, attempt: Attempt) -> Awaitable[Tuple[bool, Optional[Attempt]]]:
        """Wait at the isolation gate: whether it may start, and the suspect whose probation
        this start ends."""

    def leave(self, attempt: Attempt) -> None:
        """The handler that entered the isolation gate has ended."""

    def hold_slot(self) -> Awaitable[Any]:
        """Take a concurrency slot (nothing where the worker thread is the slot)."""

    def free_slot(self) -> None:
        """Give back what :meth:`hold_slot` took."""

    def claim(self, update_id: int, job: Any) -> Awaitable[Optional[Attempt]]:
        """The attempt claimed at ingest, else a claim now (:obj:`None`: not taken)."""

    def call_store(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        """``fn(*args)``, a blocking store call, where the caller may block."""

    def run(
        self, key: Hashable, attempt: Attempt, aware: bool, update: Any, job: Any
    ) -> Awaitable[Ran]:
        """Run the handler (``aware``: it gets the attempt)."""

    def ended(self, attempt: Attempt) -> None:
        """The attempt no longer counts as running here."""

    def body(self, update: Any) -> Optional[str]:
        """The update's stored body for a failed attempt (:obj:`None`: it has one)."""

    def complete(self, attempt: Attempt) -> Awaitable[Outcome]:
        """Complete ``attempt`` in the group commit and end it. Gives its outcome."""

    def pass_turn(self, key: Hashable, update_id: int, outcome: Optional[Outcome]) -> None:
        """Pass the chat's turn on (:obj:`None`: the update was not claimed)."""

    def deliver(self, exhaustion: Exhaustion) -> None:
        """Hand an exhaustion to delivery, off the chat's turn."""


class UpdateFlow:
    """The per-update sequence of one front end.

    Args:
        runtime: The front end's runtime (its decisions).
        adapter: The front end's hooks.
    """

    __slots__ = ("_adapter", "_runtime")

    def __init__(self, runtime: Runtime, adapter: FlowAdapter) -> None:
        self._runtime = runtime
        self._adapter = adapter

    async def process(self, key: Hashable, update_id: int, update: Any, job: Any) -> bool:
        """Run ``update`` once its chat's turn is held. ``job`` is the front end's own
        part (the handler coroutine, or the update's text). The chat's turn is passed on at
        the end unless whoever ended the run passed it.

        Returns:
            Whether the handler was started.
        """
        runtime = self._runtime
        adapter = self._adapter
        outcome: Optional[Outcome] = None
        exhaustion: Optional[Exhaustion] = None
        completing: Optional[Attempt] = None
        turn = True
        try:
            await adapter.hold_slot()
            try:
                attempt = await adapter.claim(update_id, job)
                if attempt is None:
                    return False  # not ours, or stopping: it stays in the store
                # the usual case enters at once: no suspect waits, runs alone or is on probation
                if not adapter.enter_now(attempt) and not await self._enter(attempt):
                    return False  # given back, its attempt not spent
                owned = True
                try:
                    attempt.update = update  # what attempt.outbox.reply_text answers
                    # a unary front end's handlers get no attempt, also when its attempts
                    # carry claim ids (handle_exhaustion): they have nothing to fence with
                    aware = runtime.attempt_aware and attempt.fenced
                    ran = await adapter.run(key, attempt, aware, update, job)
                    if ran.ended_elsewhere:
                        owned = not ran.cleaned_up
                        turn = not ran.turn_passed
                        return True
                    error = ran.error
                    if error is not None or attempt.exhausted:
                        body = adapter.body(update)
                        if body is not None:
                            attempt.body = body
                    # a suspect's attempt settles before it leaves the gate: were the next
                    # suspect let in before this settle landed and crashed the process, the
                    # store would blame the crash on this attempt too (its claim is marked
                    # isolated and still live)
                    if runtime.completes_in_group(attempt, error) and not attempt.suspicion:
                        attempt.begin_settling()
                        completing = attempt  # completed once the slot is given back
                    else:
                        outcome, exhaustion = await adapter.call_store(
                            runtime.settle, attempt, error
                        )
                finally:
                    if owned:
                        adapter.leave(attempt)
                        if completing is None:  # also when cancelled: stop renewing (the
                            runtime.end(attempt)  # lease lapses and a sweep retries)
                            adapter.ended(attempt)
            finally:
                adapter.free_slot()
            if completing is not None:
                # grouped with the completions of other updates (one commit). The slot is
                # free first, so the update that takes it claims while this is in the store
                try:
                    outcome = await adapter.complete(completing)
                finally:
                    adapter.ended(completing)
            return True
        finally:
            if turn:  # strict_chat_order: the chat's next update comes from the store
                adapter.pass_turn(key, update_id, outcome)
            if exhaustion is not None:
                # after the chat's turn passed on: a slow or hanging exhaustion handler
                # holds neither the chat nor the sweep
                adapter.deliver(exhaustion)

    async def _enter(self, attempt: Attempt) -> bool:
        """Wait at the isolation gate: together, on probation or alone. A suspect's claim is
        marked in the store first.

        Returns:
            :obj:`False` when the handler must not start: the front end stops, the handlers
            running here did not end in time, or the claim was lost. The attempt was then
            given back (its attempt not spent).
        """
        adapter = self._adapter
        runtime = self._runtime
        entered = False
        try:
            entered, previous = await adapter.enter(attempt)
            if entered and previous is not None:  # its probation is over: a crash is no
                await adapter.call_store(runtime.end_probation, previous)  # longer its alone
            if entered and attempt.suspicion and not await adapter.call_store(
                runtime.mark_isolated, attempt
            ):
                adapter.leave(attempt)
                entered = False
        except BaseException:  # cancelled: stop renewing it (the lease lapses)
            if entered:
                adapter.leave(attempt)
            runtime.end(attempt)
            raise
        if not entered:
            await adapter.call_store(runtime.recovery.release, [attempt])
        return entered


def run_blocking(flow: "Coroutine[Any, Any, T]") -> T:
    """Run ``flow`` to its end on the calling thread. Its hooks block instead of suspending.

    Raises:
        RuntimeError: A hook suspended (it belongs to an event loop, not to a thread).
    """
    try:
        flow.send(None)
    except StopIteration as stop:
        result: T = stop.value
        return result
    flow.close()
    raise RuntimeError("a hook of a blocking flow suspended: it needs an event loop")
