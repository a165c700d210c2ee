"""Bulk ``retry`` and ``ack`` by state and age (with ``--dry-run``), ``--json`` on the commands
that change something, and ``prune`` in batches, against real SQLite files and the real
PostgreSQL server (``ptb_fence.cli.main`` in-process)."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from ptb_fence import (
    Abandoned,
    AttemptIdentity,
    Completed,
    Failed,
    PostgresUpdateStore,
    SQLiteUpdateStore,
)
from ptb_fence.cli import main

HOUR = 3_600_000


class Table:
    """Failed, abandoned and exhausted rows of chosen ages, written through the store."""

    def __init__(self, url: str, table: str, store: Any) -> None:
        self.url = url
        self.table = table
        self.store = store
        self.now = int(time.time() * 1000)
        self.exhaustions: Dict[int, AttemptIdentity] = {}

    def args(self, *command: str) -> List[str]:
        return ["--store", self.url, "--table", self.table, *command]

    def claim(self, update_id: int, age: int) -> AttemptIdentity:
        at = self.now - age
        assert self.store.add(update_id, json.dumps({"update_id": update_id}), at)
        identity = self.store.claim_owned(update_id, now=at, lease_until=at + 60_000,
                                          max_attempts=1, durable_exhaustion=True)
        assert identity is not None
        return identity  # type: ignore[no-any-return]

    def failed(self, update_id: int, age: int) -> None:
        identity = self.claim(update_id, age)
        at = self.now - age
        assert self.store.settle_owned(identity, Failed(at + 1, self.now + HOUR, "TimedOut"))

    def abandoned(self, update_id: int, age: int) -> None:
        identity = self.claim(update_id, age)
        assert self.store.settle_owned(identity, Abandoned(self.now - age + 1, "Forbidden"))

    def exhausted(self, update_id: int, age: int) -> None:
        identity = self.claim(update_id, age)
        assert self.store.exhaust(identity, at=self.now - age + 1, error="BadRequest")
        self.exhaustions[update_id] = identity

    def completed(self, update_id: int, age: int) -> None:
        identity = self.claim(update_id, age)
        assert self.store.settle_owned(identity, Completed(self.now - age + 1))

    def state_of(self, capsys: Any, update_id: int) -> Dict[str, Any]:
        code, out, _ = run(capsys, *self.args("show", str(update_id), "--json"))
        assert code == 0
        return json.loads(out)  # type: ignore[no-any-return]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(params=["sqlite", "postgres"])
def table(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Table]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            path = tmp_path / "bot.db"
            store: Any = SQLiteUpdateStore(str(path))
            fixture = Table(f"sqlite:///{path}", "telegram_updates", store)
        else:
            dsn = request.getfixturevalue("pg_dsn")
            name = request.getfixturevalue("pg_table")
            store = PostgresUpdateStore(dsn, name)
            fixture = Table(dsn, name, store)
        stack.callback(store.close)
        yield fixture


def test_bulk_retry_by_state_and_age_with_a_dry_run(table: Table, capsys: Any) -> None:
    table.failed(1, 3 * HOUR)
    table.failed(2, 2 * HOUR)
    table.failed(3, 10 * 60_000)  # too recent for --older-than 1h
    table.abandoned(4, 5 * HOUR)  # another state
    args = table.args("retry", "--state", "failed", "--older-than", "1h")
    code, out, err = run(capsys, *args, "--dry-run", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["dry_run"] is True and data["matched"] == 2 and data["changed"] == []
    assert [row["update_id"] for row in data["rows"]] == [1, 2]
    assert table.state_of(capsys, 1)["state"] == "failed"  # the dry run changed nothing
    code, out, err = run(capsys, *args, "--dry-run")
    assert code == 0 and "dry run: would make 2 failed update(s)" in out
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["dry_run"], data["changed"], data["skipped"]) == (False, [1, 2], [])
    for update_id, state in ((1, "pending"), (2, "pending"), (3, "failed"), (4, "abandoned")):
        row = table.state_of(capsys, update_id)
        assert row["state"] == state, (update_id, row)
        if state == "pending":
            assert row["attempts"] == 0
    code, out, _ = run(capsys, *table.args("retry", "--state", "abandoned", "--limit", "5"))
    assert code == 0 and "retried 1 update(s)" in out
    assert table.state_of(capsys, 4)["state"] == "pending"
    code, out, _ = run(capsys, *args)
    assert code == 0 and "no failed updates received before" in out


def test_bulk_ack_by_age_acknowledges_each_exact_identity(table: Table, capsys: Any) -> None:
    table.exhausted(1, 3 * HOUR)
    table.exhausted(2, 2 * HOUR)
    table.exhausted(3, 60_000)
    code, out, err = run(capsys, *table.args("ack", "--all", "--older-than", "1h", "--dry-run"))
    assert code == 0 and "dry run: would acknowledge 2 exhaustion(s)" in out, err
    code, out, _ = run(capsys, *table.args("exhaustions", "--json"))
    assert [e["update_id"] for e in json.loads(out)["exhaustions"]] == [1, 2, 3]
    code, out, err = run(capsys, *table.args("ack", "--all", "--older-than", "1h", "--json"))
    assert code == 0, err
    data = json.loads(out)
    assert data["changed"] == [1, 2] and data["skipped"] == []
    assert data["rows"][0]["claim_id"] == table.exhaustions[1].claim_id
    code, out, _ = run(capsys, *table.args("exhaustions", "--json"))
    assert [e["update_id"] for e in json.loads(out)["exhaustions"]] == [3]
    # a single ack prints JSON too
    i = table.exhaustions[3]
    code, out, _ = run(capsys, *table.args("ack", "3", "--attempt", str(i.attempt),
                                           "--claim-id", i.claim_id, "--json"))
    assert code == 0 and json.loads(out)["acknowledged"][0]["update_id"] == 3


@pytest.mark.parametrize("argv, needle", [
    (["ack"], "ack --all"),
    (["ack", "5"], "--attempt N --claim-id"),
    (["ack", "5", "--all"], "name no UPDATE_ID"),
    (["ack", "--older-than", "1h"], "go with ack --all"),
    (["retry"], "retry --state"),
    (["retry", "5", "--state", "failed"], "name no UPDATE_ID"),
    (["retry", "5", "--dry-run"], "go with retry --state"),
    (["retry", "--state", "pending"], "failed or abandoned"),
])
def test_bulk_misuse_is_refused(table: Table, capsys: Any, argv: List[str], needle: str) -> None:
    table.failed(5, HOUR)
    code, out, err = run(capsys, *table.args(*argv))
    assert code == 2 and out == "" and needle in err, err
    assert table.state_of(capsys, 5)["state"] == "failed"


def test_single_retry_and_prune_print_what_changed_as_json(table: Table, capsys: Any) -> None:
    table.failed(1, HOUR)
    code, out, err = run(capsys, *table.args("retry", "1", "--json"))
    assert code == 0, err
    data = json.loads(out)
    assert data["changed"] == [1] and data["before"]["state"] == "failed"
    for update_id in range(10, 40):
        table.completed(update_id, 3 * 24 * HOUR + update_id)
    table.completed(99, HOUR)
    code, out, err = run(capsys, *table.args("prune", "--older-than", "2d", "--json"))
    assert code == 0, err
    assert json.loads(out)["deleted"] == 30
    assert "prune [" + "#" * 24 + "] 30/30 row(s)" in err  # the bar on stderr, not stdout
    assert table.state_of(capsys, 99)["state"] == "completed"


def test_schema_and_migrate_print_json(table: Table, capsys: Any) -> None:
    code, out, _ = run(capsys, *table.args("schema", "--json"))
    data = json.loads(out)
    assert code == 0 and data["table"] == table.table
    code, out, _ = run(capsys, *table.args("migrate", "--json"))
    assert code == 0 and json.loads(out)["current"] is True


def test_prune_of_more_rows_than_a_batch_deletes_each_once(table: Table, capsys: Any) -> None:
    """25,000 settled rows (three batches of about 10,000, many sharing a settled_at) and a
    few that must stay: the batches together delete exactly the old ones."""
    table.completed(30_000, HOUR)  # too recent (and the store makes its table)
    table.failed(30_001, 20 * 24 * HOUR)  # never pruned
    old = table.now - 10 * 24 * HOUR
    rows = [(n, "{}", "completed", 1, old, old, old + n // 7) for n in range(1, 25_001)]
    sql = (f'INSERT INTO "{table.table}" (update_id, body, state, attempts, due_at, '
           "received_at, settled_at) VALUES (?, ?, ?, ?, ?, ?, ?)")
    if table.url.startswith("sqlite"):
        import sqlite3

        conn: Any = sqlite3.connect(table.url[len("sqlite:///"):])
        conn.executemany(sql, rows)
        conn.commit()
        conn.close()
    else:
        import psycopg2
        import psycopg2.extras

        conn = psycopg2.connect(table.url)
        with conn.cursor() as cur:
            psycopg2.extras.execute_batch(cur, sql.replace("?", "%s"), rows, page_size=5_000)
        conn.commit()
        conn.close()
    code, out, err = run(capsys, *table.args("prune", "--older-than", "2d", "--json"))
    assert code == 0, err
    assert json.loads(out)["deleted"] == 25_000
    assert "25,000 row(s)" in err and "/25,000 row(s)" in err
    code, out, _ = run(capsys, *table.args("status", "--json"))
    assert json.loads(out)["total"] == 2
