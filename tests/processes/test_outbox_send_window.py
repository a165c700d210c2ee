"""The send window under an open transaction: real PTB bot processes
(tests/processes/outbox_worker.py) against :class:`ptb_fence.testing.FakeBotApi`, real SQLite
and PostgreSQL.

A duplicate reply is possible only when a sender dies between Telegram's answer and the
record of the call. Here another chat's fenced transaction stays open (on SQLite it holds the
database's write lock) while Telegram answers eight replies at once: the time from the answers
to each call reading ``sent`` is measured, then the bot is SIGKILLed with the transaction
still open, and another process takes over. No reply may arrive twice.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List

from ptb_fence.testing import FakeBotApi
from ptb_support import wait_sync
from recovery_support import Bed
from test_outbox_processes import (  # noqa: F401 - fixtures
    bed,
    bots,
    outbox_rows,
    quiet,
    replies_by_update,
    spawn,
    stop,
    wait_all_sent,
)
from test_ptb_processes import Bots
from worker_support import make_store

WINDOW_BOUND_SECONDS = 0.5
"""The longest time allowed from Telegram's answers to the calls reading ``sent``, as seen by
a reader polling every 10 ms on a shared machine (the record itself: the answer plus at most
the 0.1 s grouping window on PostgreSQL, plus one journal commit on SQLite)."""


def test_a_sent_call_is_recorded_at_once_while_another_chats_transaction_is_open(
    bed: Bed, bots: Bots, capsys: Any,
) -> None:
    """Eight replies are in flight (FakeBotApi holds them) when chat 3100's handler opens a
    fenced transaction and sleeps 10 s in it. Telegram answers the eight; each must read
    ``sent`` within the bound. The bot is then SIGKILLed (the transaction dies with it)
    and a process started beforehand takes over: the eight are not sent again; chat 3100's
    update runs again and its reply goes out once."""
    store = make_store(bed.url, bed.table)
    try:
        with FakeBotApi() as fake:
            fake.hold("sendMessage")
            sender = spawn(bots, fake, bed, "--poll", "--lease", "30", "--slow-seconds", "10")
            other = spawn(bots, fake, bed, "--lease", "30", "--sweep", "30")
            ids = [fake.inject_message(chat_id=3000 + i, text="plain") for i in range(8)]

            def in_flight() -> bool:
                states = bed.states()
                return (len(fake.calls_to("sendMessage")) >= 8
                        and all(states.get(u) == "completed" for u in ids))

            wait_sync("every update completed and eight requests in flight", in_flight, 60)
            holder = fake.inject_message(chat_id=3100, text="hold")
            wait_sync("chat 3100's transaction open", lambda: os.path.exists(
                os.path.join(bots.dir, f"holding.{holder}.{sender.pid}")), 30)
            answered = time.monotonic()
            fake.release("sendMessage")  # Telegram answers the eight
            recorded: Dict[int, float] = {}
            deadline = answered + 3.0
            while len(recorded) < 8 and time.monotonic() < deadline:
                for entry in store.list_calls(state="sent", limit=100):
                    if entry.update_id in ids and entry.update_id not in recorded:
                        recorded[entry.update_id] = time.monotonic() - answered
                time.sleep(0.01)
            open_still = os.path.exists(os.path.join(bots.dir, f"holding.{holder}.{sender.pid}"))
            bots.kill(sender)  # the transaction is still open (10 s)
            killed_after = time.monotonic() - answered
            wait_all_sent(bots, bed, ids + [holder], 60)
            quiet(fake)
            stop(bots, other)
            copies = {u: len(r) for u, r in replies_by_update(fake).items()}
    finally:
        store.close()
    windows: List[float] = sorted(recorded.values())
    with capsys.disabled():
        print(f"\n[{bed.url.split(':')[0]}] answer to 'sent' with another chat's transaction "
              f"open, 8 calls: {['%.3f' % w for w in windows]} s (of {len(recorded)} "
              f"recorded); SIGKILL {killed_after:.2f} s after the answers; copies {copies}")
    assert open_still and killed_after < 10.0  # the kill came while the transaction was open
    assert copies == {u: 1 for u in ids + [holder]}, (copies, outbox_rows(bed))
    assert len(recorded) == 8 and max(windows) <= WINDOW_BOUND_SECONDS, windows
