"""``strict_chat_order`` across two processes sharing one store (two processes on one
SQLite file, two on PostgreSQL).

20 chats x 15 updates are recorded pending (interleaved ids, as Telegram numbers them); two bot
processes (``tests/processes/chat_order_worker.py``, UpdateIntake) start together, both sweeping and
handling, and log every handler run as an interval. Per chat the intervals never overlap and their
update ids strictly increase; every update is handled exactly once; both processes handled some.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_order_worker.py")
CHATS = 20
PER_CHAT = 15

pytestmark = pytest.mark.timeout(90)


def body(update_id: int, chat: int) -> str:
    return json.dumps(
        {
            "update_id": update_id,
            "message": {
                "message_id": update_id,
                "date": 0,
                "chat": {"id": chat, "type": "private"},
                "text": f"u{update_id}",
            },
        }
    )


def record_pending(store: Any) -> Dict[int, int]:
    """CHATS x PER_CHAT pending rows, ids interleaved across chats; ``{update_id: chat}``."""
    chats = {1000 + n: 500 + n % CHATS for n in range(CHATS * PER_CHAT)}
    old = int(time.time() * 1000) - 60_000
    rows = [(u, body(u, chat), old, chat) for u, chat in chats.items()]
    assert all(store.add_many_in_chats(rows))
    return chats


def expect(proc: "subprocess.Popen[bytes]", *markers: bytes) -> None:
    """Read ``proc``'s output up to each of ``markers`` in turn (whole lines); lines between
    them (log records on the merged stderr) are skipped; the end of the output fails."""
    assert proc.stdout is not None
    seen: List[bytes] = []
    for marker in markers:
        while True:
            line = proc.stdout.readline()
            assert line, f"the output ended before {marker!r}: {seen}"
            seen.append(line)
            if line.strip() == marker:
                break


def run_workers(kind: str, target: str, table: str, log: str, go: str, *extra: str) -> List[str]:
    """Two worker processes, started together once both are built; their outputs."""
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, kind, target, table, log, "--go", go, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(2)
    ]
    try:
        for proc in procs:
            expect(proc, b"ready")
        Path(go).touch()
        outputs = [proc.communicate(timeout=70)[0].decode(errors="replace") for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, out in zip(procs, outputs):
        assert proc.returncode == 0, out
    return outputs


def record_without_chat_keys(kind: str, target: str, table: str, log: str, tmp_path: Path) -> Dict[int, int]:
    """A process without strict_chat_order records CHATS x PER_CHAT updates (ids interleaved
    across chats) through ``UpdateIntake.accept``, claims the first of some chats (its handlers
    block) and is killed (SIGKILL); ``{update_id: chat}``."""
    chats = {1000 + n: 500 + n % CHATS for n in range(CHATS * PER_CHAT)}
    bodies = tmp_path / "bodies.json"
    bodies.write_text(json.dumps([body(u, chat) for u, chat in chats.items()]))
    proc = subprocess.Popen(
        [sys.executable, WORKER, kind, target, table, log, "--lax", "--block", "--accept", str(bodies)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        expect(proc, b"ready", b"recorded")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return chats


def switch_to_strict(kind: str, target: str, table: str, log: str, tmp_path: Path) -> List[str]:
    """The lax process's backlog, then two strict processes handling it."""
    chats = record_without_chat_keys(kind, target, table, log, tmp_path)
    # handlers long enough for the two processes to overlap on one chat if they could
    outputs = run_workers(kind, target, table, log, str(tmp_path / "go"), "--hold", "0.02")
    return [json.dumps(chats), *outputs]


