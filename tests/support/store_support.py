"""Stores for tests: the PostgreSQL DSN, fresh table names, and an empty store of a kind.

The fixtures built on these live in tests/conftest.py; this module holds what tests and helper
modules import by name (a ``conftest`` module is not importable reliably: every folder's
conftest.py is imported under that one name).
"""

from __future__ import annotations

import os
import uuid
from typing import Any, List

import pytest

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"

STORE_KINDS = ("memory", "sqlite", "postgres")
"""The shipped stores, by the name the ``store_kind`` fixture gives them."""


def postgres_dsn() -> str:
    """The DSN tests use (``PTB_FENCE_POSTGRES_DSN`` or the local default)."""
    return os.environ.get("PTB_FENCE_POSTGRES_DSN", DEFAULT_DSN)


def fresh_table_name() -> str:
    """A unique table name (for tests that make several stores)."""
    return "t_" + uuid.uuid4().hex[:16]


def drop_table(dsn: str, table: str) -> None:
    """Drop ``table`` (and what depends on it) and its outbox, state, steps, jobs, pace,
    broadcasts and recipients tables if they exist."""
    import psycopg2

    from ptb_fence.stores._broadcasts import broadcast_tables
    from ptb_fence.stores._jobs_sql import jobs_table_name
    from ptb_fence.stores._outbox_sql import outbox_table_name
    from ptb_fence.stores._pace import pace_table_name
    from ptb_fence.stores._state_sql import state_table_name
    from ptb_fence.stores._steps_sql import steps_table_name

    conn = psycopg2.connect(dsn)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
            cur.execute(f'DROP TABLE IF EXISTS "{outbox_table_name(table)}"')
            cur.execute(f'DROP TABLE IF EXISTS "{state_table_name(table)}"')
            cur.execute(f'DROP TABLE IF EXISTS "{steps_table_name(table)}"')
            cur.execute(f'DROP TABLE IF EXISTS "{jobs_table_name(table)}"')
            cur.execute(f'DROP TABLE IF EXISTS "{pace_table_name(table)}"')
            names = broadcast_tables(table)
            cur.execute(f'DROP TABLE IF EXISTS "{names["recipients"]}", "{names["broadcasts"]}"')
    finally:
        conn.close()


def new_store(kind: str, request: pytest.FixtureRequest, path: str) -> Any:
    """A fresh empty store of ``kind`` (``memory``, ``sqlite`` at ``path``, or ``postgres`` in a
    fresh table dropped after the test, through the ``pg_dsn``/``pg_tables`` fixtures)."""
    from ptb_fence import MemoryUpdateStore, PostgresUpdateStore, SQLiteUpdateStore

    if kind == "memory":
        return MemoryUpdateStore()
    if kind == "sqlite":
        return SQLiteUpdateStore(path)
    if kind != "postgres":
        raise ValueError(f"unknown store kind {kind!r}; one of {STORE_KINDS}")
    table = fresh_table_name()
    request.getfixturevalue("pg_tables").append(table)
    return PostgresUpdateStore(request.getfixturevalue("pg_dsn"), table=table)


def settle_many(store: Any, items: Any, effects: Any = None) -> List[Any]:
    """The landings of a ``commit`` of ``items`` as settlements with ``effects``, one per item."""
    from ptb_fence import Batch

    return list(store.commit(Batch(settlements=tuple(items), effects=effects)).landed)
