"""The runnable examples in ``examples/`` do what their docstrings say.

Each example runs as a real subprocess (``sys.executable``) against the fake Bot API
(:class:`ptb_fence.testing.FakeBotApi`) and, for the webhook examples, real HTTP posts
(:func:`ptb_fence.testing.post_to_webhook`) on 127.0.0.1. The tests assert what a user would
observe: replies sent, domain rows written exactly once, exhaustions stored and acknowledged,
clean exits (code 0) on SIGINT/SIGTERM or ``--exit-after``. Every wait is bounded and every
process still running at the end is killed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from ptb_fence import SQLiteUpdateStore
from ptb_fence.testing import FakeBotApi, make_message_update, post_to_webhook

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SECRET = "example-secret_42"
BLOCKED = "Forbidden: bot was blocked by the user"
STARTUP = 45.0  # seconds a bot process may take to come up (imports are slow on a busy machine)


# -- process handling -------------------------------------------------------------------------
class Runner:
    """Starts example processes with their output in files; kills leftovers at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.procs: List["subprocess.Popen[bytes]"] = []
        self.logs: Dict[int, Path] = {}

    def start(self, script: str, *args: str, env: Optional[Dict[str, str]] = None,
              name: str = "") -> "subprocess.Popen[bytes]":
        log = self.dir / f"{name or Path(script).stem}-{len(self.procs)}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("TELEGRAM_")}
        full_env.pop("PTB_FENCE_POSTGRES_DSN", None)  # the tests pass --dsn explicitly
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
        )
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env.update(env or {})
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(EXAMPLES / script), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                env=full_env,
            )
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def log(self, proc: "subprocess.Popen[bytes]") -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def all_logs(self) -> str:
        return "\n".join(
            f"----- {path.name} (pid {pid}) -----\n{path.read_text(errors='replace')[-6000:]}"
            for pid, path in self.logs.items()
        )

    def wait_for(self, what: str, condition: Callable[[], Any], timeout: float,
                 alive: Optional[List["subprocess.Popen[bytes]"]] = None) -> Any:
        """Poll ``condition`` until truthy; fail after ``timeout`` s or when a process in
        ``alive`` exits first (with all logs in the message)."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            for proc in alive or []:
                if proc.poll() is not None:
                    raise AssertionError(
                        f"waiting for {what}: process {proc.pid} exited with "
                        f"{proc.returncode}\n{self.all_logs()}"
                    )
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}\n"
                                     f"{self.all_logs()}")
            time.sleep(0.05)

    def stop(self, proc: "subprocess.Popen[bytes]", sig: int, timeout: float = 30.0) -> int:
        """Send ``sig`` and return the exit code (fails if the process does not exit)."""
        proc.send_signal(sig)
        return self.exit_code(proc, timeout)

    def exit_code(self, proc: "subprocess.Popen[bytes]", timeout: float = 30.0) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"process {proc.pid} did not exit within {timeout}s\n"
                                 f"{self.all_logs()}") from None

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:  # pragma: no cover - a process in D state
                    pass


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    r = Runner(tmp_path)
    try:
        yield r
    finally:
        r.kill_all()


@pytest.fixture
def fake() -> Iterator[FakeBotApi]:
    with FakeBotApi() as server:
        yield server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def texts_to(fake: FakeBotApi, chat_id: int) -> List[str]:
    return [m["text"] for m in fake.sent_messages if m["chat_id"] == chat_id]


def query(path: Path, sql: str, *params: Any) -> List[Any]:
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def assert_one_booking_per_update(rows: List[Any]) -> None:
    update_ids = [row[0] for row in rows]
    assert len(update_ids) == len(set(update_ids)), f"an update booked twice: {rows}"


# -- examples/polling_sqlite.py --------------------------------------------------------------
def test_polling_sqlite_books_once_replies_and_stores_exhaustion(
    runner: Runner, fake: FakeBotApi, tmp_path: Path
) -> None:
    db = tmp_path / "bookings.sqlite3"
    # the first "typing…" is refused as if the user had blocked the bot
    fake.fail_next("sendChatAction", 1, error_code=403, description=BLOCKED)
    blocked = fake.inject_message(chat_id=1, text="/book 09:00")
    bot = runner.start(
        "polling_sqlite.py", "--db", str(db), "--base-url", fake.base_url, "--exit-after", "4",
        env={"TELEGRAM_BOT_TOKEN": fake.token},
    )
    runner.wait_for("the refused sendChatAction", lambda: fake.calls_to("sendChatAction"),
                    STARTUP, alive=[bot])
    first = fake.inject_message(chat_id=2, text="/book 10:00")
    second = fake.inject_message(chat_id=3, text="/book 10:00")
    usage = fake.inject_message(chat_id=4, text="/book soon")

    assert runner.exit_code(bot, timeout=45) == 0, runner.all_logs()  # --exit-after 4

    # replies: one booking of 10:00, one "taken", one usage hint, nothing to the blocked user
    replies = texts_to(fake, 2) + texts_to(fake, 3)
    assert sorted(replies) == ["Booked 10:00 for you.", "Sorry, 10:00 is already taken."], \
        fake.sent_messages
    assert texts_to(fake, 4) == ["Usage: /book HH:MM, e.g. /book 10:30"]
    assert texts_to(fake, 1) == []
    assert len(fake.sent_messages) == 3
    assert {blocked, first, second, usage} <= fake.confirmed_update_ids

    # the domain table: slot 10:00 booked exactly once, by one of the two updates
    bookings = query(db, "SELECT update_id, slot, chat_id FROM bookings")
    assert len(bookings) == 1 and bookings[0][1] == "10:00", bookings
    assert bookings[0][0] in (first, second)
    winner_chat = 2 if bookings[0][0] == first else 3
    assert texts_to(fake, winner_chat) == ["Booked 10:00 for you."]

    # the blocked user's update: one exhaustion stored, and acknowledged in the update table
    exhaustions = query(db, "SELECT update_id, attempt, error FROM booking_exhaustions")
    assert len(exhaustions) == 1 and exhaustions[0][:2] == (blocked, 1), exhaustions
    assert "blocked by the user" in exhaustions[0][2]
    states = dict(
        (row[0], row[1:])
        for row in query(db, "SELECT update_id, state, attempts, settled_at IS NOT NULL "
                             "FROM telegram_updates")
    )
    assert states[blocked] == ("abandoned", 1, 1)  # settled_at set = acknowledged
    for update_id in (first, second, usage):
        assert states[update_id] == ("completed", 1, 1)


def test_polling_sqlite_no_polling_handles_records_left_by_a_crash(
    runner: Runner, fake: FakeBotApi, tmp_path: Path
) -> None:
    db = tmp_path / "bookings.sqlite3"
    # an update recorded (acknowledged to Telegram) by a process that died before handling it
    update = make_message_update(4242, 7, "/book 08:15")
    with SQLiteUpdateStore(str(db)) as store:
        assert store.add(4242, json.dumps(update), int(time.time() * 1000))
    bot = runner.start(
        "polling_sqlite.py", "--db", str(db), "--base-url", fake.base_url, "--no-polling",
        env={"TELEGRAM_BOT_TOKEN": fake.token},
    )
    runner.wait_for("the reply", lambda: texts_to(fake, 7), STARTUP, alive=[bot])
    assert runner.stop(bot, signal.SIGTERM) == 0, runner.all_logs()

    assert texts_to(fake, 7) == ["Booked 08:15 for you."]
    assert fake.calls_to("getUpdates") == []  # --no-polling never polls
    bookings = query(db, "SELECT update_id, slot, chat_id FROM bookings")
    assert bookings == [(4242, "08:15", 7)]
    assert query(db, "SELECT state, attempts FROM telegram_updates WHERE update_id = 4242") == [
        ("completed", 1)
    ]
    assert "stopped" in runner.log(bot)


# -- examples/webhook_postgres.py ------------------------------------------------------------
def test_webhook_postgres_two_processes_sweeper_takes_over_a_killed_webhook(
    runner: Runner, fake: FakeBotApi, pg_dsn: str, pg_table: str, pg_tables: List[str]
) -> None:
    import psycopg2

    bookings_table = pg_table + "_bookings"
    pg_tables.append(bookings_table)  # dropped by the fixture
    port = free_port()
    url = f"http://127.0.0.1:{port}/telegram"
    env = {"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_WEBHOOK_SECRET": SECRET}
    common = [
        "--dsn", pg_dsn, "--table", pg_table, "--bookings-table", bookings_table,
        "--base-url", fake.base_url,
        # a lease far longer than finding a dead process takes (about 3 s on PostgreSQL), so
        # the takeover is the dead-process path; the sweeper waits 5 s before it takes a
        # *pending* update, so the webhook process handles what it receives
        "--lease-seconds", "15", "--sweep-every", "0.3", "--pending-grace", "5",
    ]
    webhook = runner.start("webhook_postgres.py", *common, "--listen", "127.0.0.1",
                           "--port", str(port), env=env, name="webhook")
    sweeper = runner.start("webhook_postgres.py", *common, "--no-webhook", env=env,
                           name="sweeper")
    runner.wait_for("the webhook to listen", lambda: listening(port), STARTUP,
                    alive=[webhook, sweeper])
    runner.wait_for("the sweeper to run", lambda: "sweeping (no webhook)" in runner.log(sweeper),
                    STARTUP, alive=[webhook, sweeper])
    assert fake.webhook["url"] == url and fake.webhook["secret_token"] == SECRET

    def post(update_id: int, chat_id: int, text: str, secret: str = SECRET) -> int:
        return post_to_webhook(url, make_message_update(update_id, chat_id, text),
                               secret_token=secret)

    assert post(501, 11, "/book 11:00") == 200
    assert post(502, 12, "/book 12:00") == 200
    assert post(501, 11, "/book 11:00") == 200  # Telegram redelivers: a duplicate, one row
    assert post(503, 13, "/book 13:00", secret="wrong") == 403
    runner.wait_for("two replies", lambda: len(fake.sent_messages) >= 2, 30,
                    alive=[webhook, sweeper])

    def recorded_sent() -> int:
        conn = psycopg2.connect(pg_dsn)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM \"{pg_table}_outbox\" WHERE state = 'sent'")
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    # a reply killed between Telegram's answer and its record is sent again by the process that
    # takes the dead one's calls over (the send window): the kill below waits for the records
    runner.wait_for("the two replies recorded sent", lambda: recorded_sent() >= 2, 30,
                    alive=[webhook, sweeper])

    # Update 510: the webhook process hangs in the handler ("typing…" never answers), is
    # killed, and the sweep-only process takes the update over once it finds the webhook dead.
    fake.delay("sendChatAction", 30)
    calls_before = len(fake.calls_to("sendChatAction"))
    assert post(510, 20, "/book 20:00") == 200
    runner.wait_for("the webhook process inside the handler",
                    lambda: len(fake.calls_to("sendChatAction")) > calls_before, 30,
                    alive=[webhook, sweeper])
    webhook.kill()
    webhook.wait(timeout=10)
    fake.delay("sendChatAction", 0)
    runner.wait_for("the sweeper's reply to update 510", lambda: texts_to(fake, 20), 30,
                    alive=[sweeper])
    assert runner.stop(sweeper, signal.SIGTERM) == 0, runner.all_logs()

    assert texts_to(fake, 11) == ["Booked 11:00 for you."]
    assert texts_to(fake, 12) == ["Booked 12:00 for you."]
    assert texts_to(fake, 13) == []
    assert texts_to(fake, 20) == ["Booked 20:00 for you."]
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'SELECT update_id, slot, chat_id FROM "{bookings_table}" ORDER BY slot')
            bookings = cur.fetchall()
            cur.execute(f'SELECT update_id, state, attempts FROM "{pg_table}" ORDER BY update_id')
            updates = cur.fetchall()
    finally:
        conn.close()
    assert_one_booking_per_update(bookings)
    assert bookings == [(501, "11:00", 11), (502, "12:00", 12), (510, "20:00", 20)]
    # 503 (wrong secret) was never recorded; 510 was taken over by the sweeper, the killed
    # webhook's attempt given back (its handler did not run alone there)
    assert updates == [(501, "completed", 1), (502, "completed", 1), (510, "completed", 1)]
    assert "sweep handed 1 update(s)" in runner.log(sweeper)


# -- examples/blocking_wsgi.py ---------------------------------------------------------------
def test_blocking_wsgi_webhook_books_once_and_stops_on_sigint(
    runner: Runner, fake: FakeBotApi, tmp_path: Path
) -> None:
    db = tmp_path / "bookings.sqlite3"
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    bot = runner.start(
        "blocking_wsgi.py", "--db", str(db), "--base-url", fake.base_url,
        "--listen", "127.0.0.1", "--port", str(port),
        "--set-webhook", "https://bot.example.com/telegram",
        env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_WEBHOOK_SECRET": SECRET},
    )
    runner.wait_for("the WSGI server to listen", lambda: listening(port), STARTUP, alive=[bot])
    runner.wait_for("setWebhook", lambda: fake.webhook["url"], 10, alive=[bot])
    assert fake.webhook["secret_token"] == SECRET

    def post(update: Any, secret: Optional[str] = SECRET) -> int:
        return post_to_webhook(url, update, secret_token=secret)

    def recorded(update_id: int) -> bool:
        return bool(query(db, "SELECT 1 FROM telegram_updates WHERE update_id = ?", update_id))

    # the user blocked the bot: no booking, one exhaustion (403 is not retried)
    fake.fail_next("sendChatAction", 1, error_code=403, description=BLOCKED)
    assert post(make_message_update(700, 9, "/book 09:00")) == 200
    assert recorded(700)  # 200 only after the commit
    runner.wait_for("the exhaustion", lambda: query(db, "SELECT 1 FROM booking_exhaustions"),
                    20, alive=[bot])

    assert post(make_message_update(701, 10, "/book 10:00")) == 200
    assert recorded(701)
    assert post(make_message_update(702, 11, "/book 10:00")) == 200
    assert post(make_message_update(701, 10, "/book 10:00")) == 200  # duplicate
    assert post(make_message_update(703, 12, "/book 10:00"), secret="wrong") == 403
    assert post(make_message_update(704, 12, "/book 10:00"), secret=None) == 403
    assert post(b"not json") == 400
    assert post({"update_id": -1}) == 400
    assert not recorded(703) and not recorded(704)
    runner.wait_for("two replies", lambda: len(fake.sent_messages) >= 2, 20, alive=[bot])
    assert runner.stop(bot, signal.SIGINT) == 0, runner.all_logs()

    replies = texts_to(fake, 10) + texts_to(fake, 11)
    assert sorted(replies) == ["Booked 10:00 for you.", "Sorry, 10:00 is already taken."], \
        fake.sent_messages
    assert texts_to(fake, 9) == [] and texts_to(fake, 12) == []
    assert len(fake.sent_messages) == 2, fake.sent_messages  # each reply once (the duplicate none)
    assert sorted(query(db, "SELECT state, tries FROM telegram_updates_outbox")) == [
        ("sent", 1), ("sent", 1)]
    bookings = query(db, "SELECT update_id, slot FROM bookings")
    assert len(bookings) == 1 and bookings[0][0] in (701, 702) and bookings[0][1] == "10:00"
    exhaustions = query(db, "SELECT update_id, attempt, error FROM booking_exhaustions")
    assert len(exhaustions) == 1 and exhaustions[0][:2] == (700, 1)
    assert "blocked by the user" in exhaustions[0][2]
    states = dict(
        (row[0], row[1:])
        for row in query(db, "SELECT update_id, state, attempts, settled_at IS NOT NULL "
                             "FROM telegram_updates")
    )
    assert states == {
        700: ("abandoned", 1, 1),  # acknowledged exhaustion
        701: ("completed", 1, 1),
        702: ("completed", 1, 1),
    }
    assert "stopped" in runner.log(bot)


def test_blocking_wsgi_exit_after(runner: Runner, fake: FakeBotApi, tmp_path: Path) -> None:
    db = tmp_path / "bookings.sqlite3"
    port = free_port()
    bot = runner.start(
        "blocking_wsgi.py", "--db", str(db), "--base-url", fake.base_url,
        "--listen", "127.0.0.1", "--port", str(port), "--exit-after", "2",
        env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_WEBHOOK_SECRET": SECRET},
    )
    runner.wait_for("the WSGI server to listen", lambda: listening(port), STARTUP, alive=[bot])
    for update_id, chat_id, text in ((1, 1, "/book 07:00"), (2, 2, "/book later")):
        update = make_message_update(update_id, chat_id, text)
        assert post_to_webhook(f"http://127.0.0.1:{port}/", update, secret_token=SECRET) == 200
    assert runner.exit_code(bot, timeout=30) == 0, runner.all_logs()
    assert texts_to(fake, 1) == ["Booked 07:00 for you."]
    assert texts_to(fake, 2) == ["Usage: /book HH:MM, e.g. /book 10:30"]
    assert len(fake.sent_messages) == 2, fake.sent_messages
    # --exit-after waited for both replies: nothing left unsent for the next start
    assert sorted(query(db, "SELECT update_id, state FROM telegram_updates_outbox")) == [
        (1, "sent"), (2, "sent")]
    assert query(db, "SELECT update_id, slot FROM bookings") == [(1, "07:00")]


# -- examples/custom_store.py ----------------------------------------------------------------
def test_custom_store_conforms_and_the_check_bites(runner: Runner) -> None:
    good = runner.start("custom_store.py", name="custom-good")
    broken = runner.start("custom_store.py", "--break-fence", name="custom-broken")
    assert runner.exit_code(good, timeout=60) == 0, runner.all_logs()
    assert runner.exit_code(broken, timeout=60) == 1, runner.all_logs()

    out = runner.log(good)
    assert "DictUpdateStore: durable = True" in out
    assert "check_update_store: no violations" in out
    assert "handled: [1]; exhaustions delivered: [(2, 'refusing on purpose')]" in out

    out = runner.log(broken)
    assert "FenceIgnoresClaimId" in out
    assert "- fence: owns with a wrong claim id returned True" in out
    assert "- attempt-ownership: settle_owned with a wrong claim id returned True" in out
    assert "UpdateIntake" not in out  # a store that fails the check is not used


# -- the offline commands in the examples' docstrings, as written ------------------------------
def offline_commands(script: str) -> List[List[str]]:
    """The shell commands of the docstring's "Offline" paragraph, split like a shell would."""
    import ast
    import shlex

    doc = ast.get_docstring(ast.parse((EXAMPLES / script).read_text())) or ""
    offline = doc[doc.index("\nOffline"):]
    lines = offline.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.startswith("    python ")]


