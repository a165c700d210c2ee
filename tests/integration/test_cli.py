"""The ``ptb-fence`` command line against real SQLite files and the real PostgreSQL server.

Every command runs in-process through ``ptb_fence.cli.main([...])`` (output via capsys); a few
run the installed ``ptb-fence`` console script and ``python -m ptb_fence`` in a subprocess.
Refusals must exit 2 with one line on stderr and leave the table exactly as it was.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import psycopg2
import pytest

from ptb_fence import (
    Abandoned,
    AttemptIdentity,
    Completed,
    Failed,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    postgres_update_store_schema,
)
from ptb_fence.cli import main
from ptb_fence.cli._format import format_age, parse_duration
from ptb_fence.stores.postgres._sql import postgres_admin_statements
from ptb_fence.stores.sqlite._sql import sqlite_admin_statements
from ptb_fence.cli._target import StoreTarget
from ptb_fence.conformance import RULES

BODY_MARKER = "cli-body-marker-7f3a"
PASSWORD = "Sup3rSecretPw"

Row = Tuple[Any, ...]


def body(update_id: int, text: str) -> str:
    return json.dumps(
        {
            "update_id": update_id,
            "message": {
                "message_id": update_id,
                "date": 1_700_000_000,
                "chat": {"id": 7, "type": "private"},
                "text": f"{text} {BODY_MARKER}",
            },
        }
    )


class Fixture:
    """A populated update table plus ways to read it back (no ptb_fence code involved)."""

    def __init__(self, kind: str, url: str, table: str, store: Any) -> None:
        self.kind = kind
        self.url = url
        self.table = table
        self.store = store
        self.now = int(time.time() * 1000)
        self.exhaustion: Optional[AttemptIdentity] = None

    def args(self, *command: str) -> List[str]:
        return ["--store", self.url, "--table", self.table, *command]

    def snapshot(self) -> List[Row]:
        sql = (
            "SELECT update_id, body, state, attempts, due_at, received_at, settled_at, error, "
            f'claim_id FROM "{self.table}" ORDER BY update_id'
        )
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.url[len("sqlite:///"):])
            try:
                return [tuple(r) for r in conn.execute(sql).fetchall()]
            finally:
                conn.close()
        conn = psycopg2.connect(self.url)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()

    def row(self, update_id: int) -> Optional[Dict[str, Any]]:
        names = ("update_id", "body", "state", "attempts", "due_at", "received_at",
                 "settled_at", "error", "claim_id")
        for values in self.snapshot():
            if values[0] == update_id:
                return dict(zip(names, values))
        return None


def populate(store: Any, now: int) -> AttemptIdentity:
    """Rows in every state; returns the identity of the one unacknowledged exhaustion.

    1001 completed (settled 589 s ago) · 1002, 1006 pending · 1003 failed (retry in 4 min) ·
    1007 failed (retry due now) · 1004 processing (live lease) · 1008 processing (lease lapsed)
    · 1005 unacknowledged exhaustion after 5 attempts · 1009 abandoned (settled 399 s ago).
    """
    for uid, text in [(1001, "/start"), (1002, "hello"), (1003, "order"), (1004, "pay"),
                      (1005, "broken"), (1006, "late"), (1007, "again"), (1008, "stuck"),
                      (1009, "blocked")]:
        assert store.add(uid, body(uid, text), now - 600_000 + (uid - 1000))
    claim = store.claim_owned
    i = claim(1001, now=now - 590_000, lease_until=now - 470_000, max_attempts=5)
    assert store.settle_owned(i, Completed(now - 589_000))
    i = claim(1003, now=now - 60_000, lease_until=now + 60_000, max_attempts=5)
    assert store.settle_owned(i, Failed(now - 59_000, now + 240_000, "TimedOut: Timed out"))
    i = claim(1007, now=now - 60_000, lease_until=now + 60_000, max_attempts=5)
    assert store.settle_owned(i, Failed(now - 59_000, now - 1_000, "NetworkError: reset"))
    assert claim(1004, now=now - 10_000, lease_until=now + 600_000, max_attempts=5)
    assert claim(1008, now=now - 300_000, lease_until=now - 180_000, max_attempts=5)
    t = now - 500_000
    for k in range(5):
        i = claim(1005, now=t, lease_until=t + 120_000, max_attempts=5, durable_exhaustion=True)
        assert i is not None and i.attempt == k + 1
        if k < 4:
            assert store.settle_owned(i, Failed(t + 10, t + 500, "BadRequest: text is empty"))
            t += 1_000
    assert store.exhaust(i, at=t + 1_000, error="BadRequest: Message text is empty")
    j = claim(1009, now=now - 400_000, lease_until=now - 280_000, max_attempts=5)
    assert store.settle_owned(j, Abandoned(now - 399_000, "Forbidden: bot was blocked by the user"))
    return i


@contextlib.contextmanager
def sqlite_db(path: Any) -> Iterator[Fixture]:
    """A populated ``telegram_updates`` table in a new SQLite file."""
    store = SQLiteUpdateStore(str(path), "telegram_updates")
    try:
        fixture = Fixture("sqlite", f"sqlite:///{path}", "telegram_updates", store)
        fixture.exhaustion = populate(store, fixture.now)
        yield fixture
    finally:
        store.close()


@contextlib.contextmanager
def postgres_db(dsn: str, table: str) -> Iterator[Fixture]:
    """A populated fresh PostgreSQL table."""
    store = PostgresUpdateStore(dsn, table)
    try:
        fixture = Fixture("postgres", dsn, table, store)
        fixture.exhaustion = populate(store, fixture.now)
        yield fixture
    finally:
        store.close()


# Not conftest's store: the command line needs a populated table it reaches by URL.
@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Fixture]:
    """A populated table in SQLite (a file in tmp_path) or PostgreSQL (a fresh table)."""
    if request.param == "sqlite":
        with sqlite_db(tmp_path / "bot.sqlite3") as fixture:
            yield fixture
    else:
        dsn = request.getfixturevalue("pg_dsn")
        with postgres_db(dsn, request.getfixturevalue("pg_table")) as fixture:
            yield fixture


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(
    capsys: pytest.CaptureFixture[str], fx: Optional[Fixture], argv: List[str], *needles: str
) -> str:
    """Exit 2, exactly one line on stderr (containing ``needles``), nothing on stdout, no
    change to the table."""
    before = fx.snapshot() if fx is not None else None
    code, out, err = run(capsys, *argv)
    assert code == 2, (argv, out, err)
    assert out == ""
    assert err.startswith("ptb-fence: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    if fx is not None:
        assert fx.snapshot() == before
    return err


# -- status ------------------------------------------------------------------------------------
def test_status_counts_due_work_and_oldest_pending(db: Fixture, capsys: Any) -> None:
    code, out, err = run(capsys, *db.args("status"))
    assert code == 0 and err == ""
    for state, count in [("pending", 2), ("processing", 2), ("failed", 2), ("completed", 1),
                         ("abandoned", 2), ("total", 9)]:
        assert re.search(rf"^{state}\s+{count}$", out, re.M), (state, out)
    assert re.search(r"^retries due now\s+1$", out, re.M)
    assert re.search(r"^leases lapsed now\s+1$", out, re.M)
    assert re.search(r"^unacknowledged exhaustions\s+1$", out, re.M)
    # update 1002 was received 600 s - 2 ms before the fixture's now
    assert re.search(r"^oldest pending\s+(9m 59s|10m 0\ds) \(update 1002, received .* UTC\)$",
                     out, re.M), out
    assert BODY_MARKER not in out


def test_status_json(db: Fixture, capsys: Any) -> None:
    code, out, _ = run(capsys, *db.args("status", "--json"))
    assert code == 0
    data = json.loads(out)
    assert data["counts"] == {"pending": 2, "processing": 2, "failed": 2, "completed": 1,
                              "abandoned": 2}
    assert data["total"] == 9
    assert data["retries_due_now"] == 1
    assert data["leases_lapsed_now"] == 1
    assert data["unacknowledged_exhaustions"] == 1
    assert data["table"] == db.table
    oldest = data["oldest_pending"]
    assert oldest["update_id"] == 1002
    assert oldest["received_at"] == db.now - 600_000 + 2
    assert 599 <= oldest["age_seconds"] < 700
    assert oldest["received_at_utc"].endswith("Z")


def test_options_may_follow_the_command(db: Fixture, capsys: Any) -> None:
    code, out, _ = run(capsys, "status", "--json", "--store", db.url, "--table", db.table)
    assert code == 0 and json.loads(out)["total"] == 9


def test_store_and_table_from_the_environment(
    db: Fixture, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_FENCE_STORE", db.url)
    monkeypatch.setenv("PTB_FENCE_TABLE", db.table)
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0 and json.loads(out)["total"] == 9


def test_status_of_an_empty_table(tmp_path: Any, capsys: Any) -> None:
    SQLiteUpdateStore(str(tmp_path / "e.db")).close()
    code, out, _ = run(capsys, "--store", f"sqlite:///{tmp_path}/e.db", "status")
    assert code == 0
    assert re.search(r"^total\s+0$", out, re.M)
    assert re.search(r"^oldest pending\s+-$", out, re.M)


# -- list / show -------------------------------------------------------------------------------
def test_list_all_by_state_and_paged(db: Fixture, capsys: Any) -> None:
    code, out, _ = run(capsys, *db.args("list"))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["UPDATE_ID", "STATE", "ATTEMPTS"]
    ids = [int(line.split()[0]) for line in lines[2:-1]]
    assert ids == list(range(1001, 1010))
    assert lines[-1] == "9 row(s)"
    assert BODY_MARKER not in out
    line_1005 = next(line for line in lines if line.strip().startswith("1005"))
    assert "abandoned" in line_1005 and " 5 " in line_1005
    assert "BadRequest: Message text is empty" in line_1005

    code, out, _ = run(capsys, *db.args("list", "--state", "failed"))
    assert [int(line.split()[0]) for line in out.splitlines()[2:-1]] == [1003, 1007]

    code, out, _ = run(capsys, *db.args("list", "--limit", "3"))
    assert [int(line.split()[0]) for line in out.splitlines()[2:-1]] == [1001, 1002, 1003]
    assert out.splitlines()[-1] == "3 row(s); next page: --after 1003"
    code, out, _ = run(capsys, *db.args("list", "--limit", "3", "--after", "1003"))
    assert [int(line.split()[0]) for line in out.splitlines()[2:-1]] == [1004, 1005, 1006]

    code, out, _ = run(capsys, *db.args("list", "--state", "completed", "--after", "1001"))
    assert code == 0 and out == "no completed rows after update 1001\n"


def test_list_json(db: Fixture, capsys: Any) -> None:
    code, out, _ = run(capsys, *db.args("list", "--state", "processing", "--json"))
    data = json.loads(out)
    assert [r["update_id"] for r in data["rows"]] == [1004, 1008]
    assert data["next_after"] is None
    assert all("body" not in r for r in data["rows"])
    assert data["rows"][0]["due_at"] == db.now + 600_000


def test_show_pretty_prints_the_body_with_times_in_utc(db: Fixture, capsys: Any) -> None:
    code, out, err = run(capsys, *db.args("show", "1005"))
    assert code == 0 and err == ""
    fields = dict(
        line.split(None, 1) for line in out.split("body:")[0].splitlines() if line.strip()
    )
    assert fields["state"] == "abandoned"
    assert fields["attempts"] == "5"
    assert fields["claim_id"] == db.exhaustion.claim_id
    assert fields["exhaustion"] == "yes, unacknowledged"
    assert fields["error"] == "BadRequest: Message text is empty"
    assert fields["settled_at"] == "-"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC \(\S+( \S+)? ago\)",
                        fields["received_at"]), fields["received_at"]
    assert fields["due_at"].endswith("UTC (ended at)")
    body_text = out.split("body:\n", 1)[1]
    assert '  "update_id": 1005,' in body_text
    assert f'    "text": "broken {BODY_MARKER}"' in body_text
    assert (
        f"ptb-fence ack 1005 --attempt 5 --claim-id {db.exhaustion.claim_id}" in out
    )


def test_show_labels_leases_and_retries(db: Fixture, capsys: Any) -> None:
    _, out, _ = run(capsys, *db.args("show", "1004"))
    assert "(lease until; held for" in out
    _, out, _ = run(capsys, *db.args("show", "1008"))
    assert "(lease until; lapsed 3m" in out and "claimable)" in out
    _, out, _ = run(capsys, *db.args("show", "1003"))
    assert "(retry at; in 3m" in out or "(retry at; in 4m" in out
    _, out, _ = run(capsys, *db.args("show", "1007"))
    assert "(retry at; due now)" in out


def test_show_json_includes_the_raw_body(db: Fixture, capsys: Any) -> None:
    code, out, _ = run(capsys, *db.args("show", "1003", "--json"))
    data = json.loads(out)
    assert data["body"] == body(1003, "order")
    assert data["state"] == "failed" and data["due_at"] == db.now + 240_000
    assert data["error"] == "TimedOut: Timed out"


def test_show_lists_the_recorded_steps(db: Fixture, capsys: Any) -> None:
    from ptb_fence import StepRecord

    row = db.row(1004)
    assert row is not None
    long_result = json.dumps({"charge": "ch-1", "note": "x" * 200})
    records = [
        StepRecord("k-1004-reserve", 1004, "reserve", '{"slot": 9}', row["attempts"],
                   row["claim_id"], db.now - 5_000),
        StepRecord("k-1004-charge", 1004, "charge", long_result, row["attempts"],
                   row["claim_id"], db.now - 4_000),
    ]
    for record in records:
        assert db.store.record_step(record) is True
    code, out, err = run(capsys, *db.args("show", "1004"))
    assert code == 0 and err == ""
    steps = out.split("steps (2):\n", 1)[1].split("body:", 1)[0]
    lines = steps.splitlines()
    assert lines[0].split() == ["NAME", "KEY", "ATTEMPT", "RECORDED", "(UTC)", "RESULT"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split()[:3] == ["reserve", "k-1004-reserve", "1"]
    assert lines[2].rstrip().endswith('{"slot": 9}')
    assert lines[3].split()[:3] == ["charge", "k-1004-charge", "1"]
    assert long_result not in out and "…" in lines[3]  # the result is cut short
    code, out, _ = run(capsys, *db.args("show", "1004", "--json"))
    data = json.loads(out)
    assert [s["name"] for s in data["steps"]] == ["reserve", "charge"]
    charge = data["steps"][1]
    assert charge["key"] == "k-1004-charge" and charge["result"] == long_result
    assert charge["attempt"] == 1 and charge["claim_id"] == row["claim_id"]
    assert charge["recorded_at"] == db.now - 4_000 and charge["recorded_at_utc"].endswith("Z")
    # an update without steps
    _, out, _ = run(capsys, *db.args("show", "1003"))
    assert "steps: none recorded" in out
    _, out, _ = run(capsys, *db.args("show", "1003", "--json"))
    assert json.loads(out)["steps"] == []


def test_show_of_a_table_without_a_steps_table(pg_dsn: str, pg_table: str, capsys: Any) -> None:
    """A PostgreSQL table made before steps, not migrated since: show lists no steps."""
    from ptb_fence.stores._steps_sql import steps_table_name

    with PostgresUpdateStore(pg_dsn, pg_table) as store:
        assert store.add(1, body(1, "hi"), int(time.time() * 1000))
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE "{steps_table_name(pg_table)}"')
        conn.commit()
    finally:
        conn.close()
    code, out, _ = run(capsys, "--store", pg_dsn, "--table", pg_table, "show", "1")
    assert code == 0 and "steps" not in out.split("body:")[0]
    code, out, _ = run(capsys, "--store", pg_dsn, "--table", pg_table, "show", "1", "--json")
    assert code == 0 and json.loads(out)["steps"] is None


# -- exhaustions / ack -------------------------------------------------------------------------
def test_exhaustions_lists_identities_and_pages(db: Fixture, capsys: Any) -> None:
    identity = db.exhaustion
    code, out, _ = run(capsys, *db.args("exhaustions"))
    assert code == 0
    line = out.splitlines()[2].split()
    assert line[:3] == ["1005", "5", identity.claim_id]
    assert "1 unacknowledged exhaustion(s)" in out
    assert BODY_MARKER not in out
    # a second exhaustion, then pages of one
    i = db.store.claim_owned(1006, now=db.now, lease_until=db.now + 60_000, max_attempts=5)
    assert db.store.exhaust(i, at=db.now, error="handler gave up")
    code, out, _ = run(capsys, *db.args("exhaustions", "--limit", "1"))
    assert out.splitlines()[2].split()[0] == "1005"
    assert "next page: --after 1005" in out
    code, out, _ = run(capsys, *db.args("exhaustions", "--limit", "1", "--after", "1005",
                                        "--json"))
    data = json.loads(out)
    assert [(e["update_id"], e["attempt"], e["claim_id"]) for e in data["exhaustions"]] == [
        (1006, 1, i.claim_id)
    ]
    assert data["exhaustions"][0]["error"] == "handler gave up"
    code, out, _ = run(capsys, *db.args("exhaustions", "--after", "1006"))
    assert out == "no unacknowledged exhaustions after update 1006\n"


def test_ack_with_the_exact_identity(db: Fixture, capsys: Any, caplog: Any) -> None:
    identity = db.exhaustion
    caplog.set_level(logging.INFO, logger="ptb_fence.cli")
    code, out, err = run(capsys, *db.args("ack", "1005", "--attempt", "5",
                                          "--claim-id", identity.claim_id))
    assert code == 0 and err == "", err
    assert out.startswith("acknowledged the exhaustion of update 1005 (attempt 5")
    row = db.row(1005)
    assert row["state"] == "abandoned" and row["settled_at"] is not None
    assert abs(row["settled_at"] - int(time.time() * 1000)) < 60_000
    assert db.store.due_exhaustions(limit=10) == []
    records = [r for r in caplog.records if r.name == "ptb_fence.cli"]
    assert len(records) == 1
    assert (records[0].update_id, records[0].attempt, records[0].claim_id) == (
        1005, 5, identity.claim_id
    )
    assert records[0].levelno == logging.INFO
    # a second acknowledgement is refused and changes nothing
    assert_refused(capsys, db, db.args("ack", "1005", "--attempt", "5", "--claim-id",
                                       identity.claim_id), "already acknowledged")


@pytest.mark.parametrize(
    ("attempt", "claim_id", "needle"),
    [("4", None, "not attempt 4"), ("5", "0" * 32, "claim id")],
)
def test_ack_with_a_wrong_identity_is_refused(
    db: Fixture, capsys: Any, attempt: str, claim_id: Optional[str], needle: str
) -> None:
    claim = claim_id or db.exhaustion.claim_id
    err = assert_refused(capsys, db, db.args("ack", "1005", "--attempt", attempt,
                                             "--claim-id", claim), needle, "nothing changed")
    assert db.exhaustion.claim_id in err  # the message shows the identity to use


@pytest.mark.parametrize(
    "extra",
    [
        ["--attempt", "0", "--claim-id", "abc"],
        ["--attempt", "x", "--claim-id", "abc"],
        ["--attempt", "-1", "--claim-id", "abc"],
        ["--attempt", "5", "--claim-id", ""],
        ["--attempt", "5", "--claim-id", "has space"],
        ["--attempt", "5"],
        ["--claim-id", "abc"],
    ],
)
def test_ack_with_a_malformed_identity_is_refused(
    db: Fixture, capsys: Any, extra: List[str]
) -> None:
    assert_refused(capsys, db, db.args("ack", "1005", *extra))


def test_ack_of_an_unknown_update_or_a_non_exhaustion_is_refused(db: Fixture, capsys: Any) -> None:
    claim = db.exhaustion.claim_id
    assert_refused(capsys, db, db.args("ack", "4242", "--attempt", "1", "--claim-id", claim),
                   "no update 4242")
    assert_refused(capsys, db, db.args("ack", "1009", "--attempt", "1", "--claim-id", claim),
                   "already acknowledged")
    assert_refused(capsys, db, db.args("ack", "1001", "--attempt", "1", "--claim-id", claim),
                   "completed, not an exhaustion")
    assert_refused(capsys, db, db.args("ack", "abc", "--attempt", "1", "--claim-id", claim),
                   "invalid update id")


# -- retry -------------------------------------------------------------------------------------
def test_retry_of_an_exhaustion_gives_a_full_new_set_of_attempts(
    db: Fixture, capsys: Any, caplog: Any
) -> None:
    old = db.exhaustion
    caplog.set_level(logging.INFO, logger="ptb_fence.cli")
    code, out, err = run(capsys, *db.args("retry", "1005"))
    assert code == 0 and err == ""
    assert "abandoned, an unacknowledged exhaustion -> pending" in out
    assert "attempts 5 -> 0" in out
    assert "it is no longer an exhaustion" in out
    row = db.row(1005)
    assert row["state"] == "pending" and row["attempts"] == 0
    assert row["due_at"] == row["received_at"] and row["settled_at"] is None
    assert row["error"] == "BadRequest: Message text is empty"  # kept for the record
    assert row["claim_id"] == old.claim_id
    assert db.store.due_exhaustions(limit=10) == []
    assert db.store.acknowledge_exhaustion(old, db.now) is False
    # claimable again with a full set: attempt 1, a new claim id
    now = int(time.time() * 1000)
    fresh = db.store.claim_owned(1005, now=now, lease_until=now + 60_000, max_attempts=5)
    assert fresh is not None and fresh.attempt == 1 and fresh.claim_id != old.claim_id
    records = [r for r in caplog.records if r.name == "ptb_fence.cli"]
    assert len(records) == 1
    record = records[0]
    assert (record.update_id, record.attempt, record.claim_id) == (1005, 5, old.claim_id)
    assert record.previous_state == "abandoned" and record.was_exhaustion is True
    assert BODY_MARKER not in record.getMessage()


def test_retry_of_a_failed_update_makes_it_due_now(db: Fixture, capsys: Any) -> None:
    code, out, _ = run(capsys, *db.args("retry", "1003"))
    assert code == 0
    assert "update 1003: failed -> pending" in out and "attempts 1 -> 0" in out
    assert "no longer an exhaustion" not in out
    row = db.row(1003)
    assert (row["state"], row["attempts"], row["due_at"]) == ("pending", 0, row["received_at"])
    now = int(time.time() * 1000)
    assert 1003 in [u.update_id for u in db.store.due(now=now, pending_before=now, limit=100)]


def test_retry_of_an_ordinary_abandoned_update(db: Fixture, capsys: Any) -> None:
    code, out, _ = run(capsys, *db.args("retry", "1009"))
    assert code == 0 and "update 1009: abandoned -> pending" in out
    row = db.row(1009)
    assert (row["state"], row["settled_at"]) == ("pending", None)


@pytest.mark.parametrize(
    ("update_id", "needle"),
    [
        ("1004", "processing: its lease is never disturbed"),
        ("1008", "processing"),
        ("1002", "already pending"),
        ("1001", "completed"),
        ("4242", "no update 4242"),
        ("-3", "invalid update id"),
    ],
)
def test_retry_refusals_change_nothing(
    db: Fixture, capsys: Any, update_id: str, needle: str
) -> None:
    assert_refused(capsys, db, db.args("retry", update_id), needle)


def test_the_retry_statement_alone_never_matches_a_live_lease_or_a_stale_read(
    db: Fixture,
) -> None:
    """The one conditional UPDATE matches only a failed/abandoned row as it was read."""
    before = db.snapshot()
    cases = [
        (1004, "processing", 1),  # a live lease, even if asked for explicitly
        (1004, "failed", 1),  # a stale read: the row is processing now
        (1002, "pending", 0),
        (1001, "completed", 1),
        (1003, "failed", 2),  # attempts changed since the read
        (1005, "failed", 5),  # state changed since the read
    ]
    if db.kind == "sqlite":
        sql = sqlite_admin_statements(db.table)
        conn = sqlite3.connect(db.url[len("sqlite:///"):], isolation_level=None)
        try:
            for update_id, state, attempts in cases:
                params = {"update_id": update_id, "state": state, "attempts": attempts}
                assert conn.execute(sql.retry, params).fetchall() == [], (update_id, state)
            params = {"update_id": 1003, "state": "failed", "attempts": 1}
            assert conn.execute(sql.retry, params).fetchall() == [(1003,)]
        finally:
            conn.close()
    else:
        sql = postgres_admin_statements(db.table)
        conn = psycopg2.connect(db.url)
        try:
            with conn.cursor() as cur:
                for update_id, state, attempts in cases:
                    params = {"update_id": update_id, "state": state, "attempts": attempts}
                    cur.execute(sql.retry, params)
                    assert cur.fetchall() == [], (update_id, state)
                cur.execute(sql.retry, {"update_id": 1003, "state": "failed", "attempts": 1})
                assert cur.fetchall() == [(1003,)]
            conn.commit()
        finally:
            conn.close()
    after = db.snapshot()
    assert [r for r in after if r[0] != 1003] == [r for r in before if r[0] != 1003]
    assert db.row(1003)["state"] == "pending"


# -- prune -------------------------------------------------------------------------------------
def test_prune_deletes_only_settled_rows_older_than_the_bound(db: Fixture, capsys: Any) -> None:
    before = {row[0] for row in db.snapshot()}
    code, out, err = run(capsys, *db.args("prune", "--older-than", "5m"))
    assert code == 0
    assert out.startswith("pruned 2 row(s) settled before ")
    assert "pruning completed and abandoned rows" in err  # progress
    assert "warning: pruning rows settled less than 24h ago" in err
    assert {row[0] for row in db.snapshot()} == before - {1001, 1009}
    code, out, err = run(capsys, *db.args("prune", "--older-than", "7d"))
    assert code == 0 and out.startswith("pruned 0 row(s)") and "warning" not in err


@pytest.mark.parametrize("duration", ["5", "0s", "-5m", "5x", "m", "1.5.2h", "7 d", ""])
def test_prune_with_a_bad_duration_is_refused(db: Fixture, capsys: Any, duration: str) -> None:
    assert_refused(capsys, db, db.args("prune", f"--older-than={duration}"), "duration")


def test_duration_and_age_formats() -> None:
    assert parse_duration("90s") == 90_000
    assert parse_duration("15m") == 900_000
    assert parse_duration("12h") == 43_200_000
    assert parse_duration("7d") == 604_800_000
    assert parse_duration("1.5h") == 5_400_000
    assert parse_duration("250ms") == 250
    assert format_age(500) == "500 ms"
    assert format_age(45_900) == "45 s"
    assert format_age(61_000) == "1m 01s"
    assert format_age(3 * 3_600_000 + 5 * 60_000) == "3h 05m"
    assert format_age(2 * 86_400_000 + 4 * 3_600_000) == "2d 04h"


# -- schema / migrate --------------------------------------------------------------------------
def test_schema_prints_the_migration(capsys: Any) -> None:
    code, out, _ = run(capsys, "--table", "bot_updates", "schema")
    assert code == 0
    assert out == postgres_update_store_schema("bot_updates").rstrip("\n") + "\n"
    assert_refused(capsys, None, ["--table", "bad-name", "schema"], "invalid table name")


def test_migrate_creates_upgrades_and_is_idempotent(
    pg_dsn: str, pg_tables: List[str], capsys: Any
) -> None:
    fresh, legacy = "t_cli_fresh_" + os.urandom(4).hex(), "t_cli_legacy_" + os.urandom(4).hex()
    pg_tables.extend([fresh, legacy])
    code, out, _ = run(capsys, "--store", pg_dsn, "--table", fresh, "migrate")
    assert code == 0 and "created the table" in out
    code, out, _ = run(capsys, "--store", pg_dsn, "--table", fresh, "migrate")
    assert code == 0 and "is up to date; nothing changed" in out
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                f'CREATE TABLE "{legacy}" (update_id BIGINT PRIMARY KEY, body TEXT NOT NULL, '
                "state TEXT NOT NULL, attempts INT NOT NULL DEFAULT 0, due_at BIGINT NOT NULL, "
                "received_at BIGINT NOT NULL, settled_at BIGINT, error TEXT)"
            )
            cur.execute(f"INSERT INTO \"{legacy}\" VALUES (1, '{{}}', 'pending', 0, 5, 5, NULL, NULL)")
        conn.commit()
    finally:
        conn.close()
    # an unmigrated table: inspection works, the fenced commands name the fix
    code, out, _ = run(capsys, "--store", pg_dsn, "--table", legacy, "status", "--json")
    assert code == 0 and json.loads(out)["counts"]["pending"] == 1
    assert_refused(capsys, None, ["--store", pg_dsn, "--table", legacy, "exhaustions"],
                   "postgres_update_store_schema", "ptb-fence migrate")
    code, out, _ = run(capsys, "--store", pg_dsn, "--table", legacy, "migrate")
    assert code == 0 and "added the claim_id column" in out
    code, out, _ = run(capsys, "--store", pg_dsn, "--table", legacy, "exhaustions")
    assert code == 0 and out == "no unacknowledged exhaustions\n"


def test_migrate_and_schema_on_sqlite_say_the_store_migrates_itself(
    tmp_path: Any, capsys: Any
) -> None:
    url = f"sqlite:///{tmp_path}/never.db"
    for command in ("migrate", "schema"):
        code, out, _ = run(capsys, "--store", url, command)
        assert code == 0
        assert "creates its table and adds a missing claim_id column itself" in out
    assert os.listdir(tmp_path) == []


# -- check -------------------------------------------------------------------------------------
def test_check_sqlite_uses_scratch_files_only(tmp_path: Any, capsys: Any) -> None:
    url = f"sqlite:///{tmp_path}/mine.db"
    code, out, err = run(capsys, "--store", url, "check")
    assert code == 0, (out, err)
    assert out.startswith(f"SQLiteUpdateStore conforms: {len(RULES)} rules, 0 violations")
    n = len(RULES)
    assert f"rule 1/{n}: one-record-per-update" in err and f"rule {n}/{n}" in err
    assert os.listdir(tmp_path) == []  # nothing of the user's was created or touched


def test_check_postgres_uses_scratch_tables_and_drops_them(
    pg_dsn: str, pg_table: str, capsys: Any
) -> None:
    with postgres_db(pg_dsn, pg_table) as db:
        check_postgres(db, capsys)


def check_postgres(db: Fixture, capsys: Any) -> None:
    before = db.snapshot()
    code, out, err = run(capsys, *db.args("check"))
    assert code == 0, (out, err)
    assert out.startswith(f"PostgresUpdateStore conforms: {len(RULES)} rules, 0 violations")
    assert f"dropped {len(RULES)} scratch table(s)" in err
    assert db.snapshot() == before
    prefix = re.search(r"scratch tables (ptb_fence_check_[0-9a-f]{12}_)\*", err).group(1)
    conn = psycopg2.connect(db.url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_tables WHERE starts_with(tablename, %s)",
                        (prefix,))
            assert cur.fetchone()[0] == 0
            # the bind-bot rule bound scratch tables: their owner rows are gone too
            cur.execute("SELECT count(*) FROM ptb_fence_meta WHERE starts_with(table_name, %s)",
                        (prefix,))
            assert cur.fetchone()[0] == 0
    finally:
        conn.close()


# -- refusals of the store and table -----------------------------------------------------------
def test_missing_sqlite_file_is_refused_and_not_created(tmp_path: Any, capsys: Any) -> None:
    url = f"sqlite:///{tmp_path}/missing.db"
    for command in (["status"], ["list"], ["show", "1"], ["exhaustions"], ["retry", "1"],
                    ["ack", "1", "--attempt", "1", "--claim-id", "c"],
                    ["prune", "--older-than", "1d"]):
        assert_refused(capsys, None, ["--store", url, *command], "no SQLite database at")
    assert os.listdir(tmp_path) == []


def test_missing_sqlite_table_is_refused_and_not_created(tmp_path: Any, capsys: Any) -> None:
    with sqlite_db(tmp_path / "bot.sqlite3") as db:
        missing_sqlite_table(db, capsys)


def missing_sqlite_table(db: Fixture, capsys: Any) -> None:
    for command in (["status"], ["exhaustions"], ["retry", "1005"],
                    ["ack", "1005", "--attempt", "5", "--claim-id", "c"],
                    ["prune", "--older-than", "1d"]):
        assert_refused(capsys, db, ["--store", db.url, "--table", "other", *command],
                       "no table 'other'")
    conn = sqlite3.connect(db.url[len("sqlite:///"):])
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    finally:
        conn.close()
    # the store's own table, its outbox (whose AUTOINCREMENT keeps sqlite_sequence), its state
    # table, its steps, jobs, pace, broadcasts and recipients tables: no other
    assert sorted(names) == ["sqlite_sequence", "telegram_updates",
                             "telegram_updates_broadcasts", "telegram_updates_jobs",
                             "telegram_updates_outbox", "telegram_updates_pace",
                             "telegram_updates_persistence", "telegram_updates_recipients",
                             "telegram_updates_steps"]


def test_missing_postgres_table_is_refused_and_not_created(
    pg_dsn: str, pg_table: str, capsys: Any
) -> None:
    for command in (["status"], ["list"], ["show", "1"], ["exhaustions"], ["retry", "1"],
                    ["ack", "1", "--attempt", "1", "--claim-id", "c"],
                    ["prune", "--older-than", "1d"]):
        assert_refused(capsys, None, ["--store", pg_dsn, "--table", pg_table, *command],
                       f"no table {pg_table!r}", "ptb-fence migrate")
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (f'"{pg_table}"',))
            assert cur.fetchone()[0] is None
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("store", "needle"),
    [
        ("mysql://u:pw@host/db", "unknown store URL scheme 'mysql://'"),
        ("redis://localhost", "unknown store URL scheme"),
        ("just-a-path.db", "no scheme"),
        ("sqlite://relative.db", "invalid SQLite store URL"),
        ("sqlite:///", "invalid SQLite store URL"),
        ("sqlite:///:memory:", "name a database file"),
    ],
)
def test_bad_store_urls_are_refused(capsys: Any, store: str, needle: str) -> None:
    err = assert_refused(capsys, None, ["--store", store, "status"], needle)
    assert "pw" not in err.replace("pwd", "")


def test_no_store_and_bad_table_and_bad_command(
    capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.delenv("PTB_FENCE_STORE", raising=False)
    assert_refused(capsys, None, ["status"], "no store given")
    url = f"sqlite:///{tmp_path}/x.db"
    assert_refused(capsys, None, ["--store", url, "--table", "drop table x", "status"],
                   "invalid table name")
    assert_refused(capsys, None, ["--store", url, "--table", "a" * 64, "status"],
                   "invalid table name")
    assert_refused(capsys, None, ["--store", url, "frobnicate"], "invalid choice")
    assert_refused(capsys, None, [], "required")
    assert os.listdir(tmp_path) == []


def test_help_exits_zero(capsys: Any) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "retry" in out and "exhaustions" in out
    code, out, _ = run(capsys, "retry", "--help")
    assert code == 0 and "UPDATE_ID" in out


# -- secrets -----------------------------------------------------------------------------------
def with_password(dsn: str, password: str = PASSWORD) -> str:
    assert dsn.startswith("postgresql://") and "@" in dsn and ":" not in dsn.split("@")[0][13:]
    user, rest = dsn[len("postgresql://"):].split("@", 1)
    return f"postgresql://{user}:{password}@{rest}"


def test_dsn_password_never_printed(pg_dsn: str, pg_table: str, capsys: Any) -> None:
    secret_dsn = with_password(pg_dsn)  # trust auth ignores the password
    err = assert_refused(capsys, None, ["--store", secret_dsn, "--table", pg_table, "status"],
                         "no table")
    assert PASSWORD not in err and ":***@" in err
    # unreachable server: exit 3, one line, no password
    unreachable = f"postgresql://bob:{PASSWORD}@127.0.0.1:1/db"
    for dsn in (unreachable, f"postgresql://bob@127.0.0.1:1/db?password={PASSWORD}"):
        code, out, err = run(capsys, "--store", dsn, "status")
        assert code == 3 and out == "" and err.count("\n") == 1, err
        assert PASSWORD not in err and "***" in err
    code, out, err = run(capsys, "--store", unreachable, "check")
    assert code == 3 and PASSWORD not in out + err
    # a malformed DSN: refused, no password
    code, out, err = run(capsys, "--store", f"postgresql://u:{PASSWORD}@h/db?sslmode", "status")
    assert code in (2, 3) and PASSWORD not in err and err.count("\n") == 1


def test_masking_covers_every_spelling() -> None:
    target = StoreTarget("postgresql://bob:p%40ss%2Fw0rd@db.example:5432/bot?sslmode=require")
    assert target.display == "postgresql://bob:***@db.example:5432/bot?sslmode=require"
    assert target.redact("x p@ss/w0rd y p%40ss%2Fw0rd z") == "x *** y *** z"
    target = StoreTarget("postgres://bob@db/bot?password=hunter2&application_name=x")
    assert "hunter2" not in target.display and "application_name=x" in target.display
    assert target.redact("hunter2") == "***"


# -- the installed script ----------------------------------------------------------------------
def script() -> str:
    # the script pip installed beside this interpreter: a venv used by path (not activated)
    # has it there, not on PATH
    name = "ptb-fence.exe" if os.name == "nt" else "ptb-fence"
    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    pytest.fail(f"the ptb-fence console script is not installed beside {sys.executable}: "
                "run `python -m pip install -e .` with that interpreter")


def test_installed_script_status_and_refusal(tmp_path: Any) -> None:
    path = tmp_path / "bot.sqlite3"
    with SQLiteUpdateStore(str(path)) as store:
        populate(store, int(time.time() * 1000))
    url = f"sqlite:///{path}"
    done = subprocess.run([script(), "--store", url, "status", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["unacknowledged_exhaustions"] == 1
    done = subprocess.run([script(), "--store", url, "retry", "1004"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "its lease is never disturbed" in done.stderr
    done = subprocess.run([script(), "--store", f"sqlite:///{tmp_path}/none.db", "list"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no SQLite database at" in done.stderr
    assert not (tmp_path / "none.db").exists()


def test_python_dash_m_dispatches_to_the_cli(tmp_path: Any) -> None:
    path = tmp_path / "bot.sqlite3"
    SQLiteUpdateStore(str(path)).close()
    done = subprocess.run(
        [sys.executable, "-m", "ptb_fence", "--store", f"sqlite:///{path}", "list"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "no rows\n"


def test_verbose_logs_the_retry_to_stderr(tmp_path: Any) -> None:
    path = tmp_path / "bot.sqlite3"
    with SQLiteUpdateStore(str(path)) as store:
        populate(store, int(time.time() * 1000))
    done = subprocess.run([script(), "-v", "--store", f"sqlite:///{path}", "retry", "1003"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "INFO ptb_fence.cli: retry: update 1003 failed -> pending" in done.stderr
    assert BODY_MARKER not in done.stderr


# -- polish: pipes, bad files, plain paths, --version, final rows, demo --keep ---------------
def cli_process(*argv: str, **kwargs: Any) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "ptb_fence", *argv], capture_output=True,
                          text=True, timeout=60, **kwargs)


def test_piping_into_head_exits_quietly(tmp_path: Any) -> None:
    path = tmp_path / "big.sqlite3"
    store = SQLiteUpdateStore(str(path), "telegram_updates")
    try:
        now = int(time.time() * 1000)
        for uid in range(1, 3001):
            assert store.add(uid, body(uid, "x" * 40), now)
    finally:
        store.close()
    for command in ("list --limit 3000", "show 7"):
        # `head -1` exits after one line; the CLI then writes into a closed pipe
        result = subprocess.run(
            ["bash", "-c", f"set -o pipefail; {sys.executable} -m ptb_fence --store "
             f"sqlite:///{path} {command} | head -1 >/dev/null; echo \"status=$?\" >&2"],
            capture_output=True, text=True, timeout=60,
        )
        assert "BrokenPipeError" not in result.stderr and "Traceback" not in result.stderr, \
            result.stderr
        assert "Exception ignored" not in result.stderr, result.stderr
        assert result.stderr.strip().splitlines()[-1] in ("status=0", "status=141"), \
            result.stderr


def test_a_file_that_is_not_a_database_is_bad_input(tmp_path: Any, capsys: Any) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("these are my notes, not a database\n" * 50)
    err = assert_refused(capsys, None, ["--store", f"sqlite:///{path}", "status"],
                         "not a SQLite database")
    assert str(path) in err
    assert path.read_text().startswith("these are my notes")


def test_a_directory_is_reported_as_a_directory(tmp_path: Any, capsys: Any) -> None:
    assert_refused(capsys, None, ["--store", f"sqlite:///{tmp_path}", "status"],
                   "is a directory, not a SQLite database")


def test_a_plain_path_to_an_existing_file_is_sqlite(tmp_path: Any, capsys: Any) -> None:
    with sqlite_db(tmp_path / "cli.db"):
        pass
    previous = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, out, err = run(capsys, "--store", "cli.db", "status")
        assert (code, err) == (0, ""), err
        assert re.search(r"^total\s+9$", out, re.M), out
        # a plain path that names no file: the suggestion spells the URL
        err = assert_refused(capsys, None, ["--store", "other.db", "status"], "no scheme",
                             "--store sqlite:///other.db")
    finally:
        os.chdir(previous)
    # a libpq key=value DSN is a PostgreSQL store; its password is never echoed
    code, out, err = run(capsys, "--store", f"host=127.0.0.1 port=1 password={PASSWORD}",
                         "status")
    assert code == 3 and "password=***" in err and PASSWORD not in out + err


def test_version(capsys: Any) -> None:
    import ptb_fence

    code, out, err = run(capsys, "--version")
    assert code == 0 and out.strip() == f"ptb-fence {ptb_fence.__version__}", (out, err)
    result = cli_process("--version")
    assert result.returncode == 0 and ptb_fence.__version__ in result.stdout


def test_final_rows_show_no_due_time(db: Fixture, capsys: Any) -> None:
    code, out, _ = run(capsys, *db.args("list"))
    assert code == 0
    header, *lines = out.splitlines()
    due = header.index("DUE (UTC)")
    settled = header.index("SETTLED (UTC)")
    for line in lines:
        if re.match(r"\s*100[19]\s", line):  # 1001 completed, 1009 abandoned
            assert line[due:settled].strip() == "-", line
        elif re.match(r"\s*1003\s", line):  # failed: its retry time
            assert line[due:settled].strip() != "-", line
    code, out, _ = run(capsys, *db.args("show", "1001"))
    assert re.search(r"^due_at\s+-$", out, re.M), out


def test_demo_keep_prints_the_path_and_a_next_step() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ptb_fence", "demo", "--updates", "20", "--chats", "2", "--keep"],
        capture_output=True, text=True, timeout=170,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"^kept: (\S+)$", result.stdout, re.M)
    assert match, result.stdout
    path = match.group(1)
    try:
        assert os.path.isfile(path)
        step = re.search(r"^\s+(ptb-fence --store sqlite:///\S+ status)$", result.stdout, re.M)
        assert step, result.stdout
        again = cli_process(*step.group(1).split()[1:])
        assert again.returncode == 0 and re.search(r"^completed\s+20$", again.stdout, re.M), \
            again.stdout + again.stderr
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
