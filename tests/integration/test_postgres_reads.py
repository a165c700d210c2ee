"""PostgreSQL single-statement reads (the outbox's listings, ``read_state``) run in autocommit
mode: no ``BEGIN``/``COMMIT`` around them, the pooled connection handed back as it was lent
(a caller's pool of connections not in autocommit stays so, and idle), and a connection
broken under a read is replaced and the read retried. The state reads and the grouped
completions' state writes find their rows through the primary key on a table not analyzed."""

from __future__ import annotations

from typing import Any, Dict, List

import psycopg2
import psycopg2.extensions
import psycopg2.pool

from ptb_fence import Batch, PostgresUpdateStore, StateKey, StateWrite
from store_support import fresh_table_name


def _counting_pool(dsn: str, commits: List[int]) -> Any:
    class Connection(psycopg2.extensions.connection):  # type: ignore[misc]
        def commit(self) -> None:
            commits.append(1)
            super().commit()

    return psycopg2.pool.ThreadedConnectionPool(1, 4, dsn, connection_factory=Connection)


def _add_users(conn: Any, table: str, first: int, last: int) -> None:
    """Insert user rows ``first``..``last`` (value ``'v'``, version 1) into ``table``'s state
    table in one statement, committed, leaving the table not analyzed."""
    from ptb_fence.stores._state_sql import state_table_name

    with conn, conn.cursor() as cur:
        cur.execute(
            f'INSERT INTO "{state_table_name(table)}" '  # noqa: S608
            "(kind, name, key, value, version, updated_at) "
            "SELECT 'user', '', n::text, 'v', 1, 1 FROM generate_series(%s, %s) n",
            (first, last))


def test_reads_commit_nothing_and_hand_the_connection_back_as_lent(
    pg_dsn: str, pg_tables: List[str]
) -> None:
    table = fresh_table_name()
    pg_tables.append(table)
    commits: List[int] = []
    pool = _counting_pool(pg_dsn, commits)
    store = PostgresUpdateStore(pool, table=table, pool_size=4)
    key = StateKey("user", "", "7")
    try:
        assert store.write_state([StateWrite(key, "v1", 0)], 1) is None
        commits.clear()
        for _ in range(5):
            assert store.read_state([key])[key].value == "v1"
            assert store.list_calls(limit=10) == []
            assert store.claimed_calls("s", limit=10) == []
        assert commits == [], f"{len(commits)} commits for 15 reads"
        conn = pool.getconn()
        try:  # the pool's connection: as the pool made it, and not inside a transaction
            assert conn.autocommit is False
            assert conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
        finally:
            pool.putconn(conn)
        assert store.write_state([StateWrite(key, "v2", 1)], 2) is None  # writes still commit
        assert commits and store.read_state([key])[key].value == "v2"
    finally:
        store.close()
        pool.closeall()


def test_a_read_on_a_connection_broken_meanwhile_is_retried(
    pg_dsn: str, pg_tables: List[str]
) -> None:
    table = fresh_table_name()
    pg_tables.append(table)
    store = PostgresUpdateStore(pg_dsn, table=table, pool_size=1)
    key = StateKey("chat", "", "-5")
    try:
        assert store.write_state([StateWrite(key, "x", 0)], 1) is None
        # the one pooled connection's backend is terminated from another connection
        with store.transaction() as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                (pid,) = cur.fetchone()
        killer = psycopg2.connect(pg_dsn)
        try:
            killer.autocommit = True
            with killer.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
        finally:
            killer.close()
        assert store.read_state([key])[key].value == "x"  # on a new connection
    finally:
        store.close()


