"""A PTB handler that defers its cancellation (its cleanup swallows every ``CancelledError`` for
a minute) is bounded all the same:

- ``attempt_timeout_seconds``: once it passes (plus the short grace a cancelled handler gets to
  end), the attempt is failed with ``AttemptTimeout`` and its lease no longer renewed, although
  the handler's task runs on; the chat's next update goes on and the update is retried.
- SIGTERM under ``run_polling()``: the process exits within ``stop_timeout_seconds`` plus that
  grace (and the store calls of the stop), whatever the task does; a second process handles the
  released update.

Real bot processes (tests/processes/ptb_bot_worker.py ``--run-polling``, PTB's own signal handling)
against a FakeBotApi in this process, on a SQLite file and on the real PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from ptb_fence.testing import FakeBotApi
from ptb_support import wait_sync
from recovery_support import Bed, _all_handled, _exactly_once, _stop, bed  # noqa: F401 - fixture
from test_ptb_processes import Bots, bots  # noqa: F401 - fixture

STUBBORN = ("--stubborn", "slow", "--stubborn-seconds", "60")


def _cancelled(bots: Bots, update_id: int) -> bool:
    return os.path.exists(os.path.join(bots.dir, f"cancelled.{update_id}"))


def test_a_handler_deferring_its_cancellation_is_failed_at_the_attempt_timeout(
    bots: Bots, bed: Bed  # noqa: F811 - fixtures
) -> None:
    with FakeBotApi() as fake:
        slow = fake.inject_message(chat_id=1, text="slow")
        after = fake.inject_message(chat_id=1, text="after it, same chat")
        other = fake.inject_message(chat_id=2, text="another chat")
        bot = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *STUBBORN,
                         "--attempt-timeout", "1", "--lease", "2", "--retry", "0.1")
        bots.wait_ready(bot)
        wait_sync("the stubborn handler started", lambda: bot.pid in bots.started(slow), 20)
        began = time.monotonic()
        # the handler's task swallows the cancellation and runs on for a minute; its attempt is
        # failed all the same, the chat goes on and the retry (no longer stubborn) completes
        _all_handled(bots, bed, [slow, after, other], 20, "every update completed")
        took = time.monotonic() - began
        assert _cancelled(bots, slow)
        written = _exactly_once(bed, [slow, after, other])
        assert written[slow][0][1] == 2  # the retry wrote it; the stubborn attempt 1 nothing
        log = bots.output()
        assert f"update {slow} attempt 1 failed" in log and "AttemptTimeout" in log, log
        assert "still runs" in log and "ignored its cancellation" in log, log
        print(f"chat went on {took:.2f} s after the stubborn handler started")
        assert took < 12, took
        seconds = _stop(bots, bot, signal.SIGTERM, 15)
        assert bot.returncode == 0, bots.output()
        print(f"SIGTERM to exit with the stubborn task still running: {seconds:.2f} s")


def test_sigterm_with_a_handler_deferring_its_cancellation_exits_within_the_stop_timeout(
    bots: Bots, bed: Bed  # noqa: F811 - fixtures
) -> None:
    with FakeBotApi() as fake:
        slow = fake.inject_message(chat_id=1, text="slow")
        first = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *STUBBORN,
                           "--stop-timeout", "1", "--lease", "30")
        bots.wait_ready(first)
        wait_sync("the stubborn handler started", lambda: first.pid in bots.started(slow), 20)
        seconds = _stop(bots, first, signal.SIGTERM, 30)
        print(f"SIGTERM to exit, stop_timeout_seconds=1, handler ignoring cancellation: {seconds:.2f} s")
        assert first.returncode == 0, bots.output()
        assert _cancelled(bots, slow)
        # stop_timeout_seconds (1 s) + the cancelled handler's grace (1 s) + stop and shutdown
        assert seconds < 6, f"{seconds:.2f} s\n{bots.output()}"
        # released, not left to its 30 s lease: a second process handles it at once
        second = bots.spawn(fake, bed.url, bed.table, bed.domain, "--poll", *STUBBORN, "--lease", "30")
        bots.wait_ready(second)
        _all_handled(bots, bed, [slow], 15, "the released update handled by the second process")
        _exactly_once(bed, [slow])
        bots.stop_all()
