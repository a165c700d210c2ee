"""FencedPersistence in real bot processes (tests/processes/persistence_worker.py: a PTB
``Application`` with a persistent three-step ``ConversationHandler``, ``run_polling()``, a
FakeBotApi as Telegram) on SQLite and PostgreSQL: SIGKILL between steps and in the middle of a
step, restart: the conversation continues at the right step, the domain rows and the state
agree, no step is applied twice; a second process sharing PostgreSQL takes a killed process's
update over and sees the first step's state; a failing attempt's change is not seen by its
retry; the same user in two chats at once (one process, and two processes) loses no change."""

from __future__ import annotations

import glob
import json
import os
import signal
import sqlite3
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore, StateKey
from ptb_fence._state_codec import conversation_state_key, decode_state
from ptb_fence.testing import FakeBotApi
from ptb_support import wait_sync
from store_support import fresh_table_name
from test_ptb_processes import Bots

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "persistence_worker.py")
SLOT, CONFIRM = 1, 2
DOMAIN = "(update_id BIGINT, user_id BIGINT, step INT, value TEXT, attempt INT, pid INT)"


class Bed:
    """A store (SQLite file or PostgreSQL table) with the bot's domain table."""

    def __init__(self, url: str, table: str, domain: str, open_store: Any, query: Any) -> None:
        self.url, self.table, self.domain = url, table, domain
        self.open_store, self.query = open_store, query

    def steps(self) -> List[Tuple[int, int, int, str]]:
        """``(update_id, user_id, step, value)`` of every domain row, by update id."""
        return sorted((int(u), int(us), int(s), str(v)) for u, us, s, v in self.query(
            f"SELECT update_id, user_id, step, value FROM {self.domain}"))  # noqa: S608

    def state(self, *keys: StateKey) -> Dict[StateKey, Any]:
        """The committed state of ``keys`` (decoded; a deleted state is :obj:`None`)."""
        store = self.open_store()
        try:
            rows = store.read_state(list(keys))
        finally:
            store.close()
        return {k: None if e.value is None else decode_state(e.value) for k, e in rows.items()}

    def versions(self, *keys: StateKey) -> Dict[StateKey, int]:
        """The stored version of each of ``keys`` that has a row."""
        store = self.open_store()
        try:
            rows = store.read_state(list(keys))
        finally:
            store.close()
        return {k: e.version for k, e in rows.items()}

    def completed(self, ids: List[int]) -> bool:
        rows = dict(self.query(f"SELECT update_id, state FROM {self.table}"))  # noqa: S608
        return all(rows.get(u) == "completed" for u in ids)

    def states(self, ids: List[int]) -> Dict[int, str]:
        """The row state of each of ``ids``."""
        rows = dict(self.query(f"SELECT update_id, state FROM {self.table}"))  # noqa: S608
        return {u: str(rows.get(u)) for u in ids}


@pytest.fixture(params=["sqlite", "postgres"])
def bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    if request.param == "sqlite":
        path = str(tmp_path / "bot.db")
        SQLiteUpdateStore(path).close()
        conn = sqlite3.connect(path)
        conn.execute(f"CREATE TABLE domain {DOMAIN}")
        conn.commit()
        conn.close()

        def query(sql: str) -> List[Any]:
            c = sqlite3.connect(path, timeout=10)
            try:
                return list(c.execute(sql))
            finally:
                c.close()

        yield Bed("sqlite:///" + path, "telegram_updates", "domain",
                  lambda: SQLiteUpdateStore(path), query)
        return
    import psycopg2

    dsn, table = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_table")
    domain = fresh_table_name()
    request.getfixturevalue("pg_tables").append(domain)
    PostgresUpdateStore(dsn, table).close()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True

    def pg_query(sql: str) -> List[Any]:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall()) if cur.description else []

    pg_query(f"CREATE TABLE {domain} {DOMAIN}")
    try:
        yield Bed(dsn, table, domain, lambda: PostgresUpdateStore(dsn, table), pg_query)
    finally:
        conn.close()


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


