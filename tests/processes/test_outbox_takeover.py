"""A dead sender's outbox calls are taken over with its updates: real PTB bot processes
(tests/processes/outbox_worker.py) against :class:`ptb_fence.testing.FakeBotApi`, real SQLite
and PostgreSQL, a bot SIGKILLed while its replies are claimed for sending.

The dead process is proven dead by the liveness signal the update takeover reads (the SQLite
lock file, the PostgreSQL advisory lock): its calls become claimable then, not when their
sender lease (30 s here, 120 s by default) lapses. Only the calls whose request was in flight
at the kill may reach the user twice.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List

import pytest

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
)
from test_ptb_processes import Bots

TAKEOVER_BOUND_SECONDS = 20.0
"""Seconds from the SIGKILL until every reply is delivered, asserted. The goal is the 5 s of
the updates' takeover (met here: 1.0-1.1 s on SQLite, 3.9-4.9 s on PostgreSQL, whose
liveness needs 3 s without a heartbeat); 20 s keeps the test stable on a loaded 2-core
machine, as tests/processes/test_recovery_takeover.py does, and still fails by far without
the takeover of calls (the 30 s lease, then a sweep up to 30 s later)."""


@pytest.mark.parametrize("taker", ["another", "restarted"])
def test_a_killed_senders_calls_are_sent_by_another_process_within_seconds(
    bed: Bed, bots: Bots, capsys: Any, taker: str,
) -> None:
    """FakeBotApi holds sendMessage: the bot (lease 30 s) has its 8 senders' requests in
    flight and more calls claimed ahead (up to 8) when it is SIGKILLed; 4 later replies of
    those chats wait behind them. Telegram then answers the 8 (they took effect). Another bot
    process that was already running (sweeping every 30 s), or the bot started again at
    once, sends every call within the bound: the 8 in flight a second time, every other
    reply once."""
    with FakeBotApi() as fake:
        fake.hold("sendMessage")
        sender = spawn(bots, fake, bed, "--poll", "--lease", "30")
        other = None
        ids = [fake.inject_message(chat_id=2000 + i, text="plain") for i in range(16)]
        later = [fake.inject_message(chat_id=2000 + i, text="plain") for i in range(4)]
        every = ids + later

        def ready() -> bool:
            states = bed.states()
            return (len(fake.calls_to("sendMessage")) >= 8
                    and all(states.get(u) == "completed" for u in every))

        wait_sync("every update completed and eight requests in flight", ready, 60)
        in_flight = {int(c["text"].split()[1]) for c in fake.calls_to("sendMessage")}
        # the sender also claims calls ahead of its free senders, in groups: how many (up to
        # the 8 more of those chats) depends on timing; the rest wait pending
        sending = [r for r in outbox_rows(bed) if r[5] == "sending"]
        assert len(in_flight) == 8 and len(sending) >= 8, (in_flight, outbox_rows(bed))
        if taker == "another":
            # running before the kill, started once the sender holds every call it can (so
            # that its own sender, which claims what is due, finds nothing to take before)
            other = spawn(bots, fake, bed, "--lease", "30", "--sweep", "30")
        bots.kill(sender)
        killed = time.monotonic()
        fake.release("sendMessage")  # Telegram answers the requests that were in flight
        if other is None:  # the same bot, started again (its start is part of the time)
            other = spawn(bots, fake, bed, "--poll", "--lease", "30", "--sweep", "30")

        expected = {u: 2 if u in in_flight else 1 for u in every}

        def delivered() -> bool:
            got = replies_by_update(fake)
            return all(len(got.get(u, [])) >= n for u, n in expected.items())

        try:
            wait_sync("every reply delivered", delivered, TAKEOVER_BOUND_SECONDS)
        except AssertionError:
            raise AssertionError(
                f"{outbox_rows(bed)}\n{bots.output()[-4000:]}") from None
        took = time.monotonic() - killed
        quiet(fake)
        stop(bots, other)
        got: Dict[int, List[Any]] = replies_by_update(fake)
        copies = {u: len(got.get(u, [])) for u in every}
        assert copies == expected, (copies, in_flight)
        assert all(r[5] == "sent" for r in outbox_rows(bed)), outbox_rows(bed)
    with capsys.disabled():
        print(f"\n[{bed.url.split(':')[0]}] SIGKILL with 8 calls in flight and 8 claimed, "
              f"taken over by {taker} process: every reply delivered {took:.2f} s after the "
              "kill")
    assert took <= TAKEOVER_BOUND_SECONDS, took
