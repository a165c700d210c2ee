"""``ptb-fence migrate --check``, ``migrate`` building indexes ``CONCURRENTLY`` on a table that
exists, and the ``--store`` spellings an application already has (libpq keywords, SQLAlchemy
URLs), against the real PostgreSQL server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Iterator, List, Tuple

import psycopg2
import pytest

from ptb_fence.cli import main

LEGACY = (
    '(update_id BIGINT PRIMARY KEY, body TEXT NOT NULL, state TEXT NOT NULL, attempts INT NOT '
    "NULL DEFAULT 0, due_at BIGINT NOT NULL, received_at BIGINT NOT NULL, settled_at BIGINT, "
    "error TEXT)"
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def execute(dsn: str, *statements: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
        conn.commit()
    finally:
        conn.close()


def index_valid(dsn: str, name: str) -> Any:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                        (f'"{name}"',))
            found = cur.fetchone()
            return None if found is None else bool(found[0])
    finally:
        conn.close()


def test_migrate_check_exits_1_while_behind_and_0_when_current(
    pg_dsn: str, pg_table: str, capsys: Any
) -> None:
    execute(pg_dsn, f'CREATE TABLE "{pg_table}" {LEGACY}')
    args = ["--store", pg_dsn, "--table", pg_table, "migrate"]
    code, out, err = run(capsys, *args, "--check")
    assert code == 1, out + err
    assert "is behind: it lacks column claim_id" in out and "ptb-fence migrate" in out
    code, out, _ = run(capsys, *args, "--check", "--json")
    data = json.loads(out)
    assert code == 1 and data["current"] is False
    assert data["missing_columns"] == ["claim_id", "fingerprint", "instance", "isolated_claim",
                                       "chat_key"]
    assert f"{pg_table}_state_due_at_idx" in data["missing_indexes"]
    # --check changed nothing
    code, out, _ = run(capsys, *args, "--check", "--json")
    assert code == 1 and json.loads(out)["missing_columns"][0] == "claim_id"
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["current"] is True and "added the claim_id column" in data["changes"]
    assert f'built the index "{pg_table}_state_due_at_idx" concurrently' in data["changes"]
    code, out, _ = run(capsys, *args, "--check")
    assert code == 0 and "is up to date" in out
    # a missing table is behind too, and --check does not create it
    code, out, _ = run(capsys, "--store", pg_dsn, "--table", pg_table + "_x", "migrate",
                       "--check", "--json")
    assert code == 1 and json.loads(out)["table_exists"] is False


def waiting_ddl(dsn: str, table: str, timeout: float = 20.0) -> None:
    """Wait until another backend waits for a lock in a statement on ``table`` (the
    migration's DDL: the text of a long script is cut by the server, the table is named
    early)."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    deadline = time.monotonic() + timeout
    try:
        with conn.cursor() as cur:
            while time.monotonic() < deadline:
                cur.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                    "AND state = 'active' AND wait_event_type = 'Lock' "
                    "AND strpos(query, %s) > 0",
                    (table,),
                )
                if cur.fetchone()[0]:
                    return
                time.sleep(0.05)
    finally:
        conn.close()
    raise AssertionError("the migration never started its DDL")


def test_migrate_builds_a_missing_index_without_blocking_inserts(
    pg_dsn: str, pg_table: str
) -> None:
    """A transaction that wrote to the table is still open while ``migrate`` runs: a plain
    ``CREATE INDEX`` (or ``ALTER TABLE``) would queue for its lock behind it, and every new
    insert would queue behind that. Built ``CONCURRENTLY``, a new insert goes through."""
    assert main(["--store", pg_dsn, "--table", pg_table, "migrate"]) == 0
    index = f"{pg_table}_state_due_at_idx"
    execute(pg_dsn, f'DROP INDEX "{index}"')
    holder = psycopg2.connect(pg_dsn)
    migrate = None
    try:
        with holder.cursor() as cur:
            cur.execute(f"INSERT INTO \"{pg_table}\" (update_id, body, state, attempts, due_at, "
                        "received_at) VALUES (1, '{}', 'pending', 0, 5, 5)")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PTB_FENCE_STORE")}
        migrate = subprocess.Popen(
            [sys.executable, "-m", "ptb_fence", "--store", pg_dsn, "--table", pg_table,
             "migrate"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        waiting_ddl(pg_dsn, pg_table)
        writer = psycopg2.connect(pg_dsn)
        try:
            with writer.cursor() as cur:
                cur.execute("SET statement_timeout = 3000")
                started = time.monotonic()
                cur.execute(f"INSERT INTO \"{pg_table}\" (update_id, body, state, attempts, "
                            "due_at, received_at) VALUES (2, '{}', 'pending', 0, 5, 5)")
                blocked = time.monotonic() - started
            writer.commit()
        finally:
            writer.close()
        assert blocked < 1.0, blocked
        holder.commit()
        out, err = migrate.communicate(timeout=60)
        assert migrate.returncode == 0, out + err
        assert f'built the index "{index}" concurrently' in out
        assert index_valid(pg_dsn, index) is True
    finally:
        holder.close()
        if migrate is not None and migrate.poll() is None:
            migrate.kill()
            migrate.wait()


def test_migrate_rebuilds_an_invalid_index(pg_dsn: str, pg_table: str, capsys: Any) -> None:
    """An interrupted ``CREATE INDEX CONCURRENTLY`` leaves an invalid index that ``IF NOT
    EXISTS`` would skip forever: ``--check`` reports it and ``migrate`` rebuilds it."""
    assert main(["--store", pg_dsn, "--table", pg_table, "migrate"]) == 0
    capsys.readouterr()
    index = f"{pg_table}_state_due_at_idx"
    execute(pg_dsn, f"UPDATE pg_index SET indisvalid = false WHERE indexrelid = "
                    f"to_regclass('\"{index}\"')")
    assert index_valid(pg_dsn, index) is False
    code, out, _ = run(capsys, "--store", pg_dsn, "--table", pg_table, "migrate", "--check")
    assert code == 1 and "invalid: an interrupted build" in out
    code, out, err = run(capsys, "--store", pg_dsn, "--table", pg_table, "migrate")
    assert code == 0 and "concurrently" in out, out + err
    assert index_valid(pg_dsn, index) is True


@pytest.mark.parametrize("spelling", ["keywords", "sqlalchemy"])
def test_keyword_dsns_and_sqlalchemy_urls_are_accepted(
    pg_dsn: str, pg_table: str, capsys: Any, spelling: str
) -> None:
    assert main(["--store", pg_dsn, "--table", pg_table, "migrate"]) == 0
    capsys.readouterr()
    params = psycopg2.extensions.parse_dsn(pg_dsn)
    if spelling == "keywords":
        store = " ".join(f"{key}={value}" for key, value in params.items())
    else:
        store = pg_dsn.replace("postgresql://", "postgresql+psycopg2://", 1)
        assert store.startswith("postgresql+psycopg2://")
    code, out, err = run(capsys, "--store", store, "--table", pg_table, "status", "--json")
    assert code == 0, err
    assert json.loads(out)["total"] == 0


def test_a_keyword_dsn_password_is_masked(capsys: Any) -> None:
    store = "host=127.0.0.1 port=1 dbname=x user=u password=Kw0rdSecret connect_timeout=2"
    code, out, err = run(capsys, "--store", store, "status")
    assert code == 3 and "Kw0rdSecret" not in out + err
    assert "password=***" in err
