"""UpdateFlow, the per-update sequence both front ends share, run both ways.

A recording adapter and runtime stand in for a front end: each test checks which steps ran,
in which order, for one path of an update's life. Its hooks block (``run_blocking``, as
UpdateIntake's) or suspend (an event loop, as the PTB processor's).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Hashable, List, Optional, Tuple

import pytest

from ptb_fence.runtime._flow import RELEASED, Ran, UpdateFlow, run_blocking


class FakeAttempt:
    def __init__(self, update_id: int, suspicion: int = 0) -> None:
        self.update_id = update_id
        self.attempt = 1
        self.fenced = True
        self.exhausted = False
        self.suspicion = suspicion
        self.body: Optional[str] = None
        self.update: Any = None
        self.settling = False

    def begin_settling(self) -> None:
        self.settling = True


class FakeRecovery:
    def __init__(self, events: List[Tuple[Any, ...]]) -> None:
        self._events = events

    def release(self, attempts: List[FakeAttempt]) -> None:
        self._events.append(("release", [a.update_id for a in attempts]))


class FakeRuntime:
    attempt_aware = True

    def __init__(self, events: List[Tuple[Any, ...]], *, mark: bool = True) -> None:
        self.events = events
        self.recovery = FakeRecovery(events)
        self._mark = mark

    def completes_in_group(self, attempt: FakeAttempt, error: Optional[BaseException]) -> bool:
        return error is None

    def settle(self, attempt: FakeAttempt, error: Optional[BaseException]) -> Tuple[str, Any]:
        self.events.append(("settle", attempt.update_id, type(error).__name__))
        return ("retrying", None) if error is None else ("exhausted", f"exhaustion {error}")

    def end(self, attempt: FakeAttempt) -> None:
        self.events.append(("end", attempt.update_id))

    def end_probation(self, attempt: FakeAttempt) -> None:
        self.events.append(("end_probation", attempt.update_id))

    def mark_isolated(self, attempt: FakeAttempt) -> bool:
        self.events.append(("mark_isolated", attempt.update_id))
        return self._mark


class Adapter:
    """Hooks that record. The awaited ones suspend once first when ``suspend`` is set."""

    def __init__(
        self,
        events: List[Tuple[Any, ...]],
        attempt: Optional[FakeAttempt],
        ran: Any,
        *,
        wait: Tuple[bool, Optional[FakeAttempt]] = (True, None),
        suspend: bool = False,
    ) -> None:
        self.events = events
        self._attempt = attempt
        self._ran = ran  # a Ran, or an async callable giving one
        self._wait = wait  # what enter gives: (entered, previous)
        self._suspend = suspend

    async def _step(self) -> None:
        if self._suspend:
            await asyncio.sleep(0)

    def enter_now(self, attempt: FakeAttempt) -> bool:
        return not attempt.suspicion

    async def enter(self, attempt: FakeAttempt) -> Tuple[bool, Optional[FakeAttempt]]:
        self.events.append(("enter", attempt.update_id))
        await self._step()
        return self._wait

    def leave(self, attempt: FakeAttempt) -> None:
        self.events.append(("leave", attempt.update_id))

    async def hold_slot(self) -> None:
        self.events.append(("hold_slot",))
        await self._step()

    def free_slot(self) -> None:
        self.events.append(("free_slot",))

    async def claim(self, update_id: int, job: Any) -> Optional[FakeAttempt]:
        self.events.append(("claim", update_id, job))
        await self._step()
        return self._attempt

    async def call_store(self, fn: Callable[..., Any], *args: Any) -> Any:
        await self._step()
        return fn(*args)

    async def run(
        self, key: Hashable, attempt: FakeAttempt, aware: bool, update: Any, job: Any
    ) -> Ran:
        self.events.append(("run", attempt.update_id, aware, attempt.update))
        await self._step()
        if isinstance(self._ran, Ran):
            return self._ran
        ran: Ran = await self._ran()
        return ran

    def ended(self, attempt: FakeAttempt) -> None:
        self.events.append(("ended", attempt.update_id))

    def body(self, update: Any) -> Optional[str]:
        return f"body of {update}"

    async def complete(self, attempt: FakeAttempt) -> str:
        self.events.append(("complete", attempt.update_id, attempt.settling))
        await self._step()
        return "completed"

    def pass_turn(self, key: Hashable, update_id: int, outcome: Any) -> None:
        self.events.append(("pass_turn", key, update_id, outcome))

    def deliver(self, exhaustion: Any) -> None:
        self.events.append(("deliver", exhaustion))


def _flow(
    attempt: Optional[FakeAttempt], ran: Any, *, mark: bool = True, **adapter: Any
) -> Tuple[UpdateFlow, List[Tuple[Any, ...]]]:
    events: List[Tuple[Any, ...]] = []
    runtime: Any = FakeRuntime(events, mark=mark)
    return UpdateFlow(runtime, Adapter(events, attempt, ran, **adapter)), events


def test_a_success_is_completed_in_the_group_after_the_slot_is_free() -> None:
    flow, events = _flow(FakeAttempt(7), Ran())
    assert run_blocking(flow.process("chat", 7, "update 7", "text")) is True
    assert events == [
        ("hold_slot",),
        ("claim", 7, "text"),
        ("run", 7, True, "update 7"),
        ("leave", 7),
        ("free_slot",),
        ("complete", 7, True),
        ("ended", 7),
        ("pass_turn", "chat", 7, "completed"),
    ]


def test_a_failure_settles_then_passes_the_turn_then_delivers_its_exhaustion() -> None:
    error = ValueError("boom")
    flow, events = _flow(FakeAttempt(8), Ran(error))
    assert run_blocking(flow.process("chat", 8, "update 8", None)) is True
    assert events[2:] == [
        ("run", 8, True, "update 8"),
        ("settle", 8, "ValueError"),
        ("leave", 8),
        ("end", 8),
        ("ended", 8),
        ("free_slot",),
        ("pass_turn", "chat", 8, "exhausted"),
        ("deliver", "exhaustion boom"),
    ]


def test_a_failed_attempt_gets_its_body_from_the_front_end() -> None:
    attempt = FakeAttempt(9)
    flow, _ = _flow(attempt, Ran(ValueError("x")))
    run_blocking(flow.process("chat", 9, "update 9", None))
    assert attempt.body == "body of update 9"


def test_an_update_not_claimed_passes_the_turn_on_without_an_outcome() -> None:
    flow, events = _flow(None, Ran())
    assert run_blocking(flow.process("chat", 10, "update 10", None)) is False
    assert events == [
        ("hold_slot",),
        ("claim", 10, None),
        ("free_slot",),
        ("pass_turn", "chat", 10, None),
    ]


def test_a_suspect_ends_the_previous_probation_and_is_given_back_when_its_mark_fails() -> None:
    previous = FakeAttempt(1, suspicion=1)
    flow, events = _flow(FakeAttempt(11, suspicion=1), Ran(), mark=False, wait=(True, previous))
    assert run_blocking(flow.process("chat", 11, "update 11", None)) is False
    assert events[2:] == [
        ("enter", 11),
        ("end_probation", 1),
        ("mark_isolated", 11),
        ("leave", 11),
        ("release", [11]),
        ("free_slot",),
        ("pass_turn", "chat", 11, None),
    ]


def test_a_suspect_that_did_not_get_in_is_given_back() -> None:
    flow, events = _flow(FakeAttempt(12, suspicion=2), Ran(), wait=(False, None))
    assert run_blocking(flow.process("chat", 12, "update 12", None)) is False
    assert ("run", 12, True, "update 12") not in events
    assert events[2:4] == [("enter", 12), ("release", [12])]


def test_a_suspect_settles_on_its_own_before_it_leaves_the_gate() -> None:
    flow, events = _flow(FakeAttempt(13, suspicion=1), Ran())
    assert run_blocking(flow.process("chat", 13, "update 13", None)) is True
    assert events.index(("settle", 13, "NoneType")) < events.index(("leave", 13))
    assert not any(event[0] == "complete" for event in events)


def test_a_run_released_by_the_stop_is_not_settled_but_cleaned_up() -> None:
    flow, events = _flow(FakeAttempt(14), RELEASED)
    assert run_blocking(flow.process("chat", 14, "update 14", None)) is True
    assert events[3:] == [
        ("leave", 14),
        ("end", 14),
        ("ended", 14),
        ("free_slot",),
        ("pass_turn", "chat", 14, None),
    ]


@pytest.mark.parametrize("turn_passed", [False, True])
def test_a_run_ended_by_another_thread_is_left_to_it(turn_passed: bool) -> None:
    ran = Ran(ended_elsewhere=True, cleaned_up=True, turn_passed=turn_passed)
    flow, events = _flow(FakeAttempt(15), ran)
    assert run_blocking(flow.process("chat", 15, "update 15", None)) is True
    after = events[3:]
    assert after[0] == ("free_slot",)
    assert (("pass_turn", "chat", 15, None) in after) is not turn_passed
    assert not any(event[0] in ("leave", "end", "ended", "settle") for event in after)


def test_on_an_event_loop_each_hook_may_suspend() -> None:
    flow, events = _flow(FakeAttempt(16), Ran(ValueError("late")), suspend=True)
    assert asyncio.run(flow.process("chat", 16, "update 16", None)) is True
    assert ("settle", 16, "ValueError") in events
    assert events[-2:] == [
        ("pass_turn", "chat", 16, "exhausted"),
        ("deliver", "exhaustion late"),
    ]


def test_a_cancelled_handler_leaves_the_gate_ends_the_attempt_and_passes_the_turn() -> None:
    async def main() -> List[Tuple[Any, ...]]:
        started = asyncio.Event()

        async def hanging() -> Ran:
            started.set()
            await asyncio.sleep(60)
            raise AssertionError("not cancelled")

        flow, events = _flow(FakeAttempt(17), hanging, suspend=True)
        task = asyncio.ensure_future(flow.process("chat", 17, "update 17", None))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return events

    events = asyncio.run(main())
    assert events[3:] == [
        ("leave", 17),
        ("end", 17),
        ("ended", 17),
        ("free_slot",),
        ("pass_turn", "chat", 17, None),
    ]


def test_a_store_error_is_raised_at_its_step_and_the_flow_still_cleans_up() -> None:
    class Failing(FakeRuntime):
        def settle(self, attempt: FakeAttempt, error: Optional[BaseException]) -> Any:
            raise OSError("store down")

    events: List[Tuple[Any, ...]] = []
    adapter = Adapter(events, FakeAttempt(18), Ran(ValueError("x")), suspend=True)
    runtime: Any = Failing(events)
    flow = UpdateFlow(runtime, adapter)
    with pytest.raises(OSError, match="store down"):
        asyncio.run(flow.process("chat", 18, "update 18", None))
    assert events[3:] == [
        ("leave", 18),
        ("end", 18),
        ("ended", 18),
        ("free_slot",),
        ("pass_turn", "chat", 18, None),
    ]


def test_run_blocking_refuses_a_hook_that_suspends() -> None:
    flow, events = _flow(FakeAttempt(19), Ran(), suspend=True)
    with pytest.raises(RuntimeError, match="suspended"):
        run_blocking(flow.process("chat", 19, "update 19", None))
    # closed at its first suspension: nothing more ran but its cleanup (the turn passes on)
    assert events == [("hold_slot",), ("pass_turn", "chat", 19, None)]
