"""open_source: the connections a PostgresUpdateStore works on, from what its caller passed.

A DSN string or a connection factory (:class:`DsnPool`: the store opens its connections), a
psycopg2 pool (:class:`UserPool`) or a SQLAlchemy Engine (:class:`EnginePool`: the
application's connections). Its own module, so that the sources need not import each other.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Union

from ptb_fence._errors import UsageError
from ptb_fence.stores.postgres._connections import (
    DsnPool,
    UserPool,
    dsn_opener,
    factory_opener,
    redact,
    secrets_of,
)
from ptb_fence.stores.postgres._engine_pool import EnginePool

__all__ = ["Source", "open_source"]

Source = Union[DsnPool, UserPool, EnginePool]
"""Where a store's connections come from."""


def open_source(dsn_or_pool: Any, pool_size: int, schema: Optional[str] = None) -> Source:
    """The connection source for a DSN string, a caller's psycopg2 pool, a SQLAlchemy Engine
    or a connection factory.

    With ``schema``, connections work in that schema (``search_path``). Only connections the
    store opens itself can do that.

    Raises:
        ValueError: For a malformed DSN (its password is not repeated).
        TypeError: If ``dsn_or_pool`` is none of these.
        ptb_fence.UsageError: A schema with a pool or an engine (whose connections the
            application shares).
    """
    import psycopg2.extensions
    import psycopg2.pool

    shared = isinstance(dsn_or_pool, psycopg2.pool.AbstractConnectionPool) or type(
        dsn_or_pool
    ).__module__.startswith("sqlalchemy.")
    if schema is not None and shared:
        raise UsageError(
            f"a schema-qualified table ({schema}.…) needs connections the store opens itself, "
            "with search_path set to the schema: pass a DSN or a connection factory, or set "
            "search_path on your pool's connections and pass the bare table name"
        )

    if isinstance(dsn_or_pool, str):
        secrets = secrets_of(dsn_or_pool)
        problem: Optional[str] = None
        try:
            psycopg2.extensions.parse_dsn(dsn_or_pool)
        except psycopg2.Error as exc:
            problem = redact(str(exc).strip(), secrets)
        if problem is not None:
            # A fragment of an unparsable DSN may be part of a password: quote nothing.
            problem = re.sub(r'"[^"]*"', '"…"', problem)
            raise ValueError(f"invalid PostgreSQL DSN: {problem}")
        return DsnPool(dsn_opener(dsn_or_pool, secrets, schema), pool_size)
    if isinstance(dsn_or_pool, psycopg2.pool.AbstractConnectionPool):
        args = tuple(getattr(dsn_or_pool, "_args", ()))
        kwargs = dict(getattr(dsn_or_pool, "_kwargs", {}))
        dsn = args[0] if args and isinstance(args[0], str) else kwargs.get("dsn")
        return UserPool(dsn_or_pool, secrets_of(dsn, kwargs))
    if type(dsn_or_pool).__module__.startswith("sqlalchemy."):
        return EnginePool(dsn_or_pool, pool_size)
    if callable(dsn_or_pool):
        return DsnPool(factory_opener(dsn_or_pool, schema), pool_size)
    raise TypeError(
        "PostgresUpdateStore needs a DSN string, a psycopg2 connection pool "
        "(psycopg2.pool.AbstractConnectionPool), a SQLAlchemy Engine on psycopg2 or a "
        f"connection factory (a callable returning a psycopg2 connection), not "
        f"{type(dsn_or_pool).__name__}"
    )
