#!/usr/bin/env python
"""A booking bot that loses no update and books no slot twice: PTB polling over SQLite.

``/book 10:30`` books the slot ``10:30`` for the chat. Every update is committed to a SQLite file
before Telegram is told it arrived (the next ``getUpdates`` offset), then claimed under a lease
and handled by a :class:`ptb_fence.ptb.FencedUpdateProcessor`. The booking is written **inside a
fenced transaction in the same SQLite file**, which also settles the update as completed in the
same commit: a crash before the commit re-runs the handler (nothing lost), a crash after it never
does (nothing written twice), and an attempt whose lease lapsed (the process was paused, the
event loop blocked) cannot write at all. The reply goes into the outbox in that same
transaction: it is sent after the commit, iff the commit landed (never by a failed or stale
attempt, still after a crash that followed the commit).

Run it against Telegram (Python 3.10+; install from a clone of the repository with
``python -m pip install -e .``)::

    export TELEGRAM_BOT_TOKEN=123456:ABC...
    python examples/polling_sqlite.py --db bookings.sqlite3

Stop it with Ctrl+C (SIGINT) or SIGTERM. Kill it with ``kill -9`` in the middle of a booking and
start it again: the update is handled again (its lease lapses after ``--lease-seconds``), and the
slot is still booked exactly once. Several copies may run on one machine against the same file
(only one of them should poll; start the others with ``--no-polling``: they take over updates
whose lease lapsed, retries and exhaustions).

Read the bookings::

    sqlite3 bookings.sqlite3 'SELECT * FROM bookings'
    sqlite3 bookings.sqlite3 'SELECT * FROM booking_exhaustions'

Offline, against the fake Bot API of ``ptb_fence.testing`` (no token needed: a local
``--base-url`` uses the fake's token). In one terminal::

    python -m ptb_fence.testing serve --message "/book 10:00" --message "/book 10:00"

and in another (it answers both, books 10:00 once, and exits)::

    python examples/polling_sqlite.py --db offline.sqlite3 --base-url http://127.0.0.1:8081/bot --exit-after 2
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sqlite3
import sys
import time
import urllib.parse
from typing import Any, Callable, List, Optional, Set, Tuple

from telegram import Update
from telegram.constants import ChatAction
from telegram.ext import Application, CommandHandler, ContextTypes

from ptb_fence import Exhaustion, OwnershipLost, SQLiteUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor

LOGGER = logging.getLogger("booking_bot")

LOCAL_TOKEN = "123456:TEST-TOKEN"  # what ``python -m ptb_fence.testing serve`` accepts


def is_local(base_url: str) -> bool:
    """Whether ``base_url`` points at a Bot API on this machine (the fake one, offline)."""
    host = urllib.parse.urlsplit(base_url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")

SLOT = re.compile(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]")

# The domain tables live in the same SQLite file as the update store, so one transaction covers
# the booking *and* the settlement of the update ("complete=True" below).
SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS bookings (
    slot      TEXT PRIMARY KEY,   -- one booking per slot
    chat_id   INTEGER NOT NULL,
    update_id INTEGER NOT NULL,   -- the update that booked it (not UNIQUE: Telegram may reuse
                                  -- an update_id after a week without updates)
    claim_id  TEXT NOT NULL,      -- the attempt that wrote it, for audits
    booked_at INTEGER NOT NULL    -- epoch milliseconds
)""",
    """
CREATE TABLE IF NOT EXISTS booking_exhaustions (
    update_id    INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    claim_id     TEXT NOT NULL,
    exhausted_at INTEGER NOT NULL,
    error        TEXT,
    body         TEXT NOT NULL,
    -- handle_exhaustion runs at least once per exhaustion; its full identity is the
    -- idempotency key, so a second delivery inserts nothing
    PRIMARY KEY (update_id, attempt, claim_id)
)""",
)


class Context(FencedCallbackContext):
    """Our handlers' context type: PTB's CallbackContext plus ``context.attempt``.

    ``processor.install()`` would set :class:`FencedCallbackContext` by itself; a subclass of
    your own is only needed for the type checker or for your own attributes.
    """

    __slots__ = ()


