"""The optional store capability ``outbox`` (the Bot API calls an attempt queued, sent iff its
completion committed) in the memory, SQLite and PostgreSQL stores: the calls ride in the
settle's own transaction (a settle that fails writes none, a failing insert undoes the settle),
``write_effects`` lands and vanishes with the caller's own connection, concurrent claimers on
two store objects (two PostgreSQL pools) never share a call and keep each chat's order,
PostgreSQL skips locked calls instead of waiting, long table names, an existing table gets its
outbox; the port's outbox methods and the capability group."""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import psycopg2
import pytest

from broken_stores import FencedOnlyStore
from store_support import settle_many
from ptb_fence import (
    AttemptEffects,
    AttemptIdentity,
    Batch,
    ClaimTerms,
    Completed,
    Failed,
    MemoryUpdateStore,
    OutboxCall,
    OutboxEntry,
    OutboxStore,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    StoreCapabilities,
)
from ptb_fence.contract import CAPABILITY_GROUPS, OUTBOX_METHODS
from ptb_fence.runtime._port import StorePort
from ptb_fence.stores._outbox_sql import outbox_table_name

T = 1_700_000_000_000
L = 60_000


def calls(*chats: Optional[int], prefix: str = "m") -> AttemptEffects:
    """One ``sendMessage`` per chat key given, in order."""
    return AttemptEffects(tuple(
        OutboxCall("sendMessage", '{"chat_id": %s, "text": "%s%d"}' % (chat, prefix, seq),
                   chat, seq)
        for seq, chat in enumerate(chats)
    ))


def claimed(store: Any, update_id: int, now: int = T, lease: int = L) -> AttemptIdentity:
    assert store.add(update_id, '{"update_id": %d}' % update_id, now)
    identity = store.claim_owned(update_id, now=now, lease_until=now + lease, max_attempts=5)
    assert identity is not None
    return identity


def methods(store: Any) -> List[str]:
    return [entry.method + entry.params_json for entry in store.list_calls(limit=1000)]


# -- effects ride in the settle's transaction ------------------------------------------------------
def test_the_shipped_stores_have_the_whole_group(store: Any) -> None:
    assert "outbox" in StoreCapabilities.of(store)
    assert all(callable(getattr(store, m)) for m in OUTBOX_METHODS)
    assert set(OUTBOX_METHODS) <= set(dir(OutboxStore))
    assert StorePort(store, component="test", fenced=True).has_outbox


def test_only_landed_completions_write_their_calls(store: Any) -> None:
    live, lapsed, failing = claimed(store, 1), claimed(store, 2, lease=10), claimed(store, 3)
    landed = settle_many(store, [(live, Completed(T + 5)), (lapsed, Completed(T + 11)),
         (failing, Failed(T + 5, T + 100, "x"))],
        effects={live: calls(7, None, prefix="a"), lapsed: calls(7, prefix="b"),
                 failing: calls(8, prefix="c")},
    )
    assert landed == [True, False, True]
    entries = store.list_calls()
    assert [(e.update_id, e.seq, e.state, e.due_at, e.created_at, e.tries) for e in entries] == [
        (1, 0, "pending", T + 5, T + 5, 0), (1, 1, "pending", T + 5, T + 5, 0)]
    assert [e.chat_key for e in entries] == [7, None]
    assert all(e.identity == live for e in entries)
    assert store.outbox_counts() == {"pending": 2, "sending": 0, "sent": 0, "failed": 0,
                                     "failed_acknowledged": 0}
    # the combined write: the fresh row is claimed, the completion writes its calls
    late = claimed(store, 4)
    got = store.commit(Batch(
        ClaimTerms(T + 6, T + L, 5), claimed_records=((10, '{"update_id": 10}', T + 6),),
        settlements=((late, Completed(T + 6)), (lapsed, Completed(T + 20))),
        effects={late: calls(9, prefix="d"), lapsed: calls(9, prefix="e")},
    ))
    assert got.claimed_records[0] is not None and got.landed == (True, False)
    assert [e.update_id for e in store.list_calls()] == [1, 1, 4]


