"""``ptb-fence health`` run as a real process (``python -m ptb_fence``) against real SQLite files
and the real PostgreSQL server.

Exit statuses: 0 healthy, 1 unhealthy (an unreachable store, a missing table and a store that
does not answer in time included), 2 bad arguments. Rows are written through the stores' public
methods with chosen times; the probe must leave them exactly as they were.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple

import psycopg2
import pytest

from ptb_fence import (
    AttemptEffects,
    Batch,
    Completed,
    Failed,
    OutboxCall,
    PostgresUpdateStore,
    SQLiteUpdateStore,
)
from ptb_fence.stores._outbox_sql import outbox_table_name

PASSWORD = "HealthPr0beSecret"
MINUTE = 60_000
TABLE_CHECKS = ["store", "schema", "pending_age", "failed_age", "lapsed_age", "exhaustions",
                "exhaustion_age"]
CHECKS = TABLE_CHECKS + ["unsent_age", "failed_calls"]  # the stores make an outbox table
SENDER = "health-test-sender"


def now_ms() -> int:
    return int(time.time() * 1000)


def body(update_id: int) -> str:
    return json.dumps({"update_id": update_id, "message": {"chat": {"id": 7}, "text": "hi"}})


def health(*argv: str, timeout: float = 60) -> Tuple[int, str, str, float]:
    """Run ``python -m ptb_fence ARGV`` without the PTB_FENCE_* environment; returns the exit
    status, stdout, stderr and the wall time."""
    env = {k: v for k, v in os.environ.items() if k not in ("PTB_FENCE_STORE", "PTB_FENCE_TABLE")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ptb_fence", *argv],
        capture_output=True, text=True, env=env, timeout=timeout,
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def check_line(out: str, name: str) -> str:
    """The text report's line of check ``name`` (``ok`` or ``FAIL``, the name, the message)."""
    found = re.findall(rf"^(?:ok|FAIL)\s+{name}\s+.*$", out, re.M)
    assert len(found) == 1, (name, out)
    return str(found[0])


def verdicts(out: str) -> Dict[str, str]:
    """``{check name: "ok" | "FAIL"}`` from the text report."""
    return {m.group(2): m.group(1) for m in re.finditer(r"^(ok|FAIL)\s+(\w+)\s", out, re.M)}


