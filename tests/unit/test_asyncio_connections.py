"""asyncio connections are told apart by module and class names, without importing their
driver: asyncpg (not installed in the test extra) and aiosqlite by their top-level package, any
other driver by a ``commit`` that is a coroutine function. Each is a ``UsageError`` (a
``TypeError``) at ``caller_connection`` and ``dbapi_connection``, naming what works."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from ptb_fence import UsageError, is_misuse
from ptb_fence.runtime._connections import asyncio_refusal, caller_connection, dbapi_connection


def _shaped(module: str, name: str, **methods: Any) -> Any:
    """An object whose class lives in ``module`` as the driver's does (nothing imported)."""
    kind = type(name, (), dict(methods, __module__=module))
    return kind()


async def _commit(self: Any) -> None:
    return None


@pytest.mark.parametrize("module, name", [
    ("asyncpg.connection", "Connection"),
    ("asyncpg.pool", "Pool"),
    ("aiosqlite.core", "Connection"),
])
def test_known_asyncio_drivers_are_refused_by_module_name(module: str, name: str) -> None:
    given = _shaped(module, name, cursor=lambda self: None, commit=_commit,
                    rollback=_commit)
    for call in (caller_connection, dbapi_connection):
        with pytest.raises(UsageError) as raised:
            call(given)
        assert isinstance(raised.value, TypeError) and is_misuse(raised.value)
        assert f"{module}.{name}" in str(raised.value)
        assert "run_in_transaction(fn, connection=conn)" in str(raised.value)


def test_an_unknown_driver_with_an_async_commit_is_refused() -> None:
    given = _shaped("someasyncdb", "Connection", cursor=lambda self: None, commit=_commit,
                    rollback=_commit)
    assert asyncio_refusal(given) is not None
    with pytest.raises(UsageError):
        caller_connection(given)


def test_sync_connections_are_not_asyncio() -> None:
    conn = sqlite3.connect(":memory:")
    try:
        assert asyncio_refusal(conn) is None
        assert asyncio_refusal(conn.cursor()) is None
    finally:
        conn.close()
