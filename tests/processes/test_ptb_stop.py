"""``Application.stop()`` (and SIGTERM under ``run_polling``) ends in bounded
time even when the sweep finds a due retry while the Application is stopping.

A real bot process (tests/processes/ptb_bot_worker.py ``--run-polling``) against a FakeBotApi in
this process: one update fails its first attempt (retry after 0.5 s), another handler takes 3 s;
SIGTERM arrives while the slow one runs, so the retry falls due during ``stop()``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

from ptb_fence import SQLiteUpdateStore
from ptb_fence.testing import FakeBotApi
from ptb_support import DOMAIN_DDL, rows, wait_sync
from test_ptb_processes import Bots, _by_update, _sqlite_domain, bots  # noqa: F401 - fixture


def test_sigterm_during_a_due_retry_exits_in_bounded_time_and_loses_nothing(
    tmp_path: Any, bots: Bots  # noqa: F811 - the fixture
) -> None:
    path = str(tmp_path / "bot.db")
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute(DOMAIN_DDL)
    store.close()
    url = "sqlite:///" + path
    options = ("--retry", "0.5", "--slow", "slow", "--slow-seconds", "3", "--fail-once", "fail",
               "--sweep", "0.05", "--lease", "5")
    with FakeBotApi() as fake:
        slow = fake.inject_message(chat_id=1, text="slow")
        fail = fake.inject_message(chat_id=2, text="fail")
        ids = [slow, fail] + [fake.inject_message(chat_id=3, text=f"m{i}") for i in range(3)]
        first = bots.spawn(fake, url, "telegram_updates", "domain", "--run-polling", *options)
        bots.wait_ready(first)
        wait_sync(
            "the slow handler running and the failing one failed once",
            lambda: first.pid in bots.started(slow)
            and rows(path).get(fail, ("",))[0] == "failed",
            15,
        )
        first.send_signal(signal.SIGTERM)
        began = time.monotonic()
        try:
            first.wait(15)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SIGTERM did not end the bot within 15 s\n{bots.output()}") from None
        assert time.monotonic() - began < 15
        assert first.returncode == 0, bots.output()

        second = bots.spawn(fake, url, "telegram_updates", "domain", "--poll", *options)
        bots.wait_ready(second)

        def done() -> bool:
            table = rows(path)
            return set(table) >= set(ids) and all(table[u][0] == "completed" for u in ids)

        try:
            wait_sync("every update completed after the restart", done, 25)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{rows(path)}\n{bots.output()}") from None
        bots.stop_all()
        assert second.returncode == 0, bots.output()
    domain = _by_update(_sqlite_domain(path))
    assert set(domain) == set(ids)
    assert all(len(v) == 1 for v in domain.values()), domain  # handled once each
    assert os.path.exists(path)
