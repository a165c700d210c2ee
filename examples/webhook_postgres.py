#!/usr/bin/env python
"""A booking bot on webhooks and PostgreSQL, meant to run as several processes.

``/book 10:30`` books the slot ``10:30`` once, whichever process handles the update and however
many times it is handled. Every process shares one PostgreSQL table of updates
(:class:`ptb_fence.PostgresUpdateStore`) and a ``bookings`` table in the same database:

- a **webhook process** (the default) runs PTB's webhook server. It answers Telegram's POST with
  200 only after the update is committed to PostgreSQL, then claims it under a lease, handles it,
  and settles it;
- a **sweep-only process** (``--no-webhook``) runs no web server. Its sweep takes over updates
  whose owner died or stalled (lease lapsed), failed updates whose retry time has come, updates
  received by a process that died before handling them (after ``--pending-grace``), and delivers
  exhaustions. Every webhook process sweeps too; a sweep-only process keeps that going while you
  redeploy the webhook processes, or runs the work on a machine without public ingress.

The booking is written in a **fenced transaction** on a connection of the store's own pool:
ptb_fence first runs ``SELECT … FOR UPDATE`` on the update's row to check that this attempt still
owns it (a stale process whose lease lapsed is refused and rolled back), then our INSERT runs, the
reply is queued into the outbox by the same transaction, and ``complete=True`` settles the update
in the same commit. After the commit one of the processes sends the reply (at least once, each
chat's replies in order); a refused or rolled-back attempt never replies.

Deployment (one public URL, any number of processes on any number of machines)::

    export TELEGRAM_BOT_TOKEN=123456:ABC...
    export TELEGRAM_WEBHOOK_SECRET=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')
    export PTB_FENCE_POSTGRES_DSN=postgresql://bot:secret@db.internal:5432/bot

    # behind your reverse proxy / load balancer, which terminates TLS for
    # https://bot.example.com/telegram and spreads requests over these ports:
    python examples/webhook_postgres.py --port 8001 --webhook-url https://bot.example.com/telegram
    python examples/webhook_postgres.py --port 8002 --webhook-url https://bot.example.com/telegram
    # and, optionally, one or more workers without a web server:
    python examples/webhook_postgres.py --no-webhook

PTB's webhook server needs the ``[webhooks]`` extra (tornado): install from a clone of the
repository with ``python -m pip install -e '.[webhooks]'``.

All processes must use the same DSN, ``--table`` and ``--bookings-table``; the webhook processes
the same secret and URL (each calls ``setWebhook`` with them at start, which is harmless). Order
of updates within a chat is kept within one process; updates of one chat that land on different
processes can run concurrently, so keep your writes correct under that (the slot's primary key
does it here). Stop any process with SIGINT or SIGTERM; kill one with ``kill -9`` and another
takes its in-flight updates over after ``--lease-seconds``.

Offline, against the fake Bot API of ``ptb_fence.testing`` and a local PostgreSQL (no token
and no secret needed: a local ``--base-url`` uses the fake's token and a generated secret; the
webhook URL defaults to ``http://LISTEN:PORT/URL_PATH``). In one terminal::

    python -m ptb_fence.testing serve

and in another (install from a clone of the repository with
``python -m pip install -e '.[webhooks]'``)::

    python examples/webhook_postgres.py --dsn postgresql://postgres@127.0.0.1:5432/postgres \\
        --base-url http://127.0.0.1:8081/bot --listen 127.0.0.1 --port 8080 \\
        --table my_updates --bookings-table my_bookings

then type ``/book 10:00`` in the first terminal: the fake posts it to the webhook and shows the
reply.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
import secrets
import time
import urllib.parse
from typing import Any, Callable, List, Optional, Set, Tuple

from psycopg2 import sql
from telegram import Update
from telegram.constants import ChatAction
from telegram.ext import Application, CommandHandler, ContextTypes

from ptb_fence import Exhaustion, OwnershipLost, PostgresUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor

LOGGER = logging.getLogger("booking_bot")

WEBHOOKS_INSTALL = "python -m pip install -e '.[webhooks]'"  # from a clone of the repository
LOCAL_TOKEN = "123456:TEST-TOKEN"  # what ``python -m ptb_fence.testing serve`` accepts


def webhooks_installed() -> bool:
    """Whether PTB's webhook server can run (its ``[webhooks]`` extra, i.e. tornado)."""
    try:
        import tornado  # noqa: F401  (only probing)
    except ImportError:
        return False
    return True


