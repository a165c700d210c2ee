"""Durable jobs in real processes: PTB bots (tests/processes/jobs_worker.py, their callbacks in
``__main__``) sharing a SQLite file or a PostgreSQL table, SIGKILLed and restarted, against
FakeBotApi.

What must hold: a reminder scheduled by a committed update fires exactly once (one committed
fenced row, one outbox call), none is lost, and a repeating job declared by every process and
every restart exists once and runs once per period.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from ptb_fence.stores._outbox_sql import outbox_table_name
from ptb_fence.testing import FakeBotApi
from ptb_support import wait_sync
from recovery_support import Bed, make_bed
from test_ptb_processes import Bots
from worker_support import make_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs_worker.py")
SWEEP = 0.5


@pytest.fixture(params=["sqlite", "postgres"])
def bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    for made in make_bed(request, tmp_path):
        made.query(f"CREATE TABLE {made.domain}_fired (tag TEXT, run_id BIGINT, attempt INT, "
                   "claim_id TEXT, pid INT, fired_at BIGINT, due BIGINT)")
        if request.param == "postgres":
            request.getfixturevalue("pg_tables").append(f"{made.domain}_fired")
        yield made


@pytest.fixture
def bots(tmp_path: Any) -> Iterator[Bots]:
    directory = tmp_path / "bots"
    directory.mkdir()
    started = Bots(str(directory), WORKER)
    yield started
    for proc in started.procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def spawn(bots: Bots, fake: FakeBotApi, bed: Bed, *extra: str) -> Any:
    proc = bots.spawn(fake, bed.url, bed.table, bed.domain, "--sweep", str(SWEEP), *extra)
    bots.wait_ready(proc, timeout=60)
    return proc


def fired(bed: Bed) -> List[Tuple[str, int, int, str, int, int, int]]:
    return [tuple(row) for row in bed.query(  # type: ignore[misc]
        f"SELECT tag, run_id, attempt, claim_id, pid, fired_at, due FROM {bed.domain}_fired")]


def completed_claims(bed: Bed) -> Dict[int, str]:
    return {int(u): str(c) for u, c in bed.query(
        f"SELECT update_id, claim_id FROM {bed.table} WHERE state = 'completed'")}  # noqa: S608


def calls(bed: Bed) -> List[Tuple[str, str]]:
    """(state, params) of every outbox call."""
    return [(str(s), str(p)) for s, p in bed.query(
        f'SELECT state, params FROM "{outbox_table_name(bed.table)}"')]  # noqa: S608


def stop(proc: Any) -> None:
    import signal

    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def test_reminders_fire_once_across_two_processes_one_killed_every_ten_seconds(
    bed: Bed, bots: Bots, capsys: Any
) -> None:
    """1,000 reminders due over 60 s, scheduled by the handlers of 1,000 updates. Two
    processes share the store; every ~10 s one of them is SIGKILLed and restarted. Each
    reminder fires once: one committed fenced row, one outbox call, none lost."""
    rng = random.Random(37)
    count, spread = 1000, 60_000
    with FakeBotApi() as fake:
        procs = {"poll": spawn(bots, fake, bed, "--poll"), "sweep": spawn(bots, fake, bed)}
        start = int(time.time() * 1000) + 3000
        dues = {f"t{i}": start + i * spread // count for i in range(count)}
        for i, (tag, due) in enumerate(dues.items()):
            fake.inject_message(chat_id=1 + i % 50, text=f"remind {due} {tag}")
        kills = []
        deadline = time.monotonic() + (start + spread) / 1000 - time.time() + 90
        turn = "poll"
        while time.monotonic() < deadline:
            tags = {row[0] for row in fired(bed)}
            if len(tags) >= count:
                break
            time.sleep(rng.uniform(8, 12) if len(kills) < 6 else 1.0)
            if len(kills) < 6:
                bots.kill(procs[turn])
                kills.append((turn, len({row[0] for row in fired(bed)})))
                procs[turn] = spawn(bots, fake, bed, *(["--poll"] if turn == "poll" else []))
                turn = "sweep" if turn == "poll" else "poll"
        wait_sync("every reminder fired and sent", lambda: len({r[0] for r in fired(bed)}) >= count
                  and not [c for c in calls(bed) if c[0] in ("pending", "sending")], 120)
        for proc in procs.values():
            stop(proc)
        received = [m["text"] for m in fake.sent_messages
                    if str(m.get("text", "")).startswith("reminder ")]
    rows = fired(bed)
    by_tag: Dict[str, List[Any]] = {}
    for row in rows:
        by_tag.setdefault(row[0], []).append(row)
    claims = completed_claims(bed)
    assert set(by_tag) == set(dues)  # none lost
    duplicates = {tag: found for tag, found in by_tag.items() if len(found) != 1}
    assert not duplicates, dict(list(duplicates.items())[:10])  # each fired once
    assert all(claims.get(found[0][1]) == found[0][3] for found in by_tag.values())
    sent_calls = [params for state, params in calls(bed) if "reminder" in params]
    assert len(sent_calls) == count and {c[0] for c in calls(bed)} == {"sent"}
    assert set(received) == {f"reminder {tag}" for tag in dues}
    late = sorted(found[0][5] - found[0][6] for found in by_tag.values())
    p50, p99 = late[len(late) // 2] / 1000, late[int(len(late) * 0.99)] / 1000
    with capsys.disabled():
        print(f"\n[{bed.url.split(':')[0]}] {count} reminders over {spread / 1000:.0f} s, "
              f"SIGKILLs {kills}; lateness p50 {p50:.2f} s, p99 {p99:.2f} s, max "
              f"{late[-1] / 1000:.2f} s; replies received {len(received)} "
              f"({len(received) - count} from the send window)")
    assert p99 <= SWEEP + 1.0  # the look interval and a second


def test_a_repeating_job_declared_by_every_process_and_restart_runs_once_per_period(
    bed: Bed, bots: Bots
) -> None:
    with FakeBotApi() as fake:
        procs = [spawn(bots, fake, bed, "--declare", "beat:1"),
                 spawn(bots, fake, bed, "--declare", "beat:1")]
        started = time.monotonic()
        for _ in range(3):  # three restarts, each declares it again
            time.sleep(2.0)
            bots.kill(procs[0])
            procs[0] = spawn(bots, fake, bed, "--declare", "beat:1")
        time.sleep(2.0)
        for proc in procs:
            stop(proc)
        elapsed = time.monotonic() - started
    store = make_store(bed.url, bed.table)
    try:
        jobs = store.list_jobs(name="beat", include_ended=True)
    finally:
        store.close()
    assert len(jobs) == 1 and jobs[0].runs >= 1
    runs = sorted(int(row[0].split("#")[1]) for row in fired(bed) if row[0].startswith("beat#"))
    assert runs == list(range(1, len(runs) + 1)), runs  # each run once, none skipped twice
    assert elapsed / 2 <= len(runs) <= elapsed + 2, (len(runs), elapsed)
    assert jobs[0].runs >= len(runs)


def test_a_conversation_timeout_fires_once_after_a_sigkill_mid_conversation(
    bed: Bed, bots: Bots
) -> None:
    """Twenty chats enter a conversation with a 3 s timeout. The process that scheduled the
    timeouts is SIGKILLed before they are due. A new process times each conversation out
    once: one fenced row and one reply per chat."""
    chats = list(range(500, 520))
    with FakeBotApi() as fake:
        first = spawn(bots, fake, bed, "--poll", "--conversation-timeout", "3")
        for chat in chats:
            fake.inject_message(chat_id=chat, text="/book")
        store = make_store(bed.url, bed.table)
        try:
            wait_sync("the timeouts scheduled", lambda: len(store.list_jobs()) == len(chats), 30)
        finally:
            store.close()
        bots.kill(first)
        second = spawn(bots, fake, bed, "--poll", "--conversation-timeout", "3")
        wait_sync("every conversation timed out", lambda: len(
            [r for r in fired(bed) if r[0].startswith("timeout ")]) >= len(chats), 60)
        time.sleep(2.0)  # a second timeout would come now
        stop(second)
        replies = sorted(m["text"] for m in fake.sent_messages
                         if str(m.get("text", "")).startswith("timed out"))
    rows = sorted(r[0] for r in fired(bed) if r[0].startswith("timeout "))
    assert rows == sorted(f"timeout {chat}" for chat in chats)  # once each
    assert replies == sorted(f"timed out {chat}" for chat in chats)
