"""Broadcasts across real processes. 20,000 recipients against a fake Bot API limited to 600
messages a second, two sender processes on one database, one of them SIGKILLed mid-run and
started again. Three senders and a bot-wide flood hold. A pause across a restart.

Each recipient gets the message, a recipient twice only from the send window of the killed
process (at most one claimed page), no request is answered 429 and none goes inside a hold.
The rate the senders keep while both run is printed: its target lives in the benchmarks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any, Iterator, List

import pytest

from ptb_fence.runtime._broadcasts import PAGE
from ptb_fence.testing import FakeBotApi, RateLimits
from ptb_support import wait_sync
from recovery_support import Bed, make_bed

pytestmark = pytest.mark.timeout(240)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "broadcast_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPIENTS = 20_000
LIMIT = 600


@pytest.fixture(params=["sqlite", "postgres"])
def bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    yield from make_bed(request, tmp_path)


class Senders:
    """Broadcast worker processes, none outliving the test."""

    def __init__(self, directory: str, fake: FakeBotApi, bed: Bed) -> None:
        self.dir, self.fake, self.bed = directory, fake, bed
        self.procs: List[Any] = []

    def spawn(self, *extra: str) -> Any:
        out = open(os.path.join(self.dir, f"out.{len(self.procs)}"), "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, WORKER, self.fake.base_url, self.fake.token, self.bed.url,
             self.bed.table, "--dir", self.dir, "--per-second", str(LIMIT), *extra],
            env={**os.environ, "PYTHONPATH": ROOT},
            stdout=out, stderr=subprocess.STDOUT)
        out.close()
        self.procs.append(proc)
        wait_sync(f"sender {proc.pid} ready", lambda: os.path.exists(
            os.path.join(self.dir, f"ready.{proc.pid}")) or proc.poll() is not None, 60)
        assert proc.poll() is None, self.output()
        return proc

    def output(self) -> str:
        return "\n".join(open(os.path.join(self.dir, f"out.{i}"), encoding="utf-8",
                              errors="replace").read() for i in range(len(self.procs)))

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def reached(fake: FakeBotApi, text: str = "big") -> Counter[int]:
    """How often each chat got ``text``."""
    return Counter(int(m["chat_id"]) for m in fake.sent_messages if m.get("text") == text)


def test_a_sigkilled_sender_loses_no_recipient_and_the_pace_holds(bed: Bed,
                                                                  tmp_path: Any) -> None:
    limits = RateLimits(global_limit=LIMIT, hold_grace_seconds=0.3)
    with FakeBotApi(rate_limits=limits) as fake:
        senders = Senders(str(tmp_path), fake, bed)
        try:
            first = senders.spawn("--start", f"big:{RECIPIENTS}")
            senders.spawn()
            wait_sync("a quarter sent", lambda: len(fake.sent_messages) >= RECIPIENTS // 4, 120)
            busy = fake.sent_times()
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            killed_at = len(fake.sent_messages)
            senders.spawn()
            wait_sync("every recipient reached", lambda: len(reached(fake)) == RECIPIENTS, 180)
            time.sleep(1.0)  # nothing more may come
        finally:
            senders.close()
        copies = reached(fake)
        duplicates = sum(n - 1 for n in copies.values())
        # both senders at work, from the first 50 sends to the kill
        stretch = busy[50:]
        rate = (len(stretch) - 1) / (stretch[-1] - stretch[0])
        print(f"\n[{bed.url.split(':')[0]}] {RECIPIENTS} recipients, SIGKILL after "
              f"{killed_at} sends: {duplicates} duplicate(s), {rate:.0f}/s while both sent "
              f"({rate / LIMIT:.0%} of {LIMIT}/s), {fake.rate_limited} answered 429, "
              f"{fake.requests_in_hold} inside a hold")
    assert sorted(copies) == list(range(1, RECIPIENTS + 1))  # nobody lost
    assert duplicates <= PAGE  # only the killed sender's page in flight
    assert fake.requests_in_hold == 0 and fake.rate_limited == 0


def test_three_senders_send_nothing_inside_a_flood_hold(bed: Bed, tmp_path: Any) -> None:
    """Three sender processes share one broadcast. Telegram answers one of them with a
    bot-wide 429 ``retry_after=5``: no process sends inside the hold (past a grace of 0.3 s
    for requests already on their way), and every recipient gets the message once."""
    limits = RateLimits(global_limit=300, hold_grace_seconds=0.3)
    with FakeBotApi(rate_limits=limits) as fake:
        senders = Senders(str(tmp_path), fake, bed)
        try:
            senders.spawn("--start", "big:3000", "--per-second", "300")
            senders.spawn("--per-second", "300")
            senders.spawn("--per-second", "300")
            wait_sync("500 sent", lambda: len(fake.sent_messages) >= 500, 60)
            fake.flood(retry_after=5)
            wait_sync("the flood answered", lambda: fake.rate_limited >= 1, 30)
            wait_sync("every recipient reached", lambda: len(reached(fake)) == 3000, 120)
        finally:
            senders.close()
        assert fake.requests_in_hold == 0
        # the answer that began the hold, and the requests the other senders sent before they
        # read the hold (they read it every 50 ms): inside the grace, sent again after it
        assert fake.rate_limited >= 1
        assert set(reached(fake).values()) == {1}


def test_a_paused_broadcast_stays_paused_across_a_restart_and_resume_sends_the_rest(
    bed: Bed, tmp_path: Any, capsys: Any
) -> None:
    """An operator pauses a broadcast with the command line, the bot is restarted (SIGTERM, a
    new process), nothing is sent while paused, and a resume sends exactly the rest."""
    from ptb_fence.cli import main

    store = ["--store", bed.url, "--table", bed.table]
    with FakeBotApi() as fake:
        senders = Senders(str(tmp_path), fake, bed)
        try:
            first = senders.spawn("--start", "news:2000", "--per-second", "200")
            wait_sync("300 sent", lambda: len(reached(fake, "news")) >= 300, 60)
            assert main([*store, "broadcast", "pause", "news"]) == 0
            time.sleep(1.0)  # the sends the sender held already go out
            at_pause = len(fake.sent_messages)
            first.send_signal(signal.SIGTERM)
            first.wait(30)
            senders.spawn("--per-second", "200")
            time.sleep(2.0)
            assert len(fake.sent_messages) == at_pause  # nothing while paused
            assert main([*store, "broadcast", "resume", "news"]) == 0
            wait_sync("every recipient reached", lambda: len(reached(fake, "news")) == 2000, 60)
            time.sleep(0.5)
        finally:
            senders.close()
        capsys.readouterr()
        assert at_pause < 2000
        assert set(reached(fake, "news").values()) == {1}
