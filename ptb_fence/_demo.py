"""``python -m ptb_fence demo``: the main job, offline.

A real python-telegram-bot ``Application`` polls a fake Bot API with a
:class:`~ptb_fence.ptb.FencedUpdateProcessor` over SQLite. Every handler makes a fenced write.
It queues its reply with ``attempt.outbox.reply_text`` in the same transaction
(``run_in_transaction(..., complete=True)``). So the reply is sent iff that commit lands.
The demo pauses one bot process past its lease (SIGSTOP), and another takes its update over.
The stale attempt's write and reply are fenced out. Then the demo SIGKILLs that process in a
handler and restarts a poller. At the end the database and the fake server show that nothing
was lost or written twice, every update got its reply, and no reply came from a stale attempt.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ptb_fence.stores._outbox_sql import outbox_table_name
from ptb_fence.stores._queries import Statements, load

__all__ = ["main"]

LEASE_SECONDS = 1.5
SLOW_SECONDS = 4.0
TABLE = "telegram_updates"  # the store's default table


def _statements() -> Statements:
    """The demo's statements (``demo.sql``) and the store's admin ones, on its tables."""
    names = {"ledger": "demo_ledger", "table": TABLE, "outbox": outbox_table_name(TABLE)}
    return load("sqlite", "ptb_fence.stores.sqlite", ("admin.sql", "demo.sql")).fill(names, {})


# -- the bot (runs in a child process) ---------------------------------------------------------
def _run_bot(args: argparse.Namespace) -> int:
    import logging

    from telegram import Update
    from telegram.ext import Application, ContextTypes, MessageHandler, filters

    from ptb_fence import OwnershipLost, SQLiteUpdateStore
    from ptb_fence.ptb import FencedUpdateProcessor

    logging.basicConfig(
        level=logging.WARNING,
        format=f"[bot {os.getpid()}] %(levelname)s %(name)s: %(message)s",
    )
    store = SQLiteUpdateStore(args.db)
    events = Path(args.events)
    markers = Path(args.markers)

    def event(line: str) -> None:
        with events.open("a") as fh:
            fh.write(f"{line} {os.getpid()}\n")

    async def handle(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        # install() sets FencedCallbackContext at run time. The builder's static context type
        # stays PTB's default, which has no ``attempt``.
        attempt = context.attempt  # type: ignore[attr-defined]
        message = update.effective_message
        assert attempt is not None and message is not None
        text = message.text or ""
        if text.startswith("slow") and attempt.attempt == 1:
            (markers / f"{update.update_id}-{os.getpid()}").write_text(text)
            await asyncio.sleep(SLOW_SECONDS)
        else:
            await asyncio.sleep(0.002)

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(_statements()["demo_book"], {
                "update_id": update.update_id, "chat_id": message.chat_id,
                "attempt": attempt.attempt, "claim_id": attempt.claim_id, "pid": os.getpid(),
            })
            # queued in this transaction: sent after it commits, never if it is refused
            attempt.outbox.reply_text(f"booked #{update.update_id} (attempt {attempt.attempt})")

        try:
            await attempt.run_in_transaction(write, complete=True)
        except OwnershipLost:
            event(f"refused {update.update_id} {attempt.attempt}")
            raise

    processor = FencedUpdateProcessor(
        store,
        max_concurrent=8,
        lease_seconds=LEASE_SECONDS,
        sweep_every_seconds=0.3,
        pending_grace_seconds=0.5,
        retry=lambda error, attempt: 0.2,
    )
    app = (
        processor.install(Application.builder().token(args.token).base_url(args.base_url))
        .build()
    )
    app.add_handler(MessageHandler(filters.TEXT, handle))

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        updater = app.updater
        assert updater is not None  # the builder makes one unless told updater(None)
        async with app:
            await app.start()
            if args.poll:
                await updater.start_polling(poll_interval=0.0, timeout=1)
            event("ready")
            await stop.wait()
            if args.poll:
                await updater.stop()
            await app.stop()

    asyncio.run(run())
    store.close()
    return 0


def _wait_stopped(pid: int, timeout: float = 2.0) -> None:
    """Wait until every thread of ``pid`` is stopped.

    On Linux it reads ``/proc``. Elsewhere it sleeps a short while.
    A thread still running after ``SIGSTOP`` was sent could take SQLite's write lock."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        time.sleep(0.05)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
        except (OSError, IndexError):
            states = []
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.002)


