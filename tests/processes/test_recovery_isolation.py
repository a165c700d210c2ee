"""Suspect updates start on probation or run alone: a blocking ``UpdateIntake`` over a real
SQLite file or PostgreSQL table, the suspects made by a real process that held their claims and
was SIGKILLed (tests/processes/liveness_worker.py: it claims six rows, the first one marked
isolated, the second one marked and then past its probation).

No other handler of the process starts while a suspect is on probation; a suspect again runs
alone; updates that are not suspect still run together; the crash cost the suspects nothing
but the one whose claim was marked isolated; ``close()`` gives a suspect that waits back at
once, its attempt not spent. The same for a PTB bot process stopped by SIGTERM.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any, Dict, List, Tuple

import pytest
from ptb_fence import AttemptIdentity, UpdateIntake
from ptb_fence.testing import FakeBotApi, make_message_update
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_support import build, polling, run, wait_for, wait_sync
from telegram import Update
from telegram.ext import TypeHandler
from recovery_support import STOP_TIMEOUT, Bed, _stop, bed  # noqa: F401
from test_ptb_processes import Bots, bots  # noqa: F401
from test_store_liveness import COUNT, Where, start_worker, where  # noqa: F401

SUSPECTS = range(300, 300 + COUNT)
FRESH = range(400, 406)


def _kill_holder(where: Where) -> None:
    """A process claims the six suspects-to-be and dies holding them."""
    proc, _instance = start_worker(where, SUSPECTS[0])
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def _attempts(where: Where) -> Dict[int, Tuple[str, int]]:
    store = where.store()
    try:
        conn_rows: List[Any] = []
        with store.transaction() as conn:
            cur = conn.cursor()
            cur.execute(f'SELECT update_id, state, attempts FROM "{where.table}"')  # noqa: S608
            conn_rows = list(cur.fetchall())
        return {int(u): (str(s), int(a)) for u, s, a in conn_rows}
    finally:
        store.close()


def test_suspects_again_run_alone_fresh_updates_together(where: Where) -> None:  # noqa: F811
    """The dead process had marked two claims (one still on probation: charged; one past it:
    its handler had started as a suspect), so both rows are suspect again: each runs alone.
    The other four start on probation, one after another."""
    _kill_holder(where)
    lock = threading.Lock()
    running: List[int] = []
    overlaps: List[Tuple[int, List[int]]] = []  # (starting update, what ran then)
    attempts: Dict[int, int] = {}

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        update_id = update["update_id"]
        with lock:
            overlaps.append((update_id, list(running)))
            running.append(update_id)
            attempts[update_id] = attempt.attempt
        time.sleep(0.1)
        with lock:
            running.remove(update_id)
            overlaps.append((update_id, list(running)))

    store = where.store()
    intake = UpdateIntake(store, handle_attempt=handle, max_concurrent=8)
    try:
        intake.start()  # takes the dead process's claims over: six suspects
        for u in FRESH:
            intake.accept(json.dumps(make_message_update(u, u, "m", message_id=u)))
        wait_sync("every update handled", lambda: len(attempts) == COUNT + len(FRESH), 60)
        assert intake.idle(30)
    finally:
        intake.close()
        store.close()
    again = set(SUSPECTS[:2])
    for update_id, others in overlaps:
        if update_id in again:
            assert others == [] or others == [update_id], (update_id, others)
        else:
            assert not set(others) & again, (update_id, others)
    # the first claim was marked isolated in the dead process: its crash counted
    assert [attempts[u] for u in SUSPECTS] == [2] + [1] * (COUNT - 1), attempts
    assert all(attempts[u] == 1 for u in FRESH), attempts
    states = _attempts(where)
    assert all(states[u][0] == "completed" for u in list(SUSPECTS) + list(FRESH)), states


_UNMARKS = ("end_probation",)
_SETTLES = ("settle", "settle_owned", "exhaust")


def _update_ids(value: Any, depth: int = 0) -> List[int]:
    """The update ids of the attempt identities in a store call's arguments."""
    if isinstance(value, AttemptIdentity):
        return [value.update_id]
    if depth < 3 and isinstance(value, (list, tuple)):
        return [u for item in value for u in _update_ids(item, depth + 1)]
    return []