class Table:
    """An update table of one kind, filled through the store's public methods."""

    def __init__(self, kind: str, url: str, table: str, store: Any) -> None:
        self.kind = kind
        self.url = url
        self.table = table
        self.store = store
        self.now = now_ms()

    def args(self, *extra: str) -> List[str]:
        return ["--store", self.url, "--table", self.table, "health", *extra]

    # -- rows ---------------------------------------------------------------------------------
    def pending(self, update_id: int, age_ms: int) -> None:
        assert self.store.add(update_id, body(update_id), self.now - age_ms)

    def completed(self, update_id: int, age_ms: int) -> None:
        self.pending(update_id, age_ms)
        at = self.now - age_ms
        i = self.store.claim_owned(update_id, now=at, lease_until=at + 2 * MINUTE, max_attempts=5)
        assert self.store.settle_owned(i, Completed(at + 1_000))

    def failed(self, update_id: int, retry_in_ms: int) -> None:
        """A failed row whose retry is due ``retry_in_ms`` from now (negative: overdue)."""
        self.pending(update_id, 30 * MINUTE)
        at = self.now - 20 * MINUTE
        i = self.store.claim_owned(update_id, now=at, lease_until=at + 2 * MINUTE, max_attempts=5)
        assert self.store.settle_owned(i, Failed(at + 1_000, self.now + retry_in_ms, "boom"))

    def processing(self, update_id: int, lease_left_ms: int) -> None:
        """A claimed row whose lease ends ``lease_left_ms`` from now (negative: lapsed)."""
        self.pending(update_id, 30 * MINUTE)
        at = self.now + min(lease_left_ms, 0) - 2 * MINUTE
        assert self.store.claim_owned(
            update_id, now=at, lease_until=self.now + lease_left_ms, max_attempts=5
        )

    def exhaustion(self, update_id: int, age_ms: int, *, acknowledged: bool = False) -> None:
        """An exhaustion recorded ``age_ms`` ago (acknowledged right after, if asked)."""
        self.pending(update_id, age_ms + 10 * MINUTE)
        at = self.now - age_ms - MINUTE
        i = self.store.claim_owned(
            update_id, now=at, lease_until=at + 2 * MINUTE, max_attempts=5,
            durable_exhaustion=True,
        )
        assert self.store.exhaust(i, at=self.now - age_ms, error="gave up")
        if acknowledged:
            assert self.store.acknowledge_exhaustion(i, self.now - age_ms + 1_000)

    def healthy_rows(self) -> None:
        """Rows in every state, none of them old enough to be unhealthy with the defaults;
        old settled history and a failed row whose retry is far away count for nothing."""
        self.completed(1, 3 * 60 * MINUTE)
        self.pending(2, 2_000)
        self.failed(3, retry_in_ms=30 * MINUTE)
        self.processing(4, lease_left_ms=2 * MINUTE)
        self.exhaustion(5, age_ms=5 * 60 * MINUTE, acknowledged=True)
        self.exhaustion(6, age_ms=MINUTE)

    def call(self, update_id: int, age_ms: int) -> int:
        """An outbox call committed ``age_ms`` ago with its update's completion (pending)."""
        self.pending(update_id, age_ms + MINUTE)
        at = self.now - age_ms
        i = self.store.claim_owned(update_id, now=at, lease_until=at + MINUTE, max_attempts=5)
        params = json.dumps({"chat_id": update_id, "text": "hi"})
        effects = AttemptEffects((OutboxCall("sendMessage", params, update_id, 0),))
        landed = self.store.commit(Batch(settlements=((i, Completed(at)),), effects={i: effects}))
        assert landed.landed == (True,)
        [entry] = self.store.list_calls(state="pending", limit=10)
        return int(entry.call_id)

    def claim(self, call_id: int, at: int) -> None:
        claimed = self.store.claim_calls(now=at, lease_until=at + MINUTE, limit=10, sender=SENDER)
        assert [e.call_id for e in claimed] == [call_id]

    def failed_call(self, update_id: int, *, acknowledged: bool = False) -> None:
        """A call Telegram refused an hour ago (its failure acknowledged, if asked)."""
        call = self.call(update_id, 61 * MINUTE)
        self.claim(call, self.now - 60 * MINUTE)
        assert self.store.fail_call(call, SENDER, at=self.now - 60 * MINUTE,
                                    error="Forbidden: bot was blocked by the user")
        if acknowledged:
            assert self.store.acknowledge_send_failure(call, self.now - 59 * MINUTE)

    def sent_call(self, update_id: int) -> None:
        """A call sent an hour ago: old, but no longer waiting."""
        call = self.call(update_id, 61 * MINUTE)
        self.claim(call, self.now - 60 * MINUTE)
        result = json.dumps({"message_id": 1, "chat": {"id": update_id}})
        assert self.store.record_sent([(call, SENDER, result, self.now - 60 * MINUTE)]) == [True]

    # -- reading back (no ptb_fence code) -----------------------------------------------------
    def snapshot(self, table: Optional[str] = None) -> List[Tuple[Any, ...]]:
        sql = f'SELECT * FROM "{table or self.table}" ORDER BY 1'
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.url[len("sqlite:///"):])
            try:
                return [tuple(r) for r in conn.execute(sql).fetchall()]
            finally:
                conn.close()
        pg = psycopg2.connect(self.url)
        try:
            with pg.cursor() as cur:
                cur.execute(sql)
                return [tuple(r) for r in cur.fetchall()]
        finally:
            pg.close()


@pytest.fixture(params=["sqlite", "postgres"])
def table(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Table]:
    """An empty update table in a SQLite file or a fresh PostgreSQL table."""
    if request.param == "sqlite":
        path = tmp_path / "bot.sqlite3"
        store: Any = SQLiteUpdateStore(str(path), "telegram_updates")
        fixture = Table("sqlite", f"sqlite:///{path}", "telegram_updates", store)
    else:
        dsn = request.getfixturevalue("pg_dsn")
        name = request.getfixturevalue("pg_table")
        store = PostgresUpdateStore(dsn, name)
        fixture = Table("postgres", dsn, name, store)
    try:
        yield fixture
    finally:
        store.close()