def seen(bots: Bots, update_id: int) -> List[Tuple[int, int, Dict[str, Any]]]:
    """``(attempt, pid, what the handler saw)`` for each run of a handler of ``update_id``, in
    the order they began (an attempt given back after a conflict runs again with its
    number)."""
    runs = []
    for path in glob.glob(os.path.join(bots.dir, f"seen.{update_id}.*")):
        _, _, attempt, pid = os.path.basename(path).split(".")
        with open(path, encoding="utf-8") as file:
            for line in file:
                saw = json.loads(line)
                runs.append((saw.pop("at"), int(attempt), int(pid), saw))
    return [(attempt, pid, saw) for _, attempt, pid, saw in sorted(runs, key=lambda r: r[0])]


def handled(bots: Bots, bed: Bed, ids: List[int], within: float = 60.0) -> None:
    try:
        wait_sync(f"updates {ids} completed", lambda: bed.completed(ids), within)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{bots.output()}") from None


def stop(bots: Bots, proc: Any) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


USER = 5
CONVERSATION = conversation_state_key("booking", (USER, USER))
USER_DATA = StateKey("user", "", str(USER))


def test_sigkill_between_and_in_the_middle_of_steps_the_conversation_continues(
    bots: Bots, bed: Bed
) -> None:
    with FakeBotApi() as fake:
        first = bots.spawn(fake, bed.url, bed.table, bed.domain, "--hang", "slot 10:00")
        bots.wait_ready(first)
        book = fake.inject_message(chat_id=USER, text="/book")
        handled(bots, bed, [book])
        bots.kill(first)  # between steps
        assert bed.state(CONVERSATION, USER_DATA) == {CONVERSATION: SLOT,
                                                      USER_DATA: {"booking": book}}
        second = bots.spawn(fake, bed.url, bed.table, bed.domain, "--hang", "slot 10:00")
        bots.wait_ready(second)
        slot = fake.inject_message(chat_id=USER, text="slot 10:00")
        wait_sync("the slot step hangs", lambda: glob.glob(
            os.path.join(bots.dir, f"hanging.{slot}.{second.pid}")), 30)
        bots.kill(second)  # in the middle of a step: user_data changed, nothing committed
        assert bed.state(CONVERSATION, USER_DATA) == {CONVERSATION: SLOT,
                                                      USER_DATA: {"booking": book}}
        third = bots.spawn(fake, bed.url, bed.table, bed.domain)
        bots.wait_ready(third)
        handled(bots, bed, [slot])  # taken over from the dead process
        confirm = fake.inject_message(chat_id=USER, text="yes")
        handled(bots, bed, [confirm])
        stop(bots, third)
    # every attempt started from the committed state: the retried step saw step 1's state
    assert [s[2] for s in seen(bots, slot)] == [
        {"state": SLOT, "user_data": {"booking": book}},
        {"state": SLOT, "user_data": {"booking": book}},
    ]
    assert seen(bots, confirm)[-1][2] == {
        "state": CONFIRM, "user_data": {"booking": book, "slot": "slot 10:00"}}
    # one domain row per step, and the state agrees with them
    assert bed.steps() == [(book, USER, 1, "book"), (slot, USER, 2, "slot 10:00"),
                           (confirm, USER, 3, "slot 10:00")]
    assert bed.state(CONVERSATION, USER_DATA) == {
        CONVERSATION: None,  # ended
        USER_DATA: {"booking": book, "slot": "slot 10:00", "confirmed": "slot 10:00"},
    }


