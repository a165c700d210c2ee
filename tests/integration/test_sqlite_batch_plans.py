"""The SQLite store's batch statements find each row of a batch by its update id."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import List

import pytest

from ptb_fence import SQLiteUpdateStore

BATCHES = ("complete_owned_many", "renew_many", "renew_owned_many", "release_many")


@pytest.mark.parametrize("name", BATCHES)
def test_a_batch_statement_searches_the_table_by_primary_key(tmp_path: Path, name: str) -> None:
    """Not every processing row through the state index, each scanning the whole batch."""
    path = str(tmp_path / "plans.sqlite3")
    store = SQLiteUpdateStore(path)
    store.add(1, '{"update_id": 1}', 1)
    conn = sqlite3.connect(path)
    try:
        params = {"completions": "[]", "leases": "[]", "identities": "[]",
                  "now": 1, "lease_until": 2, "at": 3}
        plan: List[str] = [row[3] for row in conn.execute(
            "EXPLAIN QUERY PLAN " + store._sql[name], params)]
    finally:
        conn.close()
        store.close()
    searches = [step for step in plan if step.startswith(("SEARCH t", "SCAN t"))]
    assert searches == ["SEARCH t USING INTEGER PRIMARY KEY (rowid=?)"], plan


def test_completing_a_batch_among_many_processing_rows_completes_exactly_it(tmp_path: Path) -> None:
    """The batch completes its own rows and leaves the other processing rows alone."""
    path = str(tmp_path / "batch.sqlite3")
    store = SQLiteUpdateStore(path)
    try:
        for update_id in range(1, 201):
            store.add(update_id, f'{{"update_id": {update_id}}}', 1)
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("UPDATE telegram_updates SET state = 'processing', attempts = 1, "
                         "due_at = 1000000, claim_id = 'c' || update_id")
            completions = "[" + ",".join(f'[{u}, 1, "c{u}", 5]' for u in range(50, 82)) + "]"
            done = conn.execute(store._sql["complete_owned_many"],
                                {"completions": completions}).fetchall()
            states = dict(conn.execute("SELECT update_id, state FROM telegram_updates"))
        finally:
            conn.close()
    finally:
        store.close()
    assert sorted(row[0] for row in done) == list(range(50, 82))
    assert [u for u, s in states.items() if s == "completed"] == list(range(50, 82))
    assert sum(1 for s in states.values() if s == "processing") == 200 - 32