def switch_while_a_lax_process_runs(
    kind: str, target: str, table: str, log: str, tmp_path: Path
) -> Tuple[Dict[int, int], List[str]]:
    """A rolling switch: two processes with strict_chat_order run already (nothing to key when
    they start), then a process still without the option records CHATS x PER_CHAT updates
    (ids interleaved across chats) through ``UpdateIntake.accept``, claims the first of some
    chats (its handlers block) and is killed (SIGKILL). The strict processes handle all of
    it. Returns ``{update_id: chat}`` and the strict processes' outputs."""
    chats = {1000 + n: 500 + n % CHATS for n in range(CHATS * PER_CHAT)}
    bodies = tmp_path / "bodies.json"
    bodies.write_text(json.dumps([body(u, chat) for u, chat in chats.items()]))
    strict = [
        subprocess.Popen(
            [sys.executable, WORKER, kind, target, table, log, "--hold", "0.02",
             "--until", str(len(chats))],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(2)
    ]
    lax = None
    try:
        for proc in strict:
            expect(proc, b"ready", b"started")
        lax = subprocess.Popen(
            [sys.executable, WORKER, kind, target, table, log, "--lax", "--block", "--accept",
             str(bodies)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        expect(lax, b"ready", b"recorded")
        lax.kill()
        lax.wait(timeout=30)
        outputs = [proc.communicate(timeout=70)[0].decode(errors="replace") for proc in strict]
    finally:
        for proc in strict + ([lax] if lax is not None else []):
            if proc.poll() is None:
                proc.kill()
    for proc, out in zip(strict, outputs):
        assert proc.returncode == 0, out
    return chats, outputs


def check(intervals: List[Tuple[int, int, int, float, float]], chats: Dict[int, int]) -> None:
    ids = [row[0] for row in intervals]
    assert sorted(ids) == sorted(chats), "every update handled exactly once"
    assert len(set(row[2] for row in intervals)) == 2, "both processes handled updates"
    by_chat: Dict[int, List[Tuple[int, int, int, float, float]]] = {}
    for row in intervals:
        assert chats[row[0]] == row[1]
        by_chat.setdefault(row[1], []).append(row)
    for chat, runs in by_chat.items():
        runs.sort(key=lambda row: row[3])
        order = [row[0] for row in runs]
        assert order == sorted(order), f"chat {chat}: handled out of order {order}"
        for before, after in zip(runs, runs[1:]):
            assert after[3] >= before[4], (
                f"chat {chat}: update {after[0]} (pid {after[2]}) started before update "
                f"{before[0]} (pid {before[2]}) ended"
            )


def sqlite_intervals(log: str) -> List[Any]:
    conn = sqlite3.connect(log)
    try:
        return conn.execute("SELECT * FROM intervals").fetchall()
    finally:
        conn.close()


def test_two_processes_on_one_sqlite_file(tmp_path: Path) -> None:
    target = str(tmp_path / "shared.sqlite3")
    log = str(tmp_path / "log.sqlite3")
    conn = sqlite3.connect(log)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE intervals (update_id, chat, pid, started, ended)")
    conn.commit()
    conn.close()
    with SQLiteUpdateStore(target) as store:
        chats = record_pending(store)
    run_workers("sqlite", target, "telegram_updates", log, str(tmp_path / "go"))
    check(sqlite_intervals(log), chats)


def test_two_processes_on_postgresql(pg_dsn: str, pg_table: str, tmp_path: Path) -> None:
    import psycopg2

    log = pg_table + "_log"
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{log}"')
            cur.execute(
                f'CREATE TABLE "{log}" (update_id BIGINT, chat BIGINT, pid INT, '
                "started DOUBLE PRECISION, ended DOUBLE PRECISION)"
            )
        with PostgresUpdateStore(pg_dsn, table=pg_table) as store:
            chats = record_pending(store)
        run_workers("postgres", pg_dsn, pg_table, log, str(tmp_path / "go"))
        with conn.cursor() as cur:
            cur.execute(f'SELECT * FROM "{log}"')
            intervals = cur.fetchall()
        check(intervals, chats)
    finally:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{log}"')
        conn.close()


def test_a_lax_backlog_is_ordered_after_the_switch_on_sqlite(tmp_path: Path) -> None:
    """A process without strict_chat_order records a backlog (claiming some of it) and dies;
    two processes with strict_chat_order then keep each chat's updates in order, one at a
    time, across both: the rows recorded without a chat key get their chat's key at start."""
    target = str(tmp_path / "shared.sqlite3")
    log = str(tmp_path / "log.sqlite3")
    conn = sqlite3.connect(log)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE intervals (update_id, chat, pid, started, ended)")
    conn.commit()
    conn.close()
    chats_json, *outputs = switch_to_strict("sqlite", target, "telegram_updates", log, tmp_path)
    chats = {int(k): v for k, v in json.loads(chats_json).items()}
    check(sqlite_intervals(log), chats)
    assert "recorded without a chat key" in "".join(outputs), outputs


def test_a_lax_backlog_is_ordered_after_the_switch_on_postgresql(
    pg_dsn: str, pg_table: str, tmp_path: Path
) -> None:
    """As on SQLite, on PostgreSQL."""
    import psycopg2

    log = pg_table + "_log"
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{log}"')
            cur.execute(
                f'CREATE TABLE "{log}" (update_id BIGINT, chat BIGINT, pid INT, '
                "started DOUBLE PRECISION, ended DOUBLE PRECISION)"
            )
        chats_json, *outputs = switch_to_strict("postgres", pg_dsn, pg_table, log, tmp_path)
        chats = {int(k): v for k, v in json.loads(chats_json).items()}
        with conn.cursor() as cur:
            cur.execute(f'SELECT * FROM "{log}"')
            intervals = cur.fetchall()
        check(intervals, chats)
        assert "recorded without a chat key" in "".join(outputs), outputs
    finally:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{log}"')
        conn.close()


def test_updates_a_lax_process_records_after_the_switch_are_ordered_on_sqlite(
    tmp_path: Path,
) -> None:
    """A process without strict_chat_order still runs beside two that have it (a rolling
    switch): what it records has no chat key, and the strict processes key it at their next
    sweep, so each chat's updates still run one at a time in update_id order across both, and
    the strict processes say (WARNING) that a process without the option records into the
    table."""
    target = str(tmp_path / "shared.sqlite3")
    log = str(tmp_path / "log.sqlite3")
    conn = sqlite3.connect(log)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE intervals (update_id, chat, pid, started, ended)")
    conn.commit()
    conn.close()
    chats, outputs = switch_while_a_lax_process_runs(
        "sqlite", target, "telegram_updates", log, tmp_path
    )
    check(sqlite_intervals(log), chats)
    assert "without strict_chat_order records into" in "".join(outputs), outputs


def test_updates_a_lax_process_records_after_the_switch_are_ordered_on_postgresql(
    pg_dsn: str, pg_table: str, tmp_path: Path
) -> None:
    """As on SQLite, on PostgreSQL."""
    import psycopg2

    log = pg_table + "_log"
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{log}"')
            cur.execute(
                f'CREATE TABLE "{log}" (update_id BIGINT, chat BIGINT, pid INT, '
                "started DOUBLE PRECISION, ended DOUBLE PRECISION)"
            )
        chats, outputs = switch_while_a_lax_process_runs(
            "postgres", pg_dsn, pg_table, log, tmp_path
        )
        with conn.cursor() as cur:
            cur.execute(f'SELECT * FROM "{log}"')
            intervals = cur.fetchall()
        check(intervals, chats)
        assert "without strict_chat_order records into" in "".join(outputs), outputs
    finally:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{log}"')
        conn.close()
