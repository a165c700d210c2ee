"""The PostgreSQL store: for several processes or machines (psycopg2, imported when a store
is created)."""

from ptb_fence.stores.postgres._store import PostgresUpdateStore, postgres_update_store_schema

__all__ = ["PostgresUpdateStore", "postgres_update_store_schema"]
