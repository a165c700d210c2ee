"""A bot process for tests/processes/test_chat_order_processes.py: UpdateIntake with
strict_chat_order handling the pending rows of a shared store, logging each handler run as an
interval.

Usage: ``chat_order_worker.py KIND TARGET TABLE LOG [--lax] [--hold SECONDS] [--go FILE]
[--accept FILE --block] [--until COUNT]``

KIND is ``sqlite`` (TARGET a file; LOG another SQLite file) or ``postgres`` (TARGET a DSN; LOG
a table name in the same database). The handler writes ``(update_id, chat, pid, started,
ended)`` (``time.time()``) after it ran. The process exits once no row of TABLE is unsettled
(or after 50 s), closing the intake first. ``--lax`` runs without strict_chat_order. With
``--go`` it prints ``ready`` once built and starts the intake only when FILE exists (so that
several processes start together). With ``--accept`` it starts, records the update bodies of
FILE (a JSON list) through ``UpdateIntake.accept``, prints ``recorded`` and, with ``--block``,
handles none of them to the end (its handlers block until the process is killed). With
``--until`` it prints ``started`` once the intake started and exits only once TABLE holds at least
COUNT rows, none of them unsettled (a process started before the updates are recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import threading
import time
from typing import Any, Callable, Dict

from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore, UpdateIntake


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("sqlite", "postgres"))
    parser.add_argument("target")
    parser.add_argument("table")
    parser.add_argument("log")
    parser.add_argument("--lax", action="store_true")
    parser.add_argument("--hold", type=float, default=0.005)
    parser.add_argument("--go")
    parser.add_argument("--accept")
    parser.add_argument("--block", action="store_true")
    parser.add_argument("--until", type=int, default=0)
    args = parser.parse_args()
    local = threading.local()

    if args.kind == "sqlite":
        store: Any = SQLiteUpdateStore(args.target, args.table)

        def log(row: tuple) -> None:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = sqlite3.connect(args.log, timeout=30, isolation_level=None)
            conn.execute("INSERT INTO intervals VALUES (?, ?, ?, ?, ?)", row)

        def unsettled() -> int:
            conn = sqlite3.connect(args.target, timeout=30)
            try:
                waiting, total = conn.execute(
                    "SELECT count(*) FILTER (WHERE state IN ('pending', 'processing', 'failed')), "
                    f'count(*) FROM "{args.table}"'
                ).fetchone()
                return int(waiting) + max(0, args.until - int(total))
            finally:
                conn.close()
    else:
        import psycopg2

        store = PostgresUpdateStore(args.target, table=args.table)

        def log(row: tuple) -> None:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = psycopg2.connect(args.target)
                conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'INSERT INTO "{args.log}" VALUES (%s, %s, %s, %s, %s)', row)

        def unsettled() -> int:
            conn = psycopg2.connect(args.target)
            try:
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT count(*) FILTER (WHERE state IN ('pending', 'processing', "
                        f"'failed')), count(*) FROM \"{args.table}\""
                    )
                    waiting, total = cur.fetchone()
                    return int(waiting) + max(0, args.until - int(total))
            finally:
                conn.close()

    def handle(update: Dict[str, Any]) -> None:
        if args.block:
            threading.Event().wait()  # until the process is killed
        started = time.time()
        time.sleep(args.hold)
        ended = time.time()
        log((update["update_id"], update["message"]["chat"]["id"], os.getpid(), started, ended))

    intake = UpdateIntake(
        store,
        handle=handle,
        strict_chat_order=not args.lax,
        max_concurrent=8,
        lease_seconds=20,
        sweep_every_seconds=0.1,
        pending_grace_seconds=0.1,
    )
    print("ready", flush=True)
    if args.go:
        wait = time.monotonic() + 30
        while not os.path.exists(args.go) and time.monotonic() < wait:
            time.sleep(0.01)
    intake.start()
    if args.until:
        print("started", flush=True)
    if args.accept:
        with open(args.accept) as handle_file:
            for text in json.load(handle_file):
                assert intake.accept(text) == "accepted"
        print("recorded", flush=True)
    deadline = time.monotonic() + 50
    try:
        while time.monotonic() < deadline and unsettled():
            time.sleep(0.05)
    finally:
        intake.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
