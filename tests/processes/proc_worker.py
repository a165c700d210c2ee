"""A bot process for tests/processes/test_runtime_processes.py (run with ``sys.executable``).

Usage::

    python tests/processes/proc_worker.py STORE TABLE --dir DIR --domain DOMAIN [options]

``STORE`` is ``sqlite:///absolute/path`` or a PostgreSQL DSN. The process builds the store, an
:class:`ptb_fence.UpdateIntake` whose ``handle_attempt`` does a fenced domain write (one row in
``DOMAIN``, a table in the same database), starts it, optionally accepts updates, and runs until
the file ``DIR/stop`` exists (or ``--max-life`` seconds passed), then closes cleanly.

Everything the test needs to observe goes to files in ``DIR``:

- ``ready.<pid>``: the intake started (and ``--accept`` finished, if given);
- ``started.<update_id>.<pid>``: a handler began (written before it does anything else);
- ``runs.<pid>.jsonl``: one JSON line per handler event (``start``, ``commit``, ``skip``,
  ``lost``, ``owner_lost``, ``error``), each with the attempt's identity and a timestamp.

Handler behaviour (``--mode``):

- ``complete``: ``transaction(complete=True)`` inserting one domain row, no duplicate check
  (a second write would be visible as a second row);
- ``plain``: ``transaction()`` (no completion in the commit); inside it the handler checks for
  an existing domain row of its update and skips the insert if there is one (idempotency);
- ``block``: waits until ``DIR/release`` exists, then (``--lost-first``) waits up to 5 s for
  ``owner_lost`` and logs it, then tries ``transaction(complete=True)`` (``--no-complete``:
  a plain ``transaction()``, so only its ownership check fences the write); OwnershipLost is
  logged and re-raised.

``--kill-after-commit UID`` makes the process SIGKILL itself right after the ``with`` block of
that update committed (before the runtime settles anything). ``--sleep S`` sleeps inside the
handler before the transaction (a slow handler). ``--pause-in-tx`` writes
``intx.<update_id>.<pid>`` after the domain insert, inside the open transaction, and waits there
for ``DIR/release``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
# the project root (two levels up: tests/processes/), for ``import ptb_fence``
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from ptb_fence import OwnershipLost, UpdateIntake  # noqa: E402


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("table")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--domain", required=True)
    parser.add_argument("--mode", choices=("complete", "plain", "block"), default="complete")
    parser.add_argument("--lease", type=float, default=0.5)
    parser.add_argument("--sweep", type=float, default=0.1)
    parser.add_argument("--grace", type=float, default=0.1)
    parser.add_argument("--max-concurrent", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--kill-after-commit", type=int, action="append", default=[])
    parser.add_argument("--lost-first", action="store_true")
    parser.add_argument("--no-complete", action="store_true", help="block: plain transaction()")
    parser.add_argument(
        "--pause-in-tx", action="store_true", help="wait for DIR/release inside the transaction"
    )
    parser.add_argument("--accept", default="", help="FIRST:COUNT[:CHATS] updates to accept")
    parser.add_argument("--max-life", type=float, default=40.0)
    return parser.parse_args(argv)


def make_store(url: str, table: str) -> Any:
    if url.startswith("sqlite:///"):
        from ptb_fence import SQLiteUpdateStore

        return SQLiteUpdateStore(url[len("sqlite:///") - 1 :], table)
    from ptb_fence import PostgresUpdateStore

    return PostgresUpdateStore(url, table)


def update_body(update_id: int, chat: int) -> str:
    return json.dumps(
        {
            "update_id": update_id,
            "message": {
                "message_id": update_id,
                "date": 0,
                "chat": {"id": chat, "type": "private"},
                "text": f"u{update_id}",
            },
        }
    )


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = args.dir
        self.pid = os.getpid()
        self.sqlite = args.store.startswith("sqlite:///")
        self.ph = "?" if self.sqlite else "%s"
        self.deadline = time.monotonic() + args.max_life
        self._log_fd = os.open(
            os.path.join(self.dir, f"runs.{self.pid}.jsonl"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o644,
        )

    # -- observation ---------------------------------------------------------------------
    def log(self, event: str, attempt: Any, **extra: Any) -> None:
        record: Dict[str, Any] = {
            "event": event,
            "pid": self.pid,
            "update_id": attempt.update_id,
            "attempt": attempt.attempt,
            "claim_id": attempt.claim_id,
            "t": time.time(),
        }
        record.update(extra)
        os.write(self._log_fd, (json.dumps(record) + "\n").encode())  # one write: atomic

    def touch(self, name: str) -> None:
        with open(os.path.join(self.dir, name), "w"):
            pass

    def exists(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.dir, name))

    def wait_file(self, name: str) -> bool:
        while time.monotonic() < self.deadline:
            if self.exists(name):
                return True
            if self.exists("stop") and name != "stop":
                return False
            time.sleep(0.01)
        return False

    # -- the handler -----------------------------------------------------------------------
    def _execute(self, conn: Any, sql: str, params: tuple) -> List[tuple]:
        cur = conn.cursor()
        try:
            cur.execute(sql.replace("?", self.ph), params)
            return list(cur.fetchall()) if cur.description is not None else []
        finally:
            cur.close()

    def _insert(self, conn: Any, attempt: Any) -> None:
        self._execute(
            conn,
            f"INSERT INTO {self.args.domain} (update_id, attempt, claim_id, pid) "
            "VALUES (?, ?, ?, ?)",
            (attempt.update_id, attempt.attempt, attempt.claim_id, self.pid),
        )

    def handle(self, update: Dict[str, Any], attempt: Any) -> None:
        args = self.args
        self.log("start", attempt)
        self.touch(f"started.{attempt.update_id}.{self.pid}")
        if args.mode == "block":
            if not self.wait_file("release"):
                self.log("error", attempt, error="never released")
                raise RuntimeError("never released")
            if args.lost_first:
                fired = attempt.owner_lost.wait(5.0)
                self.log("owner_lost", attempt, fired=fired)
        if args.sleep:
            time.sleep(args.sleep)
        complete = args.mode != "plain" and not args.no_complete
        try:
            lost_before = attempt.owner_lost.is_set()
            with attempt.transaction(complete=complete) as conn:
                if args.mode == "plain":
                    existing = self._execute(
                        conn,
                        f"SELECT count(*) FROM {args.domain} WHERE update_id = ?",
                        (attempt.update_id,),
                    )
                    if existing[0][0]:
                        self.log("skip", attempt)
                    else:
                        self._insert(conn, attempt)
                else:
                    self._insert(conn, attempt)
                if args.pause_in_tx:
                    self.touch(f"intx.{attempt.update_id}.{self.pid}")
                    self.wait_file("release")
        except OwnershipLost as exc:
            self.log(
                "lost",
                attempt,
                owner_lost_before=lost_before,
                identity_matches=exc.identity == attempt.identity,
            )
            if args.mode == "block" and not args.lost_first:
                fired = attempt.owner_lost.wait(5.0)
                self.log("owner_lost", attempt, fired=fired)
            raise
        except Exception as exc:
            self.log("error", attempt, error=f"{type(exc).__name__}: {exc}")
            raise
        self.log("commit", attempt, completed=attempt.completed)
        if attempt.update_id in args.kill_after_commit:
            os.kill(self.pid, signal.SIGKILL)

    # -- main --------------------------------------------------------------------------------
    def run(self) -> int:
        args = self.args
        store = make_store(args.store, args.table)
        try:
            intake = UpdateIntake(
                store,
                handle_attempt=self.handle,
                lease_seconds=args.lease,
                sweep_every_seconds=args.sweep,
                pending_grace_seconds=args.grace,
                max_concurrent=args.max_concurrent,
                retry=lambda error, attempt: 0.05,
            )
            intake.start()
            try:
                if args.accept:
                    parts = [int(p) for p in args.accept.split(":")]
                    first, count = parts[0], parts[1]
                    chats = parts[2] if len(parts) > 2 else count
                    for update_id in range(first, first + count):
                        result = intake.accept(update_body(update_id, 1000 + update_id % chats))
                        if result != "accepted":
                            raise RuntimeError(f"accept({update_id}) -> {result}")
                self.touch(f"ready.{self.pid}")
                while time.monotonic() < self.deadline and not self.exists("stop"):
                    time.sleep(0.02)
            finally:
                intake.close()
        finally:
            store.close()
        return 0


def main() -> int:
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format=f"%(asctime)s [{os.getpid()}] %(name)s %(levelname)s %(message)s",
    )
    return Worker(parse_args(sys.argv[1:])).run()


if __name__ == "__main__":
    sys.exit(main())
