"""The optional store capability ``state`` (persisted bot state that commits with the update,
versioned per key) in the memory, SQLite and PostgreSQL stores: the writes ride in the
settle's own transaction, a moved version stops only its own completion (reported as a
StateConflict, the claim kept) inside a grouped settle, ``write_effects`` writes inside the
caller's transaction and raises on a moved version, two store objects (two PostgreSQL pools)
racing on one key never both land, older tables get the state table, long names; the port's
state methods and the capability group."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, List

import psycopg2
import pytest

from ptb_fence.contract import Batch

from broken_stores import FencedOnlyStore
from store_support import settle_many
from ptb_fence import (
    AttemptEffects,
    AttemptIdentity,
    Completed,
    MemoryUpdateStore,
    OutboxCall,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    StateConflict,
    StateConflictError,
    StateEntry,
    StateKey,
    StateStore,
    StateWrite,
    StoreCapabilities,
    postgres_update_store_schema,
)
from ptb_fence.contract import CAPABILITY_GROUPS, OUTBOX_METHODS, STATE_METHODS
from ptb_fence.runtime._port import StorePort
from ptb_fence.stores._state_sql import state_table_name

T = 1_700_000_000_000
L = 60_000
USER = StateKey("user", "", "7")
CHAT = StateKey("chat", "", "-5")


def claimed(store: Any, update_id: int) -> AttemptIdentity:
    assert store.add(update_id, '{"update_id": %d}' % update_id, T)
    identity = store.claim_owned(update_id, now=T, lease_until=T + L, max_attempts=5)
    assert identity is not None
    return identity


def writes(*items: Any) -> AttemptEffects:
    """``writes((key, value, version), ...)`` as effects."""
    return AttemptEffects(state=tuple(StateWrite(k, v, n) for k, v, n in items))


def test_the_shipped_stores_have_the_whole_group(store: Any) -> None:
    assert "state" in StoreCapabilities.of(store)
    assert set(STATE_METHODS) <= set(dir(StateStore))
    assert StorePort(store, component="test", fenced=True).has_state


def test_a_grouped_settle_lands_the_fresh_writes_and_stops_only_the_stale_completion(
    store: Any,
) -> None:
    assert store.write_state([StateWrite(USER, "u1", 0)], T) is None
    fresh, stale, plain = claimed(store, 1), claimed(store, 2), claimed(store, 3)
    landed = settle_many(store, [(fresh, Completed(T + 1)), (stale, Completed(T + 1)), (plain, Completed(T + 1))],
        effects={fresh: writes((USER, "u2", 1)),
                 stale: AttemptEffects(calls=(OutboxCall("sendMessage", "{}", 1, 0),),
                                       state=(StateWrite(CHAT, "c", 0),
                                              StateWrite(USER, "lost", 1)))},
    )
    assert landed[0] is True and landed[2] is True
    assert isinstance(landed[1], StateConflict) and landed[1].keys == (USER,)
    assert not landed[1]  # reads as "did not land" where only that is asked
    assert store.read_state([USER, CHAT]) == {USER: StateEntry("u2", 2)}
    assert store.owns(stale, T + 2) and not store.owns(fresh, T + 2)
    assert store.list_calls() == []
    # the same attempt completes from fresh versions: everything of it lands once
    assert settle_many(store, [(stale, Completed(T + 3))], effects={stale: writes((CHAT, "c", 0), (USER, "u3", 2))}
    ) == [True]
    assert store.read_state([USER, CHAT]) == {USER: StateEntry("u3", 3), CHAT: StateEntry("c", 1)}


def test_a_grouped_settle_writes_nothing_of_a_completion_that_lost_its_claim(
    store: Any,
) -> None:
    """In one group: inserts and updates of several owners land with their completions;
    the writes of an attempt whose claim moved on (its versions still current) land nowhere,
    and the group still commits."""
    other = StateKey("user", "", "8")
    assert store.write_state([StateWrite(CHAT, "c1", 0)], T) is None
    first, second = claimed(store, 1), claimed(store, 2)
    lost = AttemptIdentity(3, 1, "0" * 32)  # never claimed with this id
    assert store.add(3, '{"update_id": 3}', T)
    assert store.claim_owned(3, now=T, lease_until=T + L, max_attempts=5) not in (None, lost)
    landed = settle_many(store, [(first, Completed(T + 1)), (lost, Completed(T + 1)), (second, Completed(T + 1))],
        effects={first: writes((USER, "u1", 0), (CHAT, "c2", 1)),
                 lost: writes((other, "never", 0)),
                 second: writes((StateKey("chat", "", "-6"), "c", 0))},
    )
    assert landed == [True, False, True]
    assert store.read_state([USER, CHAT, other, StateKey("chat", "", "-6")]) == {
        USER: StateEntry("u1", 1), CHAT: StateEntry("c2", 2),
        StateKey("chat", "", "-6"): StateEntry("c", 1),
    }


@pytest.mark.parametrize("moved", ["updated", "inserted"])
def test_a_moved_version_among_disjoint_writers_stops_only_its_own_completion(
    store: Any, moved: str
) -> None:
    """The attempts of a group write different keys; one key moved after its attempt read
    it (updated, or inserted where the attempt saw none): that attempt alone gets its
    StateConflict and keeps its claim; the others' completions and writes land once."""
    other = StateKey("user", "", "8")
    assert store.write_state([StateWrite(CHAT, "c1", 0)], T) is None
    if moved == "updated":
        assert store.write_state([StateWrite(USER, "u1", 0)], T) is None
        stale_write, current = (USER, "lost", 1), StateEntry("moved", 2)
        assert store.write_state([StateWrite(USER, "moved", 1)], T) is None
    else:
        stale_write, current = (USER, "lost", 0), StateEntry("moved", 1)
        assert store.write_state([StateWrite(USER, "moved", 0)], T) is None
    stale, fresh, plain = claimed(store, 1), claimed(store, 2), claimed(store, 3)
    landed = settle_many(store, [(stale, Completed(T + 1)), (fresh, Completed(T + 1)), (plain, Completed(T + 1))],
        effects={stale: writes(stale_write), fresh: writes((CHAT, "c2", 1), (other, "o", 0))},
    )
    assert isinstance(landed[0], StateConflict) and landed[0].keys == (USER,)
    assert landed[1:] == [True, True]
    assert store.read_state([USER, CHAT, other]) == {
        USER: current, CHAT: StateEntry("c2", 2), other: StateEntry("o", 1)}
    assert store.owns(stale, T + 2)
    assert not store.owns(fresh, T + 2) and not store.owns(plain, T + 2)


