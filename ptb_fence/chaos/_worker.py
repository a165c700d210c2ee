"""ChaosWorker: one bot process of a chaos run (``python -m ptb_fence.chaos._worker``).

The runner (:mod:`ptb_fence.chaos`) starts several of these, kills, pauses and restarts them.
A worker runs a real :class:`~ptb_fence.UpdateIntake` on the run's store. It feeds it the bodies
the runner appends to ``DIR/feed.<slot>.jsonl`` and remembers its place in
``DIR/progress.<slot>``. A restarted worker goes on from there, as when Telegram redelivers.
The handler reads ``chaos <path> <behaviour>`` from the update's text. It logs its run. With
``--pay URL`` it charges that payment API in the step ``charge``, logging each call to
``DIR/calls.<slot>.<pid>.jsonl``. Then it writes one domain row, fails once, or always fails.
``DIR/stats.<slot>.<pid>.json`` holds informational counters only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from ptb_fence import OwnershipLost, UpdateIntake
from ptb_fence._values import Exhaustion
from ptb_fence.chaos._db import ChaosDatabase
from ptb_fence.runtime import Attempt
from ptb_fence.testing import charge

__all__ = ["ChaosWorker", "main"]

_LOGGER = logging.getLogger("ptb_fence.chaos.worker")

_WRITE_PATIENCE = 60.0
"""Seconds a worker keeps retrying a log write while the database is unreachable."""


class InjectedFailure(Exception):
    """A handler failure the chaos run injects on purpose."""


class ChaosWorker:
    """One worker process of a chaos run.

    Args:
        args (:class:`argparse.Namespace`): The parsed command line (see :func:`main`).
    """

    __slots__ = (
        "_args",
        "_counters",
        "_db",
        "_dir",
        "_intake",
        "_calls",
        "_lock",
        "_parent",
        "_pid",
        "_rng",
        "_sabotage",
        "_signalled",
        "_store",
    )

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        self._db = ChaosDatabase(args.store, args.prefix)
        self._dir: str = args.dir
        self._pid = os.getpid()
        self._parent = os.getppid()
        self._rng = random.Random(f"{args.seed}:{args.slot}:{self._pid}")
        self._lock = threading.Lock()
        # set by the SIGTERM handler, read by the main thread between naps: a handler must take
        # no lock (it runs on the main thread, which may hold it, e.g. inside Event.wait())
        self._signalled: List[int] = []
        self._counters: Dict[str, int] = {}
        self._store: Any = None
        self._calls: Optional[int] = None
        self._intake: Optional[UpdateIntake] = None
        # for the runner's own tests only: "unfenced" writes outside the fence, "no-write" skips
        # the domain write, "pay-twice" charges again after the step. Each must make the run fail
        self._sabotage = os.environ.get("PTB_FENCE_CHAOS_SABOTAGE", "")

    # -- helpers -----------------------------------------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + n

    def _path(self, name: str) -> str:
        return os.path.join(self._dir, name)

    def _write_stats(self) -> None:
        with self._lock:
            stats = {"slot": self._args.slot, "pid": self._pid, "counters": dict(self._counters)}
        target = self._path(f"stats.{self._args.slot}.{self._pid}.json")
        tmp = target + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(stats, handle)
        os.replace(tmp, target)

    def _make_store(self) -> Any:
        db = self._db
        table = db.table("updates")
        if db.is_sqlite:
            from ptb_fence import SQLiteUpdateStore

            return SQLiteUpdateStore(db.path or "", table)
        from ptb_fence import PostgresUpdateStore

        return PostgresUpdateStore(
            db.dsn(self._args.application_name),
            table,
            pool_size=self._args.max_concurrent + 4,
        )

    def _write(self, name: str, params: Dict[str, Any]) -> None:
        """The INSERT ``name`` in its own transaction, retried while the database is unreachable.

        A commit whose outcome is unknown may be retried: readers count distinct rows.
        """
        sql = self._db.statements()[name]
        deadline = time.monotonic() + _WRITE_PATIENCE
        while True:
            try:
                with self._store.transaction() as conn:
                    cur = conn.cursor()
                    try:
                        cur.execute(sql, params)
                    finally:
                        cur.close()
                return
            except Exception as exc:
                self._count("log_write_retries")
                if time.monotonic() > deadline:
                    raise
                _LOGGER.info("log write failed, retrying: %s", exc)
                time.sleep(0.1)

    def _event(self, kind: str, update_id: int, attempt: int, claim_id: str, detail: str = "") -> None:
        self._write("chaos_insert_event", {
            "kind": kind, "update_id": update_id, "attempt": attempt, "claim_id": claim_id,
            "pid": self._pid, "at": _now_ms(), "detail": detail[:500],
        })

    # -- the handlers ------------------------------------------------------------------------
    def handle(self, update: Dict[str, Any], attempt: Attempt) -> None:
        """``handle_attempt``: log the run, then do (or fail) the fenced domain write."""
        sql = self._db.statements()
        identity: Dict[str, Any] = {
            "update_id": attempt.update_id, "attempt": attempt.attempt,
            "claim_id": attempt.claim_id, "pid": self._pid,
        }
        self._write("chaos_insert_run", dict(identity, started_at=_now_ms()))
        text = str((update.get("message") or {}).get("text", ""))
        parts = text.split()
        path = parts[1] if len(parts) > 1 else "complete"
        behaviour = parts[2] if len(parts) > 2 else "ok"
        with self._lock:
            work = self._rng.uniform(self._args.work_min, self._args.work_max)
            share = self._rng.random() if self._args.pay else 1.0
        time.sleep(work * share)  # the handler's "work": attempts are in flight when faults strike
        first = attempt.attempt == 1
        if behaviour == "transient-before" and first:
            raise InjectedFailure("transient failure before the step and the transaction")
        if self._args.pay:
            self._pay(attempt, behaviour, work * (1.0 - share))
        if behaviour == "fail":
            raise InjectedFailure(f"update {attempt.update_id} always fails (attempt {attempt.attempt})")
        complete = path == "complete"
        skip = self._sabotage == "no-write"
        row = dict(identity, path=path, written_at=_now_ms())
        if self._sabotage == "unfenced":  # a broken handler, to prove the checks bite
            self._write("chaos_insert_domain", row)
            skip = True
        try:
            with attempt.transaction(complete=complete) as conn:
                cur = conn.cursor()
                try:
                    if not complete and not skip:
                        cur.execute(sql["chaos_count_domain"], {"update_id": attempt.update_id})
                        skip = bool(cur.fetchone()[0])
                        if skip:
                            self._count("skip")
                    if not skip:
                        cur.execute(sql["chaos_insert_domain"], row)
                finally:
                    cur.close()
                if behaviour == "transient-inside" and first:
                    raise InjectedFailure("transient failure inside the transaction (attempt 1)")
        except OwnershipLost:
            self._count("fenced_out")
            self._event("fenced_out", attempt.update_id, attempt.attempt, attempt.claim_id)
            raise
        except InjectedFailure:
            raise
        except Exception as exc:  # the database broke under the transaction (chaos)
            self._count("tx_error")
            self._event(
                "tx_error", attempt.update_id, attempt.attempt, attempt.claim_id,
                f"{type(exc).__name__}: {exc}",
            )
            raise
        if skip and not self._sabotage:
            self._event("skip", attempt.update_id, attempt.attempt, attempt.claim_id)

    def _pay(self, attempt: Attempt, behaviour: str, pause: float) -> None:
        """Charge the update in the step ``charge``, then go on with the handler."""
        url: str = self._args.pay
        update_id = attempt.update_id
        amount = 100 + update_id % 900
        began = _now_ms()

        def charge_once(key: str) -> Dict[str, Any]:
            self._log_call(attempt, key, began)
            self._count("step_calls")
            charged = charge(url, key, amount=amount, reference=str(update_id))
            # a fault in this pause strikes after the charge and before its record
            time.sleep(pause)
            if behaviour == "transient-step" and attempt.attempt == 1:
                raise InjectedFailure("transient failure in the step after the charge (attempt 1)")
            return {"id": charged["id"]}

        try:
            attempt.step_blocking("charge", charge_once)
        except OwnershipLost:
            self._count("step_refused")
            self._event("step_refused", update_id, attempt.attempt, attempt.claim_id)
            raise
        if self._sabotage == "pay-twice":  # a broken handler, to prove the checks bite
            again = f"{attempt.effect_key('charge')}-{attempt.attempt}-{attempt.claim_id}"
            charge(url, again, amount=amount, reference=str(update_id))

    def _log_call(self, attempt: Attempt, key: str, began: int) -> None:
        """Append one call of the step's function to ``DIR/calls.<slot>.<pid>.jsonl``.

        One ``os.write`` per line: a line written survives a SIGKILL.
        """
        line = json.dumps({
            "update_id": attempt.update_id, "attempt": attempt.attempt,
            "claim_id": attempt.claim_id, "pid": self._pid, "key": key, "began": began,
            "called": _now_ms(),
        }, separators=(",", ":"))
        with self._lock:
            if self._calls is None:
                self._calls = os.open(
                    self._path(f"calls.{self._args.slot}.{self._pid}.jsonl"),
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644,
                )
            os.write(self._calls, (line + "\n").encode("utf-8"))

    def handle_exhaustion(self, exhaustion: Exhaustion) -> None:
        """``handle_exhaustion``: record the delivery (fails on purpose now and then)."""
        with self._lock:
            fail = self._rng.random() < self._args.exhaustion_failure_rate
        if fail:
            self._event(
                "exhaustion_failed", exhaustion.update_id, exhaustion.attempt, exhaustion.claim_id
            )
            raise InjectedFailure(f"exhaustion handler fails once for update {exhaustion.update_id}")
        self._write("chaos_insert_exhaustion", {
            "update_id": exhaustion.update_id,
            "attempt": exhaustion.attempt,
            "claim_id": exhaustion.claim_id,
            "error": (exhaustion.error or "")[:500],
            "pid": self._pid,
            "delivered_at": _now_ms(),
        })

    def _store_error(self, error: BaseException, step: str) -> None:
        self._count(f"store_error_{step}")

    # -- feeding -----------------------------------------------------------------------------
    def _read_progress(self) -> int:
        try:
            with open(self._path(f"progress.{self._args.slot}"), encoding="ascii") as handle:
                return int(handle.read().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _save_progress(self, offset: int) -> None:
        target = self._path(f"progress.{self._args.slot}")
        tmp = f"{target}.{self._pid}.tmp"
        with open(tmp, "w", encoding="ascii") as handle:
            handle.write(str(offset))
        os.replace(tmp, target)

    def _accept(self, intake: UpdateIntake, line: bytes) -> bool:
        """Accept one body, retrying while the store is down. Returns False when stopping."""
        while not self._signalled:
            try:
                result = intake.accept(line)
            except Exception as exc:  # not recorded: "Telegram" delivers it again
                self._count("accept_errors")
                _LOGGER.info("accept failed, retrying: %s", exc)
                time.sleep(0.1)
                continue
            self._count(f"accept_{result}")
            return True
        return False

    def _feed(self, intake: UpdateIntake) -> None:
        feed = self._path(f"feed.{self._args.slot}.jsonl")
        offset = self._read_progress()
        last_stats = 0.0
        while not self._signalled:
            if os.getppid() != self._parent or os.path.exists(self._path("stop")):
                break
            try:
                with open(feed, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except FileNotFoundError:
                data = b""
            lines = data.split(b"\n")[:-1]  # complete lines only
            done = 0
            for line in lines:
                if not self._accept(intake, line):
                    break
                offset += len(line) + 1
                done += 1
                if done % 20 == 0:
                    self._save_progress(offset)
            if done:
                self._save_progress(offset)
            now = time.monotonic()
            if now - last_stats >= 1.0:
                self._write_stats()
                last_stats = now
            time.sleep(0.05)

    # -- main --------------------------------------------------------------------------------
    def run(self) -> int:
        """Run until ``DIR/stop`` exists, SIGTERM arrives or the runner is gone."""
        args = self._args
        signal.signal(signal.SIGTERM, lambda signum, frame: self._signalled.append(signum))
        self._store = self._make_store()
        try:
            intake = UpdateIntake(
                self._store,
                handle_attempt=self.handle,
                handle_exhaustion=self.handle_exhaustion,
                max_attempts=args.max_attempts,
                lease_seconds=args.lease,
                sweep_every_seconds=args.sweep,
                pending_grace_seconds=args.grace,
                max_concurrent=args.max_concurrent,
                retry=lambda error, attempt: args.retry_delay,
                on_store_error=self._store_error,
            )
            self._intake = intake
            intake.start()
            try:
                with open(self._path(f"ready.{args.slot}.{self._pid}"), "w"):
                    pass
                self._feed(intake)
            finally:
                intake.close()
        finally:
            self._write_stats()
            self._store.close()
            if self._calls is not None:
                os.close(self._calls)
        return 0


def _now_ms() -> int:
    return int(time.time() * 1000)


def parse_args(argv: List[str]) -> argparse.Namespace:
    """Parse a worker's command line (the runner builds it)."""
    parser = argparse.ArgumentParser(
        prog="python -m ptb_fence.chaos._worker",
        description="One worker process of a ptb_fence chaos run (started by the runner).",
    )
    parser.add_argument("--store", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--application-name", default="ptb_fence_chaos")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--sweep", type=float, default=0.2)
    parser.add_argument("--grace", type=float, default=0.5)
    parser.add_argument("--max-attempts", type=int, default=5)
    parser.add_argument("--max-concurrent", type=int, default=8)
    parser.add_argument("--retry-delay", type=float, default=0.1)
    parser.add_argument("--work-min", type=float, default=0.005)
    parser.add_argument("--work-max", type=float, default=0.05)
    parser.add_argument("--exhaustion-failure-rate", type=float, default=0.25)
    parser.add_argument("--pay", default="", help="the FakePaymentApi's url (empty: no payments)")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of a worker process."""
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format=f"%(asctime)s [{os.getpid()}] %(name)s %(levelname)s %(message)s",
    )
    return ChaosWorker(parse_args(sys.argv[1:] if argv is None else argv)).run()


if __name__ == "__main__":
    sys.exit(main())