def is_local(base_url: str) -> bool:
    """Whether ``base_url`` points at a Bot API on this machine (the fake one, offline)."""
    host = urllib.parse.urlsplit(base_url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


SLOT = re.compile(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]")
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

# {table} is filled in with psycopg2.sql.Identifier (quoted), never with string formatting.
BOOKINGS_SCHEMA = """
CREATE TABLE IF NOT EXISTS {table} (
    slot      TEXT PRIMARY KEY,   -- one booking per slot, across all processes
    chat_id   BIGINT NOT NULL,
    update_id BIGINT NOT NULL,    -- the update that booked it (not UNIQUE: Telegram may reuse
                                  -- an update_id after a week without updates)
    claim_id  TEXT NOT NULL,      -- the attempt that wrote it, for audits
    booked_at BIGINT NOT NULL     -- epoch milliseconds
)
"""


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


def table_name(value: str) -> str:
    """argparse type: a plain SQL identifier."""
    if not TABLE_NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a table name ([A-Za-z_][A-Za-z0-9_]*)")
    return value


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        epilog=f"The webhook server needs the [webhooks] extra: {WEBHOOKS_INSTALL}",
    )
    parser.add_argument(
        "--dsn",
        default=os.environ.get("PTB_FENCE_POSTGRES_DSN"),
        help="PostgreSQL DSN (default: $PTB_FENCE_POSTGRES_DSN)",
    )
    parser.add_argument("--table", type=table_name, default="telegram_updates",
                        help="the update table, shared by all processes")
    parser.add_argument("--bookings-table", type=table_name, default="bookings",
                        help="the domain table, shared by all processes")
    parser.add_argument(
        "--base-url",
        default="https://api.telegram.org/bot",
        help="Bot API base URL (the token is appended); point it at a fake server for tests",
    )
    parser.add_argument("--no-webhook", action="store_true",
                        help="run no web server: only sweep (lapsed leases, retries, exhaustions)")
    parser.add_argument("--listen", default="0.0.0.0", help="webhook listen address")
    parser.add_argument("--port", type=int, default=8443, help="webhook port")
    parser.add_argument("--url-path", default="telegram", help="webhook URL path")
    parser.add_argument(
        "--webhook-url",
        default=os.environ.get("TELEGRAM_WEBHOOK_URL"),
        help="public URL given to setWebhook (default: $TELEGRAM_WEBHOOK_URL, else "
        "http://LISTEN:PORT/URL_PATH, which only suits local tests)",
    )
    parser.add_argument("--lease-seconds", type=float, default=120.0, help="lease per attempt")
    parser.add_argument("--sweep-every", type=float, default=30.0, help="sweep interval (s)")
    parser.add_argument(
        "--pending-grace", type=float, default=60.0,
        help="seconds before a sweep takes a received but unclaimed update",
    )
    parser.add_argument("--max-attempts", type=int, default=5, help="attempts per update")
    parser.add_argument(
        "--pool-size", type=int, default=8,
        help="pooled PostgreSQL connections (callers wait for a free one when all are busy)",
    )
    parser.add_argument("--max-concurrent", type=int, default=32,
                        help="updates handled at once (different chats)")
    parser.add_argument(
        "--exit-after", type=int, default=None, metavar="N",
        help="stop after N updates were handled by this process (for tests and demos)",
    )
    parser.add_argument("--verbose", action="store_true", help="log at DEBUG level")
    return parser.parse_args(argv)