def test_invalid_writes_are_refused_before_anything_settles(store: Any) -> None:
    identity = claimed(store, 1)
    for bad, error in (
        (writes((StateKey("users", "", "1"), "x", 0)), ValueError),
        (writes((USER, "x", -1)), ValueError),
        (writes((USER, "x", 0), (USER, "y", 0)), ValueError),
        (AttemptEffects(state=(StateWrite(USER, b"x", 0),)), TypeError),  # type: ignore[arg-type]
    ):
        with pytest.raises(error):
            settle_many(store, [(identity, Completed(T + 1))], effects={identity: bad})
        assert store.owns(identity, T + 1)
    assert store.list_state() == []


def test_a_read_of_many_keys_is_one_call(store: Any) -> None:
    keys = [StateKey("user", "", str(i)) for i in range(700)]
    assert store.write_state([StateWrite(k, k.key, 0) for k in keys[::2]], T) is None
    found = store.read_state(keys + keys[:3])
    assert set(found) == set(keys[::2]) and all(found[k].value == k.key for k in found)


def _caller_connection(kind: str, store: Any, request: pytest.FixtureRequest) -> Any:
    if kind == "sqlite":
        conn = sqlite3.connect(store.path, isolation_level=None)
    else:
        conn = psycopg2.connect(request.getfixturevalue("pg_dsn"))
    request.addfinalizer(conn.close)
    return conn


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_write_effects_writes_in_the_callers_transaction_and_refuses_a_moved_version(
    store: Any, store_kind: str, request: pytest.FixtureRequest
) -> None:
    identity = claimed(store, 1)
    conn = _caller_connection(store_kind, store, request)
    if store_kind == "sqlite":
        conn.execute("BEGIN IMMEDIATE")
    assert store.complete_owned(identity, T + 5, connection=conn)
    store.write_effects(identity, writes((USER, "a", 0)), T + 5, connection=conn)
    conn.rollback()
    assert store.read_state([USER]) == {} and store.owns(identity, T + 5)
    if store_kind == "sqlite":
        conn.execute("BEGIN IMMEDIATE")
    assert store.complete_owned(identity, T + 6, connection=conn)
    store.write_effects(identity, writes((USER, "a", 0)), T + 6, connection=conn)
    assert store.read_state([USER]) == {}  # not committed by the store
    conn.commit()
    assert store.read_state([USER]) == {USER: StateEntry("a", 1)}
    # a moved version: nothing of that call is written, even when the caller commits anyway
    other = claimed(store, 2)
    if store_kind == "sqlite":
        conn.execute("BEGIN IMMEDIATE")
    with pytest.raises(StateConflictError) as raised:
        store.write_effects(other, writes((CHAT, "c", 0), (USER, "b", 0)), T + 7,
                            connection=conn)
    assert raised.value.keys == (USER,) and "retry" in str(raised.value)
    conn.commit()  # the transaction is still usable
    assert store.read_state([USER, CHAT]) == {USER: StateEntry("a", 1)}