def sqlite_table(tmp_path: Any) -> Table:
    path = tmp_path / "bot.sqlite3"
    return Table("sqlite", f"sqlite:///{path}", "telegram_updates",
                 SQLiteUpdateStore(str(path), "telegram_updates"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- verdicts ----------------------------------------------------------------------------------
def test_healthy_table_exits_0(table: Table) -> None:
    table.healthy_rows()
    code, out, err, _ = health(*table.args())
    assert (code, err) == (0, ""), out + err
    assert out.startswith("healthy: all 9 checks passed\n"), out
    assert verdicts(out) == {name: "ok" for name in CHECKS}
    assert "update 2 has been pending for" in check_line(out, "pending_age")
    assert "no failed update is due" in check_line(out, "failed_age")
    assert "no lapsed lease" in check_line(out, "lapsed_age")
    # the acknowledged exhaustion (5 h old) is history; only update 6 is waiting
    assert "1 unacknowledged exhaustion(s) (threshold 100)" in check_line(out, "exhaustions")
    assert "update 6 has been an unacknowledged exhaustion" in check_line(out, "exhaustion_age")


def test_a_table_with_nothing_waiting_is_healthy(table: Table) -> None:
    table.processing(1, lease_left_ms=MINUTE)
    code, out, _, _ = health(*table.args())
    assert code == 0, out
    assert "no pending update" in check_line(out, "pending_age")
    assert "0 unacknowledged exhaustion(s)" in check_line(out, "exhaustions")
    assert "no unacknowledged exhaustion" in check_line(out, "exhaustion_age")


def test_old_pending_row_exits_1_naming_the_check(table: Table) -> None:
    table.healthy_rows()
    table.pending(7, 10 * MINUTE)
    before = table.snapshot()
    code, out, err, _ = health(*table.args())
    assert code == 1 and err == "", out + err
    assert out.startswith("unhealthy: 1 of 9 checks failed: pending_age\n"), out
    assert verdicts(out) == dict({name: "ok" for name in CHECKS}, pending_age="FAIL")
    line = check_line(out, "pending_age")
    assert line.startswith("FAIL")
    assert re.search(r"update 7 has been pending for (9m 59s|10m 0\ds) \(threshold 5m 00s\)",
                     line), line
    # the failing check is listed first
    assert out.split("\n\n", 1)[1].startswith("FAIL  pending_age")
    assert table.snapshot() == before  # a probe writes nothing


def test_failed_row_due_for_long_exits_1(table: Table) -> None:
    table.failed(1, retry_in_ms=-MINUTE)  # due for a minute: still healthy
    code, out, _, _ = health(*table.args())
    assert code == 0, out
    assert "the retry of failed update 1 has been due for 1m 0" in check_line(out, "failed_age")
    table.failed(2, retry_in_ms=-10 * MINUTE)
    code, out, _, _ = health(*table.args())
    assert code == 1, out
    assert verdicts(out)["failed_age"] == "FAIL"
    assert re.search(r"failed update 2 has been due for (9m 59s|10m 0\ds) \(threshold 5m 00s\)",
                     check_line(out, "failed_age"))
    assert "unhealthy: 1 of 9 checks failed: failed_age" in out


def test_lapsed_lease_not_taken_over_exits_1(table: Table) -> None:
    table.processing(1, lease_left_ms=10 * MINUTE)  # a live lease
    table.processing(2, lease_left_ms=-8 * MINUTE)
    code, out, _, _ = health(*table.args())
    assert code == 1, out
    assert verdicts(out)["lapsed_age"] == "FAIL"
    assert "the lease on update 2 lapsed 8m 0" in check_line(out, "lapsed_age")
    code, out, _, _ = health(*table.args("--max-lapsed-age", "9m"))
    assert code == 0, out


def test_old_unacknowledged_exhaustion_exits_1(table: Table) -> None:
    table.exhaustion(1, age_ms=2 * 60 * MINUTE, acknowledged=True)  # history: ignored
    table.exhaustion(2, age_ms=30 * MINUTE)
    code, out, _, _ = health(*table.args())
    assert code == 0, out
    table.exhaustion(3, age_ms=90 * MINUTE)
    code, out, _, _ = health(*table.args())
    assert code == 1, out
    assert verdicts(out) == dict({name: "ok" for name in CHECKS}, exhaustion_age="FAIL")
    line = check_line(out, "exhaustion_age")
    assert "update 3 has been an unacknowledged exhaustion for 1h 30m (threshold 1h 00m)" in line
    assert "ptb-fence exhaustions" in line
    assert "2 unacknowledged exhaustion(s)" in check_line(out, "exhaustions")


def test_too_many_unacknowledged_exhaustions(tmp_path: Any) -> None:
    db = sqlite_table(tmp_path)
    try:
        for update_id in (1, 2, 3):
            db.exhaustion(update_id, age_ms=MINUTE)
    finally:
        db.store.close()
    code, out, _, _ = health(*db.args())
    assert code == 0, out  # three is below the default of 100
    code, out, _, _ = health(*db.args("--max-exhaustions", "3"))
    assert code == 0, out
    code, out, _, _ = health(*db.args("--max-exhaustions", "2"))
    assert code == 1, out
    assert verdicts(out) == dict({name: "ok" for name in CHECKS}, exhaustions="FAIL")
    assert "3 unacknowledged exhaustion(s) (threshold 2)" in check_line(out, "exhaustions")
    code, out, _, _ = health(*db.args("--max-exhaustions", "0", "--json"))
    assert code == 1
    data = json.loads(out)
    found = {c["name"]: c for c in data["checks"]}["exhaustions"]
    assert (found["ok"], found["value"], found["threshold"]) == (False, 3, 0)


def test_thresholds_change_the_verdict(tmp_path: Any) -> None:
    db = sqlite_table(tmp_path)
    try:
        db.pending(1, 10 * MINUTE)
        db.pending(2, 1_000)
    finally:
        db.store.close()
    assert health(*db.args())[0] == 1
    assert health(*db.args("--max-pending-age", "15m"))[0] == 0
    assert health(*db.args("--max-pending-age", "0.5h"))[0] == 0
    assert health(*db.args("--max-pending-age", "599s"))[0] == 1
    code, out, _, _ = health(*db.args("--max-pending-age", "9m"))
    assert code == 1
    assert "(threshold 9m 00s)" in check_line(out, "pending_age")


def test_json_report(table: Table) -> None:
    table.healthy_rows()
    table.pending(7, 10 * MINUTE)
    code, out, err, _ = health(*table.args("--json"))
    assert code == 1 and err == ""
    data = json.loads(out)  # one JSON object and nothing else
    assert set(data) == {"healthy", "store", "table", "now", "now_utc", "checks"}
    assert data["healthy"] is False
    assert data["table"] == table.table
    assert data["store"] == table.url  # no password in these URLs
    assert abs(data["now"] - now_ms()) < 60_000 and data["now_utc"].endswith("Z")
    assert [c["name"] for c in data["checks"]] == CHECKS
    assert {c["name"]: c["value"] for c in data["checks"]}["failed_calls"] == 0
    for check in data["checks"]:
        assert set(check) == {"name", "ok", "value", "threshold", "unit", "update_id", "message"}
        assert isinstance(check["ok"], bool) and isinstance(check["message"], str)
    by_name = {c["name"]: c for c in data["checks"]}
    assert [n for n, c in by_name.items() if not c["ok"]] == ["pending_age"]
    pending = by_name["pending_age"]
    assert pending["update_id"] == 7 and pending["unit"] == "seconds"
    assert pending["threshold"] == 300 and 599 <= pending["value"] < 700
    assert by_name["failed_age"]["value"] is None  # no failed row is due
    assert by_name["exhaustion_age"]["update_id"] == 6
    assert 59 <= by_name["exhaustion_age"]["value"] < 120
    assert by_name["exhaustion_age"]["threshold"] == 3600
    assert by_name["exhaustions"]["unit"] == "count" and by_name["exhaustions"]["value"] == 1
    assert by_name["store"]["ok"] and by_name["store"]["threshold"] == 5
    assert 0 <= by_name["store"]["value"] < 5
    code, out, _, _ = health(*table.args("--json", "--max-pending-age", "1h"))
    assert code == 0 and json.loads(out)["healthy"] is True


# -- the outbox --------------------------------------------------------------------------------
def test_an_old_unsent_outbox_call_and_unacknowledged_failed_calls_are_unhealthy(
    table: Table,
) -> None:
    table.healthy_rows()
    table.sent_call(20)  # old and sent: counts for nothing
    table.failed_call(21)
    table.failed_call(22)
    table.failed_call(23, acknowledged=True)  # counts for nothing
    unsent = table.call(24, 10 * MINUTE)  # committed 10 minutes ago, still pending
    outbox = outbox_table_name(table.table)
    before = table.snapshot(), table.snapshot(outbox)

    code, out, err, _ = health(*table.args())
    assert (code, err) == (1, ""), out + err
    assert verdicts(out) == dict({name: "ok" for name in CHECKS}, unsent_age="FAIL")
    line = check_line(out, "unsent_age")
    assert f"outbox call {unsent} (update 24) has been unsent for 10m" in line, line
    assert "(threshold 5m 00s)" in line and "outbox sender" in line, line
    assert "2 unacknowledged failed outbox call(s) (threshold 100)" in check_line(
        out, "failed_calls")

    code, out, _, _ = health(*table.args("--json", "--max-unsent-age", "15m",
                                         "--max-failed-calls", "1"))
    assert code == 1, out
    by_name = {c["name"]: c for c in json.loads(out)["checks"]}
    assert [n for n, c in by_name.items() if not c["ok"]] == ["failed_calls"]
    assert by_name["failed_calls"]["value"] == 2 and by_name["failed_calls"]["threshold"] == 1
    assert by_name["failed_calls"]["unit"] == "count"
    assert "ptb-fence outbox list --state failed" in by_name["failed_calls"]["message"]
    unsent_check = by_name["unsent_age"]
    assert unsent_check["ok"] and unsent_check["update_id"] == 24
    assert unsent_check["threshold"] == 900 and 599 <= unsent_check["value"] < 700

    code, out, _, _ = health(*table.args("--max-unsent-age", "15m", "--max-failed-calls", "2"))
    assert code == 0, out
    assert (table.snapshot(), table.snapshot(outbox)) == before  # the probe changed nothing


def test_a_table_without_an_outbox_table_has_no_outbox_checks(table: Table) -> None:
    table.healthy_rows()
    outbox = outbox_table_name(table.table)
    if table.kind == "sqlite":
        conn = sqlite3.connect(table.url[len("sqlite:///"):])
        try:
            conn.execute(f'DROP TABLE "{outbox}"')
            conn.commit()
        finally:
            conn.close()
    else:
        pg = psycopg2.connect(table.url)
        try:
            with pg.cursor() as cur:
                cur.execute(f'DROP TABLE "{outbox}"')
            pg.commit()
        finally:
            pg.close()
    code, out, err, _ = health(*table.args("--json", "--max-failed-calls", "0"))
    assert (code, err) == (0, ""), out + err
    assert [c["name"] for c in json.loads(out)["checks"]] == TABLE_CHECKS


# -- the store ---------------------------------------------------------------------------------
def test_unreachable_postgres_is_unhealthy_quickly_without_the_password() -> None:
    dsn = f"postgresql://bob:{PASSWORD}@127.0.0.1:{free_port()}/bot"
    code, out, err, elapsed = health("--store", dsn, "health")
    assert code == 1, out + err
    assert elapsed < 6, elapsed
    assert err == ""
    assert out.startswith("unhealthy: the store check failed"), out
    line = check_line(out, "store")
    assert line.startswith("FAIL") and "store unreachable: cannot connect to PostgreSQL" in line
    assert "postgresql://bob:***@127.0.0.1:" in out
    assert PASSWORD not in out + err
    code, out, err, elapsed = health("--store", dsn, "health", "--json")
    assert code == 1 and elapsed < 6 and PASSWORD not in out + err
    data = json.loads(out)
    assert data["healthy"] is False and data["now"] is None
    assert data["store"].startswith("postgresql://bob:***@127.0.0.1:")
    (store,) = data["checks"]
    assert store["name"] == "store" and store["ok"] is False and store["value"] is None
    assert store["message"].startswith("store unreachable: ")
    # the password as a URI query parameter is masked too
    dsn = f"postgresql://bob@127.0.0.1:{free_port()}/bot?password={PASSWORD}"
    code, out, err, _ = health("--store", dsn, "health")
    assert code == 1 and PASSWORD not in out + err and "password=***" in out


def test_missing_table_is_unhealthy_and_not_created(pg_dsn: str, pg_table: str,
                                                    tmp_path: Any) -> None:
    code, out, _, _ = health("--store", pg_dsn, "--table", pg_table, "health")
    assert code == 1, out
    line = check_line(out, "store")
    assert f"no table {pg_table!r}" in line and "ptb-fence migrate" in line
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s) IS NULL", (f'"{pg_table}"',))
            assert cur.fetchone() == (True,)
    finally:
        conn.close()
    path = tmp_path / "other.db"
    sqlite3.connect(str(path)).close()  # a SQLite database without the table
    code, out, _, _ = health("--store", f"sqlite:///{path}", "health")
    assert code == 1 and "no table 'telegram_updates'" in check_line(out, "store")
    code, out, _, _ = health("--store", f"sqlite:///{tmp_path}/none.db", "health")
    assert code == 1 and "store unreachable: no SQLite database at" in check_line(out, "store")
    assert not (tmp_path / "none.db").exists()


def test_a_store_that_does_not_answer_is_unhealthy_and_the_read_is_cancelled(
    pg_dsn: str, pg_table: str
) -> None:
    store = PostgresUpdateStore(pg_dsn, pg_table)
    try:
        assert store.add(1, body(1), now_ms())
    finally:
        store.close()
    locker = psycopg2.connect(pg_dsn)
    marker = f"health-{uuid.uuid4().hex[:8]}"
    try:
        with locker.cursor() as cur:
            cur.execute(f'LOCK TABLE "{pg_table}" IN ACCESS EXCLUSIVE MODE')  # blocks every read
        dsn = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}application_name={marker}"
        code, out, err, elapsed = health("--store", dsn, "--table", pg_table, "health",
                                         "--timeout", "2s")
        assert code == 1, out + err
        assert 2 <= elapsed < 7, elapsed
        assert "store timed out: no answer within 2 s while reading the table" in check_line(
            out, "store")
        # the cancelled read does not stay queued behind the lock on the server
        waiting: Optional[int] = None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            watcher = psycopg2.connect(pg_dsn)
            try:
                with watcher.cursor() as cur:
                    cur.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                        (marker,),
                    )
                    (waiting,) = cur.fetchone() or (None,)
            finally:
                watcher.close()
            if waiting == 0:
                break
            time.sleep(0.1)
        assert waiting == 0
    finally:
        locker.rollback()
        locker.close()


