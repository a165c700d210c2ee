"""``ptb-fence persistence import/export`` of a 200,000-user PicklePersistence file (written by
python-telegram-bot's own PicklePersistence) into the real PostgreSQL server, run as a real
process (``python -m ptb_fence``) on a stock server (default ``max_locks_per_transaction``).

An import in one transaction held one advisory lock per key until its commit: beyond about
12,000 keys the server's lock table was full ("out of shared memory"), the import failed and
every other session taking a lock meanwhile failed the same way. Here the import must land
every user, say its progress on stderr, hold a bounded number of locks at any moment, and leave
another session free to take a few thousand advisory locks all along; the export must give
every user back in PTB's format.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import psycopg2
import pytest
from telegram.ext import PicklePersistence

from ptb_fence.cli._persistence import BATCH
from ptb_fence.stores._state_sql import state_table_name

USERS = 200_000
OTHER_LOCKS = 2_000  # a bot's busy transaction takes a few; this is far more


def write_users(path: Path) -> None:
    """The file as PTB writes it (``on_flush``: one dump at the end, not one per update)."""

    async def write() -> None:
        persistence = PicklePersistence(filepath=path, on_flush=True)
        await persistence.get_user_data()
        for user in range(1, USERS + 1):
            await persistence.update_user_data(user, {"n": user, "name": f"user {user}"})
        await persistence.flush()

    asyncio.run(write())


def cli(*argv: str, app: str) -> "subprocess.Popen[str]":
    """``python -m ptb_fence ARGV`` whose connections are named ``app`` (``PGAPPNAME``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PTB_FENCE_STORE", "PTB_FENCE_TABLE")}
    env["PGAPPNAME"] = app
    return subprocess.Popen([sys.executable, "-m", "ptb_fence", *argv], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def watch(dsn: str, process: "subprocess.Popen[str]", app: str) -> Tuple[int, List[str]]:
    """While ``process`` runs: the most advisory locks its connections held at once, and the
    errors another session met taking :data:`OTHER_LOCKS` advisory locks in a transaction,
    again and again."""
    conn = psycopg2.connect(dsn)
    most, errors = 0, []
    try:
        while process.poll() is None:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT count(*) FROM pg_locks AS l JOIN pg_stat_activity AS a "
                    "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND a.application_name = %s",
                    (app,),
                )
                most = max(most, int(cur.fetchone()[0]))
                try:
                    cur.execute("SELECT count(pg_advisory_xact_lock(7, k)) "
                                "FROM generate_series(1, %s) AS k", (OTHER_LOCKS,))
                except psycopg2.Error as exc:
                    errors.append(f"{type(exc).__name__}: {exc}".strip())
            conn.rollback()
            time.sleep(0.05)
    finally:
        conn.close()
    return most, errors


@pytest.mark.timeout(300)
def test_a_200000_user_file_imports_and_exports_with_bounded_locks(
    pg_dsn: str, pg_table: str, tmp_path: Path
) -> None:
    from ptb_fence import PostgresUpdateStore

    store = PostgresUpdateStore(pg_dsn, table=pg_table)
    store.due(now=0, pending_before=0, limit=1)  # creates the tables
    store.close()
    source = tmp_path / "users.pickle"
    write_users(source)
    common = ("--store", pg_dsn, "--table", pg_table)

    app = f"import-{pg_table}"
    started = time.monotonic()
    process = cli("persistence", "import", str(source), *common, app=app)
    most, errors = watch(pg_dsn, process, app)
    out, err = process.communicate(timeout=60)
    took = time.monotonic() - started
    assert process.returncode == 0, err
    assert f"imported {USERS} state row(s)" in out and f"{USERS} user" in out
    assert f"imported [{'#' * 24}] {USERS:,}/{USERS:,} state row(s)" in err
    assert errors == [], errors[:3]
    assert 0 < most <= BATCH, most
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'SELECT count(*), min(version), max(version) '  # noqa: S608
                        f'FROM "{state_table_name(pg_table)}" WHERE kind = %s', ("user",))
            assert cur.fetchone() == (USERS, 1, 1)
    finally:
        conn.close()
    print(f"import: {took:.1f} s, at most {most} advisory locks held at once")

    # again (an import that stopped, run once more): nothing to write, nothing refused
    process = cli("persistence", "import", str(source), *common, app=app)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err

    exported = tmp_path / "out.pickle"
    process = cli("persistence", "export", str(exported), *common, app=app)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert f"exported {USERS} state row(s)" in out and f"exported {USERS:,} state row(s)" in err

    async def read_back() -> Dict[int, Any]:
        return dict(await PicklePersistence(filepath=exported).get_user_data())

    users = asyncio.run(read_back())
    assert len(users) == USERS
    assert users[1] == {"n": 1, "name": "user 1"}
    assert users[USERS] == {"n": USERS, "name": f"user {USERS}"}
