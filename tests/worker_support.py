"""What the bot worker processes share (tests/ptb_bot_worker.py, tests/intake_worker.py).

Imports nothing of python-telegram-bot, so the blocking worker stays free of asyncio.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Dict


def make_store(url: str, table: str) -> Any:
    """The store of ``url``: ``sqlite:///absolute/path`` or a PostgreSQL DSN."""
    if url.startswith("sqlite:///"):
        from ptb_fence import SQLiteUpdateStore

        return SQLiteUpdateStore(url[len("sqlite:///") - 1 :], table)
    from ptb_fence import PostgresUpdateStore

    return PostgresUpdateStore(url, table)


def touch(path: str) -> None:
    """Create ``path`` holding the time (the tests watch for these files)."""
    with open(path, "w", encoding="utf-8") as file:
        file.write(str(time.time()))


def extra_options(args: argparse.Namespace) -> Dict[str, Any]:
    """Recovery options, passed only when given (so the library defaults apply otherwise)."""
    options: Dict[str, Any] = {}
    if args.stop_timeout is not None:
        options["stop_timeout_seconds"] = args.stop_timeout
    if args.attempt_timeout is not None:
        options["attempt_timeout_seconds"] = args.attempt_timeout
    return options


def announce_ready(directory: str, pid: int, store: Any) -> None:
    """Write ``instance.<pid>`` (the store's liveness instance, when it holds one: claims record
    it, so a harness can count each process's claims), then ``ready.<pid>``."""
    instance = getattr(store, "instance", None)
    if instance:
        with open(os.path.join(directory, f"instance.{pid}"), "w", encoding="utf-8") as file:
            file.write(instance)
    touch(os.path.join(directory, f"ready.{pid}"))
