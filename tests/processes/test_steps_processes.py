"""Recorded steps in real processes: a PTB bot (tests/processes/outbox_worker.py, mode ``pay``)
charges a :class:`ptb_fence.testing.FakePaymentApi` in ``attempt.step`` and is SIGKILLed at
random points, on SQLite and PostgreSQL.

What must hold: each update is charged once (one charge per update at the payment API), every
request for an update carries the same effect key, no request reaches the API after the step's
record landed, and the reply carries the recorded charge.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from typing import Any, Dict, List, Tuple

import pytest

from ptb_fence.testing import FakeBotApi, FakePaymentApi
from recovery_support import Bed
from test_outbox_processes import (  # noqa: F401 - fixtures
    bed,
    bots,
    quiet,
    replies,
    spawn,
    stop,
    wait_all_sent,
)
from test_ptb_processes import Bots
from ptb_support import wait_sync
from worker_support import make_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def steps_by_update(bed: Bed, ids: List[int]) -> Dict[int, Any]:
    store = make_store(bed.url, bed.table)
    try:
        return {u: store.steps_of(u) for u in ids}
    finally:
        store.close()


def test_sigkill_at_random_points_charges_each_update_once(bed: Bed, bots: Bots, capsys: Any
                                                          ) -> None:
    """Rounds of: inject a batch (a quarter of it fails once after its charge), SIGKILL the bot
    at a random point, restart. The payment API must end with one charge per update."""
    rng = random.Random(39)
    rounds, batch = 8, 125
    ids: List[int] = []
    kills: List[Tuple[int, int]] = []  # (steps recorded at the kill, charged and unrecorded)
    with FakeBotApi() as fake, FakePaymentApi() as pay:
        for number in range(rounds):
            proc = spawn(bots, fake, bed, "--poll", "--jitter-ms", "20", "--lease", "2",
                         "--pay", pay.url)
            first = len(ids)
            ids += [fake.inject_message(chat_id=1 + (first + i) % 30,
                                        text="pay fail" if (first + i) % 4 == 0 else "pay")
                    for i in range(batch)]
            batch_ids = ids[first:]
            target = rng.randint(5, batch - 5)

            def progressed() -> bool:
                states = bed.states()
                return sum(states.get(u) == "completed" for u in batch_ids) >= target

            wait_sync(f"round {number}: {target} handled", progressed, 60)
            time.sleep(rng.uniform(0, 0.05))
            bots.kill(proc)
            time.sleep(0.3)
            recorded = steps_by_update(bed, batch_ids)
            charged = {c["reference"] for c in pay.charges}
            window = sum(1 for u in batch_ids if str(u) in charged and not recorded[u])
            kills.append((sum(1 for u in batch_ids if recorded[u]), window))
        proc = spawn(bots, fake, bed, "--poll", "--pay", pay.url)
        wait_all_sent(bots, bed, ids, 120)
        quiet(fake)
        stop(bots, proc)
        requests = pay.requests
        charges = pay.charges
    per_update: Dict[str, int] = {}
    for charge in charges:
        per_update[charge["reference"]] = per_update.get(charge["reference"], 0) + 1
    assert {str(u): 1 for u in ids} == per_update  # one charge per update, none lost
    steps = steps_by_update(bed, ids)
    assert all(len(steps[u]) == 1 and steps[u][0].name == "charge" for u in ids)
    by_key = {steps[u][0].key: steps[u][0] for u in ids}
    assert len(by_key) == len(ids)
    for request in requests:  # every request used its update's one key, before the record
        record = by_key[request.key]
        assert request.time * 1000 <= record.recorded_at + 5, (request, record)
        if isinstance(request.body, dict):  # else cut short by a SIGKILL: it charged nothing
            assert request.body["reference"] == str(record.update_id)
        else:
            assert request.charge_id is None, request
    sent = {}
    for (update_id, _, _), message in replies(fake):
        sent.setdefault(update_id, set()).add(str(message["text"]).split(" paid ")[1])
    recorded_ids = {u: {json.loads(steps[u][0].result)["id"]} for u in ids}
    assert sent == recorded_ids  # every reply carries the recorded charge
    extra = len(requests) - len(ids)
    with capsys.disabled():
        print(f"\n[{bed.url.split(':')[0]}] {len(ids)} updates, {len(kills)} SIGKILLs; per kill "
              f"(steps recorded, charged and not recorded): {kills}; payment requests "
              f"{len(requests)} (again with the same key: {extra}), charges {len(charges)}")


def test_a_frozen_stale_attempts_step_record_is_refused(bed: Bed, bots: Bots) -> None:
    """A process is SIGSTOPped inside its step, after its charge, past its lease. Another
    process takes the update over, charges with the same key (the payment API applies it
    once), records and replies. The first is resumed: its record is refused."""
    with FakeBotApi() as fake, FakePaymentApi() as pay:
        first = spawn(bots, fake, bed, "--poll", "--slow-seconds", "6", "--pay", pay.url)
        second = spawn(bots, fake, bed, "--pay", pay.url)  # its sweep takes lapsed leases
        (update_id,) = [fake.inject_message(chat_id=900, text="pay slow")]
        slow = {}

        def started() -> bool:
            for proc in (first, second):
                if os.path.exists(f"{bots.dir}/slow.{update_id}.{proc.pid}"):
                    slow["proc"] = proc
            return bool(slow)

        wait_sync("the slow handler started", started, 30)
        frozen = slow["proc"]
        frozen.send_signal(signal.SIGSTOP)
        try:
            wait_sync("the takeover replied", lambda: [m for m in fake.sent_messages
                                                      if " paid " in str(m.get("text"))], 60)
        finally:
            frozen.send_signal(signal.SIGCONT)
        wait_sync("the stale handler woke",
                  lambda: os.path.exists(f"{bots.dir}/woke.{update_id}."
                                                       f"{frozen.pid}"), 30)
        time.sleep(1.0)  # its record is refused, its handler ends
        for proc in (first, second):
            stop(bots, proc)
        quiet(fake)
        requests, charges = pay.requests, pay.charges
        replied = [m for m in fake.sent_messages if " paid " in str(m.get("text"))]
    (record,) = steps_by_update(bed, [update_id])[update_id]
    assert record.attempt == 2
    assert len(charges) == 1  # two requests, one key, one charge
    assert len(requests) == 2 and {r.key for r in requests} == {record.key}
    assert {r.charge_id for r in requests} == {charges[0]["id"]}
    assert [str(m["text"]).split()[2] for m in replied] == ["a2"]  # no reply of the stale one
    log = bots.output()
    # the stale attempt's only fenced transaction is its step's record: refused
    assert f"fenced transaction refused: update {update_id} attempt 1" in log, log[-3000:]
