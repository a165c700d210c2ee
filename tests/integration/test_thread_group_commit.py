"""ThreadGroupCommit (blocking/_group_commit.py), with real threads: items submitted together go
in one call, each thread gets its own result, an error reaches every thread of its group,
the lead passes on (nobody waits forever), and a group never exceeds its size."""

from __future__ import annotations

import threading
import time
from typing import List

import pytest

from ptb_fence.blocking._group_commit import ThreadGroupCommit


def _run_threads(n: int, target) -> None:  # noqa: ANN001
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a submitter never returned"


def test_items_submitted_together_share_calls_and_each_thread_gets_its_own_result() -> None:
    calls: List[List[int]] = []
    lock = threading.Lock()

    def run_many(items: List[int]) -> List[int]:
        with lock:
            calls.append(list(items))
        time.sleep(0.02)  # a commit: others arrive meanwhile
        return [item * 10 for item in items]

    group: ThreadGroupCommit[int, int] = ThreadGroupCommit(run_many)
    results = {}
    start = threading.Barrier(40)

    def submit(i: int) -> None:
        start.wait()
        results[i] = group.submit(i)

    _run_threads(40, submit)
    assert results == {i: i * 10 for i in range(40)}
    assert sorted(item for call in calls for item in call) == list(range(40))  # each once
    assert len(calls) < 40 / 2, calls  # grouped: 40 one-item calls before
    assert max(len(call) for call in calls) > 1


def test_one_group_in_flight_at_a_time() -> None:
    inside = [0]
    most = [0]
    lock = threading.Lock()

    def run_many(items: List[int]) -> List[int]:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.005)
        with lock:
            inside[0] -= 1
        return items

    group: ThreadGroupCommit[int, int] = ThreadGroupCommit(run_many)

    def submit(i: int) -> None:
        for k in range(20):
            assert group.submit(i * 100 + k) == i * 100 + k

    _run_threads(8, submit)
    assert most[0] == 1


def test_an_error_reaches_every_thread_of_its_group_and_the_next_group_runs() -> None:
    fail = threading.Event()
    fail.set()
    calls = []

    def run_many(items: List[int]) -> List[int]:
        calls.append(list(items))
        time.sleep(0.02)
        if fail.is_set():
            fail.clear()
            raise ConnectionError("store down")
        return items

    group: ThreadGroupCommit[int, int] = ThreadGroupCommit(run_many)
    outcomes = {}
    start = threading.Barrier(10)

    def submit(i: int) -> None:
        start.wait()
        try:
            outcomes[i] = group.submit(i)
        except ConnectionError as exc:
            outcomes[i] = exc

    _run_threads(10, submit)
    failed = [i for i, o in outcomes.items() if isinstance(o, ConnectionError)]
    assert sorted(failed) == sorted(calls[0])  # exactly the first group's items
    assert all(outcomes[i] == i for i in outcomes if i not in failed)
    assert len(outcomes) == 10


def test_a_group_holds_at_most_max_group_items() -> None:
    sizes = []

    def run_many(items: List[int]) -> List[int]:
        sizes.append(len(items))
        time.sleep(0.02)
        return items

    group: ThreadGroupCommit[int, int] = ThreadGroupCommit(run_many, max_group=3)
    start = threading.Barrier(12)

    def submit(i: int) -> None:
        start.wait()
        assert group.submit(i) == i

    _run_threads(12, submit)
    assert max(sizes) <= 3 and sum(sizes) == 12


def test_a_wrong_number_of_results_is_an_error_not_a_silent_none() -> None:
    group: ThreadGroupCommit[int, int] = ThreadGroupCommit(lambda items: [])
    with pytest.raises(RuntimeError, match="0 results for 1 items"):
        group.submit(1)
    with pytest.raises(ValueError, match="max_group"):
        ThreadGroupCommit(lambda items: items, max_group=0)