@pytest.mark.parametrize("bed", ["postgres"], indirect=True)
def test_a_second_process_sharing_postgres_takes_over_and_sees_step_one(
    bots: Bots, bed: Bed
) -> None:
    with FakeBotApi() as fake:
        standby = bots.spawn(fake, bed.url, bed.table, bed.domain, "--no-poll")
        poller = bots.spawn(fake, bed.url, bed.table, bed.domain, "--hang", "slot 11:00")
        bots.wait_ready(standby, poller)
        book = fake.inject_message(chat_id=USER, text="/book")
        handled(bots, bed, [book])
        slot = fake.inject_message(chat_id=USER, text="slot 11:00")
        wait_sync("the slot step hangs in the poller", lambda: glob.glob(
            os.path.join(bots.dir, f"hanging.{slot}.{poller.pid}")), 30)
        bots.kill(poller)
        handled(bots, bed, [slot])  # the standby process takes it over
        bots.stop_all()
    took_over = [entry for entry in seen(bots, slot) if entry[1] == standby.pid]
    assert took_over and took_over[-1][2] == {"state": SLOT, "user_data": {"booking": book}}
    assert [s[:3] for s in bed.steps()] == [(book, USER, 1), (slot, USER, 2)]
    assert bed.state(CONVERSATION, USER_DATA) == {
        CONVERSATION: CONFIRM, USER_DATA: {"booking": book, "slot": "slot 11:00"}}


def test_a_failed_attempt_is_not_seen_by_its_retry(bots: Bots, bed: Bed) -> None:
    with FakeBotApi() as fake:
        bot = bots.spawn(fake, bed.url, bed.table, bed.domain, "--fail-once", "/set")
        bots.wait_ready(bot)
        update = fake.inject_message(chat_id=USER, text="/set")
        handled(bots, bed, [update])
        stop(bots, bot)
    attempts = seen(bots, update)
    assert [a[0] for a in attempts] == [1, 2]
    assert attempts[1][2]["user_data"] == {}  # x = 1 of the failed attempt is not there
    assert bed.state(USER_DATA) == {USER_DATA: {"x": 1}}
    assert bed.steps() == [(update, USER, 0, "x")]  # only the retry's commit


def _two_chats(fake: FakeBotApi, text: str) -> List[int]:
    return [fake.inject_message(chat_id=-100 - i, text=text, user_id=USER) for i in range(2)]


@pytest.mark.parametrize("text", ["/count", "/count txn"])
def test_the_same_user_in_two_chats_at_once_loses_no_change(
    bots: Bots, bed: Bed, text: str
) -> None:
    with FakeBotApi() as fake:
        bot = bots.spawn(fake, bed.url, bed.table, bed.domain, "--count-peer")
        bots.wait_ready(bot)
        ids = _two_chats(fake, text)
        handled(bots, bed, ids)
        stop(bots, bot)
    # both handlers read the count before either committed (each waited for the other's
    # read): one of them conflicted and ran again on the fresh count, its attempt not spent
    attempts = {u: seen(bots, u) for u in ids}
    assert sorted(len(a) for a in attempts.values()) == [1, 2], attempts
    retried = [a for a in attempts.values() if len(a) == 2][0]
    assert retried[0][2]["user_data"] == {} and retried[1][2]["user_data"] == {"count": 1}
    assert [run[0] for run in retried] == [1, 1]
    assert bed.state(USER_DATA) == {USER_DATA: {"count": 2}}
    if text == "/count txn":
        assert sorted(row[3] for row in bed.steps()) == ["1", "2"]  # the loser wrote nothing


@pytest.mark.parametrize("bed", ["postgres"], indirect=True)
def test_the_same_user_in_two_processes_at_once_loses_no_change(bots: Bots, bed: Bed) -> None:
    """Two processes share the PostgreSQL store, each polling its own Telegram (two FakeBotApi
    servers of one bot, so each gets one of the two updates); both handlers read the user's
    count before either commits."""
    with FakeBotApi() as one, FakeBotApi(token=one.token, first_update_id=5000) as other:
        first = bots.spawn(one, bed.url, bed.table, bed.domain, "--count-peer")
        second = bots.spawn(other, bed.url, bed.table, bed.domain, "--count-peer")
        bots.wait_ready(first, second)
        ids = [one.inject_message(chat_id=-100, text="/count", user_id=USER),
               other.inject_message(chat_id=-101, text="/count", user_id=USER)]
        handled(bots, bed, ids)
        bots.stop_all()
    # each first attempt ran in the process that polled it; the conflicting one's retry is a
    # pending row of the shared table, which either process may claim
    assert [seen(bots, u)[0][:2] for u in ids] == [(1, first.pid), (1, second.pid)]
    first_reads = [seen(bots, u)[0][2]["user_data"] for u in ids]
    assert first_reads == [{}, {}]  # both read before either committed
    assert bed.state(USER_DATA) == {USER_DATA: {"count": 2}}  # neither change was lost
    assert sorted(len(seen(bots, u)) for u in ids) == [1, 2]  # the conflicting one ran again
    assert {run[0] for u in ids for run in seen(bots, u)} == {1}  # its attempt not spent