def test_postgres_with_a_password_in_the_dsn_healthy_and_unhealthy(
    pg_dsn: str, pg_table: str
) -> None:
    store = PostgresUpdateStore(pg_dsn, pg_table)
    try:
        fixture = Table("postgres", pg_dsn, pg_table, store)
        fixture.healthy_rows()
        assert pg_dsn.startswith("postgresql://") and "@" in pg_dsn
        user, rest = pg_dsn[len("postgresql://"):].split("@", 1)
        if ":" in user:
            pytest.skip("the test DSN carries its own password")
        secret = f"postgresql://{user}:{PASSWORD}@{rest}"  # trust auth ignores the password
        code, out, err, _ = health("--store", secret, "--table", pg_table, "health", "--json")
        assert code == 0 and PASSWORD not in out + err
        assert json.loads(out)["store"] == f"postgresql://{user}:***@{rest}"
        fixture.failed(9, retry_in_ms=-6 * MINUTE)
        code, out, err, _ = health("--store", secret, "--table", pg_table, "health")
        assert code == 1 and PASSWORD not in out + err
        assert verdicts(out)["failed_age"] == "FAIL"
    finally:
        store.close()


def test_probes_in_parallel_with_a_writer(tmp_path: Any) -> None:
    """Probes read a consistent snapshot while the bot writes: every one answers."""
    db = sqlite_table(tmp_path)
    stop = threading.Event()

    def write() -> None:
        update_id = 100
        while not stop.is_set():
            db.store.add(update_id, body(update_id), now_ms())
            update_id += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        results = [health(*db.args("--json"))[:2] for _ in range(3)]
    finally:
        stop.set()
        writer.join()
        db.store.close()
    for code, out in results:
        assert code == 0, out
        assert json.loads(out)["healthy"] is True


