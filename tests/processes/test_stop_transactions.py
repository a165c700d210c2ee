"""A graceful stop while a fenced transaction is open: the update is committed or given back.

Real bot processes of both front ends (tests/processes/ptb_bot_worker.py under ``run_polling()``,
tests/processes/intake_worker.py with ``close()``) on PostgreSQL with the library's default lease
(120 s). A handler keeps its fenced transaction (``run_in_transaction`` /
``attempt.transaction``, ``complete=True``) open for a few seconds; SIGTERM arrives in the
middle of it. The row is locked by that transaction, so it cannot be released while the
transaction is open: the stop must let it end (committed: the update is done) or end it
(rolled back: then released), never leave the row to its lease. A second process must find
the update completed or handle it far below the lease, and the stopped process's log must
not claim a release that did not happen.
"""

from __future__ import annotations

import glob
import os
import signal
from typing import Any, Iterator, List

import pytest

from ptb_fence.testing import FakeBotApi
from ptb_support import wait_sync
from recovery_support import (  # noqa: F401 - fixtures
    DEFAULTS, Bed, _all_handled, _exactly_once, _nothing_leased, _stop, bots, make_bed,
)
from test_ptb_processes import Bots


@pytest.fixture(params=["postgres"])
def bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    """The PostgreSQL store of tests/processes/recovery_support.py."""
    yield from make_bed(request, tmp_path)


def _log_lines(bots: Bots, pid: int) -> List[str]:
    with open(os.path.join(bots.dir, f"log.{pid}"), encoding="utf-8") as file:
        return file.read().splitlines()


@pytest.mark.parametrize("txn_seconds,stop_timeout", [(3.0, 10.0), (8.0, 1.0)])
def test_sigterm_during_an_open_fenced_transaction_commits_or_releases_it(
    bots: Bots, bed: Bed, txn_seconds: float, stop_timeout: float
) -> None:
    with FakeBotApi() as fake:
        slow = fake.inject_message(chat_id=1, text="txn")
        ids = [slow] + [fake.inject_message(chat_id=2 + i, text=f"m{i}") for i in range(4)]
        first = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *DEFAULTS,
                           "--txn", "txn", "--txn-seconds", str(txn_seconds),
                           "--stop-timeout", str(stop_timeout))
        bots.wait_ready(first)
        wait_sync("the fenced transaction to be open",
                  lambda: glob.glob(os.path.join(bots.dir, f"in_txn.{slow}.{first.pid}")), 20)
        # bounded: the transaction's end or the stop's deadline, plus a margin
        took = _stop(bots, first, signal.SIGTERM, min(txn_seconds, stop_timeout) + 8)
        assert first.returncode == 0, bots.output()
        _nothing_leased(bots, bed)  # committed or released: no row is left to its lease
        second = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *DEFAULTS)
        bots.wait_ready(second)
        # far below the 120 s lease
        _all_handled(bots, bed, ids, 20, "every update completed after the stop")
        _stop(bots, second, signal.SIGTERM, 15)
    written = _exactly_once(bed, ids)
    lines = _log_lines(bots, first.pid)
    released = [line for line in lines if "released" in line and "not released" not in line]
    if written[slow][0][3] == first.pid:  # its transaction committed during the stop
        assert not any(f"update {slow} " in line for line in released), "\n".join(lines)
    else:  # rolled back and released: the next process ran it, the attempt not counted
        assert written[slow][0][1] == 1, written[slow]
    assert took < min(txn_seconds, stop_timeout) + 8, took


