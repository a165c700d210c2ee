#!/usr/bin/env python
"""The production recipe in one bot: a booking conversation that loses nothing and books nothing twice.

The conversation has three steps. ``/book`` shows the free slots as buttons. A press of a
button picks a slot and asks for a name. The name books the slot.

What each piece does:

- **FencedUpdateProcessor** records every update before Telegram is told it arrived.
  It claims the update under a lease and retries it when a handler fails.
- **FencedPersistence** keeps ``user_data`` and the conversation's state in the database.
  They commit with the update, so another process continues the conversation where it stopped.
- **The persistent ConversationHandler** (``persistent=True, name="booking"``) stores its states
  there.
- **Callback queries are answered directly** (``await query.answer()``). The answer stops the
  button's spinner and has a deadline, so it goes out at once.
- **Replies go through the outbox** (``attempt.outbox``). A reply is sent if and only if the
  commit that carries it lands.
- **The booking is a fenced write.** The row, the reply and the update's completion are one
  commit (``complete=True``). A stale attempt cannot write.
- **A durable reminder** (``durable_jobs=True``). The booking schedules it with PTB's
  ``run_once``, in the commit that books. It lives in the database, so it survives a restart.
  It runs once across processes and sends through the outbox.
- **A durable conversation timeout.** ``conversation_timeout`` of the persistent conversation
  is a job in the database too. A conversation left open ends once, after a restart as well.
- **strict_chat_order** starts a chat's update only after the chat's earlier updates ended,
  across processes.
- **A second process** (``--no-polling``) shares the database. It takes over the updates of a
  process that died and keeps the bot answering.

Run it offline, against the fake Bot API of ``ptb_fence.testing`` (install from a clone of the
repository with ``python -m pip install -e .``; no token, no network). In one terminal::

    python -m ptb_fence.testing serve --message "/book"

In a second terminal, the polling process::

    python examples/booking_bot.py --db booking.sqlite3 --base-url http://127.0.0.1:8081/bot

In a third terminal, the second process::

    python examples/booking_bot.py --db booking.sqlite3 --base-url http://127.0.0.1:8081/bot --no-polling

Then type ``!button 10:00`` in the first terminal, and then a name such as ``Ada``.
Kill the polling process with ``kill -9`` while it books (``--work-seconds 5`` gives you time).
The second process books the slot once and sends the reply once.
It sends the reminder 15 minutes before the slot (``--remind-after 10`` sends it 10 seconds
after the booking instead).

Run it against Telegram::

    export TELEGRAM_BOT_TOKEN=123456:ABC...
    python examples/booking_bot.py --db booking.sqlite3

Processes on several machines share a PostgreSQL database instead of a file: build the store
with ``PostgresUpdateStore(dsn)`` and use ``%s`` placeholders in ``write``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dtm
import logging
import os
import signal
import sqlite3
import sys
import urllib.parse
from typing import List, Optional, Union

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.ext import (
    Application,
    CallbackQueryHandler,
    CommandHandler,
    ContextTypes,
    ConversationHandler,
    MessageHandler,
    TypeHandler,
    filters,
)

from ptb_fence import Exhaustion, SQLiteUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedPersistence, FencedUpdateProcessor

LOGGER = logging.getLogger("booking_bot")
LOCAL_TOKEN = "123456:TEST-TOKEN"  # what ``python -m ptb_fence.testing serve`` accepts
SLOTS = ("09:00", "10:00", "11:00")
PICK, NAME = range(2)  # the conversation's states

# The bookings live in the store's database, so a booking and its update commit together.
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS bookings (slot TEXT PRIMARY KEY, chat_id INTEGER NOT NULL,"
    " name TEXT NOT NULL, update_id INTEGER NOT NULL)"
)
INSERT = "INSERT INTO bookings VALUES (?, ?, ?, ?) ON CONFLICT (slot) DO NOTHING"
BOOKED = "SELECT 1 FROM bookings WHERE slot = ? AND update_id = ?"
REMIND_BEFORE = dtm.timedelta(minutes=15)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--db", default="booking.sqlite3", help="SQLite file (created if missing)")
    parser.add_argument("--base-url", default="https://api.telegram.org/bot",
                        help="Bot API base URL (the fake one offline)")
    parser.add_argument("--no-polling", action="store_true",
                        help="do not poll: handle what other processes recorded or left behind")
    parser.add_argument("--work-seconds", type=float, default=0.0,
                        help="seconds the last step works before it books (time to kill it)")
    parser.add_argument("--remind-after", type=float, default=None, metavar="SECONDS",
                        help="send the reminder this long after the booking "
                             "(default: 15 minutes before the slot)")
    parser.add_argument("--conversation-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="end a conversation left open this long")
    parser.add_argument("--lease-seconds", type=float, default=120.0, help="lease per attempt")
    parser.add_argument("--sweep-every", type=float, default=30.0, help="sweep interval (s)")
    return parser.parse_args(argv)


def open_store(args: argparse.Namespace) -> SQLiteUpdateStore:
    """The update store, with the bookings table in its database file."""
    store = SQLiteUpdateStore(args.db)
    with store.transaction() as conn:
        conn.execute(SCHEMA)
    return store


def reminder_time(slot: str, remind_after: Optional[float]) -> Union[float, dtm.datetime]:
    """When to remind of ``slot``: ``remind_after`` seconds from now, or before its next start."""
    if remind_after is not None:
        return remind_after
    now = dtm.datetime.now().astimezone()
    hour, minute = (int(part) for part in slot.split(":"))
    start = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if start - REMIND_BEFORE <= now:
        start += dtm.timedelta(days=1)
    return start - REMIND_BEFORE


async def remind(context: FencedCallbackContext) -> None:
    """The reminder: a durable job's callback.

    It is defined at module level, so the store keeps it by name and any process finds it.
    Its run is a fenced attempt. It reminds only if the booking it was scheduled for holds.
    """
    attempt, job = context.require_attempt(), context.job
    assert job is not None and job.chat_id is not None and isinstance(job.data, dict)
    chat_id, slot, who = job.chat_id, job.data["slot"], job.data["name"]
    booked_by = job.data["update_id"]  # the update that booked it

    def check_and_send(conn: sqlite3.Connection) -> None:
        if conn.execute(BOOKED, (slot, booked_by)).fetchone() is not None:
            attempt.outbox.send_message(chat_id, f"Reminder: {slot} is booked for {who}.")

    await attempt.run_in_transaction(check_and_send, complete=True)


def build(args: argparse.Namespace, token: str, store: SQLiteUpdateStore) -> Application:  # type: ignore[type-arg]
    """The Application: processor, persistence and the conversation."""
    async def on_exhaustion(exhaustion: Exhaustion) -> None:
        # Called at least once per update that failed on every attempt. Returning acknowledges it.
        LOGGER.error("gave up on update %s: %s", exhaustion.update_id, exhaustion.error)

    processor = FencedUpdateProcessor(
        store,
        handle_exhaustion=on_exhaustion,
        strict_chat_order=True,
        durable_jobs=True,  # the Application's job_queue keeps its jobs in the store
        lease_seconds=args.lease_seconds,
        sweep_every_seconds=args.sweep_every,
    )
    builder = (Application.builder().token(token).base_url(args.base_url)
               .context_types(ContextTypes(context=FencedCallbackContext)))
    app = processor.install(builder).persistence(FencedPersistence(store)).build()

    async def start(update: Update, context: FencedCallbackContext) -> int:
        keyboard = InlineKeyboardMarkup(
            [[InlineKeyboardButton(slot, callback_data=slot) for slot in SLOTS]])
        # Sent if and only if this update's completion commits.
        context.require_attempt().outbox.reply_text("Pick a slot:", reply_markup=keyboard)
        return PICK

    async def pick(update: Update, context: FencedCallbackContext) -> int:
        query = update.callback_query
        assert query is not None and query.message is not None
        await query.answer()  # directly: the spinner stops now, whatever the attempt's fate
        assert context.user_data is not None
        context.user_data["slot"] = query.data  # commits with this update
        context.require_attempt().outbox.send_message(
            query.message.chat.id, f"{query.data}: what name should I book it under?")
        return NAME

    async def name(update: Update, context: FencedCallbackContext) -> int:
        attempt = context.require_attempt()
        message = update.effective_message
        assert message is not None and message.text is not None and context.user_data is not None
        slot, who = str(context.user_data.get("slot")), message.text
        LOGGER.info("update %s: booking %s for %s", attempt.update_id, slot, who)
        await asyncio.sleep(args.work_seconds)  # stands for slow work before the booking

        def write(conn: sqlite3.Connection) -> None:
            # Runs only while this attempt owns the update, in one transaction with the completion.
            cursor = conn.execute(INSERT, (slot, message.chat_id, who, attempt.update_id))
            booked = cursor.rowcount == 1
            attempt.outbox.reply_text(f"Booked {slot} for {who}." if booked
                                      else f"Sorry, {slot} is taken.")

        # The reminder commits with this update. A failed or stale attempt schedules nothing.
        assert context.job_queue is not None
        context.job_queue.run_once(
            remind, reminder_time(slot, args.remind_after), chat_id=message.chat_id,
            data={"slot": slot, "name": who, "update_id": attempt.update_id})
        # The conversation ends in the same commit as the booking row.
        context.next_conversation_state(ConversationHandler.END)
        await attempt.run_in_transaction(write, complete=True)
        context.user_data.pop("slot", None)
        return ConversationHandler.END

    async def timed_out(update: Update, context: FencedCallbackContext) -> None:
        # Runs once when the conversation times out, in whichever process runs the timeout.
        assert update.effective_chat is not None
        context.require_attempt().outbox.send_message(
            update.effective_chat.id, "No booking made. Send /book to start again.")

    app.add_handler(ConversationHandler(
        entry_points=[CommandHandler("book", start)],
        states={PICK: [CallbackQueryHandler(pick)],
                NAME: [MessageHandler(filters.TEXT & ~filters.COMMAND, name)],
                ConversationHandler.TIMEOUT: [TypeHandler(Update, timed_out)]},
        fallbacks=[], name="booking", persistent=True, per_message=False,
        conversation_timeout=args.conversation_timeout,  # a durable job under FencedPersistence
    ))
    return app


async def run_without_polling(app: Application) -> None:  # type: ignore[type-arg]
    """Run the Application without an updater: the processor's sweep feeds it."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with app:
        await app.start()
        LOGGER.info("running without polling")
        await stop.wait()
        await app.stop()


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    local = urllib.parse.urlsplit(args.base_url).hostname in ("127.0.0.1", "localhost", "::1")
    token = os.environ.get("TELEGRAM_BOT_TOKEN") or (LOCAL_TOKEN if local else None)
    if not token:
        print("set TELEGRAM_BOT_TOKEN, or pass --base-url http://127.0.0.1:8081/bot "
              "to use `python -m ptb_fence.testing serve`", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s [{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "apscheduler"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    store = open_store(args)
    app = build(args, token, store)
    if args.no_polling:
        asyncio.run(run_without_polling(app))
    else:
        LOGGER.info("polling")
        app.run_polling(allowed_updates=Update.ALL_TYPES,
                        stop_signals=(signal.SIGINT, signal.SIGTERM))
    store.close()
    LOGGER.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
