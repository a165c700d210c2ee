"""``import ptb_fence`` does not import psycopg2 until a PostgreSQL store is created."""

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.strip()


def test_import_ptb_fence_does_not_import_psycopg2() -> None:
    assert _run("import ptb_fence, sys; print('psycopg2' in sys.modules)") == "False"


def test_schema_sql_does_not_import_psycopg2() -> None:
    code = (
        "import ptb_fence, sys; sql = ptb_fence.postgres_update_store_schema('t_lazy'); "
        "print('CREATE TABLE' in sql, 'psycopg2' in sys.modules)"
    )
    assert _run(code) == "True False"


def test_creating_a_postgres_store_imports_psycopg2(pg_dsn: str) -> None:
    code = (
        "import ptb_fence, sys; "
        f"store = ptb_fence.PostgresUpdateStore({pg_dsn!r}, table='t_lazy_store', "
        "create_table=False); print('psycopg2' in sys.modules); store.close()"
    )
    assert _run(code) == "True"
