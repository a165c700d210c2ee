#!/usr/bin/env python
"""A booking bot with SQLAlchemy models: PTB polling, SQLite or PostgreSQL.

``/book 10:30`` books the slot ``10:30``. A :class:`ptb_fence.ptb.FencedUpdateProcessor` commits
every update to the update store before Telegram is told it arrived, then claims it under a lease
and runs the handler. The handler writes the booking with the ORM inside
``with attempt.transaction(connection=session, complete=True):`` — ptb_fence checks in the
Session's transaction that this attempt still owns the update (PostgreSQL:
``SELECT … FOR UPDATE``) and settles it as completed there; when the block ends the Session is
flushed and committed, so the booking and the settlement are **one commit, made by
SQLAlchemy**. A crash before it re-runs the handler; a crash after it never does; an attempt
whose lease lapsed gets :exc:`ptb_fence.OwnershipLost` and its writes are rolled back.

The reply is queued with ``attempt.outbox.reply_text`` inside that block: the outbox row is
inserted through the Session's transaction, so it commits with the booking (and is sent after
the commit, at least once) or rolls back with it (a failed or stale attempt never replies).

The update store lives in the same database as the models: a SQLite file (``--db``), or
PostgreSQL (``--dsn``; SQLAlchemy's ``psycopg2`` driver, or psycopg 3 with ``--driver psycopg``).

Run it (Python 3.10+; ``python -m pip install -e . sqlalchemy``)::

    export TELEGRAM_BOT_TOKEN=123456:ABC...
    python examples/sqlalchemy_booking.py --db bookings.sqlite3
    python examples/sqlalchemy_booking.py --dsn postgresql://user@localhost/bot

Offline, against the fake Bot API of ``ptb_fence.testing``. In one terminal::

    python -m ptb_fence.testing serve --message "/book 10:00" --message "/book 10:00"

and in another (it answers both, books 10:00 once, and exits)::

    python examples/sqlalchemy_booking.py --db offline.sqlite3 --base-url http://127.0.0.1:8081/bot --exit-after 2

``--crash-once`` makes the first attempt at each booking fail after its ORM write was flushed:
the write is rolled back with the transaction and the retry books the slot (attempt 2).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
import urllib.parse
from typing import Any, List, Optional, Set, Tuple

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes

from ptb_fence import Attempt, PostgresUpdateStore, SQLiteUpdateStore, UpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor

LOGGER = logging.getLogger("sqlalchemy_booking")
LOCAL_TOKEN = "123456:TEST-TOKEN"  # what ``python -m ptb_fence.testing serve`` accepts
SLOT = re.compile(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]")


class Base(DeclarativeBase):
    pass


class Booking(Base):
    __tablename__ = "sa_bookings"

    slot: Mapped[str] = mapped_column(sa.String(5), primary_key=True)  # one booking per slot
    chat_id: Mapped[int] = mapped_column(sa.BigInteger)
    update_id: Mapped[int] = mapped_column(sa.BigInteger)
    attempt: Mapped[int]  # the attempt that wrote it, for audits


def book_slot(engine: sa.Engine, attempt: Attempt, slot: str, chat_id: int,
              crash: bool) -> Tuple[bool, Any]:
    """Book ``slot`` (blocking: run it on a worker thread). Whether it was free, and the
    outbox id of the reply."""
    with Session(engine) as session:
        # the Session's transaction: ptb_fence checks ownership and settles the update in it,
        # then flushes and commits the Session. Do not commit or roll back the Session inside
        # (TransactionEnded), nor call this inside `with session.begin():` (refused).
        with attempt.transaction(connection=session, complete=True):
            booked = session.get(Booking, slot) is None
            if booked:
                session.add(Booking(slot=slot, chat_id=chat_id, update_id=attempt.update_id,
                                    attempt=attempt.attempt))
            if crash and attempt.attempt == 1:
                session.flush()  # the INSERT reached the database ...
                raise RuntimeError("crashing after the ORM write (--crash-once)")  # ... undone
            # inserted into the outbox through the Session's transaction: sent iff this
            # commit lands (the crash above rolls it back with the booking)
            text = f"Booked {slot} for you." if booked else f"Sorry, {slot} is already taken."
            reply = attempt.outbox.reply_text(text)
        return booked, reply


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--db", default="bookings.sqlite3", help="SQLite file (created if missing)")
    parser.add_argument("--dsn", default="", help="PostgreSQL instead of SQLite")
    parser.add_argument("--driver", default="psycopg2", choices=("psycopg2", "psycopg"),
                        help="SQLAlchemy's PostgreSQL driver (psycopg: psycopg 3)")
    parser.add_argument("--table", default="telegram_updates", help="the update store's table")
    parser.add_argument("--bookings-table", default="sa_bookings", help="the bookings table")
    parser.add_argument("--base-url", default="https://api.telegram.org/bot")
    parser.add_argument("--exit-after", type=int, default=None, metavar="N",
                        help="stop after N updates were handled (for tests and demos)")
    parser.add_argument("--crash-once", action="store_true",
                        help="fail each booking's first attempt after its ORM write")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    host = urllib.parse.urlsplit(args.base_url).hostname or ""
    token = os.environ.get("TELEGRAM_BOT_TOKEN") or (
        LOCAL_TOKEN if host in ("127.0.0.1", "localhost", "::1") else None)
    if not token:
        print("set TELEGRAM_BOT_TOKEN, or pass --base-url http://127.0.0.1:8081/bot to use "
              "`python -m ptb_fence.testing serve`", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "apscheduler"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    Booking.__table__.name = args.bookings_table  # type: ignore[attr-defined]
    store: UpdateStore
    if args.dsn:
        store = PostgresUpdateStore(args.dsn, args.table)
        url = args.dsn.replace("postgresql://", f"postgresql+{args.driver}://", 1)
        engine = sa.create_engine(url)
    else:
        store = SQLiteUpdateStore(args.db, args.table)
        engine = sa.create_engine(f"sqlite:///{args.db}", connect_args={"timeout": 30})
    Base.metadata.create_all(engine)  # a project would use Alembic

    processor = FencedUpdateProcessor(store)
    builder = (
        Application.builder()
        .token(token)
        .base_url(args.base_url)
        .context_types(ContextTypes(context=FencedCallbackContext))  # handlers' type
    )
    application = processor.install(builder).build()
    handled = [0]
    waiting: Set["asyncio.Task[None]"] = set()

    def one_done() -> None:
        handled[0] += 1
        if args.exit_after is not None and handled[0] == args.exit_after:
            application.stop_running()

    def when_sent(call: Any) -> None:
        """Count the update once its outbox reply was sent (or failed): a stop hands unsent
        calls to the next start, and ``--exit-after`` wants the reply out before it stops."""
        if args.exit_after is None:
            return

        async def wait() -> None:
            for _ in range(600):  # at most 30 s
                entry = await processor.outbox_call_async(call)
                if entry is not None and entry.state in ("sent", "failed"):
                    break
                await asyncio.sleep(0.05)
            one_done()

        task = asyncio.get_running_loop().create_task(wait())
        waiting.add(task)
        task.add_done_callback(waiting.discard)

    async def book(update: Update, context: FencedCallbackContext) -> None:
        message, attempt = update.effective_message, context.require_attempt()
        assert message is not None
        slot = context.args[0] if context.args else ""
        if not SLOT.fullmatch(slot):
            # no transaction here: the attempt holds the call, and the commit that completes
            # the update (after the handler returned) writes it
            when_sent(attempt.outbox.reply_text("Usage: /book HH:MM"))
            return
        # the ORM is blocking: a worker thread, never the event loop
        booked, reply = await asyncio.to_thread(book_slot, engine, attempt, slot,
                                                message.chat_id, args.crash_once)
        LOGGER.info("update %s: %s %s", attempt.update_id, "booked" if booked else "taken", slot)
        when_sent(reply)

    application.add_handler(CommandHandler("book", book))
    LOGGER.info("polling")
    application.run_polling(allowed_updates=Update.ALL_TYPES,
                            stop_signals=(signal.SIGINT, signal.SIGTERM))
    engine.dispose()
    store.close()
    LOGGER.info("stopped after %d update(s)", handled[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