@pytest.mark.parametrize("how", ["/menu", "/menu outbox"])
def test_a_keyboard_sent_by_one_process_resolves_in_another(
    bots: Bots, bed: Bed, how: str
) -> None:
    """Two processes share the store, each polling its own Telegram (two FakeBotApi servers of
    one bot): the first sends a keyboard whose button holds an object that is not JSON (with
    ``context.bot``, or queued through the outbox); the press reaches the second, whose cache
    never saw the keyboard: its handler gets the original object, read from the store."""
    with FakeBotApi() as one, FakeBotApi(token=one.token, first_update_id=5000) as other:
        first = bots.spawn(one, bed.url, bed.table, bed.domain, "--callback-data")
        second = bots.spawn(other, bed.url, bed.table, bed.domain, "--callback-data")
        bots.wait_ready(first, second)
        menu = one.inject_message(chat_id=USER, text=how)
        handled(bots, bed, [menu])
        shown = wait_sync("the keyboard shown", lambda: one.last_keyboard(USER), 30)
        data = shown["inline_keyboard"][0][0]["callback_data"]
        press = other.inject_callback_query(USER, data, message_id=shown["message_id"])
        handled(bots, bed, [press])
        bots.stop_all()
    got = glob.glob(os.path.join(bots.dir, f"pressed.{press}.*"))
    assert [os.path.basename(p).split(".")[2] for p in got] == [str(second.pid)]
    with open(got[0], encoding="utf-8") as file:
        assert file.read() == repr(("choice", frozenset({menu})))


BOT_DATA = StateKey("bot")


def settled(bots: Bots, bed: Bed, ids: List[int], within: float = 90.0) -> Dict[int, str]:
    """Wait until every update of ``ids`` is completed or abandoned; their row states."""
    try:
        wait_sync(f"updates {ids} settled", lambda: all(
            s in ("completed", "abandoned") for s in bed.states(ids).values()), within)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{bed.states(ids)}\n{bots.output()}") from None
    return bed.states(ids)


def conflicts_logged(bots: Bots) -> int:
    """How many attempts the bots' logs say conflicted (and were given back unspent)."""
    count = 0
    for path in glob.glob(os.path.join(bots.dir, "log.*")):
        with open(path, encoding="utf-8") as file:
            count += sum("conflicted on" in line for line in file)
    return count


@pytest.mark.parametrize("processes", [1, 2])
def test_forty_concurrent_increments_of_bot_data_all_land(
    bots: Bots, bed: Bed, processes: int
) -> None:
    """40 updates of 40 chats each add one to ``bot_data["n"]`` at once (one process, or two
    sharing the store, each polling its own Telegram): every version conflict is retried
    from the fresh state without spending an attempt, so none is abandoned and the total is
    40."""
    with FakeBotApi() as one, FakeBotApi(token=one.token, first_update_id=5000) as other:
        fakes = [one, other][:processes]
        procs = [bots.spawn(fake, bed.url, bed.table, bed.domain, "--inc-sleep", "0.05",
                            "--max-concurrent", "40") for fake in fakes]
        bots.wait_ready(*procs)
        ids = [fakes[i % processes].inject_message(chat_id=1000 + i, text="/inc")
               for i in range(40)]
        states = settled(bots, bed, ids)
        bots.stop_all()
    assert states == dict.fromkeys(ids, "completed")
    assert bed.state(BOT_DATA) == {BOT_DATA: {"n": 40}}
    runs = [run for u in ids for run in seen(bots, u)]
    # a conflict does not spend an attempt: every run of an update has attempt number 1, and
    # every run past the first of an update followed a conflict
    assert {run[0] for run in runs} == {1}
    assert conflicts_logged(bots) == len(runs) - 40 >= 1  # they did overlap


