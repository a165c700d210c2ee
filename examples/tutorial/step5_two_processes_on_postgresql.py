"""Tutorial step 5: two processes on PostgreSQL.

Two bot processes share one PostgreSQL table. The poller receives the updates. The sweeper
receives nothing: it takes over the work of a process that died. The script starts both, as a
deployment would, kills the poller in the middle of a booking, and shows that the sweeper
finished it: one booking, one reply. Run it with
``python examples/tutorial/step5_two_processes_on_postgresql.py --dsn postgresql://...``.
"""

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, List

import psycopg2
from telegram import Update
from telegram.ext import Application, CommandHandler, ContextTypes

from ptb_fence import Exhaustion, PostgresUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi


# -- the bot: the same code runs in every process -------------------------------------------
def gave_up(exhaustion: Exhaustion) -> None:
    print(f"gave up on update {exhaustion.update_id}: {exhaustion.error}", file=sys.stderr)


def build_bot(args: argparse.Namespace) -> Application:  # type: ignore[type-arg]
    store = PostgresUpdateStore(args.dsn, table=args.table)  # every process: the same table
    with store.transaction() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {args.table}_bookings "
                    "(slot TEXT PRIMARY KEY, chat_id BIGINT, booked_by TEXT)")
    processor = FencedUpdateProcessor(
        store, handle_exhaustion=gave_up,
        sweep_every_seconds=1,  # the default is 30 s: a short wait for the tutorial
    )
    builder = (Application.builder().token(args.token).base_url(args.base_url)
               .context_types(ContextTypes(context=FencedCallbackContext)))
    app = processor.install(builder).build()

    async def book(update: Update, context: FencedCallbackContext) -> None:
        attempt, slot = context.require_attempt(), " ".join(context.args or [])
        assert update.effective_chat is not None
        chat_id = update.effective_chat.id
        await context.bot.send_chat_action(chat_id, "typing")  # safe to repeat: sent directly

        def write(conn: Any) -> None:  # a psycopg2 connection: %s placeholders
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO {args.table}_bookings VALUES (%s, %s, %s)",
                            (slot, chat_id, args.role))
            attempt.outbox.reply_text(f"Booked {slot}.")

        await attempt.run_in_transaction(write, complete=True)

    app.add_handler(CommandHandler("book", book))
    return app


def run_sweeper(app: Application) -> None:  # type: ignore[type-arg]
    """No updater: the processor's sweep feeds the application."""

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        async with app:  # the lease keeper and the sweep run from initialize() to shutdown()
            await app.start()
            print("sweeping", flush=True)
            await stop.wait()
            await app.stop()

    asyncio.run(run())


async def say_polling(app: Application) -> None:  # type: ignore[type-arg]
    print("polling", flush=True)


# -- the deployment: Telegram, a poller, a sweeper and a crash ------------------------------
def until(what: Callable[[], Any], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.05)


def start(role: str, args: argparse.Namespace, telegram: FakeBotApi) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [sys.executable, __file__, "--role", role, "--dsn", args.dsn, "--table", args.table,
         "--token", telegram.token, "--base-url", telegram.base_url],
        stdout=subprocess.PIPE, text=True)


def deploy(args: argparse.Namespace) -> None:
    with psycopg2.connect(args.dsn) as conn, conn.cursor() as cur:  # a demo: start empty
        for suffix in ("", "_outbox", "_persistence", "_bookings"):
            cur.execute(f"DROP TABLE IF EXISTS {args.table}{suffix}")
    with FakeBotApi(first_update_id=1000) as telegram:
        processes: List["subprocess.Popen[str]"] = []
        try:
            for role in ("poller", "sweeper"):
                processes.append(start(role, args, telegram))
                assert processes[-1].stdout is not None
                processes[-1].stdout.readline()  # "polling" or "sweeping": it runs
            poller, sweeper = processes
            telegram.delay("sendChatAction", 60)  # Telegram is slow: the poller waits in book
            telegram.inject_message(chat_id=1, text="/book 10:00")
            until(lambda: telegram.calls_to("sendChatAction"))
            poller.kill()  # SIGKILL in the middle of the handler
            poller.wait()
            print("poller killed in the middle of /book 10:00")
            telegram.delay("sendChatAction", 0)
            until(lambda: telegram.sent_messages)  # the sweeper takes the update over
            sweeper.send_signal(signal.SIGTERM)
            sweeper.wait(timeout=30)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
        print("bot said:", [message["text"] for message in telegram.sent_messages])
    with psycopg2.connect(args.dsn) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT slot, booked_by FROM {args.table}_bookings")
        print("bookings:", cur.fetchall())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dsn", default=os.environ.get("PTB_FENCE_POSTGRES_DSN"),
                        required="PTB_FENCE_POSTGRES_DSN" not in os.environ)
    parser.add_argument("--table", default="tutorial_updates")
    parser.add_argument("--role", choices=("poller", "sweeper"))
    parser.add_argument("--token")
    parser.add_argument("--base-url")
    args = parser.parse_args()
    if args.role is None:
        deploy(args)
        return
    app = build_bot(args)
    if args.role == "sweeper":
        run_sweeper(app)
    else:
        app.post_init = say_polling
        app.run_polling(poll_interval=0)


if __name__ == "__main__":
    main()
