"""A dead process's claims are taken over in seconds; a frozen one's are not.

Real bot processes of both front ends (tests/processes/ptb_bot_worker.py: PTB ``Application``;
tests/processes/intake_worker.py: blocking ``UpdateIntake`` fed by a getUpdates thread) against a
FakeBotApi on SQLite and PostgreSQL, with the library's default lease (120 s) where the bound is "seconds": only the
store's liveness check (``take_over_dead``: the dead process's advisory lock or file lock is
gone) can meet it. A SIGSTOPped process is alive: its claims wait for their (short) lease, and
its late fenced write is refused. One fenced domain row per update throughout.
"""

from __future__ import annotations

import signal
import time
from typing import Any, List

from ptb_fence.testing import FakeBotApi
from ptb_support import wait_sync
from recovery_support import (  # noqa: F401
    DEFAULTS, STOP_TIMEOUT, Bed, _all_handled, _exactly_once, _freeze_between_transactions, _stop, bed, bots)
from test_ptb_processes import Bots

TAKEOVER_BOUND = 20.0
"""Seconds from SIGKILL until every update is handled, asserted. The goal is 5 s (met
with room on an idle machine: 2.7-4.4 s in benchmarks/recovery.py); 20 s keeps the test stable
on a loaded 2-core machine and still fails by far with the old behaviour (the 120 s lease)."""


def _recorded(bed: Bed, ids: List[int]) -> bool:
    states = bed.states()
    return all(u in states for u in ids)


def test_sigkill_then_immediate_restart_takes_over_at_once(bots: Bots, bed: Bed) -> None:
    with FakeBotApi() as fake:
        hang = fake.inject_message(chat_id=9, text="hang")
        ids = [hang] + [fake.inject_message(chat_id=1 + i % 4, text=f"m{i}") for i in range(12)]
        ids += [fake.inject_message(chat_id=9, text=f"q{i}") for i in range(5)]
        first = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *DEFAULTS,
                           "--hang", "hang")
        bots.wait_ready(first)
        wait_sync("the hung handler to start", lambda: first.pid in bots.started(hang), 20)
        wait_sync("every update recorded", lambda: _recorded(bed, ids), 10)
        bots.kill(first)
        killed = time.monotonic()
        second = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *DEFAULTS)
        _all_handled(bots, bed, ids, TAKEOVER_BOUND, "the restarted process handles everything")
        took = time.monotonic() - killed
        assert took < TAKEOVER_BOUND, took  # process start-up included
        _stop(bots, second, signal.SIGTERM, STOP_TIMEOUT + 5)
    written = _exactly_once(bed, ids)
    assert written[hang][0][3] == second.pid


def test_sigkill_of_the_poller_a_second_process_takes_over_within_seconds(bots: Bots, bed: Bed) -> None:
    with FakeBotApi() as fake:
        worker = bots.spawn(fake, bed.url, bed.table, bed.domain, *DEFAULTS)
        bots.wait_ready(worker)
        hang = fake.inject_message(chat_id=9, text="hang")
        ids = [hang] + [fake.inject_message(chat_id=1 + i % 4, text=f"m{i}") for i in range(12)]
        ids += [fake.inject_message(chat_id=9, text=f"q{i}") for i in range(5)]
        poller = bots.spawn(fake, bed.url, bed.table, bed.domain, "--poll", *DEFAULTS, "--hang", "hang")
        bots.wait_ready(poller)
        wait_sync("the hung handler to start", lambda: poller.pid in bots.started(hang), 20)
        wait_sync("every update recorded", lambda: _recorded(bed, ids), 10)
        bots.kill(poller)
        killed = time.monotonic()
        _all_handled(bots, bed, ids, TAKEOVER_BOUND, "the running process takes over")
        took = time.monotonic() - killed
        assert took < TAKEOVER_BOUND, took
        bots.stop_all()
    written = _exactly_once(bed, ids)
    assert written[hang][0][3] == worker.pid


def test_a_frozen_process_is_not_taken_over_before_its_lease(bots: Bots, bed: Bed) -> None:
    lease = 4.0
    short = ("--lease", str(lease), "--sweep", "0.2", "--grace", "0.5")
    with FakeBotApi() as fake:
        worker = bots.spawn(fake, bed.url, bed.table, bed.domain, *short)
        bots.wait_ready(worker)
        slow = fake.inject_message(chat_id=9, text="slow")
        poller = bots.spawn(fake, bed.url, bed.table, bed.domain, "--poll", *short,
                            "--slow", "slow", "--slow-seconds", "3.0")
        bots.wait_ready(poller)
        wait_sync("the slow handler to start", lambda: poller.pid in bots.started(slow), 20)
        # frozen in the handler's sleep, never inside one of its transactions (whose row locks
        # nobody could take over while it is frozen); the sleep (3 s) ends within the freeze
        # (at least lease * 0.6 + the takeover), so the thawed handler's fenced write is late
        _freeze_between_transactions(poller, bed)
        frozen = time.monotonic()
        try:
            # alive (its liveness signal is held), so nobody takes it over before the lease
            while time.monotonic() - frozen < lease * 0.6:
                assert bed.states()[slow] == "processing"
                assert worker.pid not in bots.started(slow)
                time.sleep(0.1)
            _all_handled(bots, bed, [slow], lease + 15, "the lease lapses and the worker takes over")
            assert time.monotonic() - frozen >= lease * 0.6
        finally:
            poller.send_signal(signal.SIGCONT)
        time.sleep(2.0)  # the thawed handler finishes its sleep and tries its fenced write
        bots.stop_all()
    written = _exactly_once(bed, [slow])
    assert written[slow][0][3] == worker.pid  # the frozen holder's late write was refused