class _SlowSuspectSettles:
    """Wraps a store (same capabilities: every attribute is the wrapped store's): a settle of
    a suspect's attempt takes 0.3 s longer, and ``log`` shows when each began and ended, and
    when a suspect's mark ended (``end_probation`` landed)."""

    def __init__(self, inner: Any, log: List[Tuple[str, int]], lock: threading.Lock) -> None:
        self.inner, self._log, self._lock = inner, log, lock

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if name in _UNMARKS:
            def unmark(identity: AttemptIdentity, **kwargs: Any) -> Any:
                landed = target(identity, **kwargs)
                if landed:
                    with self._lock:
                        self._log.append(("unmarked", identity.update_id))
                return landed

            return unmark
        if name not in _SETTLES:
            return target

        def slow(*args: Any, **kwargs: Any) -> Any:
            ids = [args[0]] if name == "settle" else _update_ids(args)  # unary: by update id
            suspects = [u for u in ids if u in SUSPECTS]
            with self._lock:
                self._log += [("settle", u) for u in suspects]
            if suspects:
                time.sleep(0.3)
            try:
                return target(*args, **kwargs)
            finally:
                with self._lock:
                    self._log += [("settled", u) for u in suspects]

        return slow


def _check_no_start_beside_a_settle(log: List[Tuple[str, int]]) -> None:
    """No suspect started while the settle of another one, still marked, was on its way."""
    settling: List[int] = []
    unmarked: List[int] = []
    for what, update_id in log:
        if what == "settle":
            settling.append(update_id)
        elif what == "settled":
            settling.remove(update_id)
        elif what == "unmarked":
            unmarked.append(update_id)
        else:
            marked = [u for u in settling if u not in unmarked]
            assert not marked, (update_id, marked, log)  # started beside a marked settle
    assert sorted(u for what, u in log if what == "start") == list(SUSPECTS), log


@pytest.mark.parametrize("handling", ["unary", "attempt"])
def test_a_suspect_holds_the_gate_until_its_settle_landed(  # noqa: F811
    where: Where, handling: str
) -> None:
    """The next suspect starts only once the one before it is settled in the store or its
    mark ended: started while that settle was still on its way and the claim still marked, a
    crash of the next one would be blamed on both (both claims marked isolated and live), and
    a healthy update would spend attempts beside a crash-looping one."""
    _kill_holder(where)
    lock = threading.Lock()
    log: List[Tuple[str, int]] = []

    def handle(update: Dict[str, Any], attempt: Any = None) -> None:
        with lock:
            log.append(("start", update["update_id"]))

    store = where.store()
    options: Dict[str, Any] = (
        {"handle": handle} if handling == "unary" else {"handle_attempt": handle})
    intake = UpdateIntake(_SlowSuspectSettles(store, log, lock), max_concurrent=8, **options)
    try:
        intake.start()  # takes the dead process's claims over: six suspects
        wait_sync("every suspect settled",
                  lambda: sum(1 for what, _ in log if what == "settled") == COUNT, 60)
        assert intake.idle(30)
    finally:
        intake.close()
        store.close()
    _check_no_start_beside_a_settle(log)
    states = _attempts(where)
    assert all(states[u][0] == "completed" for u in SUSPECTS), states


def test_a_suspect_holds_the_gate_until_its_settle_landed_ptb(where: Where) -> None:  # noqa: F811
    """The same for a PTB Application (``FencedUpdateProcessor``; its sweep takes the dead
    process's claims over): a suspect's completion is not grouped to land after the gate let
    the next suspect in."""
    _kill_holder(where)
    lock = threading.Lock()
    log: List[Tuple[str, int]] = []

    async def on_update(update: Update, context: Any) -> None:
        with lock:
            log.append(("start", update.update_id))

    store = where.store()

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(_SlowSuspectSettles(store, log, lock),
                                          max_concurrent=8, sweep_every_seconds=0.2)
        app = build(processor, fake)
        app.add_handler(TypeHandler(Update, on_update))
        async with polling(app):
            await wait_for("every suspect settled",
                           lambda: sum(1 for what, _ in log if what == "settled") == COUNT, 60)

    try:
        with FakeBotApi() as fake:
            run(scenario(fake), timeout=120)
    finally:
        store.close()
    _check_no_start_beside_a_settle(log)
    states = _attempts(where)
    assert all(states[u][0] == "completed" for u in SUSPECTS), states


