"""Django's own migration commands, run for real in a throwaway project whose database also
holds a ptb_fence store's tables and rows: ``makemigrations --check --dry-run`` finds no
changes, ``migrate`` and ``flush`` leave the tables and their rows alone (SQLite and
PostgreSQL). The tables are no Django models, and Django compares models with migration files,
never with the database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from typing import Any, Dict, Iterator, Tuple

import psycopg2
import pytest

from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore

MODELS = """\
from django.db import models


class Order(models.Model):
    chat_id = models.BigIntegerField(db_index=True)
    text = models.TextField()
"""


def project(root: Any, database: Dict[str, Any]) -> None:
    """A Django project with one app ``shop`` (one model) and the given database."""
    (root / "shop" / "migrations").mkdir(parents=True)
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "migrations" / "__init__.py").write_text("")
    (root / "shop" / "models.py").write_text(MODELS)
    (root / "settings.py").write_text(textwrap.dedent(f"""\
        SECRET_KEY = "throwaway"
        INSTALLED_APPS = ["django.contrib.contenttypes", "shop"]
        DATABASES = {{"default": {json.dumps(database)}}}
        DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
        USE_TZ = True
    """))


def django(root: Any, *argv: str) -> Tuple[int, str]:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="settings", PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-m", "django", *argv], cwd=str(root), env=env,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(params=["sqlite", "postgres"])
def setup(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Tuple[Any, Any]]:
    """(the project root, a function returning the store's rows) with the store's tables
    made (and a row in them) before Django's first migration."""
    root = tmp_path / "proj"
    root.mkdir()
    if request.param == "sqlite":
        path = str(tmp_path / "db.sqlite3")
        store: Any = SQLiteUpdateStore(path)
        project(root, {"ENGINE": "django.db.backends.sqlite3", "NAME": path})
        yield root, store
        store.close()
        return
    dsn = request.getfixturevalue("pg_dsn")
    params = psycopg2.extensions.parse_dsn(dsn)
    schema = "s_django_" + uuid.uuid4().hex[:10]
    admin = psycopg2.connect(dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE SCHEMA "{schema}"')
    store = PostgresUpdateStore(
        dsn + ("&" if "?" in dsn else "?") + f"options=-csearch_path%3D{schema}"
    )
    project(root, {
        "ENGINE": "django.db.backends.postgresql", "NAME": params.get("dbname", "test"),
        "USER": params.get("user", "postgres"), "PASSWORD": params.get("password", ""),
        "HOST": params.get("host", "127.0.0.1"), "PORT": params.get("port", "5432"),
        "OPTIONS": {"options": f"-c search_path={schema}"},
    })
    try:
        yield root, store
    finally:
        store.close()
        with admin.cursor() as cur:
            cur.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()


def test_django_migrations_leave_the_stores_tables_alone(setup: Tuple[Any, Any]) -> None:
    root, store = setup
    code, out = django(root, "makemigrations", "shop")
    assert code == 0 and "0001_initial.py" in out, out
    assert store.add(1, '{"update_id": 1}', 1_000)  # the store makes its tables and a row
    code, out = django(root, "makemigrations", "--check", "--dry-run")
    assert code == 0 and "No changes detected" in out, out
    code, out = django(root, "migrate", "--noinput")
    assert code == 0, out
    code, out = django(root, "flush", "--noinput")
    assert code == 0, out
    code, out = django(root, "makemigrations", "--check", "--dry-run")
    assert code == 0 and "No changes detected" in out, out
    assert [u.update_id for u in store.due(now=2_000, pending_before=2_000, limit=5)] == [1]