# -- usage errors ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, needle",
    [
        (["health", "--max-pending-age", "5"], "invalid duration '5'"),
        (["health", "--max-failed-age", "0s"], "longer than zero"),
        (["health", "--max-exhaustion-age", "soon"], "invalid duration 'soon'"),
        (["health", "--max-lapsed-age=-1m"], "invalid duration '-1m'"),
        (["health", "--timeout", "1 s"], "invalid duration"),
        (["health", "--max-exhaustions=-1"], "invalid count '-1'"),
        (["health", "--max-exhaustions", "many"], "invalid count 'many'"),
        (["health", "--no-such-option"], "unrecognized arguments"),
        (["health", "--table", "bad-name"], "bad-name"),
    ],
)
def test_usage_errors_exit_2(tmp_path: Any, argv: List[str], needle: str) -> None:
    db = sqlite_table(tmp_path)
    db.store.close()
    code, out, err, _ = health("--store", db.url, *argv)
    assert code == 2, (out, err)
    assert out == ""
    assert err.startswith("ptb-fence: error: ") and err.count("\n") == 1, err
    assert needle in err, err


def test_a_missing_or_malformed_store_url_is_a_usage_error() -> None:
    code, out, err, _ = health("health")
    assert (code, out) == (2, "") and "no store given" in err
    code, out, err, _ = health("--store", f"mysql://bob:{PASSWORD}@db/bot", "health")
    assert (code, out) == (2, "") and "unknown store URL scheme" in err
    assert PASSWORD not in err