def test_a_transaction_the_stop_cannot_end_is_logged_as_not_released(
    pg_dsn: str, pg_table: str, pg_tables: List[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A fenced transaction on the caller's own connection cannot be ended by the stop: its
    row stays locked, so it is not released, and the log says so (with the lease's end)
    instead of "released"; the transaction then commits by itself and completes the update."""
    import json
    import logging
    import threading
    import time

    import psycopg2

    from store_support import fresh_table_name
    from ptb_fence import PostgresUpdateStore, UpdateIntake

    domain = fresh_table_name()
    pg_tables.append(domain)
    store = PostgresUpdateStore(pg_dsn, pg_table)
    own = psycopg2.connect(pg_dsn)
    in_txn = threading.Event()
    finished = threading.Event()
    with own, own.cursor() as cur:
        cur.execute(f"CREATE TABLE {domain} (update_id BIGINT, attempt INT)")

    def handle(update: Any, attempt: Any) -> None:
        try:
            with attempt.transaction(connection=own, complete=True) as conn:
                conn.cursor().execute(f"INSERT INTO {domain} VALUES (%s, %s)",  # noqa: S608
                                      (update["update_id"], attempt.attempt))
                in_txn.set()
                time.sleep(4)  # past stop_timeout_seconds and the stop's margin
        finally:
            finished.set()

    intake = UpdateIntake(store, handle_attempt=handle, stop_timeout_seconds=0.5)
    intake.start()
    try:
        body = {"update_id": 77, "message": {"message_id": 1, "date": 0,
                                             "chat": {"id": 1, "type": "private"}, "text": "x"}}
        assert intake.accept(json.dumps(body)) == "accepted"
        assert in_txn.wait(10)
        with caplog.at_level(logging.INFO, logger="ptb_fence"):
            intake.close()
        messages = [record.getMessage() for record in caplog.records]
        assert any("update 77 attempt 1 was not released" in m and "lease covers it" in m
                   for m in messages), messages
        assert not any(m.startswith("released ") for m in messages), messages
        assert finished.wait(10)
        with own, own.cursor() as cur:
            cur.execute(f"SELECT state FROM {pg_table} WHERE update_id = 77")  # noqa: S608
            assert cur.fetchone()[0] == "completed"  # it still owned the update: committed
            cur.execute(f"SELECT count(*) FROM {domain}")  # noqa: S608
            assert cur.fetchone()[0] == 1
    finally:
        own.close()
        store.close()


def test_close_with_a_timeout_during_an_open_fenced_transaction_releases_the_update(
    pg_dsn: str, pg_table: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``UpdateIntake.close(timeout)`` while a handler's fenced transaction (on the store's
    own connection) is open: the transaction is rolled back, the update released at once (a
    second intake handles it far below the 120 s lease), and the log says "released"."""
    import json
    import logging
    import threading
    import time

    from ptb_fence import PostgresUpdateStore, UpdateIntake

    first_store, second_store = PostgresUpdateStore(pg_dsn, pg_table), PostgresUpdateStore(pg_dsn, pg_table)
    in_txn = threading.Event()
    handled: List[int] = []

    def slow(update: Any, attempt: Any) -> None:
        with attempt.transaction(complete=True):
            in_txn.set()
            time.sleep(6)

    def quick(update: Any, attempt: Any) -> None:
        with attempt.transaction(complete=True):
            handled.append(attempt.attempt)

    body = {"update_id": 78, "message": {"message_id": 1, "date": 0,
                                         "chat": {"id": 1, "type": "private"}, "text": "x"}}
    first = UpdateIntake(first_store, handle_attempt=slow)  # default stop_timeout (10 s)
    first.start()
    try:
        assert first.accept(json.dumps(body)) == "accepted"
        assert in_txn.wait(10)
        began = time.monotonic()
        with caplog.at_level(logging.INFO, logger="ptb_fence"):
            first.close(timeout=1.0)
        took = time.monotonic() - began
        assert took < 1.0 + 2.5, took
        messages = [record.getMessage() for record in caplog.records]
        assert any(m.startswith("released 1 claimed update") for m in messages), messages
        second = UpdateIntake(second_store, handle_attempt=quick)
        second.start()
        try:
            deadline = time.monotonic() + 15
            while not handled and time.monotonic() < deadline:
                time.sleep(0.05)
            assert handled == [1]  # released: the stopped attempt was not counted
        finally:
            second.close()
    finally:
        first_store.close()
        second_store.close()


def _wait_log(bots: Bots, pid: int, text: str, within: float) -> None:
    wait_sync(f"{text!r} in the log of {pid}",
              lambda: any(text in line for line in _log_lines(bots, pid)), within)


@pytest.mark.parametrize("held", ["briefly", "past the stop"])
def test_sigterm_while_another_transaction_locks_the_running_update_s_row(
    bots: Bots, bed: Bed, held: str
) -> None:
    """At the stop's deadline the running update's row is locked by someone else's short
    transaction (a renewal in flight, an operator's ``SELECT ... FOR UPDATE``): the release
    skips a locked row. Held briefly, the stop tries again and releases it (the next process
    handles it at once, the stopped attempt not counted). Held past the stop, the row is not
    released and the log says so, with the lease's end; never silence, never "released"."""
    import psycopg2

    with FakeBotApi() as fake:
        slow = fake.inject_message(chat_id=1, text="slow")
        first = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *DEFAULTS,
                           "--slow", "slow", "--slow-seconds", "60", "--stop-timeout", "1")
        bots.wait_ready(first)
        wait_sync("the slow handler running", lambda: first.pid in bots.started(slow), 20)
        locker = psycopg2.connect(bed.url)
        try:
            with locker.cursor() as cur:  # a transaction of its own, left open
                cur.execute(f"SELECT state FROM {bed.table} WHERE update_id = %s FOR UPDATE",  # noqa: S608
                            (slow,))
                assert cur.fetchone()[0] == "processing"
            first.send_signal(signal.SIGTERM)
            # the stop's deadline passed: it gives the running update back now
            _wait_log(bots, first.pid, "handler(s) still running", 20)
            if held == "briefly":
                import time

                time.sleep(0.3)
                locker.rollback()
            first.wait(1 + 8)
        finally:
            locker.close()
        assert first.returncode == 0, bots.output()
        lines = _log_lines(bots, first.pid)
        released = [line for line in lines if "released" in line and "not released" not in line]
        not_released = [line for line in lines if f"update {slow} attempt 1 was not released" in line]
        if held == "briefly":
            assert released and not not_released, "\n".join(lines)
            _nothing_leased(bots, bed)
            second = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *DEFAULTS)
            bots.wait_ready(second)
            _all_handled(bots, bed, [slow], 20, "the released update handled at once")
            _stop(bots, second, signal.SIGTERM, 15)
            written = _exactly_once(bed, [slow])
            assert written[slow][0][1] == 1, written  # released: the stopped attempt not spent
        else:
            assert not released, "\n".join(lines)
            assert len(not_released) == 1 and "lease covers it" in not_released[0], "\n".join(lines)
            assert bed.states()[slow] == "processing"  # left to its lease, as the log says
