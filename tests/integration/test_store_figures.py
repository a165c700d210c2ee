"""The optional store capability ``figures`` (what waits in a store, for operators' metrics):
the three stores give the same figures for the same history, one consistent view while other
threads write, cheap on a long settled history (the SQL reads the waiting rows through the
indexes), legacy PostgreSQL tables; the port's ``figures()``; the capability logged; the
conformance rule and the broken stores it catches."""

from __future__ import annotations

import inspect
import json
import logging
import random
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple, Type

import pytest

from broken_stores import (
    BROKEN,
    FencedOnlyStore,
    FiguresCountAcknowledgedStore,
    FiguresCountCompletedStore,
    FiguresHeldSingleChatStore,
    FiguresHeldSmallestChatStore,
    FiguresIgnoreFailedStore,
    FiguresOldestByUpdateIdStore,
)
from store_support import new_store
from ptb_fence import (
    Abandoned,
    AttemptIdentity,
    Completed,
    Failed,
    BatchStore,
    MemoryUpdateStore,
    SQLiteUpdateStore,
    StoreCapabilities,
    StoreFigures,
    UpdateIntake,
)
from ptb_fence.conformance import RULES, check_update_store
from ptb_fence.contract import BASE_METHODS, CAPABILITY_GROUPS, FIGURES_METHODS
from ptb_fence.runtime._port import StorePort
from ptb_fence.stores.postgres._sql import statements as postgres_statements
from ptb_fence.stores.sqlite._sql import statements as sqlite_statements

from runtime_support import ALL_METHODS, StoreWrapper

T = 1_700_000_000_000
KINDS = ["memory", "sqlite", "postgres"]
FIGURES_BREAKERS: Tuple[Type[Any], ...] = (
    FiguresCountCompletedStore,
    FiguresIgnoreFailedStore,
    FiguresOldestByUpdateIdStore,
    FiguresCountAcknowledgedStore,
    FiguresHeldSingleChatStore,
    FiguresHeldSmallestChatStore,
)


def _body(update_id: int) -> str:
    return json.dumps({"update_id": update_id})


# -- one history, three stores -------------------------------------------------------------------
def _story(store: Any) -> List[StoreFigures]:
    """A history told the same way to any store; the figures after each step."""
    seen: List[StoreFigures] = [store.figures()]
    rows = [(1, _body(1), T + 30, 7), (2, _body(2), T + 20, 7), (3, _body(3), T + 10, None),
            (4, _body(4), T + 5, 8), (5, _body(5), T + 1, 9), (6, _body(6), T + 40, 9)]
    assert store.add_many_in_chats(rows) == [True] * len(rows)
    seen.append(store.figures())
    a = store.claim_owned(5, now=T + 50, lease_until=T + 60_000, max_attempts=2)
    assert store.settle_owned(a, Completed(at=T + 51))  # chat 9 keeps one unsettled row
    b = store.claim_owned(3, now=T + 50, lease_until=T + 60_000, max_attempts=2)
    assert store.settle_owned(b, Failed(at=T + 52, retry_at=T + 100, error="x"))
    seen.append(store.figures())
    c = store.claim_owned(4, now=T + 50, lease_until=T + 60_000, max_attempts=2)
    assert store.exhaust(c, at=T + 70, error="x")  # an exhaustion: chat 8 has none unsettled
    assert store.claim_owned(3, now=T + 100, lease_until=T + 60_000, max_attempts=1,
                             durable_exhaustion=True) is None  # spent at T+100
    seen.append(store.figures())
    assert store.acknowledge_exhaustion(c, T + 200)
    d = store.claim_owned(2, now=T + 200, lease_until=T + 60_000, max_attempts=2)
    assert store.release_many([d], at=T + 201) == [True]  # released: pending again
    e = store.claim_owned(1, now=T + 200, lease_until=T + 60_000, max_attempts=2)
    assert store.settle_owned(e, Abandoned(at=T + 202, error="x"))
    seen.append(store.figures())
    assert store.prune(T + 10_000) == 3  # 5 (completed), 4 (acknowledged) and 1 (abandoned)
    seen.append(store.figures())
    return seen


