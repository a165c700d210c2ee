"""A store written only to the declared contract runs a real PTB Application end to end.

``examples/custom_store.py``'s ``DictUpdateStore`` has the base, fenced and durable methods and
nothing else (no batch methods, no ``transaction()``, no ``connection=`` on ``settle_owned``).
Handlers of a real PTB ``Application`` (talking HTTP to ``FakeBotApi``) make fenced writes to the
test's own SQLite domain database with ``attempt.transaction(connection=conn, complete=True)``;
one update fails once and is retried, one fails every time and is exhausted.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sqlite3
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from telegram import Update
from telegram.ext import MessageHandler, filters

from store_support import fresh_table_name, new_store
from ptb_fence import Exhaustion, is_durable, is_fenced
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import FAST, build, polling, run, wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_store.py"


def _example_module() -> Any:
    spec = importlib.util.spec_from_file_location("ptb_fence_example_custom_store", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _retry(error: BaseException, attempt: int) -> float:
    return 0.05


def _domain(path: str) -> List[Tuple[int, int, str]]:
    conn = sqlite3.connect(path, timeout=10)
    try:
        return [
            (r[0], r[1], r[2])
            for r in conn.execute("SELECT update_id, attempt, claim_id FROM domain ORDER BY update_id, attempt")
        ]
    finally:
        conn.close()


def test_the_example_store_runs_a_ptb_application_with_fenced_writes(tmp_path: Any) -> None:
    example = _example_module()
    store = example.DictUpdateStore()
    assert is_fenced(store) and is_durable(store)
    for optional in ("commit", "add_many", "transaction"):
        assert not hasattr(store, optional), optional  # only the declared base methods
    domain = str(tmp_path / "domain.db")
    conn = sqlite3.connect(domain)
    conn.execute("CREATE TABLE domain (update_id INTEGER, attempt INTEGER, claim_id TEXT)")
    conn.commit()
    conn.close()
    calls: Dict[int, int] = {}
    errors: List[str] = []
    exhausted: List[Exhaustion] = []

    async def on_message(update: Update, context: Any) -> None:
        attempt = context.require_attempt()
        calls[update.update_id] = calls.get(update.update_id, 0) + 1
        message = update.effective_message
        text = message.text if message is not None else None
        if text == "doomed" or (text == "flaky" and attempt.attempt == 1):
            raise RuntimeError(f"{text}: failing on purpose (attempt {attempt.attempt})")

        def write() -> None:
            connection = sqlite3.connect(domain, timeout=10)
            try:
                with attempt.transaction(connection=connection, complete=True) as tx:
                    tx.execute(
                        "INSERT INTO domain (update_id, attempt, claim_id) VALUES (?, ?, ?)",
                        (update.update_id, attempt.attempt, attempt.claim_id),
                    )
            finally:
                connection.close()

        try:
            await asyncio.to_thread(write)
        except Exception as exc:  # reported below: the assertion names it
            errors.append(f"{type(exc).__name__}: {exc}")
            raise

    async def scenario(fake: FakeBotApi) -> Dict[str, int]:
        processor = FencedUpdateProcessor(
            store, handle_exhaustion=exhausted.append, max_attempts=2, retry=_retry, **FAST
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        ids = {
            text: fake.inject_message(chat_id=chat, text=text)
            for chat, text in ((1, "fine"), (2, "flaky"), (3, "doomed"))
        }
        async with polling(app):
            await wait_for(
                "fine and flaky completed, doomed's exhaustion delivered",
                lambda: errors
                or (
                    len(_domain(domain)) == 2
                    and exhausted
                    and all(store._rows[i].state == "completed" for i in (ids["fine"], ids["flaky"]))
                ),
                timeout=20,
            )
            assert not errors, errors
            await wait_for(
                "the exhaustion acknowledged",
                lambda: store._rows[ids["doomed"]].settled_at is not None,
                timeout=10,
            )
            await asyncio.sleep(0.3)  # nothing more happens: no extra attempts, no redelivery
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake), timeout=60)
    assert not errors, errors
    fine, flaky, doomed = ids["fine"], ids["flaky"], ids["doomed"]
    assert calls == {fine: 1, flaky: 2, doomed: 2}
    written = _domain(domain)
    assert [(u, a) for u, a, _ in written] == [(fine, 1), (flaky, 2)]
    for update_id, attempt_no, claim_id in written:
        row = store._rows[update_id]
        assert (row.state, row.attempts, row.claim_id) == ("completed", attempt_no, claim_id)
    assert [(e.update_id, e.attempt) for e in exhausted] == [(doomed, 2)]
    assert "doomed: failing on purpose (attempt 2)" in (exhausted[0].error or "")
    doomed_row = store._rows[doomed]
    assert doomed_row.state == "abandoned" and doomed_row.settled_at is not None


_BRANCHES = ("select", "ddl", "nothing", "write")


def _run_branch(conn: Any, branch: str, table: str, mark: str, values: Tuple[int, int, str]) -> None:
    """The handler's fenced block: read only, DDL only, nothing at all, or one insert."""
    cur = conn.cursor()
    try:
        if branch == "select":
            cur.execute(f"SELECT count(*) FROM {table}")
            cur.fetchall()
        elif branch == "ddl":
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {table} "
                "(update_id INTEGER, attempt INTEGER, claim_id TEXT)"
            )
        elif branch == "write":
            cur.execute(
                f"INSERT INTO {table} (update_id, attempt, claim_id) VALUES ({mark}, {mark}, {mark})",
                values,
            )
    finally:
        cur.close()


