"""One behaviour, two twins: the asyncio AsyncGroupCommit (PTB front end) and the blocking
ThreadGroupCommit (UpdateIntake) are held to the same spec here.

Each case submits items from concurrent callers (tasks on an event loop whose calls hop to a
thread, as the processor's store calls do; or threads) to a ``run_many`` that records its
calls, and checks what every caller got.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import pytest

from ptb_fence.blocking._group_commit import MAX_GROUP as THREAD_MAX_GROUP
from ptb_fence.blocking._group_commit import ThreadGroupCommit
from ptb_fence.ptb._group_commit import MAX_GROUP as ASYNC_MAX_GROUP
from ptb_fence.ptb._group_commit import AsyncGroupCommit

Outcome = Tuple[str, Any]  # ("ok", result) or ("error", exception)
RunMany = Callable[[List[int]], Sequence[Any]]


def via_tasks(items: List[int], run_many: RunMany) -> List[Outcome]:
    async def main() -> List[Outcome]:
        group: AsyncGroupCommit[int, Any] = AsyncGroupCommit(
            lambda batch: asyncio.to_thread(run_many, batch), "twin-spec"
        )

        async def one(item: int) -> Outcome:
            try:
                return ("ok", await group.submit(item))
            except Exception as exc:
                return ("error", exc)

        return list(await asyncio.gather(*(one(item) for item in items)))

    return asyncio.run(main())


def via_threads(items: List[int], run_many: RunMany) -> List[Outcome]:
    group: ThreadGroupCommit[int, Any] = ThreadGroupCommit(run_many)
    outcomes: List[Optional[Outcome]] = [None] * len(items)
    start = threading.Barrier(len(items), timeout=30)

    def one(n: int) -> None:
        start.wait()
        try:
            outcomes[n] = ("ok", group.submit(items[n]))
        except Exception as exc:
            outcomes[n] = ("error", exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(len(items))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(outcome is not None for outcome in outcomes)
    return outcomes  # type: ignore[return-value]


TWINS = [pytest.param(via_tasks, id="asyncio"), pytest.param(via_threads, id="threads")]


class Calls:
    """A ``run_many`` that doubles each item, takes ``seconds``, and records its calls."""

    def __init__(self, seconds: float = 0.005, fail_on: Optional[int] = None,
                 bad_item: Optional[int] = None) -> None:
        self.seconds = seconds
        self.fail_on = fail_on
        self.bad_item = bad_item
        self.groups: List[List[int]] = []
        self.returned: set[int] = set()  # items whose call has returned
        self.in_flight = 0
        self.most_in_flight = 0
        self.lock = threading.Lock()

    def __call__(self, items: List[int]) -> List[Any]:
        with self.lock:
            self.groups.append(list(items))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            time.sleep(self.seconds)
            if self.fail_on is not None and self.fail_on in items:
                raise RuntimeError(f"the store failed on a group with {self.fail_on}")
            return [ValueError(f"bad {i}") if i == self.bad_item else i * 2 for i in items]
        finally:
            with self.lock:
                self.in_flight -= 1
                self.returned.update(items)


@pytest.mark.parametrize("submit_all", TWINS)
def test_items_submitted_together_share_calls_and_each_caller_gets_its_own_result(
    submit_all: Callable[[List[int], RunMany], List[Outcome]],
) -> None:
    calls = Calls()
    items = list(range(40))
    assert submit_all(items, calls) == [("ok", i * 2) for i in items]
    assert sorted(i for group in calls.groups for i in group) == items  # each sent once
    assert len(calls.groups) < len(items) // 2, calls.groups


@pytest.mark.parametrize("submit_all", TWINS)
def test_one_group_in_flight_at_a_time(
    submit_all: Callable[[List[int], RunMany], List[Outcome]],
) -> None:
    calls = Calls(seconds=0.02)
    submit_all(list(range(30)), calls)
    assert calls.most_in_flight == 1


@pytest.mark.parametrize("submit_all", TWINS)
def test_nothing_is_reported_done_before_its_call_returned(
    submit_all: Callable[[List[int], RunMany], List[Outcome]],
) -> None:
    calls = Calls()
    outcomes = submit_all(list(range(20)), calls)
    # every caller got its result, and only after the call holding its item had returned
    assert [kind for kind, _ in outcomes] == ["ok"] * 20
    assert calls.returned == set(range(20))


@pytest.mark.parametrize("submit_all", TWINS)
def test_a_failing_call_fails_every_caller_of_its_group_and_the_others_go_on(
    submit_all: Callable[[List[int], RunMany], List[Outcome]],
) -> None:
    calls = Calls(fail_on=7)
    outcomes = submit_all(list(range(30)), calls)
    failed_group = next(group for group in calls.groups if 7 in group)
    for item, (kind, value) in enumerate(outcomes):
        if item in failed_group:
            assert kind == "error" and "failed on a group with 7" in str(value)
        else:
            assert (kind, value) == ("ok", item * 2)


@pytest.mark.parametrize("submit_all", TWINS)
def test_a_result_that_is_an_exception_is_raised_to_its_caller_alone(
    submit_all: Callable[[List[int], RunMany], List[Outcome]],
) -> None:
    outcomes = submit_all(list(range(12)), Calls(bad_item=5))
    for item, (kind, value) in enumerate(outcomes):
        if item == 5:
            assert kind == "error" and isinstance(value, ValueError) and str(value) == "bad 5"
        else:
            assert (kind, value) == ("ok", item * 2)


@pytest.mark.parametrize("submit_all", TWINS)
def test_a_group_holds_at_most_max_group_items(
    submit_all: Callable[[List[int], RunMany], List[Outcome]],
) -> None:
    assert ASYNC_MAX_GROUP == THREAD_MAX_GROUP == 256
    calls = Calls(seconds=0.05)
    items = list(range(300))
    assert submit_all(items, calls) == [("ok", i * 2) for i in items]
    assert max(len(group) for group in calls.groups) <= 256
    assert len(calls.groups) >= 2
