"""SIGTERM under ``run_polling()`` handles the updates already in the queue before the process
exits, as PTB's ``Application.stop()`` promises ("after processing any pending updates").

A real bot process (tests/processes/ptb_bot_worker.py ``--run-polling``, PTB's own signal
handling) against a FakeBotApi in this process, on a SQLite file and on the real PostgreSQL:
one getUpdates batch of 8 updates over 8 chats, ``max_concurrent=1``, each handler 0.4 s, so most
of them still wait in the queue when SIGTERM comes. They are all handled by that process within
``stop_timeout_seconds`` (nothing released, nothing left to the next start); with a stop timeout
too short for the queue, what is left is released and the next process handles it at once.
"""

from __future__ import annotations

import os
import signal
from typing import List

import pytest

from ptb_fence.testing import FakeBotApi
from ptb_support import wait_sync
from recovery_support import (  # noqa: F401 - fixture
    DEFAULTS, Bed, _all_handled, _exactly_once, _nothing_leased, _stop, bed,
)
from test_ptb_processes import Bots, bots  # noqa: F401 - fixture


def _log(bots: Bots, pid: int) -> List[str]:
    with open(os.path.join(bots.dir, f"log.{pid}"), encoding="utf-8") as file:
        return file.read().splitlines()


@pytest.mark.parametrize("stop_timeout", [30.0, 1.0])
def test_sigterm_handles_the_queued_updates_within_the_stop_timeout(
    bots: Bots, bed: Bed, stop_timeout: float  # noqa: F811 - fixtures
) -> None:
    with FakeBotApi() as fake:
        ids = [fake.inject_message(chat_id=1 + i, text="slow") for i in range(8)]
        first = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *DEFAULTS,
                           "--max-concurrent", "1", "--slow", "slow", "--slow-seconds", "0.4",
                           "--stop-timeout", str(stop_timeout))
        bots.wait_ready(first)
        wait_sync("the first handler running",
                  lambda: any(first.pid in bots.started(u) for u in ids), 20)
        took = _stop(bots, first, signal.SIGTERM, min(stop_timeout, 8 * 0.4) + 10)
        assert first.returncode == 0, bots.output()
        handled_here = sorted(u for u in ids if first.pid in bots.started(u))
        states = bed.states()
        _nothing_leased(bots, bed)  # handled or released: nothing waits for the 120 s lease
        lines = _log(bots, first.pid)
        if stop_timeout == 30.0:
            # every queued update was handled before the process exited
            assert all(states[u] == "completed" for u in ids), (states, "\n".join(lines))
            assert handled_here == ids
            assert not any("released" in line for line in lines), "\n".join(lines)
        else:
            assert len(handled_here) < len(ids), handled_here  # the deadline came first
            second = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *DEFAULTS)
            bots.wait_ready(second)
            _all_handled(bots, bed, ids, 20, "the released updates handled at once")
            _stop(bots, second, signal.SIGTERM, 15)
        print(f"stop_timeout_seconds={stop_timeout:g}: SIGTERM to exit {took:.2f} s, "
              f"{len(handled_here)} of {len(ids)} handled by the stopped process")
    _exactly_once(bed, ids)
