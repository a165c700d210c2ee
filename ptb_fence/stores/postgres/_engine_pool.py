"""EnginePool: a SQLAlchemy Engine's own pool as the connections of a PostgresUpdateStore.

The store borrows the engine's connections (``engine.raw_connection()``) and gives them back
(``close()``, or ``invalidate()`` for a broken one). So a bot that already has an engine opens
no second pool. The store's two dedicated connections serve the lease renewals and the
liveness lock, each for as long as the store runs. The engine makes them too, then they are
detached from its pool. They carry the engine's connection arguments and ``connect`` events.
They never take one of its pooled slots.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Optional

from ptb_fence._errors import UsageError
from ptb_fence.stores.postgres._connections import (
    busy,
    close_quietly,
    closed_error,
    redact,
    register_pool,
    scrubbed,
    track,
)

__all__ = ["EnginePool"]


def _check_engine(engine: Any) -> None:
    """Refuse what is not a synchronous Engine on psycopg2 (what it is named)."""
    kind = f"{type(engine).__module__}.{type(engine).__qualname__}"
    if not (hasattr(engine, "raw_connection") and hasattr(engine, "dialect")):
        raise UsageError(
            f"PostgresUpdateStore takes a SQLAlchemy Engine (create_engine(...)), got {kind}; "
            "an AsyncEngine or a Connection is not one (pass its sync_engine, or the engine)"
        )
    dialect = engine.dialect
    if dialect.name != "postgresql" or dialect.driver != "psycopg2":
        raise UsageError(
            f"PostgresUpdateStore runs psycopg2, and this engine uses {dialect.name}+"
            f"{dialect.driver}: create it with a postgresql+psycopg2:// URL (or give the "
            "store a DSN of its own)"
        )


class EnginePool:
    """The connections of a SQLAlchemy Engine, at most ``size`` held by the store at once.

    Args:
        engine: A synchronous Engine on ``postgresql+psycopg2``. The store never disposes it.
        size: How many of the engine's connections the store may hold at once. It is the
            store's ``pool_size``. The engine's own pool bounds it too.

    Raises:
        ptb_fence.UsageError: Not such an engine.
    """

    __slots__ = ("__weakref__", "_closed", "_engine", "_lock", "_lent", "_secrets", "_slots",
                 "capacity")

    def __init__(self, engine: Any, size: int) -> None:
        _check_engine(engine)
        self._engine = engine
        password = getattr(engine.url, "password", None)
        self._secrets = {str(password)} if password else set()
        self.capacity = size
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._lent: Dict[int, Any] = {}  # id(psycopg2 connection) -> the engine's proxy
        self._closed = False
        register_pool(self)

    def forget_inherited(self) -> None:
        """In a forked child: the parent's threads hold no slots (the engine's pool is the
        application's to reset, with ``engine.dispose(close=False)``)."""
        self._slots = threading.BoundedSemaphore(self.capacity)
        self._lock = threading.Lock()
        self._lent = {}

    def _raw(self, timeout: Optional[float]) -> Any:
        """``engine.raw_connection()`` with the engine's errors as the store's."""
        import psycopg2

        failure: Optional[BaseException] = None
        try:
            return self._engine.raw_connection()
        except Exception as exc:
            orig = getattr(exc, "orig", None)
            if isinstance(orig, psycopg2.Error):
                failure = scrubbed(orig, self._secrets, "could not connect to PostgreSQL: ")
            elif type(exc).__name__ == "TimeoutError" and timeout is not None:
                failure = busy(timeout, self.capacity)
            else:
                raise
        raise failure

    def connect(self) -> Any:
        """A dedicated connection made by the engine and detached from its pool."""
        proxy = self._raw(None)
        conn = proxy.driver_connection  # (the proxy forgets it once detached)
        proxy.detach()
        return track(conn)

    def acquire(self, timeout: float) -> Any:
        if self._closed:
            raise closed_error()
        deadline = time.monotonic() + timeout
        if not self._slots.acquire(timeout=timeout):
            raise busy(timeout, self.capacity)
        try:
            while True:
                proxy = self._raw(max(0.0, deadline - time.monotonic()))
                conn = proxy.driver_connection
                if conn.closed:
                    proxy.invalidate()
                    continue
                with self._lock:
                    self._lent[id(conn)] = proxy
                return track(conn)
        except BaseException:
            self._slots.release()
            raise

    def release(self, conn: Any, discard: bool) -> None:
        try:
            with self._lock:
                proxy = self._lent.pop(id(conn), None)
            if proxy is None:  # lent before a fork: not this process's to return
                close_quietly(conn)
                return
            if discard or conn.closed:
                proxy.invalidate()  # the engine opens a new one in its place
            else:
                try:
                    conn.rollback()  # the engine resets it too, but never hand back a transaction
                except Exception:
                    proxy.invalidate()
                    return
                proxy.close()  # back to the engine's pool
        finally:
            self._slots.release()

    def close(self) -> None:
        # The engine belongs to the application: leave it (and its pool) as it is.
        self._closed = True

    def redact(self, text: str) -> str:
        """``text`` without the engine URL's password."""
        return redact(text, self._secrets)
