"""Concurrency at intake: 40 simultaneous webhook posts (Telegram's default ``max_connections``).

Real threads post through real sockets to a real threaded WSGI server (wsgiref +
``ThreadingMixIn``) in front of ``webhook_app`` over SQLite and over PostgreSQL, and to PTB's own
webhook server (``app.updater.start_webhook``) with a ``FencedUpdateProcessor`` over SQLite. Each
round releases 40 posts at once (a barrier), including the same update posted twice in the same
round and redeliveries of earlier rounds. Checked: every answer is 200 (no "database is locked"
or pool exhaustion surfaces as a 5xx), each update is recorded exactly once and accepted exactly
once, and its handler commits exactly one fenced domain row (the handler writes it inside
``attempt.transaction(complete=True)``).
"""

from __future__ import annotations

import functools
import json
import logging
import random
import sqlite3
import threading
import time
import uuid
from collections import Counter
from typing import Any, Callable, Dict, Iterator, List, Tuple

import psycopg2
import pytest

from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore, UpdateIntake, webhook_app
from ptb_fence.testing import FakeBotApi, make_message_update
from intake_http_support import PtbWebhookThread, ThreadedWsgi, domain_counts, http_post, table_rows
from ptb_support import DOMAIN_DDL

SECRET = "concurrency_Secret-1"
CONNECTIONS = 40  # Telegram's default max_connections for a webhook
ROUNDS = 5
OPTIONS: Dict[str, Any] = {
    "lease_seconds": 30.0,  # no takeover can happen: a second handler run would be a bug
    "sweep_every_seconds": 0.5,
    "pending_grace_seconds": 0.5,
    "max_concurrent": 16,
}


def plan_rounds(base: int, rounds: int = ROUNDS, seed: int = 7) -> List[List[int]]:
    """``rounds`` lists of 40 update ids: 30 new ids, 5 of them posted twice in the same round,
    plus 5 redeliveries of ids from earlier rounds (in round 0: a third copy of new ones)."""
    rng = random.Random(seed)
    plan: List[List[int]] = []
    seen: List[int] = []
    for r in range(rounds):
        new = [base + r * 1000 + i for i in range(30)]
        again = new[:5]
        earlier = rng.sample(seen, 5) if seen else new[5:10]
        ids = new + again + earlier
        rng.shuffle(ids)
        assert len(ids) == CONNECTIONS
        plan.append(ids)
        seen.extend(new)
    return plan


@functools.lru_cache(maxsize=None)
def update_body(uid: int) -> bytes:
    """The update posted for ``uid`` (cached: a redelivery is byte-identical, as Telegram's)."""
    return json.dumps(
        make_message_update(uid, chat_id=1 + uid % 9, text=f"héllo ✓ {uid}")
    ).encode("utf-8")


def post_all_at_once(
    post: Callable[[int], Tuple[int, bytes]], ids: List[int]
) -> List[Tuple[int, int, bytes]]:
    """POST every id from its own thread, all released together; ``(uid, status, reply)``."""
    barrier = threading.Barrier(len(ids), timeout=20)
    results: List[Tuple[int, int, bytes]] = []
    errors: List[BaseException] = []
    lock = threading.Lock()

    def one(uid: int) -> None:
        try:
            barrier.wait()
            status, reply = post(uid)
            with lock:
                results.append((uid, status, reply))
        except BaseException as exc:  # reported below
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=one, args=(uid,), daemon=True) for uid in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "a post did not finish within 60 s"
    assert not errors, f"posts failed: {errors[:3]!r}"
    return results