def test_without_effects_nothing_is_written(store: Any) -> None:
    one, two = claimed(store, 1), claimed(store, 2)
    assert settle_many(store, [(one, Completed(T + 1))]) == [True]
    assert settle_many(store, [(two, Completed(T + 1))], effects={}) == [True]
    assert store.list_calls() == [] and store.outbox_counts()["pending"] == 0


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_call_that_cannot_be_written_undoes_its_settle(store: Any) -> None:
    """The calls are inserted in the settle's transaction: a failing insert (a NULL params,
    refused by the table) rolls the settle back with it."""
    identity = claimed(store, 1)
    broken = AttemptEffects((OutboxCall("sendMessage", None, 1, 0),))  # type: ignore[arg-type]
    with pytest.raises(Exception):
        settle_many(store, [(identity, Completed(T + 1))], effects={identity: broken})
    assert store.owns(identity, T + 1)  # not completed
    assert store.list_calls() == []
    assert settle_many(store, [(identity, Completed(T + 2))], effects={identity: calls(5)}) == [True]
    assert [e.due_at for e in store.list_calls()] == [T + 2]


# -- write_effects on the caller's own connection --------------------------------------------------
def _caller_connection(kind: str, store: Any, request: pytest.FixtureRequest) -> Any:
    if kind == "sqlite":
        conn = sqlite3.connect(store.path, isolation_level=None)
    else:
        conn = psycopg2.connect(request.getfixturevalue("pg_dsn"))
    request.addfinalizer(conn.close)
    return conn


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_write_effects_lands_and_vanishes_with_the_callers_transaction(
    store: Any, store_kind: str, request: pytest.FixtureRequest
) -> None:
    identity = claimed(store, 1)
    conn = _caller_connection(store_kind, store, request)
    # rolled back: the completion and the calls vanish together
    assert store.complete_owned(identity, T + 5, connection=conn)
    ids = store.write_effects(identity, calls(3, 3, None), T + 5, connection=conn)
    assert len(ids) == 3 and ids == sorted(ids)
    conn.rollback()
    assert store.list_calls() == [] and store.owns(identity, T + 5)
    # committed: both land
    assert store.complete_owned(identity, T + 6, connection=conn)
    ids = store.write_effects(identity, calls(3, 3, None), T + 6, connection=conn)
    assert store.list_calls() == []  # not committed by the store
    conn.commit()
    entries = store.list_calls()
    assert [e.call_id for e in entries] == ids
    assert [(e.seq, e.state, e.due_at) for e in entries] == [
        (0, "pending", T + 6), (1, "pending", T + 6), (2, "pending", T + 6)]
    assert not store.owns(identity, T + 6)


def test_memory_write_effects_follows_its_transaction_block() -> None:
    store = MemoryUpdateStore()
    identity = claimed(store, 1)
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.write_effects(identity, calls(1), T, connection=None)
            raise RuntimeError("roll back")
    assert store.list_calls() == []
    with store.transaction():
        ids = store.write_effects(identity, calls(1, 2), T, connection=None)
        assert store.list_calls() == []
    assert [e.call_id for e in store.list_calls()] == ids


