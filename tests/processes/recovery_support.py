"""What the recovery tests share: the store under test (SQLite file or PostgreSQL table, with
its fenced domain table), the bot processes and the checks (bounded stop, all handled, exactly
one fenced row per update).

The bot processes are tests/processes/ptb_bot_worker.py (a PTB ``Application``) or
tests/processes/intake_worker.py (a blocking ``UpdateIntake``); both take the same command line, so
a test written against :class:`Bots` runs on both (the ``bots`` fixture is parametrized by front
end).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from store_support import fresh_table_name
from ptb_fence import SQLiteUpdateStore
from ptb_fence.testing import make_message_update
from ptb_support import DOMAIN_DDL, rows, wait_sync
from test_ptb_processes import WORKER, Bots, _by_update, _sqlite_domain
from worker_support import make_store

INTAKE_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "intake_worker.py")

DEFAULTS = ("--lease", "120", "--sweep", "30", "--grace", "60")
"""The library defaults for lease, sweep and grace (the worker's own defaults are short)."""

STOP_TIMEOUT = 10.0
"""The library default of ``stop_timeout_seconds``."""


def _processes(tmp_path: Any, worker: str) -> Iterator[Bots]:
    directory = tmp_path / "bots"
    directory.mkdir()
    started = Bots(str(directory), worker)
    yield started
    for proc in started.procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


WORKERS = {"ptb": WORKER, "intake": INTAKE_WORKER}


@pytest.fixture(params=sorted(WORKERS))
def bots(request: Any, tmp_path: Any) -> Iterator[Bots]:
    """Bot processes of either front end: PTB ``Application`` (tests/processes/ptb_bot_worker.py) or
    blocking ``UpdateIntake`` (tests/processes/intake_worker.py); every test using it runs on
    both."""
    yield from _processes(tmp_path, WORKERS[request.param])


class Bed:
    """One store (SQLite file or PostgreSQL table) with its domain table."""

    def __init__(self, url: str, table: str, domain: str, states: Callable[[], Dict[int, str]],
                 written: Callable[[], List[Tuple[int, int, str, int]]],
                 query: Callable[[str], List[Any]]) -> None:
        self.url = url
        self.table = table
        self.domain = domain
        self.states = states
        self.written = written
        self.query = query

    def claims(self) -> Dict[Optional[str], int]:
        """``{instance: rows in processing}``: the claims each live instance holds now."""
        return {r[0]: r[1] for r in self.query(
            f"SELECT instance, COUNT(*) FROM {self.table} "  # noqa: S608
            "WHERE state = 'processing' GROUP BY instance")}

    def record_pending(self, count: int, chats: int) -> List[int]:
        """Record ``count`` message updates ``pending``, received an hour ago (an outage's
        backlog), over ``chats`` chats; returns their ids."""
        store = make_store(self.url, self.table)
        at = int(time.time() * 1000) - 3_600_000
        ids = list(range(1, count + 1))
        try:
            for first in range(0, count, 500):
                store.add_many([
                    (u, json.dumps(make_message_update(u, 1 + u % chats, f"m{u}", message_id=u)), at)
                    for u in ids[first:first + 500]])
        finally:
            store.close()
        return ids


# Not conftest's store: the bot processes reach the database by URL and table name.
@pytest.fixture(params=["sqlite", "postgres"])
def bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    yield from make_bed(request, tmp_path)


def make_bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    """The :class:`Bed` of ``request.param`` (``"sqlite"`` or ``"postgres"``), for a fixture."""
    if request.param == "sqlite":
        path = str(tmp_path / "bot.db")
        store = SQLiteUpdateStore(path)
        with store.transaction() as conn:
            conn.execute(DOMAIN_DDL)
        store.close()
        def sqlite_query(sql: str) -> List[Any]:
            conn = sqlite3.connect(path, timeout=10)
            try:
                return list(conn.execute(sql))
            finally:
                conn.close()

        yield Bed("sqlite:///" + path, "telegram_updates", "domain",
                  lambda: {u: r[0] for u, r in rows(path).items()},
                  lambda: _sqlite_domain(path), sqlite_query)
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
                  lambda: query(f"SELECT update_id, attempt, claim_id, pid FROM {domain}"), query)
    finally:
        conn.close()


def _stop(bots: Bots, proc: Any, sig: int, bound: float) -> float:
    """Send ``sig``; return the seconds until the process exited (fails past ``bound``)."""
    began = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(bound)
    except Exception:
        proc.send_signal(signal.SIGUSR1)  # its threads' stacks, to its output (worker_support)
        time.sleep(1)
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


def _client_ports(pid: int) -> List[int]:
    """The local TCP ports of the sockets process ``pid`` has open (its database sessions
    among them), read from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _freeze_between_transactions(proc: Any, bed: Bed, tries: int = 100) -> int:
    """SIGSTOP ``proc`` at a moment when none of its PostgreSQL sessions is inside a
    transaction; returns how many freezes had to be undone first.

    A process frozen between a statement and its commit keeps that transaction's row locks
    for as long as it stays frozen (the server cannot end it: the session is alive), so the
    row it was renewing or settling cannot be claimed by anyone, lease or not; that is the
    database's rule, not what a test of the lease means to show. Such a freeze is undone
    (SIGCONT) and tried again a moment later. On SQLite nothing is checked."""
    if not bed.url.startswith("postgresql"):
        proc.send_signal(signal.SIGSTOP)
        return 0
    for undone in range(tries):
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.3)  # a statement already sent reaches its backend and runs
        ports = _client_ports(proc.pid)
        busy = ports and bed.query(
            "SELECT state FROM pg_stat_activity WHERE client_port IN ({}) "  # noqa: S608
            "AND state <> 'idle'".format(", ".join(str(p) for p in ports)))
        if ports and not busy:  # no sessions seen: not known to be outside a transaction
            return undone
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"bot {proc.pid} was inside a transaction at each of {tries} freezes")


def _exactly_once(bed: Bed, ids: List[int]) -> Dict[int, List[Tuple[int, int, str, int]]]:
    written = _by_update(bed.written())
    assert set(written) == set(ids)
    assert all(len(v) == 1 for v in written.values()), {u: v for u, v in written.items() if len(v) != 1}
    return written


def _nothing_leased(bots: Bots, bed: Bed) -> None:
    """After a graceful stop no row is left ``processing``: every claim was settled or
    released (else it would wait for its lease)."""
    leased = sorted(u for u, state in bed.states().items() if state == "processing")
    assert not leased, f"still leased after the stop: {leased}\n{bots.output()}"
