"""Only a dead process is taken for dead: real bot processes (PTB ``Application`` and blocking
``UpdateIntake``, tests/processes/recovery_support.py) on SQLite and PostgreSQL with the library's
120 s lease, so any takeover within the test's time is the liveness check's.

- A live process whose liveness signal disappears (PostgreSQL: its liveness backend terminated
  with ``pg_terminate_backend``; SQLite: its lock file deleted) keeps its running updates: a
  second process starts none of them (no handler runs twice, no two attempts of one chat at
  once under ``strict_chat_order``). A later SIGKILL of the same process is still taken over
  within seconds (it held its signal again).
- A process that forked a long-lived child (``multiprocessing``, fork start method) is taken
  over within seconds of its SIGKILL: the child does not keep its liveness signal, nor the
  fenced transaction the parent had open when it was killed.
"""

from __future__ import annotations

import os
import signal
import time
from typing import List

from ptb_fence.testing import FakeBotApi
from ptb_support import wait_sync
from recovery_support import DEFAULTS, Bed, _all_handled, _exactly_once, bed, bots  # noqa: F401
from test_ptb_processes import Bots
from test_recovery_takeover import TAKEOVER_BOUND

SLOW = 6.0
"""Seconds each slow handler runs: longer than a dead instance takes to be found (PostgreSQL
waits for its heartbeat to be a few seconds old), so a wrong takeover would happen while the
handlers still run."""


def _instance(bots: Bots, pid: int) -> str:
    with open(os.path.join(bots.dir, f"instance.{pid}"), encoding="utf-8") as file:
        return file.read().strip()


def _cut_liveness_signal(bed: Bed, instance: str) -> None:
    """Take the live instance's liveness signal away without ending its process."""
    if bed.url.startswith("sqlite:///"):
        os.unlink(f"{bed.url[len('sqlite://'):]}.instances/{instance}.lock")
        return
    from ptb_fence.stores.postgres._sql import CLASS_ID, instance_key

    # Only the backend holding this instance's advisory lock: the server is shared.
    terminated = bed.query(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
        f"AND classid = {CLASS_ID}::oid AND objid = {instance_key(instance) & 0xFFFFFFFF}::oid "
        "AND objsubid = 2 AND pid <> pg_backend_pid()"
    )
    assert terminated == [(True,)], terminated


def _started_by(bots: Bots, ids: List[int]) -> "dict[int, List[int]]":
    return {u: bots.started(u) for u in ids}


def test_a_lost_liveness_signal_is_not_taken_for_death(bots: Bots, bed: Bed) -> None:
    strict = ("--strict-chat-order",)
    with FakeBotApi() as fake:
        other = bots.spawn(fake, bed.url, bed.table, bed.domain, *DEFAULTS, *strict)
        bots.wait_ready(other)
        # chat 9: two slow updates in a row (its second must not start while the first runs)
        slow = [fake.inject_message(chat_id=9, text="slow") for _ in range(2)]
        slow += [fake.inject_message(chat_id=10 + i, text="slow") for i in range(2)]
        live = bots.spawn(fake, bed.url, bed.table, bed.domain, "--poll", *DEFAULTS, *strict,
                          "--slow", "slow", "--slow-seconds", str(SLOW), "--hang", "hang")
        bots.wait_ready(live)
        running = [slow[0], slow[2], slow[3]]
        wait_sync("the slow handlers to start",
                  lambda: all(live.pid in bots.started(u) for u in running), 20)
        _cut_liveness_signal(bed, _instance(bots, live.pid))
        cut = time.monotonic()
        # while the handlers run (and a while after), nobody else starts any of them
        while time.monotonic() - cut < SLOW:
            started = _started_by(bots, slow)
            assert all(other.pid not in pids for pids in started.values()), (
                f"a live process's updates were taken over: {started}\n{bots.output()}")
            time.sleep(0.1)
        _all_handled(bots, bed, slow, 2 * SLOW + 15, "the live process finishes its updates")
        assert all(bots.started(u) == [live.pid] for u in slow), _started_by(bots, slow)
        # it holds its signal again: a real death is still found within seconds
        hang = fake.inject_message(chat_id=20, text="hang")
        late = fake.inject_message(chat_id=20, text="late")  # queued behind it
        wait_sync("a handler that never returns to start", lambda: live.pid in bots.started(hang), 20)
        bots.kill(live)
        killed = time.monotonic()
        _all_handled(bots, bed, [hang, late], TAKEOVER_BOUND, "the other process takes over")
        took = time.monotonic() - killed
        assert took < TAKEOVER_BOUND, took
        bots.stop_all()
    written = _exactly_once(bed, slow + [hang, late])
    assert written[hang][0][3] == other.pid


def test_a_forked_child_does_not_keep_its_killed_parent_alive(bots: Bots, bed: Bed) -> None:
    with FakeBotApi() as fake:
        other = bots.spawn(fake, bed.url, bed.table, bed.domain, *DEFAULTS)
        bots.wait_ready(other)
        hang = fake.inject_message(chat_id=9, text="hang")
        parent = bots.spawn(fake, bed.url, bed.table, bed.domain, "--poll", *DEFAULTS,
                            "--hang", "hang", "--fork-child")
        bots.wait_ready(parent)
        with open(os.path.join(bots.dir, f"child.{parent.pid}"), encoding="utf-8") as file:
            child = int(file.read())
        try:
            wait_sync("the hung handler to start", lambda: parent.pid in bots.started(hang), 20)
            bots.kill(parent)
            killed = time.monotonic()
            os.kill(child, 0)  # the child lives on
            _all_handled(bots, bed, [hang], TAKEOVER_BOUND, "the other process takes over")
            took = time.monotonic() - killed
            assert took < TAKEOVER_BOUND, took
            os.kill(child, 0)
        finally:
            _kill(child)
        bots.stop_all()
    written = _exactly_once(bed, [hang])
    assert written[hang][0][3] == other.pid


def test_a_forked_child_does_not_keep_its_killed_parents_transaction_open(
    bots: Bots, bed: Bed
) -> None:
    """The handler forks the child inside its open fenced transaction (a helper started from
    a handler), then the parent is SIGKILLed with the transaction still open (the update's row
    locked by it): the child's copy of that connection must not keep the transaction and its
    row lock alive, or the update could be neither taken over nor claimed after its lease
    while the child lives."""
    with FakeBotApi() as fake:
        other = bots.spawn(fake, bed.url, bed.table, bed.domain, *DEFAULTS)
        bots.wait_ready(other)
        parent = bots.spawn(fake, bed.url, bed.table, bed.domain, "--poll", *DEFAULTS,
                            "--txn", "txn", "--txn-seconds", "3600", "--fork-in-txn")
        bots.wait_ready(parent)
        update = fake.inject_message(chat_id=9, text="txn")
        wait_sync("the fenced transaction to be open",
                  lambda: os.path.exists(os.path.join(bots.dir, f"in_txn.{update}.{parent.pid}")),
                  20)
        with open(os.path.join(bots.dir, f"child.{parent.pid}"), encoding="utf-8") as file:
            child = int(file.read())
        try:
            bots.kill(parent)
            killed = time.monotonic()
            os.kill(child, 0)  # the child lives on
            _all_handled(bots, bed, [update], TAKEOVER_BOUND, "the other process takes over")
            took = time.monotonic() - killed
            assert took < TAKEOVER_BOUND, took
            os.kill(child, 0)
        finally:
            _kill(child)
        bots.stop_all()
    written = _exactly_once(bed, [update])
    assert written[update][0][3] == other.pid


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    # not our child (the killed worker's): init reaps it
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)

