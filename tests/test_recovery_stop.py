"""Issue 12 item 1: a graceful stop releases what it claimed, and ends in bounded time.

Real PTB bot processes (tests/ptb_bot_worker.py, ``run_polling()``) against a FakeBotApi,
stopped with SIGTERM/SIGINT, with the library's default lease (120 s): waiting for a lease
would blow every bound below, so the next process can only meet them if the stopping process
released its claims. Each committed attempt writes one fenced domain row, so "handled exactly
once" is one domain row per update.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

from conftest import fresh_table_name
from ptb_fence import SQLiteUpdateStore
from ptb_fence.testing import FakeBotApi
from ptb_support import DOMAIN_DDL, rows, wait_sync
from test_ptb_processes import Bots, _by_update, _sqlite_domain

DEFAULTS = ("--lease", "120", "--sweep", "30", "--grace", "60")
"""The library defaults for lease, sweep and grace (the worker's own defaults are short)."""

STOP_TIMEOUT = 10.0
"""The library default of ``stop_timeout_seconds``."""


@pytest.fixture
def bots(tmp_path: Any) -> Iterator[Bots]:
    directory = tmp_path / "bots"
    directory.mkdir()
    bed = Bots(str(directory))
    yield bed
    for proc in bed.procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


class Bed:
    """One store (SQLite file or PostgreSQL table) with its domain table."""

    def __init__(self, url: str, table: str, domain: str, states: Callable[[], Dict[int, str]],
                 written: Callable[[], List[Tuple[int, int, str, int]]]) -> None:
        self.url = url
        self.table = table
        self.domain = domain
        self.states = states
        self.written = written


@pytest.fixture(params=["sqlite", "postgres"])
def bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    if request.param == "sqlite":
        path = str(tmp_path / "bot.db")
        store = SQLiteUpdateStore(path)
        with store.transaction() as conn:
            conn.execute(DOMAIN_DDL)
        store.close()
        yield Bed("sqlite:///" + path, "telegram_updates", "domain",
                  lambda: {u: r[0] for u, r in rows(path).items()},
                  lambda: _sqlite_domain(path))
        return
    import psycopg2

    from ptb_fence import PostgresUpdateStore

    dsn = request.getfixturevalue("pg_dsn")
    table = request.getfixturevalue("pg_table")
    tables = request.getfixturevalue("pg_tables")
    domain = fresh_table_name()
    tables.append(domain)
    PostgresUpdateStore(dsn, table).close()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True

    def query(sql: str) -> List[Any]:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall()) if cur.description else []

    query(f"CREATE TABLE {domain} (update_id BIGINT, attempt INT, claim_id TEXT, pid INT)")
    try:
        yield Bed(dsn, table, domain,
                  lambda: {r[0]: r[1] for r in query(f"SELECT update_id, state FROM {table}")},
                  lambda: query(f"SELECT update_id, attempt, claim_id, pid FROM {domain}"))
    finally:
        conn.close()


def _stop(bots: Bots, proc: Any, sig: int, bound: float) -> float:
    """Send ``sig``; return the seconds until the process exited (fails past ``bound``)."""
    began = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(bound)
    except Exception:
        raise AssertionError(
            f"bot {proc.pid} still running {bound:.1f} s after {signal.Signals(sig).name}\n"
            f"{bots.output()}"
        ) from None
    return time.monotonic() - began


def _all_handled(bots: Bots, bed: Bed, ids: List[int], within: float, what: str) -> None:
    try:
        wait_sync(what, lambda: all(bed.states().get(u) == "completed" for u in ids), within)
    except AssertionError as exc:
        states = bed.states()
        late = {u: states.get(u) for u in ids if states.get(u) != "completed"}
        raise AssertionError(f"{exc}\nnot completed: {late}\n{bots.output()}") from None


def _exactly_once(bed: Bed, ids: List[int]) -> Dict[int, List[Tuple[int, int, str, int]]]:
    written = _by_update(bed.written())
    assert set(written) == set(ids)
    assert all(len(v) == 1 for v in written.values()), {u: v for u, v in written.items() if len(v) != 1}
    return written


@pytest.mark.parametrize("mode,sig", [("burst", signal.SIGTERM), ("stream", signal.SIGINT),
                                      ("stream", signal.SIGTERM)])
def test_signal_releases_claims_so_the_next_process_handles_them_at_once(
    bots: Bots, bed: Bed, mode: str, sig: int
) -> None:
    with FakeBotApi() as fake:
        # one busy chat (a backlog queued behind slow handlers) and a few others
        ids = [fake.inject_message(chat_id=1 + (i % 3 and i % 5), text="slow" if i % 3 == 0 else f"m{i}")
               for i in range(60)]
        first = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *DEFAULTS,
                           "--slow", "slow", "--slow-seconds", "0.2")
        bots.wait_ready(first)
        wait_sync("some handled", lambda: sum(s == "completed" for s in bed.states().values()) >= 5, 20)
        feeding = threading.Event()
        feeder = None
        if mode == "stream":
            fed: List[int] = []

            def feed() -> None:
                n = 0
                while not feeding.is_set():
                    fed.append(fake.inject_message(chat_id=10 + n % 7, text=f"s{n}"))
                    n += 1
                    time.sleep(0.01)

            feeder = threading.Thread(target=feed, daemon=True)
            feeder.start()
            time.sleep(0.3)
        took = _stop(bots, first, sig, STOP_TIMEOUT + 5)
        if feeder is not None:
            time.sleep(0.3)  # updates keep arriving after the signal
            feeding.set()
            feeder.join(5)
            ids += fed
        assert first.returncode == 0, bots.output()
        assert took < STOP_TIMEOUT + 5
        second = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *DEFAULTS)
        bots.wait_ready(second)
        # far below the 120 s lease: only released claims can be handled this fast
        _all_handled(bots, bed, ids, 20, "every update handled by the next process")
        wait_sync("every update confirmed", lambda: fake.confirmed_update_ids >= set(ids), 10)
        _stop(bots, second, signal.SIGTERM, STOP_TIMEOUT + 5)
    _exactly_once(bed, ids)


def test_stop_with_a_handler_that_never_returns_is_bounded(bots: Bots, bed: Bed) -> None:
    with FakeBotApi() as fake:
        hang = fake.inject_message(chat_id=9, text="hang")
        # the hung chat's backlog: durable, released, not worked through before stopping
        ids = [hang] + [fake.inject_message(chat_id=9, text=f"q{i}") for i in range(30)]
        ids += [fake.inject_message(chat_id=1 + i % 4, text=f"m{i}") for i in range(12)]
        first = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *DEFAULTS,
                           "--hang", "hang")
        bots.wait_ready(first)
        wait_sync("the hung handler to start", lambda: first.pid in bots.started(hang), 20)
        took = _stop(bots, first, signal.SIGTERM, STOP_TIMEOUT + 5)
        assert first.returncode == 0, bots.output()
        assert took < STOP_TIMEOUT + 3, took
        second = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *DEFAULTS)
        bots.wait_ready(second)
        _all_handled(bots, bed, ids, 20, "the next process handles the released updates")
        _stop(bots, second, signal.SIGTERM, STOP_TIMEOUT + 5)
    written = _exactly_once(bed, ids)
    ((_, attempt, _, pid),) = written[hang]
    assert pid == second.pid
    assert attempt == 1  # released: the stopped attempt was not counted as spent
