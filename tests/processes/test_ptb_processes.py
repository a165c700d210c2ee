"""Real PTB bot processes (tests/processes/ptb_bot_worker.py) against a FakeBotApi in the test
process.

A bot is SIGKILLed in the middle of a handler; a restarted or second process takes its work
over. Each committed attempt writes one fenced domain row (``run_in_transaction(...,
complete=True)``) in the same database as the updates, so "handled exactly once" is a count of
domain rows per update.
"""

from __future__ import annotations

import glob
import os
import signal
import sqlite3
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from store_support import fresh_table_name
from ptb_fence import SQLiteUpdateStore
from ptb_fence.testing import FakeBotApi
from ptb_support import DOMAIN_DDL, rows, wait_sync

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "ptb_bot_worker.py")


class Bots:
    """Starts worker processes and makes sure none outlives the test."""

    def __init__(self, directory: str, worker: str = WORKER) -> None:
        self.dir = directory
        self.worker = worker
        self.procs: List[subprocess.Popen] = []  # type: ignore[type-arg]

    def spawn(self, fake: FakeBotApi, store: str, table: str, domain: str, *extra: str) -> Any:
        out = open(os.path.join(self.dir, f"out.{len(self.procs)}"), "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, self.worker, fake.base_url, fake.token, store, table,
             "--dir", self.dir, "--domain", domain, *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        self.procs.append(proc)
        return proc

    def wait_ready(self, *procs: Any, timeout: float = 30) -> None:
        for proc in procs:
            wait_sync(
                f"bot {proc.pid} ready (see {self.dir})",
                lambda: os.path.exists(os.path.join(self.dir, f"ready.{proc.pid}"))
                or proc.poll() is not None,
                timeout,
            )
            assert proc.poll() is None, f"bot {proc.pid} exited: {self.output()}"

    def started(self, update_id: int) -> List[int]:
        """The pids whose handler began ``update_id``."""
        return [int(p.rsplit(".", 1)[1]) for p in glob.glob(os.path.join(self.dir, f"started.{update_id}.*"))]

    def kill(self, proc: Any) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop_all(self) -> None:
        with open(os.path.join(self.dir, "stop"), "w", encoding="utf-8"):
            pass
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def output(self) -> str:
        text = []
        for path in sorted(glob.glob(os.path.join(self.dir, "out.*")) + glob.glob(os.path.join(self.dir, "log.*"))):
            with open(path, "rb") as file:
                text.append(f"--- {path}\n" + file.read().decode("utf-8", "replace")[-3000:])
        return "\n".join(text)


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


def _sqlite_domain(path: str) -> List[Tuple[int, int, str, int]]:
    conn = sqlite3.connect(path, timeout=10)
    try:
        return list(conn.execute("SELECT update_id, attempt, claim_id, pid FROM domain"))
    finally:
        conn.close()


def _by_update(domain: List[Tuple[int, int, str, int]]) -> Dict[int, List[Tuple[int, int, str, int]]]:
    result: Dict[int, List[Tuple[int, int, str, int]]] = {}
    for row in domain:
        result.setdefault(row[0], []).append(row)
    return result


def test_sigkill_mid_handler_then_restart_loses_nothing(tmp_path: Any, bots: Bots) -> None:
    path = str(tmp_path / "bot.db")
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute(DOMAIN_DDL)
    store.close()
    url = "sqlite:///" + path
    with FakeBotApi() as fake:
        ids = [fake.inject_message(chat_id=1 + i % 4, text=f"m{i}") for i in range(8)]
        slow = fake.inject_message(chat_id=9, text="slow")
        ids.append(slow)
        first = bots.spawn(fake, url, "telegram_updates", "domain", "--poll", "--hang", "slow")
        bots.wait_ready(first)
        wait_sync("the slow handler to start", lambda: first.pid in bots.started(slow), 15)
        ids += [fake.inject_message(chat_id=1 + i % 4, text=f"n{i}") for i in range(6)]
        time.sleep(0.1)
        bots.kill(first)  # mid-handler: the slow update is processing under a live lease
        assert rows(path)[slow][:2] == ("processing", 1)
        ids += [fake.inject_message(chat_id=5, text=f"after{i}") for i in range(3)]

        second = bots.spawn(fake, url, "telegram_updates", "domain", "--poll")
        bots.wait_ready(second)

        def done() -> bool:
            table = rows(path)
            return set(table) >= set(ids) and all(table[u][0] == "completed" for u in ids)

        try:
            wait_sync("every update completed", done, 25)
            wait_sync("every update confirmed", lambda: fake.confirmed_update_ids >= set(ids), 10)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{rows(path)}\n{bots.output()}") from None
        bots.stop_all()
        assert second.returncode == 0, bots.output()
    domain = _by_update(_sqlite_domain(path))
    assert set(domain) == set(ids)
    assert all(len(v) == 1 for v in domain.values()), domain  # exactly one write per update
    (slow_row,) = domain[slow]
    # taken over from the dead process; its crashed attempt was given back (the handler did not
    # run alone there, so the crash is not charged to it) and the new claim has a new claim id
    assert slow_row[1] == 1 and slow_row[3] == second.pid
    table = rows(path)
    assert all(table[u][0] == "completed" for u in ids)
    assert table[slow][1] == 1


def test_a_retry_that_matches_no_handler_after_a_restart_is_a_warning(tmp_path: Any, bots: Bots) -> None:
    """A ConversationHandler bot (its state per process) is SIGKILLed while handling the
    second step of a conversation; after the restart that update is retried, matches no handler
    (the conversation state died with the process) and is settled completed: the log says so at
    WARNING, with the hint that per-process state may be stale. A first attempt that matches
    no handler (an ordinary message outside a conversation) stays quiet."""
    path = str(tmp_path / "bot.db")
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute(DOMAIN_DDL)
    store.close()
    url = "sqlite:///" + path
    args = ("--conversation", "--hang", "10:00", "--run-polling")
    with FakeBotApi() as fake:
        book = fake.inject_message(chat_id=1, text="/book")
        first = bots.spawn(fake, url, "telegram_updates", "domain", *args)
        bots.wait_ready(first)
        wait_sync("/book completed", lambda: rows(path).get(book, ("",))[0] == "completed", 20)
        chosen = fake.inject_message(chat_id=1, text="10:00")
        wait_sync("the second step to start", lambda: first.pid in bots.started(chosen), 20)
        bots.kill(first)  # mid-conversation: the in-memory conversation state is gone
        assert rows(path)[chosen][:2] == ("processing", 1)
        stray = fake.inject_message(chat_id=2, text="hello")  # no conversation: no handler
        second = bots.spawn(fake, url, "telegram_updates", "domain", *args)
        bots.wait_ready(second)
        try:
            wait_sync(
                "both completed",
                lambda: all(rows(path).get(u, ("",))[0] == "completed" for u in (chosen, stray)),
                25,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{rows(path)}\n{bots.output()}") from None
        second.send_signal(signal.SIGTERM)
        second.wait(20)
    # the crashed attempt was given back (the handler did not run alone there): the rerun
    # is attempt 1 again, with a new claim id, and ran alone as a suspect
    assert rows(path)[chosen][:2] == ("completed", 1)
    assert _sqlite_domain(path) == []  # the second step never ran to its write
    with open(os.path.join(bots.dir, f"log.{second.pid}"), encoding="utf-8") as file:
        log = file.read()
    warnings = [line for line in log.splitlines() if " WARNING " in line and "no handler" in line]
    assert len(warnings) == 1, log
    assert f"update {chosen} attempt 1" in warnings[0], warnings
    assert "stale" in warnings[0] and "conversation" in warnings[0], warnings
    assert f"update {stray} " not in warnings[0]


@pytest.mark.parametrize("how", ["kill", "freeze"])
def test_a_takeover_that_matches_no_handler_is_a_warning_in_the_other_process(
    pg_dsn: str, pg_table: str, pg_tables: List[str], tmp_path: Any, bots: Bots, how: str
) -> None:
    """Two ConversationHandler bots (state per process) share PostgreSQL. The one that polls
    handles ``/book`` and starts the conversation's second step; then it is SIGKILLed (the
    other process finds it dead and takes its claim over: attempt 1, given back) or frozen
    past its lease (SIGSTOP: the other process takes the lapsed lease over: attempt 2). In the
    other process the update matches no handler, as the conversation began in the first, and
    is settled completed: that process logs it once at WARNING, with the hint that per-process
    conversation or persistence state may be stale."""
    import psycopg2

    from ptb_fence import PostgresUpdateStore

    domain = fresh_table_name()
    pg_tables.append(domain)
    PostgresUpdateStore(pg_dsn, pg_table).close()  # schema
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True

    def query(sql: str) -> List[Any]:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())

    def row(update_id: int) -> Tuple[str, int]:
        found = query(f"SELECT state, attempts FROM {pg_table} WHERE update_id = {update_id}")
        return (str(found[0][0]), int(found[0][1])) if found else ("", 0)

    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {domain} (update_id BIGINT, attempt INT, claim_id TEXT, pid INT)")
    # killed: a lease far longer than finding a dead process takes (about 3 s on PostgreSQL),
    # so only the dead-process path can explain the takeover; frozen: a lease of 1 s to lapse
    lease = "15" if how == "kill" else "1"
    try:
        with FakeBotApi() as fake:
            receiver = bots.spawn(fake, pg_dsn, pg_table, domain, "--poll", "--conversation",
                                  "--hang", "10:00", "--lease", lease)
            other = bots.spawn(fake, pg_dsn, pg_table, domain, "--conversation")  # no polling
            bots.wait_ready(receiver, other)
            book = fake.inject_message(chat_id=1, text="/book")
            wait_sync("/book completed", lambda: row(book)[0] == "completed", 20)
            chosen = fake.inject_message(chat_id=1, text="10:00")
            wait_sync("the second step to start in the receiver",
                      lambda: receiver.pid in bots.started(chosen), 20)
            if how == "kill":
                bots.kill(receiver)
            else:
                receiver.send_signal(signal.SIGSTOP)
            try:
                wait_sync("the other process to settle the step",
                          lambda: row(chosen)[0] == "completed", 25)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{row(chosen)}\n{bots.output()}") from None
            if how == "freeze":
                bots.kill(receiver)  # SIGKILL ends a stopped process too
            bots.stop_all()
        assert other.returncode == 0, bots.output()
        assert row(chosen) == ("completed", 1 if how == "kill" else 2)
        assert bots.started(chosen) == [receiver.pid]  # no handler ran in the other process
        assert query(f"SELECT update_id FROM {domain}") == []
    finally:
        conn.close()
    with open(os.path.join(bots.dir, f"log.{other.pid}"), encoding="utf-8") as file:
        log = file.read()
    warnings = [line for line in log.splitlines() if " WARNING " in line and "no handler" in line]
    assert len(warnings) == 1, log
    assert f"update {chosen} attempt {1 if how == 'kill' else 2}" in warnings[0], warnings
    assert "stale" in warnings[0] and "conversation" in warnings[0], warnings
    assert "taken over" in warnings[0], warnings


def test_two_processes_share_postgres_and_take_over_a_killed_receiver(
    pg_dsn: str, pg_table: str, pg_tables: List[str], tmp_path: Any, bots: Bots
) -> None:
    import psycopg2

    from ptb_fence import PostgresUpdateStore

    domain = fresh_table_name()
    pg_tables.append(domain)
    PostgresUpdateStore(pg_dsn, pg_table).close()  # schema
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True

    def query(sql: str) -> List[Any]:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())

    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {domain} (update_id BIGINT, attempt INT, claim_id TEXT, pid INT)")
    try:
        with FakeBotApi() as fake:
            # a lease far longer than finding a dead process takes (about 3 s on PostgreSQL):
            # the takeover is the dead-process path, which gives the crashed attempts back
            receiver = bots.spawn(
                fake, pg_dsn, pg_table, domain, "--poll", "--hang", "slow", "--lease", "15"
            )
            worker = bots.spawn(fake, pg_dsn, pg_table, domain)
            bots.wait_ready(receiver, worker)
            ids = [fake.inject_message(chat_id=1 + i % 6, text=f"m{i}") for i in range(20)]
            slow = [fake.inject_message(chat_id=20 + i, text="slow") for i in range(3)]
            ids += slow
            wait_sync("a slow handler in the receiver",
                      lambda: any(receiver.pid in bots.started(u) for u in slow), 15)
            ids += [fake.inject_message(chat_id=1 + i % 6, text=f"n{i}") for i in range(10)]
            time.sleep(0.05)
            bots.kill(receiver)
            hung = [u for u in slow if receiver.pid in bots.started(u)]
            assert hung

            def states() -> Dict[int, str]:
                return {r[0]: r[1] for r in query(f"SELECT update_id, state FROM {pg_table}")}

            # the other process finds the receiver dead and takes its claims over (nobody
            # polls right now)
            try:
                wait_sync("the worker takes the hung updates over",
                          lambda: all(states().get(u) == "completed" for u in hung), 15)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{states()}\n{bots.output()}") from None
            # a new receiver fetches whatever the killed one had not recorded
            receiver2 = bots.spawn(fake, pg_dsn, pg_table, domain, "--poll")
            bots.wait_ready(receiver2)
            try:
                wait_sync("every update completed",
                          lambda: all(states().get(u) == "completed" for u in ids), 20)
                wait_sync("every update confirmed",
                          lambda: fake.confirmed_update_ids >= set(ids), 10)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{states()}\n{bots.output()}") from None
            bots.stop_all()
        written = _by_update(query(f"SELECT update_id, attempt, claim_id, pid FROM {domain}"))
        assert set(written) == set(ids)
        assert all(len(v) == 1 for v in written.values()), written
        for update_id in hung:
            ((_, attempt, _, pid),) = written[update_id]
            # the killed receiver's attempt was given back (not run alone there)
            assert attempt == 1 and pid == worker.pid, (update_id, attempt, pid)
        assert {r[3] for v in written.values() for r in v} <= {receiver.pid, worker.pid, receiver2.pid}
    finally:
        conn.close()