def test_memory_write_effects_follows_its_transaction_block() -> None:
    store = MemoryUpdateStore()
    identity = claimed(store, 1)
    with pytest.raises(RuntimeError):
        with store.transaction() as conn:
            store.write_effects(identity, writes((USER, "a", 0)), T, connection=conn)
            assert store.read_state([USER]) == {}  # staged: lands with the block
            raise RuntimeError("rolled back")
    assert store.read_state([USER]) == {}
    with store.transaction() as conn:
        store.write_effects(identity, writes((USER, "a", 0)), T, connection=conn)
        with pytest.raises(StateConflictError):
            store.write_effects(identity, writes((USER, "b", 0)), T, connection=conn)
    assert store.read_state([USER]) == {USER: StateEntry("a", 1)}


def test_two_store_objects_racing_on_one_key_never_both_land(
    shared_stores: Callable[[], Any],
) -> None:
    """Two store objects on one database (two PostgreSQL pools, two SQLite connections),
    four threads each, rounds in which every thread completes its own update writing the
    same key from the version all of them read: exactly one completion per round lands."""
    stores = [shared_stores(), shared_stores()]
    threads_per_store, rounds = 4, 6
    count = threads_per_store * len(stores)
    identities = [claimed(stores[0], 1 + i) for i in range(count * rounds)]
    barrier = threading.Barrier(count, timeout=60)
    outcomes: List[List[Any]] = [[] for _ in range(rounds)]
    errors: List[BaseException] = []
    lock = threading.Lock()

    def worker(index: int) -> None:
        store = stores[index % len(stores)]
        try:
            for round_ in range(rounds):
                entry = store.read_state([USER]).get(USER)
                version = 0 if entry is None else entry.version
                barrier.wait()
                identity = identities[round_ * count + index]
                got = settle_many(store, [(identity, Completed(T + 1))],
                    effects={identity: writes((USER, f"{round_}:{index}", version))})[0]
                with lock:
                    outcomes[round_].append(got)
                barrier.wait()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
    for round_, got in enumerate(outcomes):
        assert sum(1 for g in got if g is True) == 1, (round_, got)
        assert all(isinstance(g, StateConflict) for g in got if g is not True), got
    entry = stores[1].read_state([USER])[USER]
    assert entry.version == rounds and entry.value is not None
    assert entry.value.startswith(f"{rounds - 1}:")


