"""Shared fixtures: real PostgreSQL (own table per test), the store of each kind, intakes.

Tests live by layer: ``unit/`` (in memory, no database server, socket or process),
``integration/`` (real stores incl. PostgreSQL, threads, PTB Applications against FakeBotApi),
``processes/`` (real processes; marked ``slow``). Helpers they import are in ``support/``.
"""

from __future__ import annotations

import fcntl
import glob
import os
import tempfile
import time
from typing import Any, Callable, Iterator, List

import pytest

from ptb_fence import MemoryUpdateStore, PostgresUpdateStore, SQLiteUpdateStore, UpdateIntake
from store_support import STORE_KINDS, drop_table, fresh_table_name, new_store, postgres_dsn


def _postgres_problem() -> "str | None":
    import time

    import psycopg2

    # a required server gets time to come back (a test may have restarted it)
    deadline = time.monotonic() + (60 if os.environ.get("PTB_FENCE_REQUIRE_POSTGRES") == "1" else 3)
    while True:
        try:
            conn = psycopg2.connect(postgres_dsn(), connect_timeout=3)
            conn.close()
            return None
        except Exception as exc:  # pragma: no cover - depends on the machine
            if time.monotonic() > deadline:
                return (
                    "PostgreSQL not reachable at PTB_FENCE_POSTGRES_DSN: "
                    f"{type(exc).__name__}: {exc}"
                )
            time.sleep(1)


_PG_PROBLEM: "str | None | bool" = False


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """A reachable PostgreSQL DSN; skips (or fails with PTB_FENCE_REQUIRE_POSTGRES=1)."""
    global _PG_PROBLEM
    if _PG_PROBLEM is False:
        _PG_PROBLEM = _postgres_problem()
    if _PG_PROBLEM:
        if os.environ.get("PTB_FENCE_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{_PG_PROBLEM} (required by PTB_FENCE_REQUIRE_POSTGRES=1)")
        pytest.skip(f"{_PG_PROBLEM}; set PTB_FENCE_POSTGRES_DSN to run PostgreSQL tests")
    return postgres_dsn()


@pytest.fixture
def pg_table(pg_dsn: str) -> Iterator[str]:
    """A fresh table name for this test, dropped afterwards."""
    table = fresh_table_name()
    yield table
    drop_table(pg_dsn, table)


@pytest.fixture
def pg_tables(pg_dsn: str) -> Iterator["list[str]"]:
    """A list that tests append table names to; all are dropped afterwards."""
    tables: "list[str]" = []
    yield tables
    for table in tables:
        drop_table(pg_dsn, table)


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    """The store a test runs on: ``memory``, ``sqlite`` or ``postgres``.

    A test using ``store``, ``shared_stores`` or ``fresh_stores`` runs once per kind (the
    PostgreSQL run skips, or fails with PTB_FENCE_REQUIRE_POSTGRES=1, when the server is not
    reachable: see ``pg_dsn``). For fewer kinds, parametrize it:
    ``@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])``.
    """
    return str(request.param)


@pytest.fixture
def shared_stores(
    store_kind: str, request: pytest.FixtureRequest, tmp_path: Any
) -> Iterator[Callable[[], Any]]:
    """Opens stores of ``store_kind`` on one database, all closed after the test.

    Each call is a new instance on the same SQLite file (``tmp_path/updates.db``) or the same
    PostgreSQL table (this test's ``pg_table``), as processes sharing a database have; a memory
    store is its own database, so every call returns the same instance.
    """
    opened: List[Any] = []
    if store_kind == "memory":
        shared = MemoryUpdateStore()
        opened.append(shared)

        def make() -> Any:
            return shared

    elif store_kind == "sqlite":
        path = str(tmp_path / "updates.db")

        def make() -> Any:
            opened.append(SQLiteUpdateStore(path))
            return opened[-1]

    else:
        dsn = request.getfixturevalue("pg_dsn")
        table = request.getfixturevalue("pg_table")

        def make() -> Any:
            opened.append(PostgresUpdateStore(dsn, table=table))
            return opened[-1]

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(shared_stores: Callable[[], Any]) -> Any:
    """An empty store of ``store_kind`` (the first of ``shared_stores``), closed after the test."""
    return shared_stores()


@pytest.fixture
def fresh_stores(
    store_kind: str, request: pytest.FixtureRequest, tmp_path: Any
) -> Iterator[Callable[[], Any]]:
    """Makes empty stores of ``store_kind``, each its own database (a new SQLite file in
    ``tmp_path``, a new PostgreSQL table dropped after the test); all closed after the test."""
    made: List[Any] = []

    def make() -> Any:
        made.append(new_store(store_kind, request, str(tmp_path / f"fresh{len(made)}.db")))
        return made[-1]

    yield make
    for store in made:
        store.close()


@pytest.fixture
def intakes() -> Iterator[List[UpdateIntake]]:
    """A list of intakes closed after the test (append each one you make)."""
    made: List[UpdateIntake] = []
    yield made
    for intake in made:
        intake.close()


@pytest.fixture(autouse=True)
def _one_test_alone_while_postgres_restarts(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under pytest-xdist, a test marked ``restarts_postgres`` runs while no other test runs.

    Every test holds a shared lock on a file of this test run; the restarting test announces
    itself (a flag file of its worker's: no new test starts while any is there, so it cannot
    starve; two restarting tests on two workers each remove only their own) and takes the lock
    exclusively. Without xdist (one process) there is nothing to exclude.
    """
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    base = os.path.join(tempfile.gettempdir(), f"ptb_fence_tests_{run}")
    flag = f"{base}.restarting.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    exclusive = request.node.get_closest_marker("restarts_postgres") is not None
    with open(base + ".lock", "a+") as handle:
        if exclusive:
            open(flag, "w").close()
            try:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
            finally:
                os.unlink(flag)
            return
        while glob.glob(glob.escape(base) + ".restarting.*"):
            time.sleep(0.05)
        fcntl.flock(handle, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
