"""A handler that hangs inside its open fenced transaction is retried and exhausted per policy.

``attempt_timeout_seconds`` fails such an attempt, but its transaction (on the store's own
PostgreSQL connection) keeps the update's row locked for as long as the handler hangs: no
failure can be recorded, no other claim can take the row, and the update would stay
``processing`` forever. The timeout waits for the transaction (at most ``lease_seconds``: a
commit then still completes the attempt), then ends it (the connection is cut, the server rolls
back) and settles the attempt as failed.

Real bot processes of both front ends (tests/processes/ptb_bot_worker.py under
``run_polling()``, whose ``run_in_transaction`` function sleeps on a store thread, and
tests/processes/intake_worker.py, whose ``attempt.transaction`` block sleeps on its worker
thread) on PostgreSQL; the fenced transaction stays open for 10 minutes on every attempt.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Iterator, List

import pytest

from ptb_fence.testing import FakeBotApi
from recovery_support import (  # noqa: F401 - fixtures
    Bed, _all_handled, _exactly_once, _stop, bots, make_bed,
)
from ptb_support import wait_sync
from test_ptb_processes import Bots


@pytest.fixture(params=["postgres"])
def bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    """The PostgreSQL store of tests/processes/recovery_support.py."""
    yield from make_bed(request, tmp_path)


def _log(bots: Bots, pid: int) -> List[str]:
    with open(os.path.join(bots.dir, f"log.{pid}"), encoding="utf-8") as file:
        return file.read().splitlines()


def test_a_handler_hung_inside_its_fenced_transaction_is_retried_then_exhausted(
    bots: Bots, bed: Bed
) -> None:
    with FakeBotApi() as fake:
        hung = fake.inject_message(chat_id=1, text="txn")
        others = [fake.inject_message(chat_id=10 + i, text=f"m{i}") for i in range(4)]
        bot = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling",
                         "--txn", "txn", "--txn-seconds", "600", "--attempt-timeout", "0.5",
                         "--max-attempts", "2", "--lease", "2", "--sweep", "0.2",
                         "--grace", "0.3", "--retry", "0.1", "--max-concurrent", "2",
                         "--stop-timeout", "1")
        bots.wait_ready(bot)
        _all_handled(bots, bed, others, 30, "the other chats handled")
        # each attempt: the timeout (0.5 s), the wait for its transaction (the 2 s lease), then
        # the transaction is ended and the failure recorded
        wait_sync("the hung update exhausted after 2 attempts",
                  lambda: bed.states().get(hung) == "abandoned", 40)
        lines = _log(bots, bot.pid)
        failed = [line for line in lines if f"update {hung} attempt" in line and " failed (" in line]
        assert [("attempt 1" in failed[0], "attempt 2" in failed[1])] == [(True, True)], lines
        assert "retry scheduled" in failed[0] and "(abandoned)" in failed[1], failed
        assert all("AttemptTimeout" in line for line in failed), failed
        ended = [line for line in lines if "fenced transaction" in line and "ended it" in line]
        assert len(ended) == 2, "\n".join(lines)
        assert bed.query(f"SELECT attempts FROM {bed.table} WHERE update_id = {hung}") == [(2,)]
        _stop(bots, bot, signal.SIGTERM, 1 + 10)
    written = _exactly_once(bed, others)  # the hung attempts' inserts were rolled back
    assert hung not in written