STORY = [
    StoreFigures(0, None, 0, None),
    StoreFigures(6, T + 1, 0, None, held_chat=9, held_chat_since=T + 1),
    StoreFigures(5, T + 5, 0, None, held_chat=7, held_chat_since=T + 20),
    StoreFigures(3, T + 20, 2, T + 70, held_chat=7, held_chat_since=T + 20),
    StoreFigures(2, T + 20, 1, T + 100),
    StoreFigures(2, T + 20, 1, T + 100),
]
"""What :func:`_story` must show, worked out by hand from the rules: chat 9 is held first
(its oldest row, 5, was received at T+1) until 5 completes, then chat 7 (since T+20, row 2)
until 1 is abandoned; 3 fails (still unsettled), then is spent: an exhaustion since its spend
(T+100), like 4 (T+70) until 4 is acknowledged; a released row is pending, unsettled again;
pruning the settled rows changes nothing."""


@pytest.mark.parametrize("kind", KINDS)
def test_one_history_gives_the_figures_worked_out_by_hand(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store: Any = new_store(kind, request, str(tmp_path / "figures.db"))
    try:
        assert _story(store) == STORY
    finally:
        store.close()


def _random_history(stores: List[Any], seed: int, steps: int) -> List[StoreFigures]:
    """Apply the same random operations to every store (each must answer each one alike) and
    compare their figures after every step; returns the figures seen."""
    rng = random.Random(seed)
    now = T
    held: List[Dict[int, AttemptIdentity]] = [{} for _ in stores]
    seen = [stores[0].figures()]
    recorded: Set[int] = set()
    for step in range(steps):
        now += rng.randint(0, 3_000)
        op = rng.choice(["add", "add", "claim", "claim", "claim", "settle", "settle", "exhaust",
                         "ack", "release", "prune"])
        # mostly ids the operation can act on: a recorded row, an earlier claim (maybe lapsed
        # or settled since), a waiting exhaustion
        update_id = rng.randint(1, 120)
        if op == "claim" and recorded:
            update_id = rng.choice(sorted(recorded))
        elif op in ("settle", "exhaust", "release") and held[0]:
            update_id = rng.choice(sorted(held[0]))
        elif op == "ack":
            exhausted = sorted(e.update_id for e in stores[0].due_exhaustions(limit=1000))
            update_id = rng.choice(exhausted) if exhausted else update_id
        received = now - rng.randint(0, 9_000)
        chat = rng.choice([None, 1, 2, 3])
        settlement = rng.choice([
            Completed(at=now), Failed(at=now, retry_at=now + 2_000, error="x"),
            Abandoned(at=now, error="x"),
        ])
        results: List[Any] = []
        for store, mine in zip(stores, held):
            identity = mine.get(update_id)
            if op == "add":
                results.append(store.add_many_in_chats(
                    [(update_id, _body(update_id), received, chat)]
                ))
            elif op == "claim":
                identity = store.claim_owned(update_id, now=now, lease_until=now + 5_000,
                                             max_attempts=2, durable_exhaustion=True)
                if identity is not None:
                    mine[update_id] = identity
                results.append(None if identity is None else identity.attempt)
            elif op == "settle" and identity is not None:
                results.append(store.settle_owned(identity, settlement))
            elif op == "exhaust" and identity is not None:
                results.append(store.exhaust(identity, at=now, error="x"))
            elif op == "release" and identity is not None:
                results.append(store.release_many([identity], at=now))
            elif op == "ack":
                waiting = {e.update_id: e for e in store.due_exhaustions(limit=100)}
                results.append(update_id in waiting
                               and store.acknowledge_exhaustion(waiting[update_id].identity, now))
            elif op == "prune":
                results.append(store.prune(now - 20_000))
        assert all(r == results[0] for r in results), (step, op, update_id, results)
        if op == "add" and results[0] == [True]:
            recorded.add(update_id)
        figures = [store.figures() for store in stores]
        assert all(f == figures[0] for f in figures), (step, op, update_id, figures)
        seen.append(figures[0])
    return seen


def test_random_histories_give_the_same_figures_in_the_three_stores(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    stores: List[Any] = [
        new_store(kind, request, str(tmp_path / "random.db")) for kind in KINDS
    ]
    try:
        seen = _random_history(stores, seed=1, steps=400)
    finally:
        for store in stores:
            store.close()
    # not a quiet history (the seed is fixed): the figures moved often, each part was exercised
    assert sum(a != b for a, b in zip(seen, seen[1:])) >= 80
    assert any(f.held_chat is not None for f in seen)
    assert any(f.held_chat is None and f.unsettled >= 2 for f in seen)
    assert any(f.exhaustions_waiting >= 2 for f in seen)
    assert max(f.unsettled for f in seen) >= 10


# -- one consistent view while other threads write ------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.timeout(120)
def test_figures_are_one_view_while_another_thread_moves_rows(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Rows only move pending → processing → unacknowledged exhaustion, so in any one view
    ``unsettled + exhaustions_waiting`` is the number of rows, and the exhaustions never go
    back. Counting the two with separate reads would, now and then, see a row in both or in
    neither while a writer thread moves rows (claim, then exhaust) all along."""
    store: Any = new_store(kind, request, str(tmp_path / "view.db"))
    rows = 120
    assert store.add_many([(u, _body(u), T + u) for u in range(1, rows + 1)]) == [True] * rows
    done = threading.Event()
    errors: List[BaseException] = []

    views: List[StoreFigures] = []

    def writer() -> None:
        try:
            for update_id in range(1, rows + 1):
                if update_id % 10 == 0:
                    # let the reader in now and then: a fast store (memory) could otherwise
                    # move every row before the reader's first view (the GIL decides)
                    seen = len(views)
                    deadline = time.monotonic() + 10
                    while len(views) == seen and time.monotonic() < deadline:
                        time.sleep(0.0005)
                identity = store.claim_owned(update_id, now=T + 1_000, lease_until=T + 60_000,
                                             max_attempts=5)
                assert identity is not None
                assert store.exhaust(identity, at=T + 2_000 + update_id, error="x")
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while not done.is_set():
            views.append(store.figures())
        views.append(store.figures())
    finally:
        thread.join(60)
        store.close()
    assert not errors, errors
    assert len(views) >= 3, views
    for view in views:
        assert view.unsettled + view.exhaustions_waiting == rows, view
        assert (view.oldest_unsettled_received_at is None) == (view.unsettled == 0), view
        if view.exhaustions_waiting:
            assert view.oldest_exhaustion_at == T + 2_001, view  # row 1 ended first
    waiting = [view.exhaustions_waiting for view in views]
    assert waiting == sorted(waiting)
    assert views[-1] == StoreFigures(0, None, rows, T + 2_001)


# -- cheap on a long settled history ---------------------------------------------------------------
def test_sqlite_reads_only_through_the_indexes(tmp_path: Path) -> None:
    path = str(tmp_path / "plan.db")
    store = SQLiteUpdateStore(path, table="updates")
    store.close()
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.executemany(
                'INSERT INTO "updates" (update_id, body, state, attempts, due_at, received_at, '
                "settled_at, chat_key) VALUES (?, 'b', ?, 1, ?, ?, ?, ?)",
                [(u, "abandoned" if u % 50 == 0 else "completed", T + u, T + u, T + u + 1,
                  u % 100) for u in range(1, 5_001)],
            )
        for analyzed in (False, True):
            if analyzed:
                conn.execute("ANALYZE")
            plan = [row[3] for row in conn.execute(
                "EXPLAIN QUERY PLAN " + sqlite_statements("updates")["figures"]
            )]
            on_table = [step for step in plan if re.search(r"\bupdates\b", step)]
            assert len(on_table) == 3, plan  # one read per figure, each an index search
            assert all(step.startswith("SEARCH updates USING ") for step in on_table), plan
    finally:
        conn.close()


@pytest.mark.timeout(120)
def test_postgres_reads_only_through_the_indexes(pg_dsn: str, pg_table: str) -> None:
    """50,000 completed rows and 1,000 abandoned ones, a few waiting: no sequential scan."""
    import psycopg2

    from ptb_fence import PostgresUpdateStore

    store = PostgresUpdateStore(pg_dsn, table=pg_table)
    try:
        assert store.add_many_in_chats([(1, _body(1), T - 5, 4), (2, _body(2), T - 3, 4)])
        conn = psycopg2.connect(pg_dsn)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    f'INSERT INTO "{pg_table}" (update_id, body, state, attempts, due_at, '
                    "received_at, settled_at, claim_id, chat_key) "
                    "SELECT g, 'b', CASE WHEN g %% 50 = 0 THEN 'abandoned' ELSE 'completed' END, "
                    "1, %(t)s + g, %(t)s + g, %(t)s + g + 1, md5(g::text), g %% 100 "
                    "FROM generate_series(10, 51009) AS g", {"t": T},
                )
                cur.execute(f'ANALYZE "{pg_table}"')
            conn.commit()
            assert store.figures() == StoreFigures(2, T - 5, 0, None, 4, T - 5)
            with conn.cursor() as cur:
                # the SELECT after the statement's SET TRANSACTION READ ONLY
                select = postgres_statements(pg_table)["figures"].split(";", 1)[1]
                cur.execute("EXPLAIN " + select)
                plan = "\n".join(row[0] for row in cur.fetchall())
            conn.rollback()
        finally:
            conn.close()
    finally:
        store.close()
    assert "Seq Scan" not in plan, plan
    assert plan.count("Index Scan") + plan.count("Index Only Scan") >= 3, plan


def test_postgres_table_without_the_newer_columns(pg_dsn: str, pg_table: str) -> None:
    """A table from before fencing (no claim_id, no chat_key) managed with create_table=False:
    the figures need neither; no chat is ever held."""
    import psycopg2

    from ptb_fence import PostgresUpdateStore

    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                f'CREATE TABLE "{pg_table}" (update_id BIGINT PRIMARY KEY, body TEXT NOT NULL, '
                "state TEXT NOT NULL, attempts INT NOT NULL DEFAULT 0, due_at BIGINT NOT NULL, "
                "received_at BIGINT NOT NULL, settled_at BIGINT, error TEXT)"
            )
        conn.commit()
    finally:
        conn.close()
    store = PostgresUpdateStore(pg_dsn, table=pg_table, create_table=False)
    try:
        assert store.figures() == StoreFigures(0, None, 0, None)
        for update_id in (1, 2, 3):
            assert store.add(update_id, _body(update_id), T + 10 - update_id)
        attempt = store.claim(3, now=T + 20, lease_until=T + 60_000, max_attempts=5)
        assert attempt == 1
        store.settle(3, attempt, Completed(at=T + 21))
        assert store.figures() == StoreFigures(2, T + 8, 0, None)
    finally:
        store.close()


# -- the capability and the port ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_the_shipped_stores_have_the_capability(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store: Any = new_store(kind, request, str(tmp_path / "caps.db"))
    try:
        assert "figures" in StoreCapabilities.of(store)
        port = StorePort(store, component="t")
        assert port.has_figures
        assert port.figures() == StoreFigures(0, None, 0, None)
        assert store.add(1, _body(1), T)
        assert port.figures() == store.figures() == StoreFigures(1, T, 0, None)
    finally:
        store.close()


def test_the_group_is_one_method() -> None:
    (group,) = [g for g in CAPABILITY_GROUPS if g.name == "figures"]
    assert group.methods == FIGURES_METHODS == ("figures",)
    assert group.requires == ()
    # a store of the base six plus figures has the capability: it needs no other group
    store = StoreWrapper(methods=BASE_METHODS + FIGURES_METHODS)
    assert StoreCapabilities.of(store).groups == frozenset({"base", "figures"})
    assert "unsettled" in (inspect.getdoc(BatchStore.figures) or "")


def test_the_port_without_the_capability_gives_none() -> None:
    store = StoreWrapper(methods=ALL_METHODS)  # every other method of the memory store
    assert "figures" not in ALL_METHODS
    port = StorePort(store, component="t")
    assert not port.has_figures
    assert port.figures() is None
    assert store.count("figures") == 0


def test_the_port_calls_the_store_once_per_call() -> None:
    store = StoreWrapper(methods=ALL_METHODS + FIGURES_METHODS)
    port = StorePort(store, component="t")
    assert port.has_figures
    assert store.inner.add(1, _body(1), T + 1)
    assert port.figures() == StoreFigures(1, T + 1, 0, None)
    assert store.count("figures") == 1


def test_the_port_refuses_a_value_that_is_not_store_figures() -> None:
    store = StoreWrapper(methods=ALL_METHODS + FIGURES_METHODS)
    store.hooks["figures"] = lambda original: {"unsettled": 0}
    port = StorePort(store, component="t")
    with pytest.raises(TypeError, match=r"StoreWrapper\.figures\(\) returned dict .*StoreFigures"):
        port.figures()


def test_the_capability_is_logged_at_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ptb_fence.runtime"):
        UpdateIntake(MemoryUpdateStore(), handle=lambda update: None).close()
        UpdateIntake(StoreWrapper(methods=BASE_METHODS), handle=lambda update: None).close()
    lines = [r.getMessage() for r in caplog.records if "store capabilities" in r.getMessage()]
    assert len(lines) == 2, lines
    memory, wrapped = lines
    assert re.search(r"MemoryUpdateStore: .*\bfigures\b", memory), memory
    assert "figures" not in wrapped


def test_store_figures_is_a_frozen_keyword_value() -> None:
    figures = StoreFigures(unsettled=1, oldest_unsettled_received_at=T, exhaustions_waiting=0,
                           oldest_exhaustion_at=None)
    assert figures == StoreFigures(1, T, 0, None, None, None)
    assert figures.held_chat is None and figures.held_chat_since is None
    with pytest.raises(AttributeError):
        figures.unsettled = 2  # type: ignore[misc]
    assert not hasattr(figures, "__dict__")  # slots
    assert hash(figures) == hash(StoreFigures(1, T, 0, None))


# -- the conformance rule --------------------------------------------------------------------------
def test_the_rule_is_declared() -> None:
    (figures_rule,) = [r for r in RULES if r.name == "figures"]
    assert figures_rule.level == "base"
    for breaker in FIGURES_BREAKERS:
        assert BROKEN[breaker] == ("figures",), breaker


@pytest.mark.parametrize("breaker", FIGURES_BREAKERS, ids=lambda cls: cls.__name__)
def test_the_rule_catches_a_broken_figures(breaker: Type[Any]) -> None:
    violations = check_update_store(breaker)
    assert violations, breaker.__name__
    # only figures is wrong in these stores: no other rule blames them
    assert {v.split(":", 1)[0] for v in violations} == {"figures"}, violations
    assert all(v.startswith("figures: figures() ") for v in violations), violations


def test_the_rule_passes_the_memory_store_and_skips_a_store_without_figures() -> None:
    assert check_update_store(MemoryUpdateStore) == []
    assert check_update_store(FencedOnlyStore) == []  # no figures method: nothing to blame


def test_the_rule_reports_a_wrong_type_once() -> None:
    class FloatTimeStore(MemoryUpdateStore):
        """``figures`` gives the oldest time as a float."""

        def figures(self) -> StoreFigures:
            return StoreFigures(0, 0.0, 0, None)  # type: ignore[arg-type]

    violations = check_update_store(FloatTimeStore)
    assert violations == [
        "figures: figures returned StoreFigures StoreFigures(unsettled=0, "
        "oldest_unsettled_received_at=0.0, exhaustions_waiting=0, oldest_exhaustion_at=None, "
        "held_chat=None, held_chat_since=None); it must return a StoreFigures (int counts; "
        "each time and the chat key an int or None)"
    ]


def test_the_rule_runs_on_a_store_with_figures_but_no_chat_order() -> None:
    """A base store with figures gets the unsettled checks (and a completed row counted is
    caught there); held_chat must stay None."""

    class BaseWithFigures(FencedOnlyStore):
        def figures(self) -> StoreFigures:
            return self._inner.figures()

    class BaseCountingCompleted(FencedOnlyStore):
        def figures(self) -> StoreFigures:
            return FiguresCountCompletedStore.figures(self._inner)  # type: ignore[arg-type]

    assert check_update_store(BaseWithFigures) == []
    violations = check_update_store(BaseCountingCompleted)
    assert violations and all(v.startswith("figures: ") for v in violations), violations
