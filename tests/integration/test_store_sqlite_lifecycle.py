"""SQLiteUpdateStore lifecycle: closing under load, read-only files and directories."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator, List

import pytest

from ptb_fence import SQLiteUpdateStore

REPO = str(Path(__file__).resolve().parents[2])

# -- closing while other threads are inside statements ---------------------------------------
CLOSE_RACE = r"""
import random, sys, threading, time
sys.path.insert(0, sys.argv[1])
from ptb_fence import Completed, SQLiteUpdateStore
path, rounds, threads = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
unexpected = []

def load(store, seed):
    rng = random.Random(seed)
    update_id = seed * 10**6
    try:
        while True:
            update_id += 1
            store.add(update_id, '{"x": %d}' % update_id, 1)
            identity = store.claim_owned(update_id, now=10, lease_until=10**12, max_attempts=5)
            assert identity is not None, update_id
            store.renew_owned_many([identity], 10**12, 10)
            store.due(now=10, pending_before=10, limit=50)
            with store.transaction() as conn:
                store.owns(identity, 10, connection=conn)
                conn.execute("SELECT count(*) FROM telegram_updates").fetchall()
            store.settle_owned(identity, Completed(at=10))
            if rng.random() < 0.1:
                store.prune(5)
    except RuntimeError as exc:
        if "closed" not in str(exc):
            unexpected.append(repr(exc))
    except BaseException as exc:
        unexpected.append(repr(exc))

for n in range(rounds):
    store = SQLiteUpdateStore(path)
    pool = [threading.Thread(target=load, args=(store, n * 100 + i)) for i in range(threads)]
    for thread in pool:
        thread.start()
    time.sleep(random.uniform(0.0, 0.05))
    store.close()
    for thread in pool:
        thread.join(30)
        assert not thread.is_alive()
    try:
        store.add(1, "{}", 1)
    except RuntimeError as exc:
        assert "closed" in str(exc), exc
    else:
        raise AssertionError("a call after close() did not raise")
if unexpected:
    print("\n".join(unexpected[:5]), file=sys.stderr)
    sys.exit(3)
print("ok", flush=True)
"""


@pytest.mark.timeout(300)
def test_close_under_load_never_crashes_the_process(tmp_path: Path) -> None:
    """close() while many threads run statements: no SIGSEGV, calls after raise."""
    for run in range(3):
        path = str(tmp_path / f"race{run}.sqlite3")
        proc = subprocess.run(
            [sys.executable, "-c", CLOSE_RACE, REPO, path, "15", "6"],
            capture_output=True, text=True, timeout=240,
        )
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
        assert proc.stdout.strip() == "ok"


def test_close_waits_for_a_statement_in_progress_and_refuses_later_calls(
    tmp_path: Path,
) -> None:
    """close() does not close a connection another thread is using; that thread finishes."""
    store = SQLiteUpdateStore(str(tmp_path / "a.sqlite3"))
    inside, release = threading.Event(), threading.Event()
    outcome: List[object] = []

    def holder() -> None:
        try:
            with store.transaction() as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS domain (x INTEGER)")
                inside.set()
                release.wait(10)
                conn.execute("INSERT INTO domain VALUES (1)")
            outcome.append("committed")
        except BaseException as exc:  # pragma: no cover - reported below
            outcome.append(exc)

    thread = threading.Thread(target=holder)
    thread.start()
    assert inside.wait(10)
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.3)
    with pytest.raises(RuntimeError, match="closed"):
        store.add(1, "{}", 1)
    release.set()
    thread.join(10)
    closer.join(10)
    assert not closer.is_alive()
    assert outcome == ["committed"]
    conn = sqlite3.connect(str(tmp_path / "a.sqlite3"))
    try:
        assert conn.execute("SELECT x FROM domain").fetchall() == [(1,)]
    finally:
        conn.close()


# -- read-only files and directories ----------------------------------------------------------
@contextlib.contextmanager
def immutable(path: str) -> Iterator[None]:
    """``chattr +i``: not writable even for root (tests run as root, which ignores modes)."""
    proc = subprocess.run(["chattr", "+i", path], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"chattr +i is not available here ({proc.stderr.strip()}); it is the only "
                    "way to make a file unwritable for root")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", path], check=True)


def test_connection_opened_on_an_unwritable_file_recovers_once_it_is_writable(
    tmp_path: Path,
) -> None:
    """Read-only file: a thread whose connection was opened read-only writes again after the fix."""
    path = str(tmp_path / "ro.sqlite3")
    store = SQLiteUpdateStore(path)
    try:
        assert store.add(1, "{}", 1) is True
        results: List[object] = []
        made_writable = threading.Event()

        def worker() -> None:
            with immutable(path):
                try:
                    results.append(store.add(2, "{}", 1))
                except sqlite3.OperationalError as exc:
                    results.append(str(exc))
            made_writable.set()
            for update_id in (3, 4):
                try:
                    results.append(store.add(update_id, "{}", 1))
                except sqlite3.OperationalError as exc:  # pragma: no cover - the bug
                    results.append(str(exc))

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(30)
        assert made_writable.is_set()
        assert isinstance(results[0], str) and path in results[0], results
        assert "readonly" in results[0] or "read-only" in results[0]
        assert results[1:] == [True, True], results
    finally:
        store.close()


def test_read_only_directory_with_an_existing_database_names_the_path(tmp_path: Path) -> None:
    """Read-only directory: an existing file in a directory where -wal/-shm cannot be created."""
    folder = tmp_path / "ro_dir"
    folder.mkdir()
    path = str(folder / "db.sqlite3")
    SQLiteUpdateStore(path).close()
    for suffix in ("-wal", "-shm"):
        assert not os.path.exists(path + suffix)
    with immutable(str(folder)):
        with pytest.raises(sqlite3.OperationalError) as info:
            SQLiteUpdateStore(path)
    message = str(info.value)
    assert path in message and "writable" in message, message
