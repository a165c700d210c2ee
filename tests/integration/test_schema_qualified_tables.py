"""``schema.table``: a PostgreSQL store and the command line working in a schema of their own
(their connections' search_path), against the real PostgreSQL server."""

from __future__ import annotations

import json
import uuid
from typing import Any, Iterator, List, Tuple

import psycopg2
import psycopg2.pool
import pytest

from ptb_fence import (
    Completed,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    UsageError,
    postgres_update_store_schema,
)
from ptb_fence.cli import main

T = 1_700_000_000_000


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def tables_in(dsn: str, schema: str) -> List[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1",
                        (schema,))
            return [str(row[0]) for row in cur.fetchall()]
    finally:
        conn.close()


@pytest.fixture
def schemas(pg_dsn: str) -> Iterator[List[str]]:
    """Two fresh schema names (not created), dropped afterwards."""
    names = ["s_" + uuid.uuid4().hex[:12], "s_" + uuid.uuid4().hex[:12]]
    yield names
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for name in names:
                cur.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        conn.close()


def test_the_cli_and_the_store_work_in_the_schema(
    pg_dsn: str, schemas: List[str], capsys: Any
) -> None:
    schema = schemas[0]
    qualified = f"{schema}.bot_updates"
    args = ["--store", pg_dsn, "--table", qualified]
    code, out, err = run(capsys, *args, "migrate", "--check")
    assert code == 1, out + err  # neither the schema nor the table exists yet
    code, out, err = run(capsys, *args, "migrate")
    assert code == 0 and "created the table" in out, out + err
    assert set(tables_in(pg_dsn, schema)) >= {
        "bot_updates", "bot_updates_outbox", "bot_updates_persistence", "ptb_fence_meta",
        "ptb_fence_instances",
    }
    code, out, err = run(capsys, *args, "migrate", "--check")
    assert code == 0, out + err
    store = PostgresUpdateStore(pg_dsn, "bot_updates", create_table=False, schema=schema)
    try:
        assert store.table == "bot_updates"
        assert store.add(7, '{"update_id": 7}', T)
        identity = store.claim_owned(7, now=T, lease_until=T + 60_000, max_attempts=3)
        assert identity is not None and store.settle_owned(identity, Completed(T + 1))
        assert store.add(8, '{"update_id": 8}', T)
    finally:
        store.close()
    code, out, err = run(capsys, *args, "status", "--json")
    assert code == 0, err
    assert json.loads(out)["counts"] == {"pending": 1, "processing": 0, "failed": 0,
                                         "completed": 1, "abandoned": 0}
    code, out, err = run(capsys, *args, "health", "--max-pending-age", "10000d")
    assert code == 0, out + err
    code, out, err = run(capsys, *args, "prune", "--older-than", "1d", "--json")
    assert code == 0 and json.loads(out)["deleted"] == 1, err
    # nothing was made outside the schema
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass('public.bot_updates')")
            assert cur.fetchone() == (None,)
    finally:
        conn.close()


def test_one_table_name_in_two_schemas_is_two_tables(pg_dsn: str, schemas: List[str]) -> None:
    first, second = schemas
    for schema in (first, second):
        conn = psycopg2.connect(pg_dsn)
        try:
            with conn.cursor() as cur:
                cur.execute(postgres_update_store_schema("updates", schema=schema))  # one transaction
            conn.commit()
        finally:
            conn.close()
    one = PostgresUpdateStore(pg_dsn, "updates", schema=first)
    two = PostgresUpdateStore(lambda: psycopg2.connect(pg_dsn), "updates", schema=second)  # a factory too
    try:
        assert one.add(1, '{"update_id": 1}', T)
        assert two.add(2, '{"update_id": 2}', T)
        assert [u.update_id for u in one.due(now=T, pending_before=T, limit=5)] == [1]
        assert [u.update_id for u in two.due(now=T, pending_before=T, limit=5)] == [2]
        assert one.hold_liveness() and two.hold_liveness()
    finally:
        one.close()
        two.close()


def test_what_cannot_work_in_a_schema_is_refused(
    pg_dsn: str, schemas: List[str], tmp_path: Any, capsys: Any
) -> None:
    pool = psycopg2.pool.ThreadedConnectionPool(1, 2, pg_dsn)
    try:
        with pytest.raises(UsageError, match="pass a DSN or a connection factory"):
            PostgresUpdateStore(pool, "t", schema=schemas[0])
    finally:
        pool.closeall()
    with pytest.raises(ValueError, match="invalid schema name"):
        PostgresUpdateStore(pg_dsn, "t", schema="bad-schema")
    with pytest.raises(ValueError, match="invalid table name"):
        PostgresUpdateStore(pg_dsn, "a.b")  # the table name's rule: a schema is its own keyword
    with pytest.raises(ValueError, match="invalid table name"):
        postgres_update_store_schema("s.t")
    path = tmp_path / "bot.db"
    SQLiteUpdateStore(str(path)).close()
    code, out, err = run(capsys, "--store", f"sqlite:///{path}", "--table", "s.telegram_updates",
                         "status")
    assert code == 2 and "SQLite has no schemas" in err
    assert postgres_update_store_schema("t", schema="Mixed").startswith(
        'CREATE SCHEMA IF NOT EXISTS "Mixed";\nSET LOCAL search_path TO "Mixed";'
    )
