"""The stores: in-memory, SQLite (embedded default) and PostgreSQL."""

from ptb_fence.stores.memory import MemoryUpdateStore
from ptb_fence.stores._names import validate_table_name
from ptb_fence.stores.postgres import PostgresUpdateStore, postgres_update_store_schema
from ptb_fence.stores.sqlite import SQLiteUpdateStore

__all__ = [
    "MemoryUpdateStore",
    "PostgresUpdateStore",
    "SQLiteUpdateStore",
    "postgres_update_store_schema",
    "validate_table_name",
]