def test_a_long_table_name_gets_a_short_distinct_state_name(tmp_path: Path) -> None:
    long_a, long_b = "a" * 60 + "xyz", "a" * 60 + "xyw"
    names = {state_table_name(long_a), state_table_name(long_b)}
    assert len(names) == 2 and all(len(name) <= 63 for name in names)
    assert state_table_name("telegram_updates") == "telegram_updates_persistence"
    store = SQLiteUpdateStore(str(tmp_path / "long.db"), table=long_a)
    try:
        assert store.write_state([StateWrite(USER, "x", 0)], T) is None
        assert store.list_state() == [(USER, StateEntry("x", 1))]
    finally:
        store.close()


def test_an_sqlite_file_from_before_the_state_table_gets_it_when_opened(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    SQLiteUpdateStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute('DROP TABLE "telegram_updates_persistence"')
        conn.execute("""INSERT INTO telegram_updates (update_id, body, state, attempts, due_at,
                        received_at) VALUES (5, '{}', 'pending', 0, 1, 1)""")
    store = SQLiteUpdateStore(path)
    try:
        identity = store.claim_owned(5, now=T, lease_until=T + L, max_attempts=3)
        assert identity is not None
        assert settle_many(store, [(identity, Completed(T))], effects={identity: writes((USER, "x", 0))}) == [True]
        assert store.read_state([USER]) == {USER: StateEntry("x", 1)}
    finally:
        store.close()


def test_postgres_schema_and_migrate_create_the_state_table(
    pg_dsn: str, pg_table: str, tmp_path: Path
) -> None:
    assert f'"{state_table_name(pg_table)}"' in postgres_update_store_schema(pg_table)
    creator = PostgresUpdateStore(pg_dsn, table=pg_table)
    creator.due(now=T, pending_before=T, limit=1)  # the schema is made on first use
    creator.close()
    conn = psycopg2.connect(pg_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE "{state_table_name(pg_table)}"')
        conn.commit()
    finally:
        conn.close()
    migrated = subprocess.run(
        [sys.executable, "-m", "ptb_fence", "migrate", "--store", pg_dsn, "--table", pg_table],
        capture_output=True, text=True, timeout=120,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert f"created the state table {state_table_name(pg_table)!r}" in migrated.stdout
    store = PostgresUpdateStore(pg_dsn, table=pg_table, create_table=False)
    try:
        identity = claimed(store, 1)
        assert settle_many(store, [(identity, Completed(T + 1))], effects={identity: writes((USER, "x", 0))}) == [True]
        assert store.read_state([USER]) == {USER: StateEntry("x", 1)}
    finally:
        store.close()


# -- the port and the group ----------------------------------------------------------------------
def test_the_port_reads_writes_and_passes_state_effects() -> None:
    store = MemoryUpdateStore()
    port = StorePort(store, component="test", fenced=True)
    assert port.write_state([StateWrite(USER, "x", 0)], T) is None
    assert port.read_state([USER, CHAT]) == {USER: StateEntry("x", 1)}
    assert port.read_state([]) == {}
    assert port.list_state(kind="user") == [(USER, StateEntry("x", 1))]
    identity = claimed(store, 1)
    assert port.settle_owned_many([(identity, Completed(T))],
                                  effects={identity: writes((USER, "y", 1))}) == [True]
    assert store.read_state([USER]) == {USER: StateEntry("y", 2)}


def test_the_port_without_state_refuses_state_writes_and_reads_nothing() -> None:
    store = FencedOnlyStore()
    port = StorePort(store, component="test", fenced=True)
    assert not port.has_state
    identity = claimed(store, 1)
    with pytest.raises(TypeError):
        port.settle_owned_many([(identity, Completed(T))],
                               effects={identity: writes((USER, "x", 0))})
    assert store.owns(identity, T)  # refused before anything was settled
    with pytest.raises(TypeError, match="state"):
        port.write_state([StateWrite(USER, "x", 0)], T)
    assert port.read_state([USER]) == {} and port.list_state() == []


def test_the_group_is_all_or_nothing_and_needs_the_outbox() -> None:
    (group,) = [g for g in CAPABILITY_GROUPS if g.name == "state"]
    assert group.methods == STATE_METHODS
    assert set(group.requires) == {"fenced", "outbox"}

    class Partial(MemoryUpdateStore):
        list_state = None  # type: ignore[assignment]

    with pytest.raises(TypeError, match="state"):
        StoreCapabilities.of(Partial())

    class StateWithoutOutbox(MemoryUpdateStore):
        pass

    for name in OUTBOX_METHODS:
        setattr(StateWithoutOutbox, name, None)
    with pytest.raises(TypeError, match="without outbox"):
        StoreCapabilities.of(StateWithoutOutbox())


def test_the_values_are_frozen_and_a_conflict_is_falsy() -> None:
    key = StateKey("bot")
    assert (key.name, key.key) == ("", "") and AttemptEffects().state == ()
    with pytest.raises(Exception):
        key.kind = "user"  # type: ignore[misc]
    conflict = StateConflict((key,))
    assert not conflict and conflict != StateConflict((USER,))
    assert "bot" in str(StateConflictError((key,)))


def test_settle_and_claim_lands_the_fresh_writes_and_stops_only_the_stale_completion(
    store: Any,
) -> None:
    """The combined settle-and-claim (the slots completions free are claimed in their commit)
    treats state writes as the other settles do."""
    from ptb_fence import ClaimTerms

    fresh, stale = claimed(store, 1), claimed(store, 2)
    assert store.add(3, '{"update_id": 3}', T)
    got = store.commit(Batch(
        ClaimTerms(now=T + 1, lease_until=T + L, max_attempts=5),
        settlements=((fresh, Completed(T + 1)), (stale, Completed(T + 1))), claims=(3,),
        effects={fresh: writes((USER, "a", 0)), stale: writes((USER, "b", 0))},
    ))
    landed, identities = got.landed, got.claims
    assert landed[0] is True and isinstance(landed[1], StateConflict)
    assert identities[0] is not None and identities[0].update_id == 3
    assert store.read_state([USER]) == {USER: StateEntry("a", 1)}
    assert store.owns(stale, T + 2)
    port = StorePort(store, component="test", fenced=True)
    again = port.commit(Batch(
        ClaimTerms(now=T + 3, lease_until=T + L, max_attempts=5),
        settlements=((stale, Completed(T + 3)),), effects={stale: writes((USER, "c", 0))},
    )).landed
    assert isinstance(again[0], StateConflict) and again[0].keys == (USER,)


def test_sqlite_state_reads_search_the_key_never_scan_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every statement the SQLite store runs on the state table to read rows (``read_state``,
    and the version check of grouped completions) finds each key through the primary key: a
    scan of the whole table per read would grow with every user the bot has seen."""
    seen: List[str] = []
    connect = sqlite3.connect

    def tracing(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(seen.append)
        return conn

    monkeypatch.setattr(sqlite3, "connect", tracing)
    path = str(tmp_path / "s.db")
    store = SQLiteUpdateStore(path)
    try:
        keys = [StateKey("user", "", str(n)) for n in range(40)] + [
            StateKey("conversation", "talk", f"[{n},{n}]") for n in range(40)]
        assert store.write_state([StateWrite(k, "v", 0) for k in keys], T) is None
        a, b = claimed(store, 1), claimed(store, 2)
        seen.clear()
        assert set(store.read_state(keys + [CHAT])) == set(keys)
        landed = settle_many(store, [(a, Completed(T + 1)), (b, Completed(T + 1))],
            effects={a: writes((keys[0], "w", 1)), b: writes((keys[41], "w", 1))},
        )
        assert landed == [True, True]
    finally:
        store.close()
    table = state_table_name("telegram_updates")
    reads = [sql for sql in seen if sql.lstrip().upper().startswith("SELECT")
             and f'"{table}"' in sql]
    assert reads, seen
    plain = connect(path)
    try:
        for sql in reads:
            plan = " | ".join(row[3] for row in plain.execute("EXPLAIN QUERY PLAN " + sql))
            assert f"SCAN {table}" not in plan, (sql[:120], plan)
            assert "SEARCH" in plan, (sql[:120], plan)
    finally:
        plain.close()


def test_sqlite_reads_many_keys_of_several_kinds_in_one_statement(tmp_path: Path) -> None:
    """Keys of several kinds and names, more than one statement may bind as parameters:
    every row is found, none twice, absent keys left out (one JSON parameter)."""
    store = SQLiteUpdateStore(str(tmp_path / "s.db"))
    try:
        keys = ([StateKey("user", "", str(n)) for n in range(130)]
                + [StateKey("chat", "", str(-n)) for n in range(70)]
                + [StateKey("conversation", "talk", f"[{n}]") for n in range(90)]
                + [StateKey("conversation", "other", f"[{n}]") for n in range(5)])
        assert store.write_state([StateWrite(k, f"v{i}", 0) for i, k in enumerate(keys)],
                                 T) is None
        absent = [StateKey("user", "", "absent"), StateKey("bot", "", "")]
        got = store.read_state(keys + absent + keys[:10])
        assert got == {k: StateEntry(f"v{i}", 1) for i, k in enumerate(keys)}
    finally:
        store.close()


def test_sqlite_grouped_writes_land_once_each(tmp_path: Path) -> None:
    """A grouped settle with many checked inserts and updates (one JSON parameter each):
    every write lands once, in its row."""
    store = SQLiteUpdateStore(str(tmp_path / "s.db"))
    try:
        old = [StateKey("user", "", str(n)) for n in range(25)]
        assert store.write_state([StateWrite(k, "old", 0) for k in old], T) is None
        attempts = [claimed(store, n + 1) for n in range(25)]
        landed = settle_many(store, [(a, Completed(T + 1)) for a in attempts],
            effects={a: writes((old[n], f"u{n}", 1), (StateKey("chat", "", str(-n)), f"c{n}", 0))
                     for n, a in enumerate(attempts)},
        )
        assert landed == [True] * 25
        got = store.read_state(old + [StateKey("chat", "", str(-n)) for n in range(25)])
        assert got == {**{old[n]: StateEntry(f"u{n}", 2) for n in range(25)},
                       **{StateKey("chat", "", str(-n)): StateEntry(f"c{n}", 1)
                          for n in range(25)}}
    finally:
        store.close()


def test_state_reads_return_keys_and_values_exactly(store: Any) -> None:
    """Keys and values of any text (quotes, backslashes, newlines, characters outside the
    BMP) and a tombstone come back exactly as written (the SQLite store carries a read's rows
    as one JSON text)."""
    odd = StateKey("conversation", 'n"a\\me', '["\\u00e9", "\\"q\\"", "😀\\n"]')
    plain = StateKey("user", "", "7")
    gone = StateKey("chat", "", "-100")
    value = 'pickle:é"\\\n😀' + "x" * 5000
    assert store.write_state([StateWrite(odd, value, 0), StateWrite(plain, "1", 0),
                              StateWrite(gone, "v", 0)], T) is None
    assert store.write_state([StateWrite(gone, None, 1)], T + 1) is None
    got = store.read_state([odd, plain, gone, StateKey("user", "", "8")])
    assert got == {odd: StateEntry(value, 1), plain: StateEntry("1", 1),
                   gone: StateEntry(None, 2)}
    assert all(type(entry.version) is int for entry in got.values())
