"""DaemonThreadPool (ptb_fence/runtime/_daemon_pool.py): the outbox's sender threads."""

from __future__ import annotations

import sys
import threading
import time
from typing import Iterator, List

import pytest

from ptb_fence.runtime._daemon_pool import DaemonThreadPool


@pytest.fixture
def slow_switches() -> Iterator[None]:
    """The submitting thread keeps the GIL for a whole burst of submits (a woken idle thread
    takes nothing meanwhile), as a busy process's scheduling may do."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.5)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_work_submitted_in_a_burst_runs_on_max_workers_threads_at_once_beside_an_idle_one(
    slow_switches: None,
) -> None:
    """An idle thread takes one job: a burst of jobs submitted before it took the first gets a
    thread each up to ``max_workers`` (the outbox relies on every sender running: a call left
    queued behind a slow send waits a whole send, maybe past its lease)."""
    pool = DaemonThreadPool(4, "test_pool")
    release = threading.Event()
    running: List[int] = []
    lock = threading.Lock()

    def job(number: int) -> None:
        with lock:
            running.append(number)
        release.wait(10)

    try:
        pool.submit(lambda: None).result(5)  # one thread, idle now
        time.sleep(0.05)
        futures = [pool.submit(job, n) for n in range(4)]
        deadline = time.monotonic() + 5
        while len(running) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(running) == [0, 1, 2, 3], running
    finally:
        release.set()
        pool.shutdown(wait=True)
    for future in futures:
        assert future.result(5) is None


def test_no_more_than_max_workers_threads_and_idle_threads_are_reused() -> None:
    pool = DaemonThreadPool(2, "test_pool")
    release = threading.Event()
    names: "set[str]" = set()

    def job() -> None:
        names.add(threading.current_thread().name)
        release.wait(10)

    try:
        futures = [pool.submit(job) for _ in range(5)]
        time.sleep(0.2)
        assert len(names) == 2
        release.set()
        for future in futures:
            future.result(5)
        for _ in range(5):  # one job at a time: the idle threads take them
            pool.submit(job).result(5)
        assert len(names) == 2, names
    finally:
        release.set()
        pool.shutdown(wait=True)