def test_help_documents_the_exit_statuses() -> None:
    code, out, _, _ = health("--help")
    assert code == 0
    assert "exit 0 healthy, 1 unhealthy, 2 bad arguments" in " ".join(out.split())
    code, out, _, _ = health("health", "--help")
    assert code == 0
    text = " ".join(out.split())
    assert "Exit status 0: healthy; 1: unhealthy" in text
    assert "an unreachable store" in text and "not exit 3" in text
    for option in ("--json", "--max-pending-age", "--max-failed-age", "--max-lapsed-age",
                   "--max-exhaustions", "--max-exhaustion-age", "--timeout"):
        assert option in text


# -- the schema --------------------------------------------------------------------------------
def test_a_legacy_postgres_table_is_unhealthy_until_migrated(pg_dsn: str, pg_table: str) -> None:
    """A table made by a release before fencing (no claim_id, no index): ``health`` names what
    it lacks and ``ptb-fence migrate``; after the migration the same probe is healthy."""
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                f'CREATE TABLE "{pg_table}" (update_id BIGINT PRIMARY KEY, body TEXT NOT NULL, '
                "state TEXT NOT NULL, attempts INT NOT NULL DEFAULT 0, due_at BIGINT NOT NULL, "
                "received_at BIGINT NOT NULL, settled_at BIGINT, error TEXT)"
            )
        conn.commit()
    finally:
        conn.close()
    args = ["--store", pg_dsn, "--table", pg_table, "health"]
    code, out, err, _ = health(*args)
    assert code == 1, out + err
    line = check_line(out, "schema")
    assert line.startswith("FAIL") and "column claim_id" in line and "ptb-fence migrate" in line
    assert f'index "{pg_table}_state_due_at_idx"' in line
    assert verdicts(out)["store"] == "ok"
    code, out, err, _ = health(*args, "--json")
    schema = {c["name"]: c for c in json.loads(out)["checks"]}["schema"]
    assert code == 1 and schema["ok"] is False and schema["value"] >= 6, schema
    code, out, err, _ = health("--store", pg_dsn, "--table", pg_table, "migrate")
    assert code == 0, out + err
    code, out, err, _ = health(*args)
    assert code == 0, out + err
    assert check_line(out, "schema").startswith("ok") and "current" in out
