"""The pgqueuer reference rows: enqueue, then dequeue + complete, of the same number of jobs.

pgqueuer is a benchmark extra (``pip install -e '.[bench]'``), never a runtime dependency. It
runs on the same PostgreSQL database with its asyncpg driver. The parent gives every child a
unique ``PGQUEUER_PREFIX`` so each row installs its own pgqueuer tables (and uninstalls them).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional

from _common import BATCH, chunks, median, server_commits, update_dicts


def pgqueuer_problem() -> Optional[str]:
    """Why the pgqueuer rows cannot run here, or None."""
    try:
        import asyncpg  # type: ignore[import-untyped]  # noqa: F401
        import pgqueuer  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return (
            f"{type(exc).__name__}: {exc} (install the benchmark extra: "
            "pip install -e '.[bench]')"
        )
    return None


async def _one_run(cfg: Dict[str, Any], n: int, measure_server: bool) -> Dict[str, Any]:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    concurrency = int(cfg["concurrency"])
    dsn = cfg["dsn"]
    payloads = [json.dumps(d).encode() for d in update_dicts(n)]
    admin_dsn, bench_db = cfg.get("admin_dsn"), cfg.get("bench_db")
    before = server_commits(admin_dsn, bench_db) if (measure_server and bench_db) else None

    producer = await asyncpg.connect(**_connect_kwargs(dsn))
    consumer = await asyncpg.connect(**_connect_kwargs(dsn))
    try:
        queries = Queries(AsyncpgDriver(producer))
        t0 = time.perf_counter()
        for batch in chunks(payloads, BATCH):
            size = len(batch)
            await queries.enqueue(["bench"] * size, list(batch), [0] * size)
        t1 = time.perf_counter()

        qm = QueueManager(Queries(AsyncpgDriver(consumer)))
        done = [0]

        if concurrency <= 1:
            limit, batch_size, max_tasks = 1, 1, None
        else:
            limit, batch_size, max_tasks = 0, int(cfg.get("pgq_batch", 16)), concurrency

        @qm.entrypoint("bench", concurrency_limit=limit)
        async def bench(job: Job) -> None:
            done[0] += 1

        t2 = time.perf_counter()
        await qm.run(
            batch_size=batch_size,
            mode=_drain_mode(),
            max_concurrent_tasks=max_tasks,
            dequeue_timeout=timedelta(seconds=1),
        )
        t3 = time.perf_counter()
        left = await producer.fetchval(f"SELECT count(*) FROM {queries.qbe.settings.queue_table}")
        if done[0] != n or left:
            raise RuntimeError(f"pgqueuer: {done[0]}/{n} jobs ran, {left} left in the queue")
    finally:
        await producer.close()
        await consumer.close()
    after = server_commits(admin_dsn, bench_db) if before is not None else None
    return {
        "n": n,
        "enqueue_seconds": t1 - t0,
        "drain_seconds": t3 - t2,
        "rate": n / ((t1 - t0) + (t3 - t2)),
        "drain_rate": n / (t3 - t2),
        "server_commits": None if before is None or after is None else after - before,
    }


def _connect_kwargs(dsn: str) -> Dict[str, Any]:
    """asyncpg keyword arguments for a libpq DSN (asyncpg itself takes only URIs)."""
    import psycopg2.extensions

    params = psycopg2.extensions.parse_dsn(dsn)
    mapping = {"host": "host", "port": "port", "user": "user", "password": "password", "dbname": "database"}
    kwargs: Dict[str, Any] = {}
    for key, name in mapping.items():
        if params.get(key):
            kwargs[name] = int(params[key]) if key == "port" else params[key]
    return kwargs


def _drain_mode() -> Any:
    from pgqueuer.types import QueueExecutionMode

    return QueueExecutionMode.drain


async def _measure(cfg: Dict[str, Any]) -> Dict[str, Any]:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def fresh_run(n: int, measure_server: bool) -> Dict[str, Any]:
        # fresh pgqueuer tables per run (installed before, uninstalled after; not timed)
        setup = await asyncpg.connect(**_connect_kwargs(cfg["dsn"]))
        queries = Queries(AsyncpgDriver(setup))
        try:
            await queries.install()
            try:
                return await _one_run(cfg, n, measure_server)
            finally:
                await queries.uninstall()
        finally:
            await setup.close()

    warm = int(cfg.get("warmup", 0))
    if warm:
        await fresh_run(warm, measure_server=False)
    runs: List[Dict[str, Any]] = []
    for _ in range(int(cfg["runs"])):
        runs.append(await fresh_run(int(cfg["updates"]), measure_server=True))
    total = sum(r["n"] for r in runs)
    server = [r["server_commits"] for r in runs if r.get("server_commits") is not None]
    rates = [r["rate"] for r in runs]
    drain = [r["drain_rate"] for r in runs]
    return {
        "rates": rates,
        "median": median(rates),
        "drain_rates": drain,
        "drain_median": median(drain),
        "handled": total,
        "server_commits_per_update": (sum(server) / total) if len(server) == len(runs) else None,
        "latency": None,
        "notes": [
            "enqueue (batches of 100, one statement each) then dequeue+complete with "
            + (
                "concurrency_limit=1, batch_size=1"
                if int(cfg["concurrency"]) <= 1
                else f"batch_size={cfg.get('pgq_batch', 16)}, max_concurrent_tasks={cfg['concurrency']}"
            )
            + " (QueueManager.run, drain mode)"
        ],
    }


def measure_pgqueuer(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Run the pgqueuer row (enqueue + dequeue + complete of ``updates`` jobs, ``runs`` times)."""
    problem = pgqueuer_problem()
    if problem:
        return {"skipped": problem}
    return asyncio.run(_measure(cfg))