def wait_until(what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class InFlight:
    """WSGI middleware that records how many requests were inside the app at once."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.now = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self, environ: Dict[str, Any], start_response: Any) -> Any:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return list(self.app(environ, start_response))
        finally:
            with self._lock:
                self.now -= 1


class Handler:
    """``handle_attempt`` that writes one fenced domain row per committed attempt."""

    def __init__(self, insert: Callable[[Any, int, Any], None]) -> None:
        self.insert = insert
        self.started: "Counter[int]" = Counter()
        self.committed: "Counter[int]" = Counter()
        self._lock = threading.Lock()

    def __call__(self, update: Dict[str, Any], attempt: Any) -> None:
        uid = update["update_id"]
        with self._lock:
            self.started[uid] += 1
        time.sleep(0.002)  # a little work, so attempts overlap
        with attempt.transaction(complete=True) as conn:
            self.insert(conn, uid, attempt)
        with self._lock:
            self.committed[uid] += 1


def run_webhook_rounds(
    store: Any, handler: Handler, caplog: Any
) -> Tuple[List[Tuple[int, int, bytes]], List[List[int]], InFlight]:
    store_errors: List[Tuple[str, BaseException]] = []
    intake = UpdateIntake(
        store,
        handle_attempt=handler,
        on_store_error=lambda error, step: store_errors.append((step, error)),
        **OPTIONS,
    )
    intake.start()
    app = InFlight(webhook_app(intake, secret_token=SECRET))
    plan = plan_rounds(base=10_000)
    results: List[Tuple[int, int, bytes]] = []
    try:
        with ThreadedWsgi(app) as server:

            def post(uid: int) -> Tuple[int, bytes]:
                return http_post(
                    server.port,
                    "/telegram",
                    update_body(uid),
                    {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": SECRET},
                    timeout=60,
                )

            for ids in plan:
                results += post_all_at_once(post, ids)
            distinct = {uid for ids in plan for uid in ids}
            wait_until("every update handled", lambda: set(handler.committed) == distinct)
            assert intake.idle(30)
    finally:
        intake.close()
    assert store_errors == [], store_errors
    noisy = [r.getMessage() for r in caplog.records if "locked" in r.getMessage().lower()]
    assert noisy == [], noisy
    return results, plan, app


def check_exactly_once(
    results: List[Tuple[int, int, bytes]], plan: List[List[int]], handler: Handler
) -> "set[int]":
    distinct = {uid for ids in plan for uid in ids}
    assert len(results) == ROUNDS * CONNECTIONS
    bad = [(uid, status, reply) for uid, status, reply in results if status != 200]
    assert bad == [], f"{len(bad)} non-200 answers, e.g. {bad[:3]}"
    accepted = Counter(uid for uid, _, reply in results if reply == b"accepted\n")
    duplicates = Counter(uid for uid, _, reply in results if reply == b"duplicate\n")
    assert accepted == Counter({uid: 1 for uid in distinct}), "an update was accepted twice or never"
    assert sum(duplicates.values()) == ROUNDS * CONNECTIONS - len(distinct)
    assert handler.started == Counter({uid: 1 for uid in distinct}), "a handler ran twice"
    assert handler.committed == Counter({uid: 1 for uid in distinct})
    return distinct


# -- SQLite ------------------------------------------------------------------------------------
def test_40_concurrent_webhook_posts_sqlite(tmp_path: Any, caplog: Any) -> None:
    caplog.set_level(logging.WARNING)
    path = str(tmp_path / "updates.db")
    store = SQLiteUpdateStore(path)
    conn = sqlite3.connect(path, timeout=10)
    conn.execute(DOMAIN_DDL)
    conn.commit()
    conn.close()

    def insert(conn: Any, uid: int, attempt: Any) -> None:
        conn.execute(
            "INSERT INTO domain (update_id, attempt, claim_id) VALUES (?, ?, ?)",
            (uid, attempt.attempt, attempt.claim_id),
        )

    handler = Handler(insert)
    try:
        results, plan, app = run_webhook_rounds(store, handler, caplog)
    finally:
        store.close()
    distinct = check_exactly_once(results, plan, handler)
    assert app.most >= 2, "the posts never overlapped: the test did not exercise concurrency"
    rows = table_rows(path)
    assert set(rows) == distinct
    assert {state for state, _ in rows.values()} == {"completed"}
    for uid in distinct:  # recorded as received
        assert rows[uid][1] == update_body(uid).decode("utf-8")
    assert domain_counts(path) == Counter({uid: 1 for uid in distinct})


# -- PostgreSQL --------------------------------------------------------------------------------
@pytest.fixture
def pg_domain(pg_dsn: str, pg_tables: List[str]) -> Iterator[str]:
    table = "d_" + uuid.uuid4().hex[:16]
    pg_tables.append(table)
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(
            f"CREATE TABLE {table} (update_id BIGINT NOT NULL, attempt INTEGER NOT NULL, "
            "claim_id TEXT NOT NULL)"
        )
    conn.close()
    yield table


def _pg_query(dsn: str, sql: str) -> List[Tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def test_40_concurrent_webhook_posts_postgres(
    pg_dsn: str, pg_table: str, pg_domain: str, caplog: Any
) -> None:
    caplog.set_level(logging.WARNING)
    store = PostgresUpdateStore(pg_dsn, pg_table)

    def insert(conn: Any, uid: int, attempt: Any) -> None:
        with conn.cursor() as cur:
            cur.execute(
                f"INSERT INTO {pg_domain} (update_id, attempt, claim_id) VALUES (%s, %s, %s)",
                (uid, attempt.attempt, attempt.claim_id),
            )

    handler = Handler(insert)
    try:
        results, plan, app = run_webhook_rounds(store, handler, caplog)
    finally:
        store.close()
    distinct = check_exactly_once(results, plan, handler)
    assert app.most >= 2, "the posts never overlapped: the test did not exercise concurrency"
    rows = _pg_query(pg_dsn, f"SELECT update_id, state, body FROM {pg_table}")
    assert Counter(r[0] for r in rows) == Counter({uid: 1 for uid in distinct})
    assert {r[1] for r in rows} == {"completed"}
    assert all(r[2] == update_body(r[0]).decode("utf-8") for r in rows)
    domain = Counter(r[0] for r in _pg_query(pg_dsn, f"SELECT update_id FROM {pg_domain}"))
    assert domain == Counter({uid: 1 for uid in distinct})


# -- PTB's own webhook server ------------------------------------------------------------------
def test_40_concurrent_posts_to_ptbs_webhook_server(tmp_path: Any, caplog: Any) -> None:
    caplog.set_level(logging.WARNING)
    path = str(tmp_path / "ptb.db")
    plan = plan_rounds(base=50_000, rounds=3, seed=11)
    distinct = {uid for ids in plan for uid in ids}
    results: List[Tuple[int, int, bytes]] = []
    with FakeBotApi() as fake, PtbWebhookThread(path, fake, SECRET, lease_seconds=30.0) as hook:
        for ids in plan:
            results += post_all_at_once(lambda uid: hook.post(update_body(uid)), ids)
            # a 200 means committed: every id posted so far has its row now
            assert set(table_rows(path)) == {uid for uid, _, _ in results}
        wait_until(
            "every update handled and settled",
            lambda: set(hook.handled_snapshot()) == distinct
            and {state for state, _ in table_rows(path).values()} == {"completed"},
        )
        time.sleep(0.3)  # a second (wrong) run would show up here
        handled = hook.handled_snapshot()
    bad = [(uid, status) for uid, status, _ in results if status != 200]
    assert bad == [], f"{len(bad)} non-200 answers from PTB's webhook, e.g. {bad[:3]}"
    assert len(results) == 3 * CONNECTIONS
    rows = table_rows(path)
    assert set(rows) == distinct and {state for state, _ in rows.values()} == {"completed"}
    assert handled == Counter({uid: 1 for uid in distinct}), "a handler ran twice or never"
    assert domain_counts(path) == Counter({uid: 1 for uid in distinct})
    noisy = [r.getMessage() for r in caplog.records if "locked" in r.getMessage().lower()]
    assert noisy == [], noisy
