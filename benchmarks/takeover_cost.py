"""What the once-per-second ``take_over_dead`` sweep costs on PostgreSQL.

Usage (from the repository root)::

    python benchmarks/takeover_cost.py                    # 100,000 rows; 0, 10, 100 instances
    python benchmarks/takeover_cost.py --rows 20000 --calls 50

Builds an update table of ``--rows`` rows (by default 99 % completed, 0.5 % pending and 0.5 %
processing, as a bot with the default retention looks; ``--every 20``: 5 % each), registers 0, 10 and 100 *live* instances (their advisory
locks held by one helper session, their rows in ``ptb_fence_instances``, the processing rows
spread over them), then, through a :class:`ptb_fence.PostgresUpdateStore` holding liveness as a
running process does, calls ``take_over_dead`` ``--calls`` times and reports: the statements it
sends per call (counted by a cursor factory: the liveness probe, the takeover statement, and the
commit), the median and 95th percentile of its duration, and the plan of the takeover statement
(``EXPLAIN (ANALYZE, BUFFERS)``: the scan it makes on the update table). A last row kills one
instance (its lock released, its row kept) to show the cost when there is something to take
over. PostgreSQL comes from ``PTB_FENCE_POSTGRES_DSN``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import psycopg2  # noqa: E402
import psycopg2.extensions  # noqa: E402

from ptb_fence import PostgresUpdateStore  # noqa: E402
from ptb_fence.stores.postgres._sql import CLASS_ID, INSTANCES_TABLE, instance_key, statements  # noqa: E402

DSN = os.environ.get("PTB_FENCE_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
COUNT: Dict[str, int] = {"statements": 0}


class CountingCursor(psycopg2.extensions.cursor):
    """Counts every statement the store sends."""

    def execute(self, query: Any, vars: Any = None) -> Any:  # noqa: A002 - psycopg2's name
        COUNT["statements"] += 1
        return super().execute(query, vars)


def _counting_connect(original: Any) -> Any:
    def connect(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cursor_factory", CountingCursor)
        conn = original(*args, **kwargs)
        commit = conn.commit

        return _CountingConnection(conn, commit)

    return connect


class _CountingConnection:
    """A connection whose ``commit`` is counted as a round trip too."""

    def __init__(self, conn: Any, commit: Any) -> None:
        object.__setattr__(self, "_conn", conn)

    def commit(self) -> None:
        COUNT["statements"] += 1
        self._conn.commit()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._conn, name, value)


def build(admin: Any, table: str, rows: int, instances: List[str], me: str, every: int) -> None:
    with admin.cursor() as cur:
        cur.execute(f'TRUNCATE "{table}"')
        cur.execute(f"DELETE FROM {INSTANCES_TABLE} WHERE table_name = %s AND instance <> %s",
                    (table, me))
        now = int(time.time() * 1000)
        # one row in ``every`` pending, one processing (owned by the instances, if any), the
        # rest completed
        cur.execute(
            f"""INSERT INTO "{table}" (update_id, body, state, attempts, due_at, received_at,
                   settled_at, claim_id, instance)
            SELECT g, '{{"update_id": ' || g || '}}',
                   CASE WHEN g %% %(every)s = 0 THEN 'pending' WHEN g %% %(every)s = 1 THEN 'processing'
                        ELSE 'completed' END,
                   CASE WHEN g %% %(every)s = 0 THEN 0 ELSE 1 END,
                   CASE WHEN g %% %(every)s = 1 THEN %(lease)s ELSE %(now)s END,
                   %(now)s,
                   CASE WHEN g %% %(every)s > 1 THEN %(now)s END,
                   md5(g::text),
                   CASE WHEN g %% %(every)s = 1 AND %(n)s > 0
                        THEN (%(names)s::TEXT[])[1 + (g / %(every)s) %% GREATEST(%(n)s, 1)] END
            FROM generate_series(1, %(rows)s) AS g""",
            {"now": now, "lease": now + 3_600_000, "rows": rows, "n": len(instances),
             "names": instances or [""], "every": every},
        )
        for name in instances:
            cur.execute(
                f"INSERT INTO {INSTANCES_TABLE} (table_name, instance, lock_key, started_at, "
                "seen_at) VALUES (%s, %s, %s, %s, "
                # refreshed a minute ago (after the server started): the lock is tried on each
                # (a frozen instance's row looks like this), the dearest case
                "(extract(epoch FROM statement_timestamp()) * 1000)::BIGINT - 60000)",
                (table, name, instance_key(name), now))
        cur.execute(f'ANALYZE "{table}"')


UNRESTRICTED = ("WHERE EXISTS (SELECT 1 FROM dead)\n      AND ", "WHERE ")
"""Undoes the restriction, to compare with the statement as it was before (``--compare``)."""


def explain(admin: Any, table: str, me: Optional[str], before: bool = False) -> List[str]:
    sql = statements(table)["take_over_dead"]
    if before:
        sql = sql.replace(*UNRESTRICTED)
    with admin.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql,
                    {"table": table, "me": me, "now": int(time.time() * 1000)})
        plan = [r[0] for r in cur.fetchall()]
        cur.execute("ROLLBACK")
    return plan


def server_ms(admin: Any, table: str, me: Optional[str], before: bool, runs: int) -> float:
    """Median server-side execution time (EXPLAIN ANALYZE) of the takeover statement."""
    times = []
    for _ in range(runs):
        plan = explain(admin, table, me, before)
        (line,) = [x for x in plan if x.startswith("Execution Time:")]
        times.append(float(line.split()[2]))
    return statistics.median(times)


def measure(store: Any, calls: int) -> Dict[str, float]:
    durations = []
    before = COUNT["statements"]
    for _ in range(calls):
        began = time.perf_counter()
        store.take_over_dead(now=int(time.time() * 1000))
        durations.append((time.perf_counter() - began) * 1000)
    durations.sort()
    return {
        "statements": (COUNT["statements"] - before) / calls,
        "median": statistics.median(durations),
        "p95": durations[int(0.95 * (len(durations) - 1))],
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--every", type=int, default=200,
                        help="one row in EVERY is processing, one pending (default 200: 0.5 %%)")
    parser.add_argument("--plans", action="store_true", help="print every plan in full")
    parser.add_argument("--compare", type=int, default=30, metavar="RUNS",
                        help="median server-side time of the statement with and without the "
                        "EXISTS restriction, over RUNS alternating EXPLAIN ANALYZE (0: skip)")
    args = parser.parse_args(argv)
    table = f"bench_takeover_{uuid.uuid4().hex[:10]}"
    psycopg2.connect = _counting_connect(psycopg2.connect)  # the store's connections count
    store = PostgresUpdateStore(DSN, table)
    admin = psycopg2.extensions.connection(DSN)
    admin.autocommit = True
    holder = psycopg2.extensions.connection(DSN)  # holds the live instances' advisory locks
    holder.autocommit = True
    try:
        me = store.hold_liveness()
        print(f"{'instances':>9} {'rows':>8} {'statements/call':>16} {'median ms':>10} "
              f"{'p95 ms':>8} {'server ms before/after':>22}  takeover plan on the update table")
        for n in (0, 10, 100, "100+1 dead"):
            count = 100 if n == "100+1 dead" else int(n)
            names = [uuid.uuid4().hex for _ in range(count)]
            build(admin, table, args.rows, names, me, args.every)
            with holder.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock_all()")
                for name in names[1:] if n == "100+1 dead" else names:
                    cur.execute("SELECT pg_advisory_lock(%s, %s)", (CLASS_ID, instance_key(name)))
            plan = explain(admin, table, me)
            compared = ""
            if args.compare:
                old = server_ms(admin, table, me, True, args.compare)
                new = server_ms(admin, table, me, False, args.compare)
                compared = f"{old:.3f}/{new:.3f}"
            figures = measure(store, 1 if n == "100+1 dead" else args.calls)
            scan = [line.strip() for line in plan if table in line and "Scan" in line]
            print(f"{str(n):>9} {args.rows:>8} {figures['statements']:>16.1f} "
                  f"{figures['median']:>10.2f} {figures['p95']:>8.2f} {compared:>22}  "
                  f"{'; '.join(scan) or 'no scan of it'}", flush=True)
            if args.plans:
                print("\n".join("    " + line for line in plan))
    finally:
        store.close()
        with admin.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{table}"')
            cur.execute(f"DELETE FROM {INSTANCES_TABLE} WHERE table_name = %s", (table,))
        admin.close()
        holder.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