def _replies(fake: Any) -> List["tuple[int, int]"]:
    """(update_id, attempt) of every reply the fake Bot API received, in order."""
    found = []
    for message in fake.sent_messages:
        words = str(message.get("text", "")).replace("#", " ").replace(")", " ").split()
        # "booked #<update_id> (attempt <n>)"
        if len(words) == 4 and words[0] == "booked" and words[2] == "(attempt":
            found.append((int(words[1]), int(words[3])))
    return found


# -- the conductor (the demo command) -----------------------------------------------------------
class _Demo:
    def __init__(self, updates: int, chats: int, workdir: Path) -> None:
        self.total = updates
        self.chats = chats
        self.dir = workdir
        self.db = workdir / "ptb_fence_demo.db"
        self.events = workdir / "events.log"
        self.markers = workdir / "markers"
        self.markers.mkdir()
        self.log = (workdir / "bots.log").open("w")
        self.procs: List["subprocess.Popen[bytes]"] = []
        self.killed = 0
        self.paused = 0
        self.started = time.monotonic()
        self.sent: List[int] = []

    def bot(self, fake: Any, *, poll: bool) -> "subprocess.Popen[bytes]":
        cmd = [
            sys.executable, "-m", "ptb_fence", "demo", "--bot",
            "--db", str(self.db), "--events", str(self.events), "--markers", str(self.markers),
            "--token", fake.token, "--base-url", fake.base_url,
        ] + (["--poll"] if poll else [])
        proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def ledger(self) -> Dict[str, int]:
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            rows, distinct = conn.execute(_statements()["demo_ledger_counts"]).fetchone()
        finally:
            conn.close()
        return {"rows": rows, "distinct": distinct}

    def events_of(self, kind: str) -> List[str]:
        if not self.events.exists():
            return []
        return [l for l in self.events.read_text().splitlines() if l.startswith(kind + " ")]

    def progress(self, fake: Any, phase: str) -> None:
        ledger = self.ledger()
        print(
            f"  [{time.monotonic() - self.started:5.1f}s] {phase:<34} sent {len(self.sent):>4}"
            f"  confirmed {len(fake.confirmed_update_ids):>4}  handled {ledger['distinct']:>4}"
            f"  fenced writes {ledger['rows']:>4}",
            flush=True,
        )

    def wait(self, fake: Any, phase: str, predicate: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = 0.0
        while not predicate():
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"demo step timed out: {phase}")
            if now - last >= 1.0:
                self.progress(fake, phase)
                last = now
            time.sleep(0.05)
        self.progress(fake, phase + " - done")

    def pause_outside_a_write(self, proc: "subprocess.Popen[bytes]") -> None:
        """SIGSTOP ``proc`` at a moment when it does not hold SQLite's write lock.

        SQLite has one writer at a time. So a process paused inside a write transaction blocks
        every other process's writes on the file until it resumes. The demo wants to show a
        pause *past the lease*, so it re-pauses until the lock is free.
        """
        for _ in range(100):
            os.kill(proc.pid, signal.SIGSTOP)
            _wait_stopped(proc.pid)  # kill() returns before every thread has stopped
            conn = sqlite3.connect(self.db, timeout=0.3, isolation_level=None)
            try:
                conn.execute(_statements()["admin_begin_write"])
                conn.execute(_statements()["admin_rollback"])
                return
            except sqlite3.OperationalError:
                os.kill(proc.pid, signal.SIGCONT)
                time.sleep(0.02)
            finally:
                conn.close()
        raise RuntimeError("could not pause bot 1 outside a write transaction")

    def marker(self, update_id: int, pid: int) -> bool:
        return (self.markers / f"{update_id}-{pid}").exists()

    def ready(self, proc: "subprocess.Popen[bytes]") -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"a bot process exited early (code {proc.returncode}); see {self.log.name}")
        return any(l.endswith(f" {proc.pid}") for l in self.events_of("ready"))

    def inject(self, fake: Any, count: int, *, start: int) -> None:
        for i in range(start, start + count):
            self.sent.append(fake.inject_message(chat_id=100 + i % self.chats, text=f"book slot {i}"))

    def run(self) -> int:
        from ptb_fence import SQLiteUpdateStore
        from ptb_fence.testing import FakeBotApi

        SQLiteUpdateStore(str(self.db)).close()  # creates the schema
        conn = sqlite3.connect(self.db)
        conn.execute(_statements()["demo_create_ledger"])
        conn.commit()
        conn.close()
        first = (self.total * 2) // 3
        with FakeBotApi() as fake:
            print(
                f"ptb_fence demo: {self.total} updates in {self.chats} chats, "
                f"FencedUpdateProcessor over SQLite ({self.db}), fake Bot API at {fake.url}",
                flush=True,
            )
            self.inject(fake, first // 2, start=0)
            slow1 = fake.inject_message(chat_id=100, text="slow: paused past its lease")
            self.sent.append(slow1)
            self.inject(fake, first - first // 2, start=first // 2)
            bot1 = self.bot(fake, poll=True)
            self.wait(fake, "bot 1 polling", lambda: self.ready(bot1), 30)
            self.wait(fake, "bot 1 inside a slow handler", lambda: self.marker(slow1, bot1.pid), 30)
            self.pause_outside_a_write(bot1)
            self.paused += 1
            self.progress(fake, "bot 1 paused (SIGSTOP)")
            bot2 = self.bot(fake, poll=False)
            self.wait(fake, "bot 2 sweeping", lambda: self.ready(bot2), 30)
            self.wait(
                fake,
                "bot 2 takes over the lapsed update",
                lambda: self._has_ledger(slow1),
                30,
            )
            os.kill(bot1.pid, signal.SIGCONT)
            self.wait(
                fake,
                "bot 1 resumed; its write is fenced",
                lambda: any(l.split()[1] == str(slow1) for l in self.events_of("refused")),
                30,
            )
            slow2 = fake.inject_message(chat_id=101, text="slow: killed mid-handler")
            self.sent.append(slow2)
            self.wait(fake, "bot 1 inside a slow handler", lambda: self.marker(slow2, bot1.pid), 30)
            os.kill(bot1.pid, signal.SIGKILL)
            bot1.wait()
            self.killed += 1
            self.progress(fake, "bot 1 killed (SIGKILL mid-handler)")
            bot3 = self.bot(fake, poll=True)
            self.wait(fake, "bot 3 polling (restart)", lambda: self.ready(bot3), 30)
            self.inject(fake, self.total - first - 2, start=first)
            self.wait(
                fake,
                "handling the rest",
                lambda: self.ledger()["distinct"] >= len(self.sent)
                and set(self.sent) <= fake.confirmed_update_ids
                and set(self.sent) <= {uid for uid, _ in _replies(fake)},
                60,
            )
            for proc in (bot2, bot3):
                proc.send_signal(signal.SIGINT)
            for proc in (bot2, bot3):
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
            confirmed = len(set(self.sent) & fake.confirmed_update_ids)
            replies = _replies(fake)
        return self.report(confirmed, replies)

    def _has_ledger(self, update_id: int) -> bool:
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            return conn.execute(
                _statements()["demo_booked"], {"update_id": update_id}
            ).fetchone() is not None
        finally:
            conn.close()

    def report(self, confirmed: int, replies: List["tuple[int, int]"]) -> int:
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            sql = _statements()
            committed = dict(conn.execute(sql["demo_bookings"]))
            handled = set(committed)
            writes = conn.execute(sql["demo_booking_count"]).fetchone()[0]
            attempts = conn.execute(sql["demo_attempts"]).fetchone()[0]
            # how often each update's reply was claimed by a sender: a claim after the first
            # means the sender before it died or was paused holding the call
            tries = dict(conn.execute(sql["demo_reply_tries"]))
        finally:
            conn.close()
        sent = set(self.sent)
        lost = len(sent - handled)
        duplicates = writes - len(handled)
        prevented = len(self.events_of("refused"))
        replied = {uid for uid, _ in replies}
        duplicate_replies = len(replies) - len(replied)
        copies: Dict[int, int] = {}
        for uid, _ in replies:
            copies[uid] = copies.get(uid, 0) + 1
        # the send window: a sender died or was paused after Telegram had the reply and before
        # it was recorded sent, and another sender claimed the call again and sent it once more
        # (the one duplicate the Bot API leaves possible: it has no idempotency key). An extra
        # copy with no such second claim would be a bug, and fails the demo.
        window = sum(min(n - 1, int(tries.get(uid) or 1) - 1) for uid, n in copies.items() if n > 1)
        # a reply queued by an attempt that did not commit (the paused bot's, the killed one's)
        stale_replies = sum(1 for uid, attempt in replies if committed.get(uid) != attempt)
        unanswered = len(sent - replied)
        rows = [
            ("updates sent", len(sent)),
            ("confirmed to Telegram", confirmed),
            ("handled", len(handled & sent)),
            ("attempts started", attempts),
            ("fenced writes", writes),
            ("duplicates prevented", prevented),
            ("duplicate writes", duplicates),
            ("lost", lost),
            ("replies sent", len(replied & sent)),
            ("updates without a reply", unanswered),
            ("duplicate replies", duplicate_replies),
            ("  of them from the send window", window),
            ("replies from stale attempts", stale_replies),
            ("bot processes killed (SIGKILL)", self.killed),
            ("bot processes paused past lease", self.paused),
            ("wall time (s)", f"{time.monotonic() - self.started:.1f}"),
        ]
        width = max(len(name) for name, _ in rows)
        print()
        print("+-" + "-" * width + "-+---------+")
        for name, value in rows:
            print(f"| {name:<{width}} | {value!s:>7} |")
        print("+-" + "-" * width + "-+---------+")
        ok = (
            lost == 0 and duplicates == 0 and confirmed == len(sent) and prevented >= 1
            and unanswered == 0 and stale_replies == 0 and duplicate_replies == window
        )
        print(
            "demo result:",
            "OK (nothing lost, nothing written twice, every update replied to once its write "
            "committed, no reply from a stale attempt)" if ok else "FAILED",
        )
        if window:
            print(
                f"note: {window} reply/replies sent twice: the killed or paused bot had them "
                "answered by Telegram and not yet recorded as sent (the one window the Bot API "
                "leaves open: it has no idempotency key); every other reply was sent exactly once"
            )
        return 0 if ok else 1

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                except OSError:
                    pass
                proc.kill()
                proc.wait()
        self.log.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the demo (or, with ``--bot``, one of its bot processes)."""
    parser = argparse.ArgumentParser(
        prog="python -m ptb_fence demo",
        description="Offline demo: a fenced PTB bot survives a pause and a SIGKILL; nothing "
        "is lost, nothing written twice.",
    )
    parser.add_argument("--updates", type=int, default=300, help="updates to send (default 300)")
    parser.add_argument("--chats", type=int, default=12, help="chats they come from (default 12)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--bot", action="store_true", help=argparse.SUPPRESS)
    for name in ("--db", "--events", "--markers", "--token", "--base-url"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--poll", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bot:
        return _run_bot(args)
    if args.updates < 10 or args.chats < 1:
        parser.error("--updates must be at least 10 and --chats at least 1")
    workdir = Path(tempfile.mkdtemp(prefix="ptb_fence_demo_"))
    demo = _Demo(args.updates, args.chats, workdir)
    result = 1
    try:
        result = demo.run()
    except (TimeoutError, RuntimeError) as exc:
        print(f"demo failed: {exc}; bot logs: {workdir / 'bots.log'}", file=sys.stderr)
    finally:
        demo.cleanup()
    if result == 0 and not args.keep:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    elif result == 0:
        print(f"kept: {demo.db}")
        print("next, look at its rows (also: list, show UPDATE_ID, exhaustions):")
        print(f"    ptb-fence --store sqlite:///{demo.db} status")
    elif result != 0:
        print(f"kept for inspection: {workdir}", file=sys.stderr)
    return result
