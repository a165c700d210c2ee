"""The code the how-to guides include (``examples/howto/``) runs and does what the pages say.

Each Python snippet runs against a real store (SQLite, or PostgreSQL where the page is about
it). Each shell snippet runs line by line with the installed ``ptb-fence`` script.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import pickle
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore, UpdateIntake
from ptb_fence.testing import FakeBotApi

pytestmark = pytest.mark.timeout(150)

ROOT = Path(__file__).resolve().parents[2]
HOWTO = ROOT / "examples" / "howto"


def snippet(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"howto_{name}", HOWTO / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def until(what: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def update_body(update_id: int, text: str = "hi") -> str:
    return json.dumps({"update_id": update_id, "message": {
        "message_id": update_id, "date": 1_700_000_000, "text": text,
        "chat": {"id": 5, "type": "private"}, "from": {"id": 5, "is_bot": False,
                                                       "first_name": "A"}}})


def ptb_fence_script() -> str:
    script = Path(sys.executable).with_name("ptb-fence")
    found = str(script) if script.exists() else shutil.which("ptb-fence")
    assert found, "the ptb-fence script is not installed"
    return found


def run_shell(path: Path, cwd: Path, env: Dict[str, str]) -> List[subprocess.CompletedProcess]:
    """Each command line of ``path`` in order, ``ptb-fence`` being the installed script."""
    results = []
    for line in path.read_text().splitlines():
        command = line.split("#", 1)[0].strip()
        if not command:
            continue
        if command.startswith("export "):
            key, _, value = command[len("export "):].partition("=")
            env.setdefault(key, value)  # the test's own store wins
            continue
        command = command.replace("ptb-fence ", f"{ptb_fence_script()} ")
        results.append(subprocess.run(["/bin/sh", "-c", command], cwd=cwd, env=env,
                                      capture_output=True, text=True, timeout=60))
    return results


# -- SQLAlchemy ---------------------------------------------------------------------------------
def test_sqlalchemy_async_recipe_commits_the_row_and_the_completion_together(
    pg_dsn: str, pg_tables: List[str], intakes: List[UpdateIntake]
) -> None:
    pytest.importorskip("sqlalchemy.ext.asyncio")
    from sqlalchemy.ext.asyncio import create_async_engine

    table, bookings = "t_" + uuid.uuid4().hex[:16], "b_" + uuid.uuid4().hex[:12]
    pg_tables += [table, bookings]

    class Base(DeclarativeBase):
        pass

    class Booking(Base):
        __tablename__ = bookings
        update_id: Mapped[int] = mapped_column(primary_key=True)

    url = pg_dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    sync_engine = sa.create_engine(url)
    Base.metadata.create_all(sync_engine)
    book = snippet("sqlalchemy_async").book
    store = PostgresUpdateStore(pg_dsn, table)

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        async def handler() -> None:
            engine = create_async_engine(url)
            try:
                await book(engine, attempt, Booking(update_id=update["update_id"]))
            finally:
                await engine.dispose()

        asyncio.run(handler())

    intake = UpdateIntake(store, handle_attempt=handle_attempt)
    intakes.append(intake)
    intake.start()
    try:
        intake.accept(update_body(7))
        with psycopg.connect(pg_dsn) as check:
            until(lambda: check.execute(f"SELECT state FROM {table}").fetchall()
                  == [("completed",)])
            assert check.execute(f"SELECT update_id FROM {bookings}").fetchall() == [(7,)]
    finally:
        intake.close()
        store.close()
        sync_engine.dispose()


def test_sqlalchemy_pool_store_borrows_the_engine(pg_dsn: str) -> None:
    # The snippet uses the default table name: in a schema of its own, so that no other
    # test's table is touched (the engine's connections get it as their search_path).
    schema = "s_howto_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    scoped = pg_dsn + ("&" if "?" in pg_dsn else "?") + f"options=-csearch_path%3D{schema}"
    try:
        url = scoped.replace("postgresql://", "postgresql+psycopg2://", 1)
        store = snippet("sqlalchemy_pool").open_store(url)
        try:
            assert store.add(1, update_body(1), 1) is True
            assert store.add(1, update_body(1), 1) is False  # a redelivery: not recorded again
        finally:
            store.close()
        with psycopg.connect(pg_dsn) as check:
            assert check.execute(f'SELECT update_id FROM "{schema}".telegram_updates'
                                 ).fetchall() == [(1,)]
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


# -- psycopg 3 ----------------------------------------------------------------------------------
def test_psycopg3_recipe_commits_the_note_and_the_completion_together(
    pg_dsn: str, pg_tables: List[str], intakes: List[UpdateIntake]
) -> None:
    table = "t_" + uuid.uuid4().hex[:16]
    pg_tables.append(table)
    schema = "s_howto_" + uuid.uuid4().hex[:10]  # the snippet's "notes", apart from others'
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".notes (update_id BIGINT PRIMARY KEY, text TEXT)')
    conninfo = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}options=-csearch_path%3D{schema},public"
    save_note = snippet("psycopg3_write").save_note
    store = PostgresUpdateStore(pg_dsn, table)
    intake = UpdateIntake(
        store, handle_attempt=lambda update, attempt: asyncio.run(
            save_note(attempt, conninfo, "buy milk")))
    intakes.append(intake)
    intake.start()
    try:
        intake.accept(update_body(8))
        with psycopg.connect(pg_dsn) as check:
            until(lambda: check.execute(f"SELECT state FROM {table}").fetchall()
                  == [("completed",)])
            assert check.execute(f'SELECT * FROM "{schema}".notes').fetchall() == [
                (8, "buy milk")]
    finally:
        intake.close()
        store.close()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


# -- Alembic --------------------------------------------------------------------------------
def test_alembic_hook_leaves_the_stores_tables_out(tmp_path: Path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    path = tmp_path / "bot.db"
    SQLiteUpdateStore(str(path)).close()
    metadata = sa.MetaData()
    sa.Table("orders", metadata, sa.Column("id", sa.Integer, primary_key=True))
    engine = sa.create_engine(f"sqlite:///{path}")
    hook = snippet("alembic_hook")

    class Context:  # what alembic's env.py context receives, recorded
        options: Dict[str, Any] = {}

        def configure(self, **options: Any) -> None:
            self.options = options

    try:
        with engine.connect() as conn:
            recorded = Context()
            hook.configure(recorded, conn, metadata)
            assert recorded.options["include_object"] is hook.include_object
            without = compare_metadata(MigrationContext.configure(conn), metadata)
            with_hook = compare_metadata(MigrationContext.configure(
                conn, opts={"include_object": recorded.options["include_object"]}), metadata)
    finally:
        engine.dispose()
    assert any(op[0] == "remove_table" and op[1].name == "telegram_updates" for op in without
               if isinstance(op, tuple))
    assert [op[0] for op in with_hook if isinstance(op, tuple)] == ["add_table"]


# -- your own web framework -------------------------------------------------------------------
def test_webhook_endpoint_records_before_it_answers_200(tmp_path: Path) -> None:
    from telegram.ext import Application, ContextTypes

    from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor

    on_webhook = snippet("webhook_endpoint").on_webhook
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    processor = FencedUpdateProcessor(store, handle_exhaustion=print)

    async def run() -> List[int]:
        with FakeBotApi() as telegram:
            builder = (Application.builder().token(telegram.token).base_url(telegram.base_url)
                       .context_types(ContextTypes(context=FencedCallbackContext)))
            app = processor.install(builder).build()
            async with app:
                await app.start()
                body = json.loads(update_body(9001))
                answers = [await on_webhook(app, "s3cret", "wrong", body),
                           await on_webhook(app, "s3cret", "s3cret", body)]
                with sqlite3.connect(tmp_path / "bot.db") as db:  # committed when 200 came
                    rows = db.execute("SELECT update_id FROM telegram_updates").fetchall()
                answers += [row[0] for row in rows]
                await app.stop()
            return answers

    try:
        answers = asyncio.run(run())
    finally:
        store.close()
    assert answers == [403, 200, 9001]


# -- monitoring ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_prometheus_snippet_serves_the_processors_metrics(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    port = free_port()
    script = ("import runpy, time; "
              "from ptb_fence import SQLiteUpdateStore; "
              "from ptb_fence.ptb import FencedUpdateProcessor; "
              f"expose = runpy.run_path({str(HOWTO / 'prometheus_metrics.py')!r})['expose']; "
              f"store = SQLiteUpdateStore({str(tmp_path / 'bot.db')!r}); "
              "processor = FencedUpdateProcessor(store, handle_exhaustion=print); "
              f"expose(processor, {port}); print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert 'ptb_fence_attempts_started_total{bot="shop"} 0.0' in text


def test_probes_snippet_listens_where_the_kubernetes_manifest_probes() -> None:
    from ptb_fence import MemoryUpdateStore

    processor = snippet("probes").make_processor(MemoryUpdateStore())
    manifest = (HOWTO / "kubernetes-probes.yaml").read_text()
    assert "containerPort: 9102" in manifest
    source = (HOWTO / "probes.py").read_text()
    assert 'probe_port=9102, probe_host="0.0.0.0"' in source
    assert processor is not None


def test_monitoring_kit_snippet_prints_the_shipped_files() -> None:
    result = subprocess.run([sys.executable, str(HOWTO / "monitoring_kit.py")],
                            capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert Path(lines["alert rules"]).name == "alerts.yml" and Path(lines["alert rules"]).is_file()
    assert Path(lines["dashboard"]).name == "grafana.json" and Path(lines["dashboard"]).is_file()


def test_health_service_runs_ptb_fence_health(tmp_path: Path) -> None:
    unit = (HOWTO / "ptb-fence-health.service").read_text()
    (command,) = [line.split("=", 1)[1] for line in unit.splitlines()
                  if line.startswith("ExecStart=")]
    assert command == "/usr/bin/ptb-fence health"
    SQLiteUpdateStore(str(tmp_path / "bot.db")).close()
    env = dict(os.environ, PTB_FENCE_STORE=f"sqlite:///{tmp_path / 'bot.db'}")
    healthy = subprocess.run([ptb_fence_script(), "health"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    env["PTB_FENCE_STORE"] = f"sqlite:///{tmp_path / 'missing.db'}"
    unhealthy = subprocess.run([ptb_fence_script(), "health"], env=env, capture_output=True,
                               text=True, timeout=60)
    assert unhealthy.returncode == 1, unhealthy.stdout + unhealthy.stderr


# -- shell recipes ------------------------------------------------------------------------------
def test_migrate_picklepersistence_commands_move_the_state(tmp_path: Path) -> None:
    from telegram.ext import PicklePersistence

    async def make_pickle() -> None:
        persistence = PicklePersistence(str(tmp_path / "bot.pickle"))
        # what Application.initialize() reads first, as a running bot did
        await persistence.get_user_data()
        await persistence.get_chat_data()
        await persistence.get_bot_data()
        await persistence.get_conversations("booking")
        await persistence.update_user_data(42, {"slot": "10:00"})
        await persistence.update_conversation("booking", (42, 42), 1)
        await persistence.flush()

    asyncio.run(make_pickle())
    SQLiteUpdateStore(str(tmp_path / "bot.sqlite3")).close()
    results = run_shell(HOWTO / "migrate_picklepersistence.sh", tmp_path, dict(os.environ))
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    assert "10:00" in results[1].stdout, results[1].stdout
    with open(tmp_path / "out.pickle", "rb") as exported:
        data = pickle.load(exported)
    assert data["user_data"][42] == {"slot": "10:00"}
    assert data["conversations"]["booking"][(42, 42)] == 1


def test_upgrade_schema_commands_migrate_then_pass_the_check(
    pg_dsn: str, pg_table: str, tmp_path: Path
) -> None:
    env = dict(os.environ, PTB_FENCE_STORE=pg_dsn)
    script = HOWTO / "upgrade_schema.sh"
    local = tmp_path / "upgrade.sh"  # the same commands, on this test's own table
    local.write_text(script.read_text().replace("ptb-fence ", f"ptb-fence --table {pg_table} "))
    results = run_shell(local, tmp_path, env)
    assert [r.returncode for r in results] == [0, 0], [r.stdout + r.stderr for r in results]
    check = subprocess.run([ptb_fence_script(), "--table", pg_table, "migrate", "--check"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "CREATE TABLE" in (tmp_path / "schema.sql").read_text()


def test_bad_day_commands_run_against_a_store_with_a_failed_update(tmp_path: Path) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.sqlite3"))
    intake = UpdateIntake(store, handle=lambda update: 1 / 0,
                          retry=lambda error, attempt: 3600)  # failed, its retry an hour away
    intake.start()
    try:
        intake.accept(update_body(3))
        until(lambda: intake.stats().attempts_ended["failed"] == 1)
    finally:
        intake.close()
        store.close()
    results = run_shell(HOWTO / "bad_day.sh", tmp_path, dict(os.environ))
    assert [r.returncode for r in results] == [0] * 8, [r.stdout + r.stderr for r in results]
    assert "ZeroDivisionError" in results[1].stdout, results[1].stdout  # list --state failed


def test_the_python_snippets_are_mypy_strict_clean(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir",
         str(tmp_path / ".mypy"), *sorted(str(path) for path in HOWTO.glob("*.py"))],
        cwd=ROOT, env=dict(os.environ, MYPYPATH=str(ROOT)),
        capture_output=True, text=True, timeout=170,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_payment_step_charges_once_and_the_retry_replies_with_the_recorded_charge() -> None:
    """examples/howto/payment_step.py prints payment_step.out, which the page includes."""
    result = subprocess.run([sys.executable, str(HOWTO / "payment_step.py")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (HOWTO / "payment_step.out").read_text(), result.stderr
    assert "a crash after the charge" in result.stderr  # the first attempt did fail


def test_durable_reminder_is_sent_by_the_application_after_the_restart() -> None:
    """examples/howto/durable_reminder.py prints durable_reminder.out, which the page
    includes."""
    result = subprocess.run([sys.executable, str(HOWTO / "durable_reminder.py")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (HOWTO / "durable_reminder.out").read_text(), result.stderr


def test_broadcast_sends_each_user_once_across_a_restart() -> None:
    """examples/howto/broadcast.py prints broadcast.out, which the page includes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(HOWTO / "broadcast.py")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (HOWTO / "broadcast.out").read_text(), result.stderr


def test_a_broadcast_from_a_handler_starts_once_across_a_failed_try() -> None:
    """examples/howto/broadcast_from_handler.py prints broadcast_from_handler.out, which the
    page includes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(HOWTO / "broadcast_from_handler.py")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (HOWTO / "broadcast_from_handler.out").read_text(), result.stderr
