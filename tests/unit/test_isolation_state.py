"""IsolationState: the rules of the isolation gates, on a clock the test moves (no threads).

Fresh starts go at once unless a suspect waits, runs alone or is on probation; a suspect starts
on probation once the one before it ran for PROBATION_SECONDS or ended, and learns whose mark
to end; a suspect again waits for every running handler and holds every start while it waits
and runs.
"""

from __future__ import annotations

from typing import List

from ptb_fence import AttemptIdentity, MemoryUpdateStore, RuntimeOptions
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._isolation import PROBATION_SECONDS, IsolationState
from ptb_fence.runtime._runtime import Runtime


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _attempts(suspicions: List[int]) -> List[Attempt]:
    runtime = Runtime(
        MemoryUpdateStore(), RuntimeOptions(), attempt_aware=True, handle_exhaustion=False
    )
    made = []
    for i, suspicion in enumerate(suspicions):
        attempt = Attempt(runtime, 10 + i, 1, f"c{i}", 0)
        if suspicion:
            attempt.suspect(AttemptIdentity(10 + i, 1, f"c{i}"), suspicion)
        made.append(attempt)
    return made


def test_fresh_starts_go_together() -> None:
    state = IsolationState(Clock())
    a, b = _attempts([0, 0])
    assert state.held_for(0) is None
    assert state.start(a) is None
    assert state.held_for(0) is None
    assert state.start(b) is None


def test_suspects_start_a_probation_apart_and_end_the_mark_before_them() -> None:
    clock = Clock()
    state = IsolationState(clock)
    first, second, fresh = _attempts([1, 1, 0])
    assert state.held_for(1) is None
    assert state.start(first) is None  # nobody's mark to end
    assert state.held_for(1) == PROBATION_SECONDS  # the next suspect waits the probation
    assert state.held_for(0) == PROBATION_SECONDS  # and so does a fresh start
    clock.now += PROBATION_SECONDS / 2
    assert state.held_for(1) == PROBATION_SECONDS / 2
    clock.now += PROBATION_SECONDS / 2
    assert state.held_for(1) is None
    assert state.start(second) is first  # first still runs, marked: its mark ends first
    state.leave(second)  # ended within its probation: the next may start at once
    assert state.held_for(0) is None
    assert state.start(fresh) is None


def test_a_waiting_suspect_holds_fresh_starts() -> None:
    clock = Clock()
    state = IsolationState(clock)
    (suspect,) = _attempts([1])
    state.waiting(1, 1)
    assert state.held_for(0) is not None  # writer preference: the suspect goes first
    assert state.held_for(1) is None
    state.waiting(1, -1)
    assert state.start(suspect) is None
    state.leave(suspect)
    assert state.held_for(0) is None


def test_a_suspect_again_runs_alone() -> None:
    clock = Clock()
    state = IsolationState(clock)
    running, again, fresh, suspect = _attempts([0, 2, 0, 1])
    state.start(running)
    state.waiting(2, 1)
    assert state.held_for(2) is not None  # a handler runs
    assert state.held_for(0) is not None and state.held_for(1) is not None  # held for it
    state.leave(running)
    assert state.held_for(2) is None
    state.waiting(2, -1)
    assert state.start(again) is None
    clock.now += 3600
    assert state.held_for(0) is not None and state.held_for(1) is not None  # still alone
    assert state.held_for(2) is not None  # one alone at a time
    state.leave(again)
    assert state.held_for(0) is None and state.held_for(1) is None
    assert state.start(fresh) is None
    assert state.start(suspect) is None