def test_state_reads_search_each_key_even_on_a_table_not_analyzed(
    pg_dsn: str, pg_tables: List[str]
) -> None:
    """A state read (``read_state`` and the completions' version check) looks each key up
    in the primary key by kind, name and key, whatever the planner knows of the table: on a
    fresh table of 20,000 users, not yet analyzed, ``key = ANY(...)`` had been planned as a
    scan of every user row filtered by the array."""
    from ptb_fence.stores._state_sql import read_params
    from ptb_fence.stores.postgres._sql import statements

    table = fresh_table_name()
    pg_tables.append(table)
    store = PostgresUpdateStore(pg_dsn, table=table)
    users = [StateKey("user", "", str(n)) for n in range(20_000)]
    try:
        assert store.write_state([StateWrite(k, "v", 0) for k in users[:3]], 1) is None
        conn = psycopg2.connect(pg_dsn)
        try:
            _add_users(conn, table, 3, 19_999)
            asked = users[::700] + [StateKey("conversation", "talk", "[1,1]"), StateKey("bot")]
            with conn, conn.cursor() as cur:
                cur.execute("EXPLAIN " + statements(table)["state_read"], read_params(asked))
                plan = "\n".join(row[0] for row in cur.fetchall())
        finally:
            conn.close()
        assert "Seq Scan" not in plan and "Filter" not in plan, plan
        searches = [line for line in plan.splitlines() if "Index Cond" in line]
        assert len(searches) == 1, plan  # one search per key, the key in it
        assert all("AND (key = k" in line for line in searches), plan
        got = store.read_state(asked)
        assert set(got) == set(users[::700]) and all(e.value == "v" for e in got.values())
    finally:
        store.close()


def test_grouped_state_writes_search_each_key_on_a_table_not_analyzed(
    pg_dsn: str, pg_tables: List[str]
) -> None:
    """A grouped completion's state updates (one statement with the completions) find each
    row through the primary key on a fresh table of 60,000 rows, not yet analyzed, and land
    where their completions matched."""
    from ptb_fence import AttemptEffects, Completed
    from ptb_fence.stores.postgres._sql import statements

    table = fresh_table_name()
    pg_tables.append(table)
    store = PostgresUpdateStore(pg_dsn, table=table)
    try:
        assert store.write_state([StateWrite(StateKey("user", "", "0"), "v", 0)], 1) is None
        conn = psycopg2.connect(pg_dsn)
        try:
            _add_users(conn, table, 1, 59_999)
            ids = list(range(1, 31))
            params: Dict[str, Any] = {
                "update_ids": ids, "attempts": [1] * 30, "claim_ids": ["c"] * 30,
                "ats": [5] * 30,
                "w_update_ids": ids, "w_attempts": [1] * 30, "w_claim_ids": ["c"] * 30,
                "w_kinds": ["user"] * 30, "w_names": [""] * 30,
                "w_keys": [str(n * 100) for n in range(30)], "w_values": ["w"] * 30,
                "w_ats": [5] * 30, "w_versions": [1] * 30,
            }
            with conn, conn.cursor() as cur:
                cur.execute("EXPLAIN " + statements(table)["complete_owned_writing"], params)
                plan = "\n".join(row[0] for row in cur.fetchall())
        finally:
            conn.close()
        state_plan = plan[plan.index("CTE updated"):]
        assert "Seq Scan" not in state_plan, plan
        assert "_persistence_pkey" in state_plan and "Index Cond" in state_plan, plan
        identities = []
        for n in range(1, 4):
            assert store.add(n, '{"update_id": %d}' % n, 1)
            identity = store.claim_owned(n, now=1, lease_until=60_000, max_attempts=5)
            assert identity is not None
            identities.append(identity)
        keys = [StateKey("user", "", str(n * 100)) for n in range(1, 4)]
        landed = store.commit(Batch(
            settlements=tuple((i, Completed(2)) for i in identities),
            effects={i: AttemptEffects(state=(StateWrite(k, "new", 1),))
                     for i, k in zip(identities, keys)},
        )).landed
        assert landed == (True, True, True)
        assert {k: e.value for k, e in store.read_state(keys).items()} == dict.fromkeys(
            keys, "new")
    finally:
        store.close()