def as_run(command: List[str], replace: Dict[str, str]) -> List[str]:
    """``command`` with ``python`` this interpreter, ``examples/`` absolute and the values in
    ``replace`` swapped (ports, DSN and table names that must differ per test run)."""
    out = []
    for word in command:
        for old, new in replace.items():
            word = word.replace(old, new)
        if word == "python":
            word = sys.executable
        elif word.startswith("examples/"):
            word = str(ROOT / word)
        out.append(word)
    return out


def start_serve(runner: Runner, command: List[str], port: str) -> "subprocess.Popen[bytes]":
    """Start the docstring's ``serve`` command on ``port`` instead of its default 8081."""
    assert command[1:4] == ["-m", "ptb_fence.testing", "serve"], command
    assert "--port" not in command
    command = [*command, "--port", port]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]), PYTHONUNBUFFERED="1")
    log = runner.dir / f"serve-{len(runner.procs)}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out,
                                stderr=subprocess.STDOUT, cwd=runner.dir, env=env)
    runner.procs.append(proc)
    runner.logs[proc.pid] = log
    return proc


def type_line(proc: "subprocess.Popen[bytes]", text: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(text.encode() + b"\n")
    proc.stdin.flush()


def test_polling_sqlite_offline_command_as_written(runner: Runner, tmp_path: Path) -> None:
    serve_cmd, bot_cmd = offline_commands("polling_sqlite.py")
    port = str(free_port())
    replace = {"8081": port}
    serve = start_serve(runner, as_run(serve_cmd, replace), port)
    runner.wait_for("serve to listen", lambda: listening(int(port)), STARTUP, alive=[serve])
    argv = as_run(bot_cmd, replace)
    bot = runner.start(Path(argv[1]).name, *argv[2:])  # no TELEGRAM_* variables set
    assert runner.exit_code(bot, timeout=60) == 0, runner.all_logs()  # --exit-after 2
    runner.wait_for("both replies printed by serve",
                    lambda: "already taken" in runner.log(serve), 10, alive=[serve])
    assert runner.stop(serve, signal.SIGTERM) == 0, runner.all_logs()
    out = runner.log(serve)
    assert "-> sendMessage to chat 1: Booked 10:00 for you." in out
    assert "-> sendMessage to chat 1: Sorry, 10:00 is already taken." in out
    assert query(tmp_path / "offline.sqlite3", "SELECT slot FROM bookings") == [("10:00",)]


def test_polling_sqlite_twice_against_two_fresh_serves_with_one_database(
    runner: Runner, tmp_path: Path
) -> None:
    """The docstring's offline commands run twice with the same database, each time against a
    fresh ``serve``: the second run's messages are new updates and are handled, although a new
    ``serve`` numbers its messages from the start again. A ``serve`` told to reuse the first
    run's update ids has its updates taken for redeliveries, and the bot says so at INFO."""
    serve_cmd, bot_cmd = offline_commands("polling_sqlite.py")
    db = tmp_path / "offline.sqlite3"
    first_ids: List[str] = []
    for slot in ("10:00", "12:00"):
        port = str(free_port())
        replace = {"8081": port, "10:00": slot}
        serve = start_serve(runner, as_run(serve_cmd, replace), port)
        runner.wait_for("serve to listen", lambda: listening(int(port)), STARTUP, alive=[serve])
        bot = runner.start(Path(bot_cmd[1]).name, *as_run(bot_cmd, replace)[2:])
        assert runner.exit_code(bot, timeout=60) == 0, runner.all_logs()  # --exit-after 2
        runner.wait_for("both replies printed by serve",
                        lambda: f"Sorry, {slot} is already taken." in runner.log(serve), 10,
                        alive=[serve])
        assert runner.stop(serve, signal.SIGTERM) == 0, runner.all_logs()
        if not first_ids:
            first_ids = [line.split()[2] for line in runner.log(serve).splitlines()
                         if line.startswith("<- update ")]
    assert query(db, "SELECT slot FROM bookings ORDER BY slot") == [("10:00",), ("12:00",)]

    # the first run's ids again (--first-update-id): the bot takes them for redeliveries
    port = str(free_port())
    serve = start_serve(runner, as_run(serve_cmd, {"8081": port, "10:00": "14:00"})
                        + ["--first-update-id", first_ids[0]], port)
    runner.wait_for("serve to listen", lambda: listening(int(port)), STARTUP, alive=[serve])
    bot = runner.start(Path(bot_cmd[1]).name, *as_run(bot_cmd, {"8081": port})[2:])
    runner.wait_for(
        "the redeliveries logged",
        lambda: f"update {first_ids[1]} is already recorded" in runner.log(bot), 60,
        alive=[bot, serve])
    assert runner.stop(bot, signal.SIGTERM) == 0, runner.all_logs()
    assert "Booked 14:00" not in runner.log(serve)
    assert f"update {first_ids[0]} is already recorded" in runner.log(bot)


def test_blocking_wsgi_offline_command_as_written(runner: Runner, tmp_path: Path) -> None:
    serve_cmd, bot_cmd = offline_commands("blocking_wsgi.py")
    port, hook_port = str(free_port()), str(free_port())
    replace = {"8081": port, "8080": hook_port}
    serve = start_serve(runner, as_run(serve_cmd, replace), port)
    runner.wait_for("serve to listen", lambda: listening(int(port)), STARTUP, alive=[serve])
    argv = as_run(bot_cmd, replace)
    bot = runner.start(Path(argv[1]).name, *argv[2:])  # no TELEGRAM_* variables set
    runner.wait_for("setWebhook", lambda: "-> setWebhook" in runner.log(serve), STARTUP,
                    alive=[serve, bot])
    type_line(serve, "/book 10:00")
    runner.wait_for("the reply printed by serve",
                    lambda: "Booked 10:00 for you." in runner.log(serve), 30, alive=[serve, bot])
    assert "(HTTP 200)" in runner.log(serve)
    assert runner.stop(bot, signal.SIGTERM) == 0, runner.all_logs()
    assert runner.stop(serve, signal.SIGINT) == 0, runner.all_logs()
    assert query(tmp_path / "offline.sqlite3", "SELECT slot FROM bookings") == [("10:00",)]


def test_webhook_postgres_offline_command_as_written(
    runner: Runner, pg_dsn: str, pg_table: str, pg_tables: List[str]
) -> None:
    serve_cmd, bot_cmd = offline_commands("webhook_postgres.py")
    port, hook_port = str(free_port()), str(free_port())
    pg_tables.append(pg_table + "_b")
    replace = {"8081": port, "8080": hook_port,
               "postgresql://postgres@127.0.0.1:5432/postgres": pg_dsn,
               "my_updates": pg_table, "my_bookings": pg_table + "_b"}
    serve = start_serve(runner, as_run(serve_cmd, replace), port)
    runner.wait_for("serve to listen", lambda: listening(int(port)), STARTUP, alive=[serve])
    argv = as_run(bot_cmd, replace)
    bot = runner.start(Path(argv[1]).name, *argv[2:])  # no TELEGRAM_* variables set
    runner.wait_for("setWebhook", lambda: "-> setWebhook" in runner.log(serve), STARTUP,
                    alive=[serve, bot])
    runner.wait_for("the webhook to listen", lambda: listening(int(hook_port)), STARTUP,
                    alive=[serve, bot])
    type_line(serve, "/book 10:00")
    runner.wait_for("the reply printed by serve",
                    lambda: "Booked 10:00 for you." in runner.log(serve), 30, alive=[serve, bot])
    assert runner.stop(bot, signal.SIGTERM) == 0, runner.all_logs()
    assert runner.stop(serve, signal.SIGTERM) == 0, runner.all_logs()


@pytest.mark.parametrize("script", ["polling_sqlite.py", "blocking_wsgi.py",
                                    "webhook_postgres.py"])
def test_missing_settings_are_reported_at_once(runner: Runner, script: str) -> None:
    args = ["--dsn", ""] if script == "webhook_postgres.py" else []
    proc = runner.start(script, *args)  # Telegram's base URL, no TELEGRAM_* variables
    assert runner.exit_code(proc, timeout=STARTUP) == 2
    out = runner.log(proc)
    assert "TELEGRAM_BOT_TOKEN" in out and "Traceback" not in out
    if script != "polling_sqlite.py":
        assert "TELEGRAM_WEBHOOK_SECRET" in out
    if script == "webhook_postgres.py":
        assert "PTB_FENCE_POSTGRES_DSN" in out


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_docstrings_install_from_the_repository(script: str) -> None:
    text = (EXAMPLES / script).read_text()
    assert "pip install ptb_fence" not in text


def test_webhook_postgres_names_its_webhooks_extra(runner: Runner, tmp_path: Path) -> None:
    """The docstring installs ``[webhooks]``, ``--help`` names it, and without tornado (the
    extra not installed) a webhook process says what to install instead of PTB's traceback."""
    doc = (EXAMPLES / "webhook_postgres.py").read_text()
    assert "python -m pip install -e '.[webhooks]'" in doc
    assert "pip install -e .``" not in doc  # no install line without the extra
    helped = runner.start("webhook_postgres.py", "--help")
    assert runner.exit_code(helped, timeout=STARTUP) == 0
    assert "[webhooks]" in runner.log(helped)
    # a tornado that cannot be imported, as when the extra was not installed
    shadow = tmp_path / "no_tornado"
    (shadow / "tornado").mkdir(parents=True)
    (shadow / "tornado" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'tornado'\", name='tornado')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(shadow), str(ROOT)]
                                         + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    proc = runner.start("webhook_postgres.py", "--dsn", "postgresql://nobody@127.0.0.1:1/none",
                        "--base-url", "http://127.0.0.1:1/bot", env=env)
    assert runner.exit_code(proc, timeout=STARTUP) == 2
    out = runner.log(proc)
    assert "python -m pip install -e '.[webhooks]'" in out and "Traceback" not in out, out


# -- examples/sqlalchemy_booking.py and examples/django_booking.py (Using an ORM) -------------
def _orm_database(kind: str, tmp_path: Path, request: Any) -> "tuple[List[str], Callable[[str], List[Any]], str, str]":
    """The example's database arguments, a query function, and the two table names."""
    table, bookings = "t_" + os.urandom(8).hex(), "b_" + os.urandom(8).hex()
    if kind == "sqlite":
        db = tmp_path / "orm.sqlite3"
        return (["--db", str(db), "--table", table, "--bookings-table", bookings],
                lambda sql: query(db, sql), table, bookings)
    import psycopg2

    dsn: str = request.getfixturevalue("pg_dsn")
    request.getfixturevalue("pg_tables").extend([table, bookings])  # dropped afterwards

    def pg_query(sql: str) -> List[Any]:
        conn = psycopg2.connect(dsn)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        finally:
            conn.close()

    driver = ["--driver", kind.split("+")[1]] if "+" in kind else []
    return (["--dsn", dsn, "--table", table, "--bookings-table", bookings, *driver],
            pg_query, table, bookings)


@pytest.mark.parametrize("script,kind", [
    ("sqlalchemy_booking.py", "sqlite"),
    ("sqlalchemy_booking.py", "postgres+psycopg2"),
    ("sqlalchemy_booking.py", "postgres+psycopg"),
    ("django_booking.py", "sqlite"),
    ("django_booking.py", "postgres"),
])
def test_orm_examples_book_once_in_one_commit_with_the_completion(
    runner: Runner, fake: FakeBotApi, tmp_path: Path, request: Any, script: str, kind: str
) -> None:
    """Each booking's first attempt crashes after its ORM write (``--crash-once``): the write
    is rolled back with the completion, the retry books. One booking, both updates completed,
    one "Booked" and one "taken" reply."""
    args, run_query, table, bookings = _orm_database(kind, tmp_path, request)
    first = fake.inject_message(chat_id=1, text="/book 10:00")
    second = fake.inject_message(chat_id=2, text="/book 10:00")
    bot = runner.start(script, *args, "--base-url", fake.base_url, "--exit-after", "2",
                       "--crash-once", env={"TELEGRAM_BOT_TOKEN": fake.token})
    assert runner.exit_code(bot, timeout=60) == 0, runner.all_logs()
    log = runner.log(bot)
    assert "crashing after the ORM write" in log and "stopped after 2 update(s)" in log

    assert sorted(texts_to(fake, 1) + texts_to(fake, 2)) == [
        "Booked 10:00 for you.", "Sorry, 10:00 is already taken."], fake.sent_messages
    booked = run_query(f"SELECT slot, update_id, attempt FROM {bookings}")
    assert len(booked) == 1 and booked[0][0] == "10:00", booked
    assert booked[0][1] in (first, second)
    assert booked[0][2] >= 2  # attempt 1's flushed write was rolled back with its completion
    winner = 1 if booked[0][1] == first else 2
    assert texts_to(fake, winner) == ["Booked 10:00 for you."]
    # each reply once: the crashed attempt's outbox row was rolled back with its booking
    assert len(fake.sent_messages) == 2, fake.sent_messages
    states = dict((r[0], r[1]) for r in run_query(f"SELECT update_id, state FROM {table}"))
    assert states == {first: "completed", second: "completed"}
    # the replies went through the outbox: both sent, each once
    sent = run_query(f"SELECT state, tries FROM {table}_outbox")
    assert sorted(sent) == [("sent", 1), ("sent", 1)], sent