@pytest.mark.parametrize(
    "store_kind, connection_kind",
    [
        ("dict", "sqlite3"),
        ("dict", "psycopg2"),
        ("dict", "psycopg2-autocommit"),
        ("dict", "psycopg2-autocommit-begun"),
        ("dict", "psycopg"),
        ("dict", "psycopg-autocommit"),
        ("sqlite", "sqlite3"),
        ("sqlite", "sqlite3-autocommit"),
        ("sqlite", "own"),
        ("postgres", "psycopg2"),
        ("postgres", "psycopg2-autocommit"),
        ("postgres", "psycopg2-autocommit-begun"),
        ("postgres", "psycopg"),
        ("postgres", "psycopg-autocommit"),
        ("postgres", "own"),
    ],
)
def test_a_fenced_block_that_writes_nothing_completes(
    store_kind: str, connection_kind: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    """A handler whose fenced block only reads, only runs DDL or runs nothing completes on its
    first attempt, like one that writes: whatever the store (one whose ``owns`` ignores the
    caller's connection, SQLite, PostgreSQL) and whatever the connection (the caller's sqlite3
    connection in its default mode or with ``isolation_level=None``, psycopg2 or psycopg 3 with
    or without autocommit — in autocommit mode also with a transaction the caller began —, the
    store's own). A connection in autocommit mode with no transaction open is put in one before
    the ownership check, which on PostgreSQL needs it for its row lock."""
    if store_kind == "dict":
        store: Any = _example_module().DictUpdateStore()
    else:
        store = new_store(store_kind, request, str(tmp_path / "updates.db"))
    postgres = connection_kind.startswith("psycopg") or store_kind == "postgres"
    if postgres:
        import psycopg
        import psycopg2

        dsn = request.getfixturevalue("pg_dsn")
        table = fresh_table_name()
        request.getfixturevalue("pg_tables").append(table)
        mark = "%s"

        def connect() -> Any:
            autocommit = "-autocommit" in connection_kind
            if connection_kind.split("-")[0] == "psycopg":  # psycopg 3
                return psycopg.connect(dsn, autocommit=autocommit)
            conn = psycopg2.connect(dsn)
            conn.autocommit = autocommit
            return conn

        def open_connection() -> Any:
            conn = connect()
            if connection_kind.endswith("-begun"):  # the caller began the transaction itself
                with conn.cursor() as cur:
                    cur.execute("BEGIN")
            return conn

    else:
        path = str(tmp_path / ("updates.db" if store_kind == "sqlite" else "domain.db"))
        table = "domain"
        mark = "?"

        def connect() -> Any:
            if connection_kind == "sqlite3-autocommit":
                return sqlite3.connect(path, timeout=10, isolation_level=None)
            return sqlite3.connect(path, timeout=10)  # the default (deferred, legacy) mode

        open_connection = connect

    setup = connect()
    _run_branch(setup, "ddl", table, mark, (0, 0, ""))
    setup.commit()
    setup.close()
    calls: Dict[int, int] = {}
    errors: List[str] = []
    completed: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        attempt = context.require_attempt()
        calls[update.update_id] = calls.get(update.update_id, 0) + 1
        branch = update.effective_message.text
        values = (update.update_id, attempt.attempt, attempt.claim_id)
        try:
            if connection_kind == "own":
                await attempt.run_in_transaction(
                    lambda conn: _run_branch(conn, branch, table, mark, values), complete=True
                )
                return

            def write() -> None:
                connection = open_connection()
                try:
                    with attempt.transaction(connection=connection, complete=True) as tx:
                        _run_branch(tx, branch, table, mark, values)
                finally:
                    connection.close()

            await asyncio.to_thread(write)
        except Exception as exc:  # reported below: the assertion names it
            errors.append(f"{branch}: {type(exc).__name__}: {exc}")
            raise
        finally:
            if attempt.completed:
                completed.append(update.update_id)

    async def scenario(fake: FakeBotApi) -> Dict[str, int]:
        processor = FencedUpdateProcessor(store, max_attempts=2, retry=_retry, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        ids = {branch: fake.inject_message(chat_id=n, text=branch) for n, branch in enumerate(_BRANCHES, 1)}
        async with polling(app):
            await wait_for(
                "every branch completed",
                lambda: errors or sorted(completed) == sorted(ids.values()),
                timeout=30,
            )
        return ids

    with FakeBotApi() as fake:
        ids = run(scenario(fake), timeout=60)
    store.close()
    assert not errors, errors
    assert calls == {update_id: 1 for update_id in ids.values()}
    check = connect()
    try:
        cur = check.cursor()
        cur.execute(f"SELECT update_id, attempt FROM {table}")
        assert cur.fetchall() == [(ids["write"], 1)]
    finally:
        check.close()
