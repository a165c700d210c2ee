"""The chaos runner's named statements (the dialects' chaos.sql, run through ChaosDatabase)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ptb_fence.chaos._db import ChaosDatabase

ROOT = Path(__file__).resolve().parents[2]

# pg_terminate_backend has no SQLite counterpart, the claim log is a function on PostgreSQL
# and two triggers on SQLite
POSTGRES_ONLY = {"chaos_terminate_backends", "chaos_statement_timeout", "chaos_claim_log_function",
                 "chaos_drop_claim_log_trigger", "chaos_claim_log_trigger",
                 "chaos_drop_claim_log_function"}
SQLITE_ONLY = {"chaos_claim_log_update_trigger", "chaos_claim_log_insert_trigger"}


def test_both_dialects_name_the_same_statements_with_named_parameters() -> None:
    sqlite = ChaosDatabase("sqlite:////tmp/unused.sqlite3", "Run_1").statements()
    postgres = ChaosDatabase("postgresql://nobody@127.0.0.1/none", "Run_1").statements()
    assert set(sqlite) - SQLITE_ONLY == set(postgres) - POSTGRES_ONLY
    for statements in (sqlite, postgres):
        for name in statements:
            text = statements[name]
            assert statements.purpose(name), name
            assert "?" not in text and "%s" not in text, name
            assert "Run_1" not in text.replace('"Run_1_', ""), name  # every table name quoted
    assert ":update_id" in sqlite["chaos_insert_domain"]
    assert "%(update_id)s" in postgres["chaos_insert_domain"]
    assert "pg_terminate_backend" in postgres["chaos_terminate_backends"]


def test_the_runner_and_the_worker_hold_no_sql_text() -> None:
    for module in ("_runner.py", "_worker.py"):
        source = (ROOT / "ptb_fence" / "chaos" / module).read_text(encoding="utf-8")
        found = re.findall(r"\b(?:SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM|pg_\w+\()", source)
        assert found == [], (module, found)


def test_the_statements_write_and_read_the_run_tables_on_sqlite(tmp_path: Path) -> None:
    db = ChaosDatabase(f"sqlite:///{tmp_path}/chaos.sqlite3", "run")
    conn = db.connect("test")
    try:
        db.create_tables(conn)
        ident = {"update_id": 7, "attempt": 1, "claim_id": "c1", "pid": 42}
        db.run(conn, "chaos_insert_run", dict(ident, started_at=100))
        db.run(conn, "chaos_insert_run", dict(ident, pid=43, started_at=200))
        db.run(conn, "chaos_insert_domain", dict(ident, path="complete", written_at=101))
        db.run(conn, "chaos_insert_domain", dict(ident, path="complete", written_at=102))
        db.run(conn, "chaos_insert_event", dict(ident, kind="skip", at=103, detail="d"))
        db.run(conn, "chaos_insert_exhaustion", dict(ident, error="e", delivered_at=104))
        db.run(conn, "chaos_insert_exhaustion", dict(ident, error="e", delivered_at=105))

        assert db.run(conn, "chaos_latest_run_pid") == [(43,)]
        assert db.run(conn, "chaos_count_domain", {"update_id": 7}) == [(2,)]
        assert db.run(conn, "chaos_count_domain", {"update_id": 8}) == [(0,)]
        # a double write stays two rows, the logs read distinct attempts
        assert db.run(conn, "chaos_domain_writes") == [(7, 1, "c1"), (7, 1, "c1")]
        assert db.run(conn, "chaos_runs") == [(7, 1, "c1")]
        assert db.run(conn, "chaos_exhaustions") == [(7, 1, "c1")]
        assert db.run(conn, "chaos_events") == [("skip", 7, 1, "c1")]
        assert db.run(conn, "chaos_claims") == []
        with pytest.raises(KeyError, match="chaos_terminate_backends"):
            db.run(conn, "chaos_terminate_backends")
        db.drop_tables(conn)
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        assert tables == []
    finally:
        conn.close()