def create_bookings_table(store: PostgresUpdateStore, table: str) -> None:
    """Create the domain table (idempotent, safe when several processes start at once)."""
    with store.transaction() as conn, conn.cursor() as cur:
        # CREATE TABLE IF NOT EXISTS can still fail when two sessions race it; a transaction
        # advisory lock on the table's name serializes the processes that start together.
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (table,))
        cur.execute(sql.SQL(BOOKINGS_SCHEMA).format(table=sql.Identifier(table)))


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    local = is_local(args.base_url)
    token = os.environ.get("TELEGRAM_BOT_TOKEN") or (LOCAL_TOKEN if local else None)
    # offline, the fake Bot API learns the secret from our setWebhook call
    secret = os.environ.get("TELEGRAM_WEBHOOK_SECRET") or (
        secrets.token_urlsafe(32) if local else None
    )
    missing = []  # report every missing setting at once
    if not token:
        missing.append("TELEGRAM_BOT_TOKEN (your bot's token, from @BotFather)")
    if not args.dsn:
        missing.append("PTB_FENCE_POSTGRES_DSN or --dsn (your PostgreSQL database)")
    if not args.no_webhook and not secret:
        missing.append(
            "TELEGRAM_WEBHOOK_SECRET (1-256 characters of A-Z a-z 0-9 _ -; Telegram sends it "
            "with every update and the webhook refuses requests without it)"
        )
    if missing:
        print("missing settings:\n  " + "\n  ".join(missing) + "\n(offline, pass --base-url "
              "http://127.0.0.1:8081/bot to use `python -m ptb_fence.testing serve`; no token or "
              "secret needed then)", file=sys.stderr)
        return 2
    if not args.no_webhook and not webhooks_installed():
        # PTB would fail only at run_webhook(), after the store was opened, with a traceback
        print(f"the webhook server needs the [webhooks] extra (tornado): {WEBHOOKS_INSTALL}\n"
              "(or run with --no-webhook for a sweep-only process)", file=sys.stderr)
        return 2
    assert token is not None
    role = "sweeper" if args.no_webhook else "webhook"
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format=f"%(asctime)s [{role} {os.getpid()}] %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "apscheduler"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    # The store ensures its own table (idempotent migration) before first use.
    store = PostgresUpdateStore(args.dsn, table=args.table, pool_size=args.pool_size)
    create_bookings_table(store, args.bookings_table)
    insert_booking = sql.SQL(
        "INSERT INTO {table} (slot, chat_id, update_id, claim_id, booked_at) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (slot) DO NOTHING"
    ).format(table=sql.Identifier(args.bookings_table))

    exit_after = ExitAfter(args.exit_after)

    async def handle_exhaustion(exhaustion: Exhaustion) -> None:
        # At least once per exhaustion, in whichever process finds it first (handler failure
        # or a sweep); acknowledged when this returns. Replace the log line by your alerting.
        LOGGER.error(
            "update %s gave up after attempt %s (claim %s): %s",
            exhaustion.update_id,
            exhaustion.attempt,
            exhaustion.claim_id,
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
        max_concurrent=args.max_concurrent,
    )
    builder = (
        Application.builder()
        .token(token)
        .base_url(args.base_url)
        # install() sets this context type anyway; saying it here lets type checkers know
        .context_types(ContextTypes(context=FencedCallbackContext))
    )
    application = processor.install(builder).build()

    async def book(update: Update, context: FencedCallbackContext) -> None:
        message = update.effective_message
        attempt = context.attempt
        assert message is not None and attempt is not None  # block=True handlers get one
        slot = context.args[0] if context.args else ""
        if not SLOT.fullmatch(slot):
            # through the outbox: written by the commit that completes the update, sent after
            usage = attempt.outbox.send_message(
                message.chat_id, "Usage: /book HH:MM, e.g. /book 10:30")
            exit_after.when_sent(processor, usage)
            return

        # "typing…"; a user who blocked the bot makes this fail with 403 Forbidden, which the
        # default retry policy does not retry: the update becomes an exhaustion, not a booking.
        await context.bot.send_chat_action(message.chat_id, ChatAction.TYPING)

        def write(conn: Any) -> Tuple[bool, Any]:
            # A psycopg2 connection inside the fenced transaction (the update's row is locked
            # FOR UPDATE by the ownership check): %s placeholders; no commit/rollback here.
            with conn.cursor() as cur:
                cur.execute(
                    insert_booking,
                    (slot, message.chat_id, attempt.update_id, attempt.claim_id,
                     int(time.time() * 1000)),
                )
                booked = bool(cur.rowcount == 1)
            # the reply goes into the outbox in this transaction: sent iff it commits
            text = f"Booked {slot} for you." if booked else f"Sorry, {slot} is already taken."
            return booked, attempt.outbox.send_message(message.chat_id, text)

        try:
            booked, reply = await attempt.run_in_transaction(write, complete=True)
        except OwnershipLost:
            # This attempt's lease lapsed (the process stalled) and another process owns the
            # update now: our INSERT was rolled back. The other process does the booking.
            LOGGER.warning("update %s: attempt %s lost its lease; not booking",
                           attempt.update_id, attempt.attempt)
            raise

        LOGGER.info("update %s: %s %s", attempt.update_id, "booked" if booked else "taken", slot)
        exit_after.when_sent(processor, reply)

    async def on_error(update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        # ptb_fence has already marked the attempt failed (retry or exhaustion); keep logs short
        LOGGER.warning("handler failed for update %s: %r",
                       getattr(update, "update_id", None), context.error)

    application.add_handler(CommandHandler("book", book))
    application.add_error_handler(on_error)

    try:
        if args.no_webhook:
            run_sweep_only(application, exit_after)
        else:
            exit_after.stop = application.stop_running
            LOGGER.info("webhook on %s:%s/%s, table %s", args.listen, args.port,
                        args.url_path, args.table)
            # PTB's webhook answers 200 only after update_queue.put() returned, i.e. after
            # ptb_fence committed the update; a store failure answers 500 and Telegram
            # redelivers. Wrong or missing secret token: 403.
            application.run_webhook(
                listen=args.listen,
                port=args.port,
                url_path=args.url_path,
                webhook_url=args.webhook_url,
                secret_token=secret,
                allowed_updates=Update.ALL_TYPES,
                stop_signals=(signal.SIGINT, signal.SIGTERM),
            )
    finally:
        store.close()
    LOGGER.info("stopped")
    return 0


def run_sweep_only(application: Application, exit_after: ExitAfter) -> None:  # type: ignore[type-arg]
    """Run the application without an updater: the processor's sweep feeds it."""

    async def run() -> None:
        stop = asyncio.Event()
        exit_after.stop = stop.set
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with application:  # initialize() ... shutdown(): the lease keeper and sweep
            await application.start()
            LOGGER.info("sweeping (no webhook)")
            await stop.wait()
            await application.stop()

    asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
