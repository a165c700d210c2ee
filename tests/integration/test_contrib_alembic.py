"""Alembic's autogenerate, run for real against a database where ptb_fence's stores made their
tables next to the application's: without the hook it proposes to drop them, with
``alembic_include_object`` it proposes nothing (SQLite and PostgreSQL)."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any, Iterator, List, Set, Tuple

import psycopg2
import pytest
import sqlalchemy
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore
from ptb_fence.contrib.sqlalchemy import (
    alembic_include_object,
    include_object,
    ptb_fence_tables,
)


def app_metadata() -> sqlalchemy.MetaData:
    """The application's own models: one table, with an index."""
    metadata = sqlalchemy.MetaData()
    sqlalchemy.Table(
        "orders", metadata,
        sqlalchemy.Column("id", sqlalchemy.Integer, primary_key=True),
        sqlalchemy.Column("chat_id", sqlalchemy.BigInteger, nullable=False, index=True),
    )
    return metadata


def proposals(engine: Any, metadata: sqlalchemy.MetaData, hook: Any = None) -> List[Tuple[Any, ...]]:
    opts = {} if hook is None else {"include_object": hook}
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts=opts)
        return list(compare_metadata(context, metadata))


def dropped_tables(diff: List[Any]) -> Set[str]:
    return {entry[1].name for entry in diff if isinstance(entry, tuple) and entry[0] == "remove_table"}


@contextlib.contextmanager
def sqlite_database(tmp_path: Any) -> Iterator[Any]:
    path = tmp_path / "bot.db"
    SQLiteUpdateStore(str(path)).close()
    SQLiteUpdateStore(str(path), "second_bot").close()
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    try:
        yield engine
    finally:
        engine.dispose()


@contextlib.contextmanager
def postgres_database(dsn: str) -> Iterator[Any]:
    """The stores' tables and the application's in a schema of their own (so that other
    tests' tables stay out of the comparison)."""
    schema = "s_alembic_" + uuid.uuid4().hex[:10]
    admin = psycopg2.connect(dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE SCHEMA "{schema}"')
    options = f"options=-csearch_path%3D{schema}"
    scoped = dsn + ("&" if "?" in dsn else "?") + options
    engine = sqlalchemy.create_engine(
        scoped.replace("postgresql://", "postgresql+psycopg2://", 1)
    )
    try:
        for table in ("telegram_updates", "second_bot"):
            store = PostgresUpdateStore(scoped, table)
            try:
                assert store.add(1, '{"update_id": 1}', 1)  # the schema is made at first use
            finally:
                store.close()
        yield engine
    finally:
        engine.dispose()
        with admin.cursor() as cur:
            cur.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    if request.param == "sqlite":
        with sqlite_database(tmp_path) as found:
            yield found
    else:
        with postgres_database(request.getfixturevalue("pg_dsn")) as found:
            yield found


def test_autogenerate_would_drop_the_stores_tables_without_the_hook(engine: Any) -> None:
    metadata = app_metadata()
    metadata.create_all(engine)
    dropped = dropped_tables(proposals(engine, metadata))
    # every table the stores made (ptb_fence_meta and ptb_fence_instances only once used)
    assert {"telegram_updates", "telegram_updates_outbox", "second_bot"} <= dropped, dropped
    assert dropped <= ptb_fence_tables("telegram_updates", "second_bot"), dropped


def test_autogenerate_proposes_nothing_with_the_hook(engine: Any) -> None:
    metadata = app_metadata()
    metadata.create_all(engine)
    hook = alembic_include_object("telegram_updates", "second_bot")
    assert proposals(engine, metadata, hook) == []
    # the ready-made hook covers the default table only: the second bot's would be dropped
    assert dropped_tables(proposals(engine, metadata, include_object)) == {
        "second_bot", "second_bot_outbox", "second_bot_persistence", "second_bot_steps",
        "second_bot_jobs", "second_bot_pace", "second_bot_broadcasts", "second_bot_recipients",
    }


def test_the_applications_own_changes_are_still_proposed(engine: Any) -> None:
    metadata = app_metadata()
    metadata.create_all(engine)
    sqlalchemy.Table("invoices", metadata,
                     sqlalchemy.Column("id", sqlalchemy.Integer, primary_key=True))
    asked: List[str] = []

    def mine(obj: Any, name: Any, type_: str, reflected: bool, compare_to: Any) -> bool:
        asked.append(str(name))
        return True

    diff = proposals(engine, metadata, alembic_include_object("telegram_updates", "second_bot",
                                                               chain=mine))
    assert [(entry[0], entry[1].name) for entry in diff] == [("add_table", "invoices")]
    assert "orders" in asked and "telegram_updates" not in asked


def test_bad_table_names_are_refused() -> None:
    with pytest.raises(ValueError, match="invalid table name"):
        alembic_include_object("bad-name")
