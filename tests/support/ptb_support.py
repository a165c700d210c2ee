"""Shared helpers of the tests/test_ptb_*.py files: a real PTB Application against FakeBotApi.

Nothing here patches PTB: the Application is built with ``processor.install(builder)`` and talks
HTTP to :class:`ptb_fence.testing.FakeBotApi`. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import threading
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Iterable, List, Optional, Tuple

from telegram.ext import Application, ApplicationBuilder

from counting_store import batch_kind
from ptb_fence.testing import FakeBotApi

FAST: Dict[str, Any] = {
    "lease_seconds": 1.0,
    "sweep_every_seconds": 0.1,
    "pending_grace_seconds": 0.2,
}
"""Short leases and sweeps for tests."""

DOMAIN_DDL = (
    "CREATE TABLE IF NOT EXISTS domain ("
    "update_id INTEGER NOT NULL, attempt INTEGER NOT NULL, claim_id TEXT NOT NULL, pid INTEGER)"
)


def run(coro: Awaitable[Any], timeout: float = 30.0) -> Any:
    """Run ``coro`` in a fresh event loop, bounded by ``timeout`` seconds."""
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


async def wait_for(
    what: str, predicate: Callable[[], Any], timeout: float = 10.0, step: float = 0.02
) -> Any:
    """Wait (asyncio) until ``predicate()`` is truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(step)


def wait_sync(what: str, predicate: Callable[[], Any], timeout: float = 10.0, step: float = 0.02) -> Any:
    """Blocking form of :func:`wait_for`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def build(processor: Any, fake: FakeBotApi, builder: Optional[ApplicationBuilder] = None) -> Application:
    """``processor.install(builder.token(...).base_url(...)).build()`` for the fake server."""
    builder = builder if builder is not None else Application.builder()
    return processor.install(builder.token(fake.token).base_url(fake.base_url)).build()


@contextlib.asynccontextmanager
async def polling(app: Application, *, timeout: float = 1.0) -> AsyncIterator[Application]:
    """Initialize, start and poll; stop and shut down on exit."""
    async with app:
        await app.start()
        assert app.updater is not None
        await app.updater.start_polling(poll_interval=0.0, timeout=timeout)
        try:
            yield app
        finally:
            if app.updater.running:
                await app.updater.stop()
            if app.running:
                await app.stop()


def rows(path: str, table: str = "telegram_updates") -> Dict[int, Tuple[str, int, Optional[str], Optional[int]]]:
    """``{update_id: (state, attempts, error, settled_at)}`` read straight from the SQLite file."""
    conn = sqlite3.connect(path, timeout=10)
    try:
        return {
            r[0]: (r[1], r[2], r[3], r[4])
            for r in conn.execute(
                f"SELECT update_id, state, attempts, error, settled_at FROM {table}"  # noqa: S608
            )
        }
    finally:
        conn.close()


def recorded_ids(path: str, ids: Iterable[int], table: str = "telegram_updates") -> set:
    """The ids of ``ids`` that have a row in the SQLite file (a fresh connection)."""
    wanted = list(ids)
    if not wanted:
        return set()
    conn = sqlite3.connect(path, timeout=10)
    try:
        marks = ",".join("?" * len(wanted))
        return {
            r[0]
            for r in conn.execute(
                f"SELECT update_id FROM {table} WHERE update_id IN ({marks})", wanted  # noqa: S608
            )
        }
    finally:
        conn.close()


def domain_rows(path: str) -> List[Tuple[int, int, str]]:
    """``(update_id, attempt, claim_id)`` of the fenced domain table, by update_id."""
    conn = sqlite3.connect(path, timeout=10)
    try:
        return [
            (r[0], r[1], r[2])
            for r in conn.execute("SELECT update_id, attempt, claim_id FROM domain ORDER BY update_id")
        ]
    finally:
        conn.close()


class FlakyStore:
    """Wraps a real store; recording (``add``, a ``commit`` with records) raises while
    :attr:`failing` (for every id, or for a call that includes one of :attr:`fail_ids`).

    Every other attribute is the wrapped store's, so the wrapper has the same capability
    level (fenced, durable, transaction, batched recording, ...). Methods named in
    :attr:`broken` raise too while :attr:`failing` (checked at each call, so also for a
    method looked up before :attr:`broken` was set).
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.failing = False
        self.fail_ids: Optional[set] = None  # None: every id while failing
        self.failed_adds: List[int] = []
        self.adds: List[Tuple[int, bool]] = []
        self.failed_calls: List[str] = []
        self.broken: "set[str]" = set()
        self._lock = threading.Lock()

    def _refuse(self, update_ids: List[int]) -> None:
        with self._lock:
            fail = self.failing and (
                self.fail_ids is None or any(uid in self.fail_ids for uid in update_ids)
            )
            if fail:
                self.failed_adds.extend(update_ids)
        if fail:
            raise sqlite3.OperationalError("disk I/O error (injected by the test)")

    def _booked(self, update_ids: List[int], added: List[bool]) -> None:
        with self._lock:
            self.adds.extend(zip(update_ids, added))

    def add(self, update_id: int, body: str, received_at: int) -> bool:
        self._refuse([update_id])
        added = bool(self.inner.add(update_id, body, received_at))
        self._booked([update_id], [added])
        return added

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target):
            return target
        if name == "commit":

            def committing(batch: Any) -> Any:
                ids = [row[0] for row in (*batch.records, *batch.claimed_records)]
                if ids:
                    self._refuse(ids)
                elif self.failing and batch_kind(batch) in self.broken:
                    with self._lock:
                        self.failed_calls.append(batch_kind(batch))
                    raise sqlite3.OperationalError(
                        f"{batch_kind(batch)}: database is locked (injected)"
                    )
                committed = target(batch)
                added = [*committed.recorded,
                         *(identity is not None for identity in committed.claimed_records)]
                self._booked([row[0] for row in batch.records]
                             + [row[0] for row in batch.claimed_records], added)
                return committed

            return committing
        # decided at call time, not at lookup: the runtime's store port looks its optional
        # methods up once, when it is built (before a test sets ``broken``)
        @functools.wraps(target)
        def maybe_broken(*args: Any, **kwargs: Any) -> Any:
            if self.failing and name in self.broken:
                with self._lock:
                    self.failed_calls.append(name)
                raise sqlite3.OperationalError(f"{name}: database is locked (injected)")
            return target(*args, **kwargs)

        return maybe_broken
