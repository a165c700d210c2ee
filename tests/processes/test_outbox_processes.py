"""Fenced replies in real processes: PTB ``Application`` s (tests/processes/outbox_worker.py,
``run_polling``) against :class:`ptb_fence.testing.FakeBotApi`, real SQLite and PostgreSQL,
counting what FakeBotApi received per update.

Every reply names its update, attempt and claim id (``reply <update_id> a<attempt> <claim>``),
so a reply is matched to the attempt that queued it and to the one attempt that committed (the
domain row the handler writes in its fenced transaction).

The guarantee under test: a call is sent iff the commit that carried it landed (never for a
failed, rolled-back or stale attempt), at least once, each chat's in commit order; a duplicate
only when the sender dies between Telegram's answer and recording it (the send window).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from ptb_fence.stores._outbox_sql import outbox_table_name
from ptb_fence.testing import FakeBotApi, make_message_update
from ptb_support import wait_sync
from recovery_support import Bed, make_bed
from test_ptb_processes import Bots
from worker_support import make_store

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "outbox_worker.py")

Reply = Tuple[int, int, str]
"""(update_id, attempt, claim_id) of a reply FakeBotApi received."""


# -- harness -----------------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgres"])
def bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    yield from _bed(request, tmp_path)


@pytest.fixture(params=["postgres"])
def pg_bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    yield from _bed(request, tmp_path)


def _bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    for made in make_bed(request, tmp_path):
        made.query(f"CREATE TABLE {made.domain}_seq (chat BIGINT PRIMARY KEY, n INT NOT NULL)")
        if request.param == "postgres":
            request.getfixturevalue("pg_tables").append(f"{made.domain}_seq")
        yield made


@pytest.fixture
def bots(tmp_path: Any) -> Iterator[Bots]:
    directory = tmp_path / "bots"
    directory.mkdir()
    started = Bots(str(directory), WORKER)
    yield started
    for proc in started.procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(5)


def spawn(bots: Bots, fake: FakeBotApi, bed: Bed, *extra: str) -> Any:
    proc = bots.spawn(fake, bed.url, bed.table, bed.domain, *extra)
    bots.wait_ready(proc, timeout=60)
    return proc


def replies(fake: FakeBotApi) -> List[Tuple[Reply, Dict[str, Any]]]:
    """Every reply FakeBotApi received (sendMessage with our text), in arrival order."""
    found = []
    for message in fake.sent_messages:
        words = str(message.get("text", "")).split()
        if len(words) >= 4 and words[0] == "reply":
            found.append(((int(words[1]), int(words[2][1:]), words[3]), message))
    return found


def replies_by_update(fake: FakeBotApi) -> Dict[int, List[Reply]]:
    by: Dict[int, List[Reply]] = {}
    for reply, _ in replies(fake):
        by.setdefault(reply[0], []).append(reply)
    return by


def outbox_rows(bed: Bed) -> List[Tuple[Any, ...]]:
    """(call_id, update_id, attempt, claim_id, chat_key, state, tries, error, sender)."""
    return bed.query(
        "SELECT call_id, update_id, attempt, claim_id, chat_key, state, tries, error, sender "
        f'FROM "{outbox_table_name(bed.table)}" ORDER BY call_id'  # noqa: S608
    )


def outbox_states(bed: Bed) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for row in outbox_rows(bed):
        counts[row[5]] = counts.get(row[5], 0) + 1
    return counts


def stored_states(bed: Bed) -> Dict[int, str]:
    """Each call's state as the store reads it: on SQLite a call in the sent journal, not
    folded into the table yet, is ``sent`` (recorded, never sent again)."""
    store = make_store(bed.url, bed.table)
    try:
        return {entry.call_id: entry.state for entry in store.list_calls(limit=1_000_000)}
    finally:
        store.close()


def committed(bed: Bed) -> Dict[int, List[Tuple[int, str, int]]]:
    """The fenced domain rows per update: (attempt, claim_id, pid)."""
    by: Dict[int, List[Tuple[int, str, int]]] = {}
    for update_id, attempt, claim_id, pid in bed.written():
        by.setdefault(int(update_id), []).append((int(attempt), str(claim_id), int(pid)))
    return by


def quiet(fake: FakeBotApi, *, for_seconds: float = 0.5, within: float = 15.0) -> None:
    """Wait until FakeBotApi received nothing new for ``for_seconds`` (what a dead process had
    already sent has been handled)."""
    def seen() -> int:  # a delayed request is in calls at once, in sent_messages after
        return len(fake.calls) + len(fake.sent_messages)

    deadline = time.monotonic() + within
    count, since = seen(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = seen()
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= for_seconds:
            return
    raise AssertionError("FakeBotApi never went quiet")


def wait_all_sent(bots: Bots, bed: Bed, ids: List[int], within: float) -> None:
    """Every update completed and the outbox holds nothing pending or sending."""

    def done() -> bool:
        states = bed.states()
        if not all(states.get(u) == "completed" for u in ids):
            return False
        counts = outbox_states(bed)
        return not counts.get("pending") and not counts.get("sending")

    try:
        wait_sync("every update completed and every call sent", done, within)
    except AssertionError as exc:
        states = bed.states()
        late = {u: states.get(u) for u in ids if states.get(u) != "completed"}
        raise AssertionError(
            f"{exc}\nnot completed: {dict(list(late.items())[:20])} ({len(late)})\n"
            f"outbox: {outbox_states(bed)}\n{bots.output()}"
        ) from None


def stop(bots: Bots, proc: Any, bound: float = 30.0) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(bound)
    except Exception:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        raise AssertionError(f"bot {proc.pid} still running {bound} s after SIGTERM\n"
                             f"{bots.output()}") from None
    assert proc.returncode == 0, f"bot {proc.pid} exited {proc.returncode}\n{bots.output()}"


def completed_claims(bed: Bed) -> Dict[int, str]:
    """The claim id of the attempt whose completion landed, per completed update."""
    return {int(u): str(c) for u, c in bed.query(
        f"SELECT update_id, claim_id FROM {bed.table} WHERE state = 'completed'")}  # noqa: S608


def assert_replies_from_committed_attempts(
    fake: FakeBotApi, bed: Bed, ids: List[int], extra: Optional[Dict[int, int]] = None,
    *, once: Optional[List[int]] = None,
) -> None:
    """Each update completed, with ``1 + extra[u]`` replies, all queued by the attempt whose
    completion committed (so 0 replies from stale or failed attempts); that attempt wrote its
    fenced row exactly once. The updates in ``once`` (default: all) have no other fenced row:
    their write committed with the completion (``complete=True``); a plain fenced write of an
    attempt whose completion did not land (killed in between) may stand beside it."""
    written = committed(bed)
    completed = completed_claims(bed)
    by_update = replies_by_update(fake)
    extra = extra or {}
    exactly_once = set(ids if once is None else once)
    wrong = {}
    for update_id in ids:
        claim = completed.get(update_id)
        rows = written.get(update_id, [])
        got = by_update.get(update_id, [])
        if claim is None:
            wrong[update_id] = ("not completed",)
        elif len([r for r in rows if r[1] == claim]) != 1:
            wrong[update_id] = ("the completing attempt's fenced write", rows, claim)
        elif update_id in exactly_once and len(rows) != 1:
            wrong[update_id] = ("fenced writes", rows)
        elif len(got) != 1 + extra.get(update_id, 0):
            wrong[update_id] = ("replies", got, "expected", 1 + extra.get(update_id, 0))
        elif any(c != claim for _, _, c in got):
            wrong[update_id] = ("a reply of another attempt", got, "completed by", claim)
    assert not wrong, dict(list(wrong.items())[:20])
    assert set(by_update) <= set(ids), set(by_update) - set(ids)


# -- SIGKILL at random points ------------------------------------------------------------------
def test_sigkill_at_random_points_every_update_ends_with_exactly_one_reply(
    bed: Bed, bots: Bots, capsys: Any
) -> None:
    """Rounds of: inject a batch, SIGKILL the bot at a random point of its handling (handlers
    sleep a random 0-20 ms around queueing their reply), look at what the dead process left,
    restart. Half the handlers queue their reply outside the transaction (held, written by the
    grouped completion), half inside ``run_in_transaction(complete=True)``.

    The send window is measured, not guessed: once a killed process is dead and FakeBotApi has
    gone quiet, a call the store still reads ``sending`` whose reply FakeBotApi already
    received was sent and not recorded; the next process sends it again. Each such hit must account for exactly one
    extra copy of that reply, and every other update must have exactly one."""
    rng = random.Random(2126)
    rounds, batch = 8, 150
    ids: List[int] = []
    hits: Dict[int, int] = {}
    kills: List[Tuple[int, int, int]] = []  # (handlers in flight, calls unsent, window hits)
    started = time.monotonic()
    with FakeBotApi() as fake:
        for number in range(rounds):
            proc = spawn(bots, fake, bed, "--poll", "--jitter-ms", "20", "--lease", "2")
            first = len(ids)
            ids += [fake.inject_message(chat_id=1 + (first + i) % 40,
                                        text="plain" if (first + i) % 2 else "inside")
                    for i in range(batch)]
            batch_ids = ids[first:]
            target = rng.randint(5, batch - 5)

            def progressed() -> bool:
                states = bed.states()
                return sum(states.get(u) == "completed" for u in batch_ids) >= target

            wait_sync(f"round {number}: {target} handled", progressed, 60)
            time.sleep(rng.uniform(0, 0.05))
            bots.kill(proc)
            quiet(fake)
            states = bed.states()
            received = replies_by_update(fake)
            in_flight = sum(s == "processing" for s in states.values())
            unsent, window = 0, 0
            shown = stored_states(bed)
            for call_id, update_id, _, _, _, state, _, _, _ in outbox_rows(bed):
                state = shown.get(call_id, state)
                if state not in ("pending", "sending"):
                    continue
                unsent += 1
                copies = len(received.get(update_id, []))
                if state == "sending" and copies > hits.get(update_id, 0):
                    # sent (FakeBotApi has this try's copy) and not recorded: resent next
                    hits[update_id] = copies
                    window += 1
            kills.append((in_flight, unsent, window))
        proc = spawn(bots, fake, bed, "--poll")
        wait_all_sent(bots, bed, ids, 120)
        quiet(fake)
        stop(bots, proc)
        elapsed = time.monotonic() - started
        # the "inside" handlers' write committed with the completion: exactly once
        inside = [u for i, u in enumerate(ids) if i % 2 == 0]
        assert_replies_from_committed_attempts(fake, bed, ids, hits, once=inside)
    rows = outbox_rows(bed)
    assert len(rows) == len(ids) and all(r[5] == "sent" for r in rows)  # one committed call each
    assert len(ids) > 1000
    assert sum(k[0] for k in kills) > 0, kills  # the kills did land during handlers
    with capsys.disabled():
        print(
            f"\n[{bed.url.split(':')[0]}] {len(ids)} updates, {len(kills)} SIGKILLs in "
            f"{elapsed:.0f} s; per kill (handlers in flight, calls committed and unsent, send "
            f"window hits): {kills}; updates with a duplicate reply from the send window: "
            f"{len(hits)} {sorted(hits)}"
        )


# -- SIGSTOP past the lease --------------------------------------------------------------------
def test_a_stale_attempts_queued_reply_is_never_sent(bed: Bed, bots: Bots) -> None:
    """A process is SIGSTOPped inside handlers that queued their reply, past their lease;
    another process takes the updates over and replies; the first is resumed: its attempts are
    stale, the one that writes is refused, the one that only returns has its completion
    refused, and neither reply is ever sent."""
    with FakeBotApi() as fake:
        first = spawn(bots, fake, bed, "--poll", "--slow-seconds", "6")
        ids = [fake.inject_message(chat_id=700, text="slow"),
               fake.inject_message(chat_id=701, text="slow nowrite")]
        paused = {u: first.pid for u in ids}
        wait_sync("both slow handlers started",
                  lambda: all(os.path.exists(os.path.join(bots.dir, f"slow.{u}.{first.pid}"))
                              for u in ids), 30)
        # The other process starts only now: had it run beside the first, it could have claimed
        # one of the updates itself, and a test that stops both has nobody left to take over.
        first.send_signal(signal.SIGSTOP)
        try:
            second = spawn(bots, fake, bed)  # no polling: its sweep takes over lapsed leases
            # the other process takes over (attempt 2) and its reply is sent
            wait_sync("the takeover replies",
                      lambda: all(any(a == 2 for _, a, _ in replies_by_update(fake).get(u, []))
                                  for u in ids), 60)
        finally:
            first.send_signal(signal.SIGCONT)
        wait_sync("the stale handlers woke",
                  lambda: all(os.path.exists(os.path.join(bots.dir, f"woke.{u}.{pid}"))
                              for u, pid in paused.items()), 30)
        time.sleep(2.0)  # sweeps, dispatchers and lease keepers of the resumed process run
        for proc in (first, second):
            stop(bots, proc)
        quiet(fake)
        assert_replies_from_committed_attempts(fake, bed, ids)
    rows = outbox_rows(bed)
    assert sorted((r[1], r[2]) for r in rows) == [(u, 2) for u in sorted(ids)], rows
    by_update = replies_by_update(fake)
    assert all(by_update[u] == [(u, 2, completed_claims(bed)[u])] for u in ids)


# -- a failing attempt -------------------------------------------------------------------------
def test_a_reply_queued_by_a_failing_attempt_is_never_sent_its_retrys_is(
    bed: Bed, bots: Bots
) -> None:
    with FakeBotApi() as fake:
        proc = spawn(bots, fake, bed, "--poll")
        ids = [fake.inject_message(chat_id=800 + i, text="fail") for i in range(5)]
        ids += [fake.inject_message(chat_id=800 + i, text="plain") for i in range(5)]
        wait_all_sent(bots, bed, ids, 60)
        quiet(fake)
        stop(bots, proc)
        assert_replies_from_committed_attempts(fake, bed, ids)
        by_update = replies_by_update(fake)
    for update_id in ids[:5]:
        assert [a for _, a, _ in by_update[update_id]] == [2]  # the retry's, never attempt 1's
    assert not [r for r in outbox_rows(bed) if r[1] in ids[:5] and r[2] == 1]


# -- per-chat order across two processes -------------------------------------------------------
def test_per_chat_order_of_replies_across_two_processes_sharing_postgres(
    pg_bed: Bed, bots: Bots
) -> None:
    """Two processes handle one backlog concurrently; each handler bumps its chat's counter in
    its fenced transaction (a row lock held to the commit: the counter is the chat's commit
    order) and queues its reply in that transaction. Each chat's replies must reach
    FakeBotApi as seq 1, 2, 3, ...: none before an earlier committed one.

    A sender that records a chat's call claims the chat's next one in that commit, so a
    busy chat stays with one sender; more chats than one sender may hold (twice its
    ``outbox_concurrency``) make both processes send."""
    bed = pg_bed
    chats, count = 40, 400
    store = make_store(bed.url, bed.table)
    at = int(time.time() * 1000) - 3_600_000
    ids = list(range(1, count + 1))
    try:
        store.add_many([(u, json.dumps(make_message_update(u, 900 + u % chats, "order",
                                                           message_id=u)), at) for u in ids])
    finally:
        store.close()
    with FakeBotApi() as fake:
        # no takeover here: a lease far longer than a send on a loaded machine, so no call
        # changes sender while its request is on the way (that case is tested below)
        procs = [bots.spawn(fake, bed.url, bed.table, bed.domain, "--jitter-ms", "5",
                            "--lease", "15")
                 for _ in range(2)]
        bots.wait_ready(*procs, timeout=60)
        wait_all_sent(bots, bed, ids, 120)
        quiet(fake)
        for proc in procs:
            stop(bots, proc)
        assert_replies_from_committed_attempts(fake, bed, ids)
        received = replies(fake)
    per_chat: Dict[int, List[int]] = {}
    for _, message in received:
        per_chat.setdefault(int(message["chat_id"]), []).append(int(message["text"].split()[-1]))
    assert sorted(per_chat) == [900 + c for c in range(chats)]
    for chat, seqs in per_chat.items():
        assert seqs == list(range(1, len(seqs) + 1)), (chat, seqs)
    handlers = {pid for rows in committed(bed).values() for _, _, pid in rows}
    senders = {r[8] for r in outbox_rows(bed)}
    assert handlers == {p.pid for p in procs}  # both handled
    assert len(senders) == 2, senders  # and both sent


# -- Telegram's refusals and lost answers ------------------------------------------------------
def _failures(bots: Bots) -> List[Dict[str, Any]]:
    found = []
    for name in sorted(os.listdir(bots.dir)):
        if name.startswith("failures."):
            with open(os.path.join(bots.dir, name), encoding="utf-8") as file:
                found += [json.loads(line) for line in file if line.strip()]
    return found


def _requests_to(fake: FakeBotApi, chat: int) -> int:
    return sum(1 for c in fake.calls_to("sendMessage") if c.get("chat_id") == chat)


def _row_of(bed: Bed, update_id: int) -> Tuple[Any, ...]:
    [row] = [r for r in outbox_rows(bed) if r[1] == update_id]
    return row


def test_refusals_flood_control_server_errors_and_lost_answers(bed: Bed, bots: Bots) -> None:
    """One scenario at a time, each on its own chat (the faults hit the next sendMessage):

    - 429 ``retry_after``: that chat waits at least ``retry_after`` and is then sent once;
      another chat is not held meanwhile;
    - 403 (blocked) and 400 (chat not found): the call ends failed with the error, never
      retried, delivered to ``handle_send_failure``;
    - 500: retried with backoff, sent once;
    - the connection dropped after the request arrived: resent (at least once), so FakeBotApi
      has two copies when the first took effect and one when it did not; an ``at_most_once``
      call ends failed (unknown outcome) with the one copy that took effect.
    """
    with FakeBotApi() as fake:
        proc = spawn(bots, fake, bed, "--poll")
        # 429 on chat 601; chat 602 meanwhile is sent at once
        fake.fail_next("sendMessage", retry_after=2)
        flood = fake.inject_message(chat_id=601, text="plain")
        wait_sync("the 429", lambda: _requests_to(fake, 601) == 1, 30)
        refused_at = time.monotonic()
        other = fake.inject_message(chat_id=602, text="plain")
        wait_sync("chat 602 replied", lambda: other in replies_by_update(fake), 30)
        assert flood not in replies_by_update(fake)
        wait_sync("chat 601 replied after the hold", lambda: flood in replies_by_update(fake), 30)
        assert time.monotonic() - refused_at >= 1.5  # retry_after 2 s, observed from here
        assert _requests_to(fake, 601) == 2

        # permanent refusals: failed, never retried, delivered to handle_send_failure
        fake.fail_next("sendMessage", error_code=403,
                       description="Forbidden: bot was blocked by the user")
        blocked = fake.inject_message(chat_id=603, text="plain")
        wait_sync("the 403 call failed", lambda: _row_of_state(bed, blocked) == "failed", 30)
        fake.fail_next("sendMessage", error_code=400, description="Bad Request: chat not found")
        unknown_chat = fake.inject_message(chat_id=604, text="plain")
        wait_sync("the 400 call failed", lambda: _row_of_state(bed, unknown_chat) == "failed",
                  30)

        # 500 twice: retried with backoff, then sent once
        fake.fail_next("sendMessage", 2, error_code=500)
        flaky = fake.inject_message(chat_id=605, text="plain")
        wait_sync("the 500s retried and sent", lambda: _row_of_state(bed, flaky) == "sent", 60)

        # connection dropped after the request arrived, with and without its effect
        fake.cut_next("sendMessage", after_effect=True)
        lost_answer = fake.inject_message(chat_id=606, text="plain")
        wait_sync("resent after the lost answer",
                  lambda: _row_of_state(bed, lost_answer) == "sent", 60)
        fake.cut_next("sendMessage", after_effect=False)
        lost_request = fake.inject_message(chat_id=607, text="plain")
        wait_sync("resent after the lost request",
                  lambda: _row_of_state(bed, lost_request) == "sent", 60)
        fake.cut_next("sendMessage", after_effect=True)
        once = fake.inject_message(chat_id=608, text="once")
        wait_sync("the at-most-once call failed", lambda: _row_of_state(bed, once) == "failed",
                  60)

        ids = [flood, other, blocked, unknown_chat, flaky, lost_answer, lost_request, once]
        wait_sync("the failures delivered",
                  lambda: {f["update_id"] for f in _failures(bots)} >= {blocked, unknown_chat,
                                                                        once}, 30)
        time.sleep(1.5)  # many sweeps: a failed call must not be tried again
        stop(bots, proc)
        quiet(fake)
        assert _requests_to(fake, 603) == 1 and _requests_to(fake, 604) == 1
        assert _requests_to(fake, 605) == 3
        assert _requests_to(fake, 606) == 2 and _requests_to(fake, 607) == 2
        assert _requests_to(fake, 608) == 1
        by_update = replies_by_update(fake)
        copies = {u: len(by_update.get(u, [])) for u in ids}
    assert copies == {flood: 1, other: 1, blocked: 0, unknown_chat: 0, flaky: 1,
                      lost_answer: 2, lost_request: 1, once: 1}, copies
    assert "Forbidden: bot was blocked by the user" in str(_row_of(bed, blocked)[7])
    assert "chat not found" in str(_row_of(bed, unknown_chat)[7]).lower()
    assert "unknown outcome" in str(_row_of(bed, once)[7])
    assert _row_of(bed, flaky)[6] == 3  # claimed three times: two 500s, then sent
    failures = _failures(bots)
    assert sorted({f["update_id"] for f in failures}) == sorted([blocked, unknown_chat, once])
    assert len(committed(bed)) == len(ids)  # every handler's write committed once


def _row_of_state(bed: Bed, update_id: int) -> Optional[str]:
    rows = [r for r in outbox_rows(bed) if r[1] == update_id]
    return str(rows[0][5]) if rows else None


# -- graceful stop -----------------------------------------------------------------------------
def test_graceful_stop_releases_unsent_calls_and_the_next_process_sends_them(
    bed: Bed, bots: Bots
) -> None:
    """Sends are slow (FakeBotApi delays sendMessage 0.4 s; a chat's calls go one at a time),
    so at SIGTERM most committed calls are unsent. The stop releases what it claimed and did
    not send, finishes the requests in flight and records them; nothing is left ``sending``.
    The next process sends the rest: every update ends with exactly one reply."""
    with FakeBotApi() as fake:
        fake.delay("sendMessage", 0.4)
        first = spawn(bots, fake, bed, "--poll", "--lease", "30")
        ids = [fake.inject_message(chat_id=1000 + i % 4, text="plain") for i in range(40)]
        wait_sync("some replies sent", lambda: len(replies(fake)) >= 4, 60)
        stop(bots, first)
        quiet(fake)
        after_stop = outbox_states(bed)
        sent_by_first = len(replies(fake))
        assert not after_stop.get("sending"), after_stop  # released at once, not left leased
        assert after_stop.get("sent", 0) == sent_by_first  # what went out was recorded
        assert after_stop.get("pending", 0) > 0, after_stop  # the stop did leave calls unsent
        fake.delay("sendMessage", 0)
        second = spawn(bots, fake, bed, "--poll", "--lease", "30")
        wait_all_sent(bots, bed, ids, 60)
        quiet(fake)
        stop(bots, second)
        assert_replies_from_committed_attempts(fake, bed, ids)
    print(f"\nstopped with {after_stop}; {sent_by_first} replies sent before the stop")


# -- a sender paused past its lease ------------------------------------------------------------
def test_a_sender_paused_past_its_lease_duplicates_only_what_telegram_had_answered(
    bed: Bed, bots: Bots
) -> None:
    """FakeBotApi holds the bot's sendMessage requests unanswered; once every update is
    completed and all 8 of its senders wait for an answer (outbox_concurrency 8), the bot is
    SIGSTOPped and the answers let go: Telegram answered them during the pause, sent and not
    recorded, the send window (exactly those 8 calls). A sweeping process started then takes
    every call over once its lease lapses: those 8 again, the 8 claimed and not begun once; the
    resumed bot then sends nothing more. Each reply: one copy, two for each call that was in
    the window at the pause."""
    with FakeBotApi() as fake:
        fake.hold("sendMessage")
        sender = spawn(bots, fake, bed, "--poll", "--lease", "8")
        ids = [fake.inject_message(chat_id=1100 + i, text="plain") for i in range(16)]
        # The pause lands where nothing but those 8 requests is under way in the bot, whatever
        # the machine's speed: the answers are held (not a fixed delay, which a slow run
        # outlasts: an answer recorded, a freed sender between its lease check and its next
        # request at the pause, which it sends when resumed after the sweeper sent it), every
        # handler and completion has committed (a paused one leaves a stale attempt's fenced
        # write beside the completing one, and on PostgreSQL its open transaction's row locks
        # hold the takeover until the resume), and no other process runs yet (a sweeper
        # started beside the bot took over updates it had not begun within their grace, so
        # its replies counted among the 8 and the bot had a sender free).
        def ready() -> bool:
            states = bed.states()
            return (len(fake.calls_to("sendMessage")) >= 8
                    and all(states.get(u) == "completed" for u in ids))

        wait_sync("every update completed and eight requests in flight", ready, 60)
        sender.send_signal(signal.SIGSTOP)
        try:
            fake.release("sendMessage")  # Telegram answers them during the pause
            quiet(fake)
            received = replies_by_update(fake)
            window = {r[1] for r in outbox_rows(bed) if r[5] == "sending" and received.get(r[1])}
            # all 8 senders at once, each call once (a pool that ran fewer threads than
            # outbox_concurrency began the 8th only after an answer)
            assert len(window) == len(received) == len(fake.calls_to("sendMessage")) == 8, (
                outbox_rows(bed), received)
            sweeper = spawn(bots, fake, bed, "--lease", "8")
            wait_all_sent(bots, bed, ids, 60)  # the sweeper took the sender's calls over
            quiet(fake)
            before_resume = {u: len(r) for u, r in replies_by_update(fake).items()}
        finally:
            sender.send_signal(signal.SIGCONT)
        time.sleep(2.0)  # the resumed sender's answers, sweeps and lease keeper run
        for proc in (sender, sweeper):
            stop(bots, proc)
        quiet(fake)
        after_resume = {u: len(r) for u, r in replies_by_update(fake).items()}
        detail = (window, {u: (before_resume.get(u), n) for u, n in after_resume.items()},
                  outbox_rows(bed), sender.pid, bots.output()[-4000:])
        assert before_resume == after_resume, detail  # the resumed sender sent nothing more
        try:
            assert_replies_from_committed_attempts(fake, bed, ids, {u: 1 for u in window})
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{detail}") from None
    print(f"\n{len(window)} replies in the send window of the paused sender")
