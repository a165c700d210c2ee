"""UpdateIntake's workers that start together claim together (one ``commit`` of claims, one
statement and one commit per group), so a recorded backlog is claimed in groups, not one commit
per update; every update is still handled exactly once. (Workers that start at different times,
e.g. after handlers of different lengths, still claim one by one: a group holds the claims that
arrive while the previous group is in the store.)

A real UpdateIntake over a real SQLite file and a real PostgreSQL table, behind a wrapper that
counts the store's calls (each write method is one transaction in the shipped SQL stores).
Before grouping: one ``claim_owned`` call (one commit) per update (120 here).

What grouping guarantees is that a claim submitted while another is in the store joins the next
group; how many claims overlap a store call on their own depends on thread scheduling: measured
with no hold (below), PostgreSQL 29-41 claim commits of 120; SQLite 64-79 on Python 3.11 and
29-43 on 3.13, but 104-117 on 3.10, whose workers released together by the barrier run one at
a time (a worker woken by the barrier does not get the GIL during a ~0.1 ms SQLite call of the
running one), and more under load. So the test keeps each claim in the store until the workers that are
to claim with it have submitted theirs, and bounds what the mechanism then guarantees.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from store_support import new_store
from counting_store import CountingStore
from ptb_fence import UpdateIntake
from ptb_fence.blocking import _intake
from ptb_fence.blocking._group_commit import ThreadGroupCommit
from runtime_support import body

BACKLOG = 120
MAX_CONCURRENT = 8


@pytest.fixture(params=["sqlite", "postgres"])
def inner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """An empty real store (closed after the test)."""
    store: Any = new_store(request.param, request, str(tmp_path / "updates.db"))
    yield store
    store.close()


class Waves:
    """Where the workers are, for holding a claim in the store until its wave has submitted.

    ``claiming``: workers inside the intake's claim group commit (submitted, not returned);
    ``at_barrier``: workers waiting in their handler for the rest of their wave (not released
    yet); ``unclaimed``: updates no claim has taken yet.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.claiming = 0
        self.at_barrier = 0
        self.unclaimed = BACKLOG
        self.timed_out = False

    def change(self, **deltas: int) -> None:
        with self.cond:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)
            self.cond.notify_all()

    def hold(self) -> None:
        """Return once every worker not waiting at the barrier has submitted its claim (or
        every unclaimed update is being claimed)."""

        def wave_submitted() -> bool:
            return (
                self.claiming + self.at_barrier >= MAX_CONCURRENT
                or self.claiming >= self.unclaimed
            )

        with self.cond:
            if self.timed_out:
                return  # reported by the test; do not wait again
            if not self.cond.wait_for(wave_submitted, timeout=20):
                self.timed_out = True


class HeldClaims(CountingStore):
    """Counts the store's calls; a claim call waits (before reaching the store) until its wave
    of workers has submitted its claims, so they are in the claim group commit meanwhile."""

    def __init__(self, inner: Any, waves: Waves) -> None:
        super().__init__(inner)
        self.waves = waves

    def __getattr__(self, name: str) -> Any:
        counted = super().__getattr__(name)
        if name not in ("claim_owned", "commit"):
            return counted

        def held(*args: Any, **kwargs: Any) -> Any:
            if name == "commit" and not args[0].claims:
                return counted(*args, **kwargs)
            self.waves.hold()
            result = counted(*args, **kwargs)
            if name == "commit":
                taken = list(result.claims)
            else:
                taken = [result] if name == "claim_owned" else list(result)
            self.waves.change(unclaimed=-sum(identity is not None for identity in taken))
            return result

        return held


def test_a_recorded_backlog_is_claimed_in_groups_and_handled_once(
    inner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    hour_ago = int(time.time() * 1000) - 3_600_000  # an outage: received long ago
    for update_id in range(1, BACKLOG + 1):
        assert inner.add(update_id, body(update_id), hour_ago)
    waves = Waves()
    store = HeldClaims(inner, waves)

    claims: List[Any] = []  # the intake's claim group commit (its others are not counted)

    class CountedClaims(ThreadGroupCommit[Any, Any]):
        """The intake's group commits; the claims' one counts the workers inside it."""

        def submit(self, item: Any) -> Any:
            if self not in claims:
                return super().submit(item)
            waves.change(claiming=1)
            try:
                return super().submit(item)
            finally:
                waves.change(claiming=-1)

    monkeypatch.setattr(_intake, "ThreadGroupCommit", CountedClaims)
    handled: "Counter[int]" = Counter()
    running = [0, 0]  # now, most
    lock = threading.Lock()

    # the workers finish together, so they start (and claim) together: a no-op handler under
    # load, or a batch of slow handlers ending at once
    # (its action, run once all have arrived, counts them released: a released worker may get
    # to run only after another one's next claim)
    together = threading.Barrier(
        MAX_CONCURRENT, action=lambda: waves.change(at_barrier=-MAX_CONCURRENT), timeout=20
    )

    def handle(update: Any, attempt: Any) -> None:
        waves.change(at_barrier=1)
        together.wait()
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        with attempt.transaction(complete=True):  # a fenced write of nothing but the completion
            pass
        with lock:
            running[0] -= 1
            handled[update["update_id"]] += 1

    intake = UpdateIntake(
        store, handle_attempt=handle, max_concurrent=MAX_CONCURRENT, sweep_every_seconds=60
    )
    assert isinstance(intake._claims, CountedClaims)  # the hold below sees the workers
    claims.append(intake._claims)
    intake.start()  # its first sweep hands the backlog to the workers
    try:
        deadline = time.monotonic() + 60
        while len(handled) < BACKLOG and time.monotonic() < deadline:
            time.sleep(0.02)
        assert intake.idle(10)
    finally:
        intake.close()
    assert not waves.timed_out, "a wave of workers never submitted its claims"
    assert sorted(handled) == list(range(1, BACKLOG + 1))
    assert set(handled.values()) == {1}  # each exactly once
    assert running[1] <= MAX_CONCURRENT
    # The barrier cuts the backlog into waves of MAX_CONCURRENT: no worker claims its next
    # update before the whole wave has claimed and started. A wave's first claim call (the
    # claims submitted before it left: one or more) stays in the store until the others of the
    # wave are waiting, so they all go in the next call: at most 2 claim commits per wave, and
    # one of them holds at least half the wave (a commit of claims, not claim_owned).
    waves_count = BACKLOG // MAX_CONCURRENT
    claims = store.calls["claim_owned"] + store.calls["commit_claims"]
    assert claims <= 2 * waves_count, dict(store.calls)  # 30 of 120
    assert store.calls["commit_claims"] >= waves_count, dict(store.calls)
    assert inner.due(now=2**62, pending_before=2**62, limit=10) == []  # nothing left over
