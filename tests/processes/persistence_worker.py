"""A PTB conversation bot with FencedPersistence, for tests/processes/test_persistence_processes.py.

Usage::

    python tests/processes/persistence_worker.py BASE_URL TOKEN STORE TABLE --dir DIR \\
        --domain DOMAIN [--no-poll] [--hang TEXT] [--fail-once TEXT] [--count-sleep S] \\
        [--callback-data] [--inc-sleep S]

``STORE`` is ``sqlite:///absolute/path`` or a PostgreSQL DSN; the bot is
``FencedUpdateProcessor(store).install(Application.builder()...).persistence(FencedPersistence(store))``
against a :class:`ptb_fence.testing.FakeBotApi`, run with ``run_polling()`` (SIGTERM or
``DIR/stop`` stops it), or with ``--no-poll`` started without polling (its sweep hands over what is due) until
``DIR/stop`` exists.

The bot is a persistent three-step ``ConversationHandler`` (``name="booking"``): ``/book``
enters ``SLOT`` (``user_data["booking"]`` = the update id), a text ``slot ...`` enters
``CONFIRM`` (``user_data["slot"]`` = the text), ``yes`` ends it (``user_data["confirmed"]`` =
the slot). Each step writes one domain row ``(update_id, user_id, step, value, attempt, pid)``
in ``transaction(complete=True)``: the same commit as the step's state (declared first with
``context.next_conversation_state``). ``/count`` adds one to
``user_data["count"]`` (after ``--count-sleep`` seconds, or with ``--count-peer`` once another
update, in this process or another, read the count too, so that two updates of one user
overlap)
and completes without a transaction (the grouped completion carries the state); ``/count txn``
does the same in ``transaction(complete=True)`` with a domain row. ``/set`` sets
``user_data["x"] = 1`` and completes. ``/inc`` adds one to ``bot_data["n"]`` (after
``--inc-sleep`` seconds; ``/inc slow``: after 0.3 s); ``/tags`` sets ``bot_data["tags"]`` to a set of 64 strings; ``/look``
only reads ``bot_data`` (a ``seen`` file per attempt). With ``--callback-data`` (``arbitrary_callback_data``)
``/menu`` sends a keyboard whose button holds ``("choice", frozenset({update_id}))`` (not
JSON) with ``context.bot`` (``/menu outbox``: queued through ``attempt.outbox``), and a press
writes ``pressed.<update_id>.<pid>`` holding the ``repr`` of the data the handler got.

Files in ``DIR``: ``ready.<pid>``; ``seen.<update_id>.<attempt>.<pid>`` (a JSON line per run:
the conversation state the handler was called in, ``user_data`` as the handler first saw it,
the time; an attempt given back after a version conflict runs again with the same number);
``log.<pid>``.
A handler whose text is ``--hang`` sleeps after changing ``user_data`` (before its commit) until
the process is killed; ``--fail-once`` makes the first attempt of that text set
``user_data["x"] = 1`` and then raise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from typing import Any, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Update  # noqa: E402
from telegram.ext import (  # noqa: E402
    Application,
    CallbackQueryHandler,
    CommandHandler,
    ConversationHandler,
    MessageHandler,
    filters,
)

from ptb_fence.ptb import FencedPersistence, FencedUpdateProcessor  # noqa: E402
from worker_support import dump_stacks_on_sigusr1, make_store, touch  # noqa: E402

SLOT, CONFIRM = 1, 2


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("token")
    parser.add_argument("store")
    parser.add_argument("table")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--domain", required=True)
    parser.add_argument("--no-poll", action="store_true")
    parser.add_argument("--hang", default="")
    parser.add_argument("--fail-once", default="")
    parser.add_argument("--count-sleep", type=float, default=0.0)
    parser.add_argument("--count-peer", action="store_true",
                        help="/count waits (up to 15 s) until another update read the count too")
    parser.add_argument("--callback-data", action="store_true")
    parser.add_argument("--inc-sleep", type=float, default=0.0,
                        help="/inc waits this long between reading and changing the total")
    parser.add_argument("--lease", type=float, default=120.0)
    parser.add_argument("--max-concurrent", type=int, default=8)
    parser.add_argument("--max-life", type=float, default=120.0)
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> Any:
    pid = os.getpid()
    store = make_store(args.store, args.table)
    mark = "?" if args.store.startswith("sqlite:///") else "%s"
    insert = (
        f"INSERT INTO {args.domain} (update_id, user_id, step, value, attempt, pid) "  # noqa: S608
        f"VALUES ({mark}, {mark}, {mark}, {mark}, {mark}, {mark})"
    )

    def seen(update: Update, context: Any, state: Any) -> None:
        name = f"seen.{update.update_id}.{context.attempt.attempt}.{pid}"
        # a line per run: an attempt given back after a conflict runs again with its number
        with open(os.path.join(args.dir, name), "a", encoding="utf-8") as file:
            file.write(json.dumps({"state": state, "user_data": dict(context.user_data),
                                   "at": time.time()}) + "\n")

    async def step(update: Update, context: Any, number: int, value: str) -> None:
        text = update.message.text
        if args.fail_once and text == args.fail_once and context.attempt.attempt == 1:
            context.user_data["x"] = 1
            raise RuntimeError("failing the first attempt (--fail-once)")
        if args.hang and text == args.hang:
            touch(os.path.join(args.dir, f"hanging.{update.update_id}.{pid}"))
            await asyncio.sleep(3600)  # until SIGKILL, with user_data changed, uncommitted
        attempt = context.attempt

        def write(conn: Any) -> None:
            conn.cursor().execute(insert, (update.update_id, update.effective_user.id, number,
                                           value, attempt.attempt, pid))

        await attempt.run_in_transaction(write, complete=True)

    async def book(update: Update, context: Any) -> int:
        seen(update, context, None)
        context.user_data["booking"] = update.update_id
        context.next_conversation_state(SLOT)  # commits with the step's transaction
        await step(update, context, 1, "book")
        return SLOT

    async def slot(update: Update, context: Any) -> int:
        seen(update, context, SLOT)
        context.user_data["slot"] = update.message.text
        context.next_conversation_state(CONFIRM)
        await step(update, context, 2, update.message.text)
        return CONFIRM

    async def confirm(update: Update, context: Any) -> int:
        seen(update, context, CONFIRM)
        chosen = context.user_data.get("slot")
        context.user_data["confirmed"] = chosen
        context.next_conversation_state(ConversationHandler.END)
        await step(update, context, 3, str(chosen))
        return ConversationHandler.END

    async def count(update: Update, context: Any) -> None:
        seen(update, context, None)
        before = context.user_data.get("count", 0)
        if args.count_peer:
            touch(os.path.join(args.dir, f"reading.{update.update_id}.{pid}"))
            end = time.monotonic() + 15
            while time.monotonic() < end and not [
                    name for name in os.listdir(args.dir)
                    if name.startswith("reading.")
                    and not name.startswith(f"reading.{update.update_id}.")]:
                await asyncio.sleep(0.05)
        if args.count_sleep:
            await asyncio.sleep(args.count_sleep)
        context.user_data["count"] = before + 1
        if context.args == ["txn"]:
            await step(update, context, 0, str(before + 1))

    async def inc(update: Update, context: Any) -> None:
        seen(update, context, None)
        before = context.bot_data.get("n", 0)
        pause = 0.3 if context.args == ["slow"] else args.inc_sleep
        if pause:
            await asyncio.sleep(pause)
        context.bot_data["n"] = before + 1

    async def tags(update: Update, context: Any) -> None:
        context.bot_data["tags"] = {f"tag-{i}" for i in range(64)}

    async def look(update: Update, context: Any) -> None:
        seen(update, context, None)
        assert len(context.bot_data["tags"]) == 64

    async def set_x(update: Update, context: Any) -> None:
        seen(update, context, None)
        if args.fail_once and update.message.text == args.fail_once:
            await step(update, context, 0, "x")  # fails the first attempt after x = 1
        context.user_data["x"] = 1

    async def menu(update: Update, context: Any) -> None:
        markup = InlineKeyboardMarkup([[InlineKeyboardButton(
            "choose", callback_data=("choice", frozenset({update.update_id})))]])
        if context.args == ["outbox"]:
            context.attempt.outbox.reply_text("menu", reply_markup=markup)
        else:
            await context.bot.send_message(update.effective_chat.id, "menu", reply_markup=markup)

    async def pressed(update: Update, context: Any) -> None:
        name = f"pressed.{update.update_id}.{pid}"
        with open(os.path.join(args.dir, name), "w", encoding="utf-8") as file:
            file.write(repr(update.callback_query.data))

    processor = FencedUpdateProcessor(
        store, lease_seconds=args.lease, sweep_every_seconds=0.2, pending_grace_seconds=0.3,
        retry=lambda error, attempt: 0.1, max_concurrent=args.max_concurrent,
    )
    builder = Application.builder().token(args.token).base_url(args.base_url)
    if args.callback_data:
        builder = builder.arbitrary_callback_data(True)
    app = processor.install(builder).persistence(FencedPersistence(store)).build()
    app.add_handler(ConversationHandler(
        entry_points=[CommandHandler("book", book)],
        states={
            SLOT: [MessageHandler(filters.Regex(r"^slot "), slot)],
            CONFIRM: [MessageHandler(filters.Regex(r"^yes$"), confirm)],
        },
        fallbacks=[],
        name="booking",
        persistent=True,
    ))
    app.add_handler(CommandHandler("count", count))
    app.add_handler(CommandHandler("set", set_x))
    app.add_handler(CommandHandler("inc", inc))
    app.add_handler(CommandHandler("tags", tags))
    app.add_handler(CommandHandler("look", look))
    app.add_handler(CommandHandler("menu", menu))
    app.add_handler(CallbackQueryHandler(pressed))
    if not args.no_poll:

        async def watch_stop_file(application: Any) -> None:
            while not os.path.exists(os.path.join(args.dir, "stop")):
                await asyncio.sleep(0.05)
            application.stop_running()

        async def ready(application: Any) -> None:
            touch(os.path.join(args.dir, f"ready.{pid}"))
            application.create_task(watch_stop_file(application))

        app.post_init = ready
        return app, store
    deadline = time.monotonic() + args.max_life
    async with app:
        await app.start()
        touch(os.path.join(args.dir, f"ready.{pid}"))
        while not os.path.exists(os.path.join(args.dir, "stop")) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await app.stop()
    store.close()
    return None


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    dump_stacks_on_sigusr1()
    logging.basicConfig(
        filename=os.path.join(arguments.dir, f"log.{os.getpid()}"),
        level=logging.INFO,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    built = asyncio.run(main(arguments))
    if built is not None:
        application, update_store = built
        application.run_polling(poll_interval=0.0, timeout=1)
        update_store.close()
