"""``ptb-fence migrate`` run as a real process (``python -m ptb_fence``) on a PostgreSQL update
table of an existing deployment, made before the outbox: it adds the outbox table (and says so),
keeps the rows, and a second run changes nothing; a store managed with ``create_table=False``
then sends through the outbox. ``ptb-fence schema`` prints the outbox table too."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Iterator, Tuple

import psycopg2
import pytest

from ptb_fence import AttemptEffects, Batch, Completed, OutboxCall, PostgresUpdateStore
from ptb_fence.stores._outbox_sql import outbox_table_name

T = 1_700_000_000_000


def cli(*argv: str) -> Tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PTB_FENCE_STORE", "PTB_FENCE_TABLE")}
    done = subprocess.run([sys.executable, "-m", "ptb_fence", *argv], capture_output=True,
                          text=True, env=env, timeout=120)
    return done.returncode, done.stdout, done.stderr


def exists(dsn: str, table: str) -> bool:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{table}"',))
            return bool(cur.fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def deployment(pg_dsn: str, pg_tables: "list[str]") -> Iterator[str]:
    """An update table with rows, as a deployment from before the outbox has it."""
    table = "t_mig_" + uuid.uuid4().hex[:12]
    pg_tables.append(table)
    store = PostgresUpdateStore(pg_dsn, table=table)
    try:
        for update_id in (1, 2):
            assert store.add(update_id, '{"update_id": %d}' % update_id, T)
    finally:
        store.close()
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE "{outbox_table_name(table)}"')
        conn.commit()
    finally:
        conn.close()
    assert not exists(pg_dsn, outbox_table_name(table))
    yield table


def test_migrate_adds_the_outbox_to_an_existing_table_once(pg_dsn: str, deployment: str) -> None:
    outbox = outbox_table_name(deployment)
    code, out, err = cli("--store", pg_dsn, "--table", deployment, "migrate")
    assert code == 0, err
    assert f"created the outbox table {outbox!r}" in out and "created the table" not in out
    assert exists(pg_dsn, outbox)
    code, out, err = cli("--store", pg_dsn, "--table", deployment, "migrate")
    assert code == 0 and "is up to date; nothing changed" in out, (out, err)

    store = PostgresUpdateStore(pg_dsn, table=deployment, create_table=False)
    try:
        assert [u.update_id for u in store.due(now=T, pending_before=T, limit=10)] == [1, 2]
        identity = store.claim_owned(1, now=T, lease_until=T + 60_000, max_attempts=3)
        assert identity is not None
        call = OutboxCall("sendMessage", '{"chat_id": 5, "text": "hi"}', 5, 0)
        assert store.commit(Batch(
            settlements=((identity, Completed(T + 1)),), effects={identity: AttemptEffects((call,))}
        )).landed == (True,)
        [entry] = store.claim_calls(now=T + 1, lease_until=T + 100, limit=5, sender="s")
        assert (entry.method, entry.chat_key, entry.tries) == ("sendMessage", 5, 1)
    finally:
        store.close()


def test_schema_prints_the_outbox_table(pg_dsn: str) -> None:
    code, out, _ = cli("--table", "bot_updates", "schema")
    assert code == 0
    assert 'CREATE TABLE IF NOT EXISTS "bot_updates_outbox"' in out
    assert "(chat_key, call_id) WHERE state IN ('pending', 'sending')" in out
