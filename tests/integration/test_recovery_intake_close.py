"""UpdateIntake's graceful stop: close() ends in bounded time and releases what runs.

Two real intakes share a store (SQLite file, PostgreSQL table) with the default lease (120 s):
the first one's handler never returns by itself; ``close()`` returns within
``stop_timeout_seconds`` plus a margin, the hung attempt is released (its late fenced write is
refused), and the second intake handles it, and the chat's queued updates, within seconds.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from ptb_fence import AttemptFinished, OwnershipLost, PostgresUpdateStore, SQLiteUpdateStore, UpdateIntake

DDL = "CREATE TABLE IF NOT EXISTS {name} (update_id BIGINT NOT NULL, attempt INTEGER NOT NULL, claim_id TEXT NOT NULL)"


# Not conftest's store: two stores on one table plus a domain table and its SQL placeholder.
@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: Any, tmp_path: Any) -> Iterator[Tuple[Any, Any, str, str]]:
    """Two stores on one table, the domain table's name and the placeholder."""
    if request.param == "sqlite":
        path = str(tmp_path / "bot.db")
        first, second = SQLiteUpdateStore(path), SQLiteUpdateStore(path)
        mark = "?"
        domain = "domain"
    else:
        from store_support import fresh_table_name

        dsn = request.getfixturevalue("pg_dsn")
        table = request.getfixturevalue("pg_table")
        domain = fresh_table_name()
        request.getfixturevalue("pg_tables").append(domain)
        first, second = PostgresUpdateStore(dsn, table), PostgresUpdateStore(dsn, table)
        mark = "%s"
    with first.transaction() as conn:
        conn.cursor().execute(DDL.format(name=domain))
    try:
        yield first, second, domain, mark
    finally:
        first.close()
        second.close()


def _body(update_id: int, chat: int, text: str) -> str:
    return json.dumps({"update_id": update_id, "message": {
        "message_id": update_id, "date": 0, "chat": {"id": chat, "type": "private"}, "text": text}})


def test_close_releases_a_hung_attempt_and_the_next_intake_handles_it_at_once(
    stores: Tuple[Any, Any, str, str],
) -> None:
    first_store, second_store, domain, mark = stores
    resume = threading.Event()
    started = threading.Event()
    refused: List[BaseException] = []
    written: Dict[int, List[Tuple[int, str]]] = {}
    lock = threading.Lock()

    def write(attempt: Any, update_id: int) -> None:
        with attempt.transaction(complete=True) as conn:
            conn.cursor().execute(
                f"INSERT INTO {domain} VALUES ({mark}, {mark}, {mark})",  # noqa: S608
                (update_id, attempt.attempt, attempt.claim_id))
        with lock:
            written.setdefault(update_id, []).append((attempt.attempt, attempt.claim_id))

    def hanging(update: Any, attempt: Any) -> None:
        if update["message"]["text"] == "hang":
            started.set()
            resume.wait(30)
            try:
                write(attempt, update["update_id"])
            except (OwnershipLost, AttemptFinished) as exc:
                refused.append(exc)
            return
        write(attempt, update["update_id"])

    def plain(update: Any, attempt: Any) -> None:
        write(attempt, update["update_id"])

    first = UpdateIntake(first_store, handle_attempt=hanging, stop_timeout_seconds=1.0)
    first.start()
    assert first.accept(_body(1, 5, "hang")) == "accepted"
    assert started.wait(10)
    ids = [1] + [10 + i for i in range(5)]
    for update_id in ids[1:]:
        assert first.accept(_body(update_id, 5, f"q{update_id}")) == "accepted"  # queued behind
    began = time.monotonic()
    first.close()
    took = time.monotonic() - began
    assert took < 1.0 + 2.0, took
    second = UpdateIntake(second_store, handle_attempt=plain)
    second.start()
    try:
        deadline = time.monotonic() + 10  # far below the 120 s lease
        while time.monotonic() < deadline and set(written) != set(ids):
            time.sleep(0.02)
        assert set(written) == set(ids), written
        assert second.idle(10)
    finally:
        resume.set()
        second.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not refused:
        time.sleep(0.02)
    assert refused, "the released attempt's late fenced write was not refused"
    assert all(len(v) == 1 for v in written.values()), written
    assert written[1][0][0] == 1  # released: the stopped attempt was not counted as spent