class ExitAfter:
    """``--exit-after N``: stop after N updates were handled by this process."""

    __slots__ = ("count", "limit", "stop", "waiting")

    def __init__(self, limit: Optional[int]) -> None:
        self.limit = limit
        self.count = 0
        self.stop: Callable[[], None] = lambda: None
        self.waiting: Set["asyncio.Task[None]"] = set()

    def one_done(self) -> None:
        """Count one handled update (call it on the event loop)."""
        self.count += 1
        if self.limit is not None and self.count == self.limit:
            LOGGER.info("handled %d update(s); --exit-after reached, stopping", self.count)
            self.stop()

    def when_sent(self, processor: FencedUpdateProcessor, call: Any) -> None:
        """Count one handled update once its outbox reply ``call`` was sent (or failed): a
        stop gives unsent calls back to the next start, and ``--exit-after`` wants the reply
        out before this process stops."""
        if self.limit is None:
            return

        async def wait() -> None:
            for _ in range(600):  # at most 30 s
                entry = await processor.outbox_call_async(call)
                if entry is not None and entry.state in ("sent", "failed"):
                    break
                await asyncio.sleep(0.05)
            self.one_done()

        task = asyncio.get_running_loop().create_task(wait())
        self.waiting.add(task)
        task.add_done_callback(self.waiting.discard)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--db", default="bookings.sqlite3", help="SQLite file (created if missing)")
    parser.add_argument(
        "--base-url",
        default="https://api.telegram.org/bot",
        help="Bot API base URL (the token is appended); point it at a fake server for tests",
    )
    parser.add_argument(
        "--no-polling",
        action="store_true",
        help="do not poll Telegram; only take over lapsed leases, retries and exhaustions",
    )
    parser.add_argument("--lease-seconds", type=float, default=120.0, help="lease per attempt")
    parser.add_argument("--sweep-every", type=float, default=30.0, help="sweep interval (s)")
    parser.add_argument(
        "--pending-grace", type=float, default=60.0,
        help="seconds before a sweep takes a received but unclaimed update",
    )
    parser.add_argument("--max-attempts", type=int, default=5, help="attempts per update")
    parser.add_argument(
        "--exit-after", type=int, default=None, metavar="N",
        help="stop after N updates were handled by this process (for tests and demos)",
    )
    parser.add_argument("--verbose", action="store_true", help="log at DEBUG level")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    token = os.environ.get("TELEGRAM_BOT_TOKEN") or (
        LOCAL_TOKEN if is_local(args.base_url) else None
    )
    if not token:
        print("set TELEGRAM_BOT_TOKEN to your bot's token (from @BotFather), or pass "
              "--base-url http://127.0.0.1:8081/bot to use `python -m ptb_fence.testing serve`",
              file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format=f"%(asctime)s [{os.getpid()}] %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "apscheduler"):  # one INFO line per request / per scheduler event
        logging.getLogger(noisy).setLevel(logging.WARNING)

    # The update store creates its table on construction; our tables go into the same file.
    # store.transaction() is a write transaction on the store's own connection (BEGIN IMMEDIATE).
    store = SQLiteUpdateStore(args.db)
    with store.transaction() as conn:
        for statement in SCHEMA:
            conn.execute(statement)

    exit_after = ExitAfter(args.exit_after)

    # -- exhaustions: updates that will not be retried -------------------------------------
    async def handle_exhaustion(exhaustion: Exhaustion) -> None:
        """Called at least once per exhaustion, also after a restart; the update is
        acknowledged (and becomes prunable history) only when this returns normally."""

        def record(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "INSERT INTO booking_exhaustions "
                "(update_id, attempt, claim_id, exhausted_at, error, body) "
                "VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (update_id, attempt, claim_id) DO NOTHING",
                (
                    exhaustion.update_id,
                    exhaustion.attempt,
                    exhaustion.claim_id,
                    exhaustion.exhausted_at,
                    exhaustion.error,
                    exhaustion.body,
                ),
            )
            return cursor.rowcount == 1

        def record_in_transaction() -> bool:
            with store.transaction() as conn:
                return record(conn)

        # blocking SQLite work belongs on a worker thread, not on the event loop
        first_time = await asyncio.to_thread(record_in_transaction)
        if first_time:
            LOGGER.error(
                "update %s gave up after attempt %s: %s (stored in booking_exhaustions)",
                exhaustion.update_id,
                exhaustion.attempt,
                exhaustion.error,
            )
            exit_after.one_done()

    processor = FencedUpdateProcessor(
        store,
        handle_exhaustion=handle_exhaustion,
        max_attempts=args.max_attempts,
        lease_seconds=args.lease_seconds,
        sweep_every_seconds=args.sweep_every,
        pending_grace_seconds=args.pending_grace,
    )
    # install() sets the processor, the durable update_queue, the context type and an
    # Application subclass that reports handler failures to the attempt.
    builder = (
        Application.builder()
        .token(token)
        .base_url(args.base_url)
        .context_types(ContextTypes(context=Context))  # optional (types); before install()
    )
    application = processor.install(builder).build()

    # -- the handlers ------------------------------------------------------------------------
    async def book(update: Update, context: Context) -> None:
        message = update.effective_message
        attempt = context.attempt
        assert message is not None and attempt is not None  # block=True handlers get one
        slot = context.args[0] if context.args else ""
        if not SLOT.fullmatch(slot):
            # Queued through the outbox: the attempt holds it, the commit that completes the
            # update writes it, and it is sent after that commit (never by a failed attempt).
            usage = attempt.outbox.send_message(
                message.chat_id, "Usage: /book HH:MM, e.g. /book 10:30")
            exit_after.when_sent(processor, usage)
            return

        # "typing…". It is also where we learn that the user blocked the bot: Telegram
        # answers 403 Forbidden, the default retry policy gives up on it at once, and the
        # update becomes an exhaustion (handle_exhaustion above) instead of a booking the
        # user could never be told about. Any other error is retried with backoff.
        await context.bot.send_chat_action(message.chat_id, ChatAction.TYPING)

        def write(conn: sqlite3.Connection) -> Tuple[bool, Any]:
            # Runs on a worker thread inside BEGIN IMMEDIATE, after ptb_fence checked on this
            # same connection that this attempt still owns the update. '?' placeholders:
            # it is a plain sqlite3.Connection. Do not commit or roll back yourself.
            cursor = conn.execute(
                "INSERT INTO bookings (slot, chat_id, update_id, claim_id, booked_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (slot) DO NOTHING",
                (slot, message.chat_id, attempt.update_id, attempt.claim_id,
                 int(time.time() * 1000)),
            )
            booked = cursor.rowcount == 1
            # The reply is inserted into the outbox by this same transaction: it is sent
            # (after the commit, at least once) iff the booking committed. A crash before the
            # commit re-runs the handler, a crash after it still sends the reply.
            text = f"Booked {slot} for you." if booked else f"Sorry, {slot} is already taken."
            return booked, attempt.outbox.send_message(message.chat_id, text)

        try:
            # complete=True: the booking, its reply and "update completed" are one commit.
            booked, reply = await attempt.run_in_transaction(write, complete=True)
        except OwnershipLost:
            # Our lease lapsed and another attempt owns the update now; nothing was written.
            # Re-raising is fine: the runtime knows this attempt is over.
            LOGGER.warning("update %s: attempt %s lost its lease; not booking",
                           attempt.update_id, attempt.attempt)
            raise

        LOGGER.info("update %s: %s %s", attempt.update_id, "booked" if booked else "taken", slot)
        exit_after.when_sent(processor, reply)

    async def on_error(update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        # The attempt is already marked failed (and retried or exhausted) by ptb_fence; this
        # only keeps the log short.
        LOGGER.warning("handler failed for update %s: %r",
                       getattr(update, "update_id", None), context.error)

    application.add_handler(CommandHandler("book", book))
    application.add_error_handler(on_error)

    if args.no_polling:
        run_without_polling(application, exit_after)
    else:
        LOGGER.info("polling; records in %s", args.db)
        # stop_running() makes run_polling return after a graceful shutdown
        exit_after.stop = application.stop_running
        # run_polling initializes the app (and with it the processor: lease keeper, sweep),
        # polls until SIGINT/SIGTERM (or stop_running()), then shuts everything down.
        application.run_polling(
            allowed_updates=Update.ALL_TYPES,
            stop_signals=(signal.SIGINT, signal.SIGTERM),
        )
    store.close()
    LOGGER.info("stopped")
    return 0


def run_without_polling(application: Application, exit_after: ExitAfter) -> None:  # type: ignore[type-arg]
    """Run the application without an updater: the processor's sweep feeds it."""

    async def run() -> None:
        stop = asyncio.Event()
        exit_after.stop = stop.set
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with application:  # initialize() ... shutdown()
            await application.start()
            LOGGER.info("running without polling (sweep only)")
            await stop.wait()
            await application.stop()

    asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