def test_close_gives_a_waiting_suspect_back(where: Where) -> None:  # noqa: F811
    go = threading.Event()
    started: List[int] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        started.append(update["update_id"])
        if update["update_id"] == FRESH[0]:
            go.wait(30)  # runs while the suspects are taken over and claimed

    store = where.store()
    intake = UpdateIntake(store, handle_attempt=handle, max_concurrent=8,
                          stop_timeout_seconds=0.5)
    try:
        intake.start()
        intake.accept(json.dumps(make_message_update(FRESH[0], 1, "m", message_id=1)))
        wait_sync("the blocking handler started", lambda: FRESH[0] in started, 20)
        _kill_holder(where)
        intake.sweep()  # takes the dead process's claims over; the suspects wait to run alone
        wait_sync(
            "the suspects claimed here",
            lambda: all(_attempts(where)[u][0] == "processing" for u in SUSPECTS)
            and all(_attempts(where)[u][1] == (2 if u == SUSPECTS[0] else 1) for u in SUSPECTS),
            20,
        )
        began = time.monotonic()
        intake.close(timeout=5)
        assert time.monotonic() - began < 5
    finally:
        go.set()
        store.close()
    assert started == [FRESH[0]]  # no suspect ran beside the blocking handler
    states = _attempts(where)
    # given back, their attempt not spent: pending with the attempts they had
    assert {u: states[u] for u in SUSPECTS} == {
        u: ("pending", 1 if u == SUSPECTS[0] else 0) for u in SUSPECTS
    }, states


def test_sigterm_gives_a_waiting_suspect_back_ptb(bots: Bots, bed: Bed) -> None:  # noqa: F811
    """A PTB bot (``run_polling()``) runs a slow handler; the sweep takes a dead process's
    claims over and the suspects wait to run alone; SIGTERM gives them back at once, their
    attempt not spent, within ``stop_timeout_seconds``."""
    kind = "sqlite" if bed.url.startswith("sqlite:///") else "postgres"
    location = bed.url[len("sqlite:///") - 1:] if kind == "sqlite" else bed.url
    with FakeBotApi() as fake:
        slow = fake.inject_message(chat_id=1, text="slow")
        bot = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", "--lease", "120",
                         "--sweep", "0.2", "--grace", "60", "--slow", "slow",
                         "--slow-seconds", "60", "--stop-timeout", "1")
        bots.wait_ready(bot)
        wait_sync("the slow handler running", lambda: bot.pid in bots.started(slow), 20)
        _kill_holder(Where(kind, location, bed.table))

        def claimed_here() -> bool:
            got = dict(bed.query(f"SELECT update_id, attempts FROM {bed.table} "  # noqa: S608
                                 "WHERE state = 'processing'"))
            return all(got.get(u) == (2 if u == SUSPECTS[0] else 1) for u in SUSPECTS)

        wait_sync("the suspects taken over and claimed", claimed_here, 20)
        time.sleep(0.5)  # they wait to run alone: none starts beside the slow handler
        assert not any(bots.started(u) for u in SUSPECTS)
        took = _stop(bots, bot, signal.SIGTERM, STOP_TIMEOUT)
        assert took < STOP_TIMEOUT, took
    got = {int(u): (s, int(a)) for u, s, a in bed.query(
        f"SELECT update_id, state, attempts FROM {bed.table}")}  # noqa: S608
    assert {u: got[u] for u in SUSPECTS} == {
        u: ("pending", 1 if u == SUSPECTS[0] else 0) for u in SUSPECTS
    }, (got, bots.output())