def test_a_slow_handler_contending_with_fast_ones_is_not_starved(bots: Bots, bed: Bed) -> None:
    """One slow update (0.3 s) and 40 fast ones (0.02 s) all add one to ``bot_data["n"]`` at
    once: the slow one loses every race against a fast one, yet the updates that conflicted
    run one at a time in the order they conflicted, so it lands, its attempt never spent."""
    with FakeBotApi() as fake:
        bot = bots.spawn(fake, bed.url, bed.table, bed.domain, "--inc-sleep", "0.02",
                         "--max-concurrent", "41")
        bots.wait_ready(bot)
        slow = fake.inject_message(chat_id=999, text="/inc slow")
        ids = [slow] + [fake.inject_message(chat_id=1000 + i, text="/inc") for i in range(40)]
        states = settled(bots, bed, ids)
        stop(bots, bot)
    assert states == dict.fromkeys(ids, "completed")
    assert bed.state(BOT_DATA) == {BOT_DATA: {"n": 41}}
    assert {run[0] for run in seen(bots, slow)} == {1}


@pytest.mark.parametrize("bed", ["postgres"], indirect=True)
def test_one_user_written_from_two_chats_by_two_processes_loses_no_change(
    bots: Bots, bed: Bed
) -> None:
    """30 updates of one user, from two chats, each polled by its own PostgreSQL process: every
    one adds one to ``user_data["count"]`` and lands, none abandoned."""
    with FakeBotApi() as one, FakeBotApi(token=one.token, first_update_id=5000) as other:
        first = bots.spawn(one, bed.url, bed.table, bed.domain, "--count-sleep", "0.02")
        second = bots.spawn(other, bed.url, bed.table, bed.domain, "--count-sleep", "0.02")
        bots.wait_ready(first, second)
        ids = []
        for _ in range(15):
            ids.append(one.inject_message(chat_id=-100, text="/count", user_id=USER))
            ids.append(other.inject_message(chat_id=-101, text="/count", user_id=USER))
        states = settled(bots, bed, ids)
        bots.stop_all()
    assert states == dict.fromkeys(ids, "completed")
    assert bed.state(USER_DATA) == {USER_DATA: {"count": 30}}
    runs = [run for u in ids for run in seen(bots, u)]
    assert {run[0] for run in runs} == {1}
    assert conflicts_logged(bots) == len(runs) - 30 >= 1


def test_a_set_read_under_another_hash_seed_is_not_written(
    bots: Bots, bed: Bed, monkeypatch: Any
) -> None:
    """``bot_data`` holds a set of strings written by a process with one ``PYTHONHASHSEED``;
    40 read-only updates in a process with another seed write nothing: the version stays,
    and each ran once (no conflict)."""
    with FakeBotApi() as fake:
        monkeypatch.setenv("PYTHONHASHSEED", "1")
        writer = bots.spawn(fake, bed.url, bed.table, bed.domain)
        bots.wait_ready(writer)
        handled(bots, bed, [fake.inject_message(chat_id=USER, text="/tags")])
        stop(bots, writer)
        version = bed.versions(BOT_DATA)
        assert version == {BOT_DATA: 1}
        monkeypatch.setenv("PYTHONHASHSEED", "2")
        reader = bots.spawn(fake, bed.url, bed.table, bed.domain, "--max-concurrent", "40")
        bots.wait_ready(reader)
        ids = [fake.inject_message(chat_id=2000 + i, text="/look") for i in range(40)]
        states = settled(bots, bed, ids)
        stop(bots, reader)
    assert states == dict.fromkeys(ids, "completed")
    assert bed.versions(BOT_DATA) == version
    assert sum(len(seen(bots, u)) for u in ids) == 40
    assert bed.state(BOT_DATA) == {BOT_DATA: {"tags": {f"tag-{i}" for i in range(64)}}}
