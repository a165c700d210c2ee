"""The SQLite store: the embedded default (one file, many threads, several processes)."""

from ptb_fence.stores.sqlite._store import SQLiteUpdateStore

__all__ = ["SQLiteUpdateStore"]