# -- concurrent claimers -----------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_concurrent_senders_on_two_store_objects_never_share_a_call_and_keep_chat_order(
    shared_stores: Callable[[], Any],
) -> None:
    """Two store objects on one database (two PostgreSQL pools, two SQLite connections per
    thread), three sender threads on each, each claiming and recording sent at once: every
    call is sent exactly once, and within each chat in call_id order (each send gets the next
    number of one global counter, taken after its claim)."""
    first, second = shared_stores(), shared_stores()
    chats = [None, 1, 2, 3, 4, 5, 6]
    for update_id in range(1, 21):
        identity = claimed(first, update_id)
        assert settle_many(first, [(identity, Completed(T + 1))], effects={identity: calls(*chats)}) == [True]
    total = 20 * len(chats)
    counter = itertools.count(1)
    counter_lock = threading.Lock()
    claims: List[Tuple[int, str]] = []
    claims_lock = threading.Lock()
    errors: List[BaseException] = []
    barrier = threading.Barrier(6)

    def sender(store: Any, name: str) -> None:
        try:
            barrier.wait()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                got = store.claim_calls(now=T + 2, lease_until=T + 10 * L, limit=4, sender=name)
                if not got:
                    if store.outbox_counts()["sent"] == total:
                        return
                    time.sleep(0.002)
                    continue
                with claims_lock:
                    claims.extend((entry.call_id, name) for entry in got)
                for entry in got:
                    with counter_lock:
                        at = T + 100 + next(counter)
                    assert store.record_sent([(entry.call_id, name, "{}", at)]) == [True]
        except BaseException as exc:  # noqa: BLE001 - reported in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=sender, args=(store, f"{label}{i}"))
               for label, store in (("a", first), ("b", second)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(150)
    assert not errors, errors
    ids = [call_id for call_id, _ in claims]
    assert len(ids) == len(set(ids)) == total
    entries = first.list_calls(limit=1000)
    assert all(e.state == "sent" and e.tries == 1 for e in entries)
    for chat in chats[1:]:
        of_chat = sorted((e for e in entries if e.chat_key == chat), key=lambda e: e.call_id)
        sent = [e.sent_at for e in of_chat]
        assert sent == sorted(sent), f"chat {chat} was sent out of order"


def test_postgres_claim_skips_a_locked_call_instead_of_waiting(
    pg_dsn: str, pg_table: str
) -> None:
    store = PostgresUpdateStore(pg_dsn, table=pg_table)
    try:
        identity = claimed(store, 1)
        assert settle_many(store, [(identity, Completed(T + 1))], effects={identity: calls(None, None, 4)}) == [True]
        first = store.list_calls()[0].call_id
        locker = psycopg2.connect(pg_dsn)
        try:
            with locker.cursor() as cur:
                cur.execute(f'SELECT 1 FROM "{outbox_table_name(pg_table)}" '
                            "WHERE call_id = %s FOR UPDATE", (first,))
            started = time.monotonic()
            got = store.claim_calls(now=T + 2, lease_until=T + L, limit=10, sender="s")
            assert time.monotonic() - started < 5
            assert [e.call_id for e in got] == [first + 1, first + 2]
        finally:
            locker.rollback()
            locker.close()
        assert [e.call_id for e in store.claim_calls(
            now=T + 2, lease_until=T + L, limit=10, sender="t")] == [first]
    finally:
        store.close()


# -- tables --------------------------------------------------------------------------------------
def test_a_long_table_name_gets_a_short_distinct_outbox_name(tmp_path: Path) -> None:
    long_a, long_b = "a" * 60 + "xyz", "a" * 60 + "xyw"
    names = {outbox_table_name(long_a), outbox_table_name(long_b)}
    assert len(names) == 2 and all(len(name) <= 63 for name in names)
    assert outbox_table_name("telegram_updates") == "telegram_updates_outbox"
    store = SQLiteUpdateStore(str(tmp_path / "long.db"), table=long_a)
    try:
        identity = claimed(store, 1)
        settle_many(store, [(identity, Completed(T))], effects={identity: calls(1)})
        assert len(store.list_calls()) == 1
    finally:
        store.close()


def test_an_sqlite_file_from_before_the_outbox_gets_it_when_opened(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    SQLiteUpdateStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute('DROP TABLE "telegram_updates_outbox"')
        conn.execute("""INSERT INTO telegram_updates (update_id, body, state, attempts, due_at,
                        received_at) VALUES (5, '{}', 'pending', 0, 1, 1)""")
    store = SQLiteUpdateStore(path)
    try:
        assert store.due(now=T, pending_before=T, limit=10)[0].update_id == 5
        identity = store.claim_owned(5, now=T, lease_until=T + L, max_attempts=3)
        assert identity is not None
        settle_many(store, [(identity, Completed(T))], effects={identity: calls(2)})
        assert [e.update_id for e in store.list_calls()] == [5]
    finally:
        store.close()


def test_postgres_prune_without_an_outbox_table_works_as_before(
    pg_dsn: str, pg_table: str
) -> None:
    """A table managed with create_table=False and not migrated has no outbox: prune still
    prunes the update rows."""
    creator = PostgresUpdateStore(pg_dsn, table=pg_table)
    creator.due(now=T, pending_before=T, limit=1)  # the schema is made on first use
    creator.close()
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE "{outbox_table_name(pg_table)}"')
        conn.commit()
    finally:
        conn.close()
    store = PostgresUpdateStore(pg_dsn, table=pg_table, create_table=False)
    try:
        identity = claimed(store, 1)
        assert store.settle_owned(identity, Completed(T + 1))
        assert store.prune(T + 2) == 1
    finally:
        store.close()


# -- the port and the group ----------------------------------------------------------------------
def test_the_port_without_an_outbox_refuses_calls_and_reads_nothing() -> None:
    store = FencedOnlyStore()
    port = StorePort(store, component="test", fenced=True)
    assert not port.has_outbox
    identity = claimed(store, 1)
    with pytest.raises(TypeError, match="no outbox"):
        port.settle_owned_many([(identity, Completed(T))], effects={identity: calls(1)})
    assert store.owns(identity, T)  # refused before anything was settled
    with pytest.raises(TypeError, match="no outbox"):
        port.write_effects(identity, calls(1), T, connection=None)
    assert port.settle_owned_many([(identity, Completed(T))], effects={}) == [True]
    assert port.claim_calls(now=T, lease_until=T + L, limit=5, sender="s") == []
    assert port.record_sent([(1, "s", "{}", T)]) == [False]
    assert port.release_calls([1, 2], "s", T) == [False, False]
    assert port.outbox_counts() is None and port.get_call(1) is None
    assert port.due_send_failures(limit=5) == [] and port.list_calls() == []
    assert not port.retry_call(1, "s", due_at=T, error="x")
    assert not port.fail_call(1, "s", at=T, error="x")
    assert not port.acknowledge_send_failure(1, T)
    assert not port.retry_failed_call(1, T) and not port.drop_call(1)


def test_the_group_is_all_or_nothing_and_needs_a_batch_store() -> None:
    (group,) = [g for g in CAPABILITY_GROUPS if g.name == "outbox"]
    assert group.methods == OUTBOX_METHODS and set(group.requires) == {"fenced"}

    class Partial(FencedOnlyStore):
        def claim_calls(self, **kwargs: Any) -> List[Any]:
            return []

    with pytest.raises(TypeError, match="outbox"):
        StoreCapabilities.of(Partial())

    inner = MemoryUpdateStore()

    class WithoutCommit(FencedOnlyStore):
        pass

    for name in OUTBOX_METHODS:
        setattr(WithoutCommit, name, getattr(MemoryUpdateStore, name))
    store = WithoutCommit()
    store._calls, store._next_call, store._staged, store._lock = {}, 1, None, inner._lock
    # a store without commit is used at the seed's levels: its outbox is never called
    assert not StorePort(store, component="test", fenced=True).has_outbox


def test_the_values_are_frozen_and_the_entry_names_its_attempt() -> None:
    call = OutboxCall("sendMessage", "{}", None, 0)
    assert call.at_most_once is False and AttemptEffects().calls == ()
    with pytest.raises(Exception):
        call.seq = 1  # type: ignore[misc]
    entry = OutboxEntry(1, 2, 3, "c", 0, None, "m", "{}", False, "pending", 0, T, T, None,
                        None, None, False)
    assert entry.identity == AttemptIdentity(2, 3, "c")


# -- calls claimed at insert ------------------------------------------------------------------------
@pytest.mark.parametrize("store_kind", ["postgres", "sqlite"])
def test_a_chats_claimed_insert_waits_for_an_open_one(store: Any) -> None:
    """A transaction that inserted a claimed call of chat 9 and is still open makes another
    completion's claimed insert of chat 9 wait for it (PostgreSQL: the chat's transaction
    lock; SQLite: the write lock) and then see its call: exactly one call of the chat is
    sending, the other pending behind it."""
    from ptb_fence import CallClaim

    first, second = claimed(store, 1), claimed(store, 2)
    effects = calls(9)
    done = threading.Event()
    landed: List[Any] = []

    def complete_second() -> None:
        landed.extend(settle_many(store, [(second, Completed(T + 2))],
            effects={second: AttemptEffects(effects.calls, claim=CallClaim("s2", T + L, 1))},
        ))
        done.set()

    with store.transaction() as conn:
        store.write_effects(first, AttemptEffects(effects.calls, claim=CallClaim("s1", T + L, 1)),
                            T + 1, connection=conn)
        thread = threading.Thread(target=complete_second, daemon=True)
        thread.start()
        done.wait(0.5)  # it must wait for this transaction's end
    thread.join(30)
    assert landed == [True]
    states = {entry.update_id: entry.state for entry in store.list_calls()}
    assert states == {1: "sending", 2: "pending"}
    assert [e.update_id for e in store.claimed_calls("s1", limit=10)] == [1]
    assert store.claimed_calls("s2", limit=10) == []
