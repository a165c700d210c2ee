"""A crash-looping update exhausts alone: the healthy updates claimed with it are handled.

One poison update whose handler kills its process (as a segfault in a C extension or the OOM
killer would: SIGKILL, no cleanup) and five healthy updates of other chats arrive in one
``getUpdates`` batch, so the first process claims and starts all six together. A supervisor
(this test) restarts the bot at once each time it dies, as ``Restart=always`` does. Real bot
processes of both front ends (PTB ``run_polling()`` and a blocking ``UpdateIntake``; attempt-aware
and unary handling), real
SQLite and PostgreSQL, the library's default lease (only the liveness takeover is fast).

Every healthy handler runs and writes its fenced row exactly once; the poison alone spends its
attempts and ends abandoned after ``max_attempts``.
"""

from __future__ import annotations

import signal
import time
from typing import Any, List

import pytest
from ptb_fence.testing import FakeBotApi
from recovery_support import DEFAULTS, STOP_TIMEOUT, Bed, _exactly_once, _stop, bed, bots  # noqa: F401
from test_ptb_processes import Bots
from worker_support import make_store

MAX_ATTEMPTS = 3

RESTARTS = 3 * MAX_ATTEMPTS
"""The supervisor gives up after this many restarts (``MAX_ATTEMPTS + 1`` are expected: the
first crash hits the whole batch and spends nothing, each later one runs the poison alone and
spends one of its attempts; the old behaviour crashed ``MAX_ATTEMPTS`` times and abandoned
everything)."""

DEADLINE = 150.0
"""Seconds for the whole crash loop on a loaded 2-core machine (about 10-20 s when idle)."""


def _settled(bed: Bed, ids: List[int]) -> bool:
    states = bed.states()
    return all(states.get(u) in ("completed", "abandoned") for u in ids)


@pytest.mark.parametrize("order", ["lax", "strict", "unary"])
def test_a_crash_looping_update_exhausts_alone(bots: Bots, bed: Bed, order: str) -> None:
    """With ``strict_chat_order`` one healthy update is in the poison's chat, behind it: it
    waits for the poison's exhaustion, then runs. ``unary``: unary handling
    (``DurableUpdateProcessor``, ``UpdateIntake(handle=...)``), whose handler gets no attempt
    and writes no fenced row: the same crash loop, checked in the store's attempts."""
    store = make_store(bed.url, bed.table)
    try:
        store.due(now=0, pending_before=0, limit=1)  # the schema, before the first crash
    finally:
        store.close()
    with FakeBotApi() as fake:
        poison = fake.inject_message(chat_id=9, text="crash")
        chats = [1, 2, 3, 4, 9 if order == "strict" else 5]
        healthy = [fake.inject_message(chat_id=c, text=f"m{c}") for c in chats]
        ids = [poison] + healthy
        args = ("--run-polling", *DEFAULTS, "--crash", "crash",
                "--max-attempts", str(MAX_ATTEMPTS), "--stop-timeout", "2")
        if order == "strict":
            args += ("--strict-chat-order",)
        if order == "unary":
            args += ("--unary",)
        proc: Any = bots.spawn(fake, bed.url, bed.table, bed.domain, *args)
        restarts = 0
        began = time.monotonic()
        while not _settled(bed, ids):
            assert time.monotonic() - began < DEADLINE, (
                f"not settled after {DEADLINE:.0f} s and {restarts} restarts: {bed.states()}\n"
                f"{bots.output()}"
            )
            if proc.poll() is not None:  # the supervisor: restart at once
                assert proc.returncode == -signal.SIGKILL, bots.output()
                restarts += 1
                assert restarts <= RESTARTS, (
                    f"{restarts} restarts: {bed.states()}\n{bots.output()}"
                )
                proc = bots.spawn(fake, bed.url, bed.table, bed.domain, *args)
            time.sleep(0.05)
        states = bed.states()
        assert all(states[u] == "completed" for u in healthy), (states, bots.output())
        assert states[poison] == "abandoned", (states, bots.output())
        if proc.poll() is None:
            _stop(bots, proc, signal.SIGTERM, STOP_TIMEOUT + 5)
    attempts = dict(bed.query(f"SELECT update_id, attempts FROM {bed.table}"))  # noqa: S608
    assert attempts[poison] == MAX_ATTEMPTS
    # the first crash (the batch's: six handlers started together) spent nothing; every later
    # one ran the poison alone and spent one of its attempts
    assert restarts == MAX_ATTEMPTS + 1, (restarts, bots.output())
    assert len(bots.started(poison)) == restarts, bots.started(poison)
    assert all(attempts[u] == 1 for u in healthy), (attempts, bots.output())
    if order == "unary":
        return  # no fenced rows: a unary handler may run again after a crash (at least once)
    written = _exactly_once(bed, healthy)
    assert all(rows[0][1] == 1 for rows in written.values()), written  # one attempt each
