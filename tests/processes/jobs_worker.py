"""A PTB bot process with durable jobs, for tests/processes/test_jobs_processes.py (run with
``sys.executable``: its job callbacks live in ``__main__``, as a bot run as a script has them).

Usage::

    python tests/processes/jobs_worker.py BASE_URL TOKEN STORE TABLE --dir DIR --domain DOMAIN
        [--poll] [--lease S] [--sweep S]

A message ``remind <due_ms> <tag>`` schedules ``remind`` at the epoch millisecond ``due_ms``
with ``data={"tag": tag, "due": due_ms}``, in the handler (so it commits with the update). A
message ``every <seconds> <name>`` declares a repeating job ``tick`` named ``name``. A run of
``remind`` writes ``(tag, run update id, attempt, claim id, pid, fired_at, due)`` into
``DOMAIN_fired`` and queues ``reminder <tag>`` to its chat, both in one fenced commit that
completes the run. A run of ``tick`` writes its name and run number the same way.
``--declare NAME:SECONDS`` declares ``tick`` at start, in ``post_init`` (every process and every
restart declares it: one job per name). ``--conversation-timeout S`` adds a persistent ``/book``
conversation under FencedPersistence that times out after ``S`` seconds: its TIMEOUT handler
writes ``timeout <chat>`` and replies ``timed out <chat>``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dtm
import logging
import os
import signal
import sys
import time
from typing import Any, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from telegram import Update  # noqa: E402
from telegram.ext import (  # noqa: E402
    Application,
    CommandHandler,
    ConversationHandler,
    MessageHandler,
    TypeHandler,
    filters,
)

from ptb_fence.ptb import FencedPersistence, FencedUpdateProcessor  # noqa: E402
from worker_support import dump_stacks_on_sigusr1, make_store, touch  # noqa: E402

ARGS: Any = None


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("token")
    parser.add_argument("store")
    parser.add_argument("table")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--domain", required=True)
    parser.add_argument("--poll", action="store_true")
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--sweep", type=float, default=0.5)
    parser.add_argument("--declare", action="append", default=[])
    parser.add_argument("--conversation-timeout", type=float, default=0.0,
                        help="a /book conversation under FencedPersistence with this timeout")
    return parser.parse_args(argv)


def _mark() -> str:
    return "?" if ARGS.store.startswith("sqlite:///") else "%s"


async def remind(context: Any) -> None:
    """A reminder's run: one fenced row and one reply, in the commit that completes it."""
    attempt, job = context.attempt, context.job
    mark = _mark()
    insert = (f"INSERT INTO {ARGS.domain}_fired (tag, run_id, attempt, claim_id, pid, fired_at, "
              f"due) VALUES ({', '.join([mark] * 7)})")  # noqa: S608

    def write(conn: Any) -> None:
        conn.cursor().execute(insert, (job.data["tag"], attempt.update_id, attempt.attempt,
                                       attempt.claim_id, os.getpid(),
                                       int(time.time() * 1000), job.data["due"]))
        attempt.outbox.send_message(chat_id=job.chat_id, text=f"reminder {job.data['tag']}")

    await attempt.run_in_transaction(write, complete=True)


async def tick(context: Any) -> None:
    """A repeating job's run: its name and run number, fenced."""
    attempt, job = context.attempt, context.job
    mark = _mark()
    insert = (f"INSERT INTO {ARGS.domain}_fired (tag, run_id, attempt, claim_id, pid, fired_at, "
              f"due) VALUES ({', '.join([mark] * 7)})")  # noqa: S608

    def write(conn: Any) -> None:
        conn.cursor().execute(insert, (f"{job.name}#{job.run_number}", attempt.update_id,
                                       attempt.attempt, attempt.claim_id, os.getpid(),
                                       int(time.time() * 1000), 0))

    await attempt.run_in_transaction(write, complete=True)


async def book(update: Update, context: Any) -> int:
    """Enters the conversation (state 0). The state and the timeout PTB schedules once this
    returns commit with the update's completion, which comes after the return. (Inside a
    ``transaction(complete=True)`` both would be written after that commit, outside the fence:
    a kill in between could keep the timeout and lose the state.)"""
    await context.attempt.run_in_transaction(lambda conn: None)
    return 0


async def timed_out(update: Update, context: Any) -> None:
    """The conversation's TIMEOUT handler: one fenced row and one reply per timeout."""
    attempt = context.attempt
    chat = update.effective_chat.id
    mark = _mark()
    insert = (f"INSERT INTO {ARGS.domain}_fired (tag, run_id, attempt, claim_id, pid, fired_at, "
              f"due) VALUES ({', '.join([mark] * 7)})")  # noqa: S608

    def write(conn: Any) -> None:
        conn.cursor().execute(insert, (f"timeout {chat}", attempt.update_id, attempt.attempt,
                                       attempt.claim_id, os.getpid(), int(time.time() * 1000),
                                       0))
        attempt.outbox.send_message(chat_id=chat, text=f"timed out {chat}")

    await attempt.run_in_transaction(write)


def build(args: argparse.Namespace) -> Any:
    store = make_store(args.store, args.table)

    async def on_message(update: Update, context: Any) -> None:
        assert update.message is not None and update.message.text is not None
        words = update.message.text.split()
        if words[0] == "remind":
            due = dtm.datetime.fromtimestamp(int(words[1]) / 1000, tz=dtm.timezone.utc)
            context.job_queue.run_once(remind, due, data={"tag": words[2], "due": int(words[1])},
                                       chat_id=update.effective_chat.id)
        elif words[0] == "every":
            context.job_queue.run_repeating(tick, float(words[1]), name=words[2])
        await context.attempt.run_in_transaction(lambda conn: None, complete=True)

    async def declare(application: Any) -> None:
        for spec in args.declare:
            name, seconds = spec.split(":")
            application.job_queue.run_repeating(tick, float(seconds), name=name)
        touch(os.path.join(args.dir, f"ready.{os.getpid()}"))

    processor = FencedUpdateProcessor(
        store, durable_jobs=True, lease_seconds=args.lease, sweep_every_seconds=args.sweep,
        pending_grace_seconds=0.2, retry=lambda error, attempt: 0.1,
    )
    builder = Application.builder().token(args.token).base_url(args.base_url).post_init(declare)
    if args.conversation_timeout:
        builder = builder.persistence(FencedPersistence(store))
    app = processor.install(builder).build()
    if args.conversation_timeout:
        app.add_handler(ConversationHandler(
            entry_points=[CommandHandler("book", book)],
            states={0: [MessageHandler(filters.TEXT & ~filters.COMMAND, book)],
                    ConversationHandler.TIMEOUT: [TypeHandler(Update, timed_out)]},
            fallbacks=[], name="booking", persistent=True,
            conversation_timeout=args.conversation_timeout,
        ))
    app.add_handler(MessageHandler(filters.TEXT, on_message))
    return app, store


async def run_without_polling(app: Any) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with app:
        await app.post_init(app)
        await app.start()
        await stop.wait()
        await app.stop()


if __name__ == "__main__":
    ARGS = parse_args(sys.argv[1:])
    dump_stacks_on_sigusr1()
    logging.basicConfig(
        filename=os.path.join(ARGS.dir, f"log.{os.getpid()}"),
        level=logging.INFO,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    application, update_store = build(ARGS)
    if ARGS.poll:
        application.run_polling(poll_interval=0.0, timeout=1)
    else:
        asyncio.run(run_without_polling(application))
    update_store.close()
