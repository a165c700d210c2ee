"""A PTB bot process for tests/processes/test_ptb_processes.py (run with ``sys.executable``).

Usage::

    python tests/processes/ptb_bot_worker.py BASE_URL TOKEN STORE TABLE \\
        --dir DIR --domain DOMAIN [options]

``BASE_URL``/``TOKEN`` point at a :class:`ptb_fence.testing.FakeBotApi` in the test process.
``STORE`` is ``sqlite:///absolute/path`` or a PostgreSQL DSN. The process builds the store and
``FencedUpdateProcessor(...).install(Application.builder()...)`` (``--unary``:
``DurableUpdateProcessor``, whose handler only announces itself); with ``--poll`` it polls the
fake server, without it it only runs the Application (its sweep hands over due updates). It
runs until ``DIR/stop`` exists (or ``--max-life`` passed), then stops cleanly.
A message whose text is ``--txn`` keeps its fenced transaction open ``--txn-seconds`` (after
its write, announcing itself with ``in_txn.<update_id>.<pid>``).

The handler writes one fenced domain row per attempt that commits, with
``await context.attempt.run_in_transaction(write, complete=True)``. A message whose text is
``--hang`` sleeps (after announcing itself) until the process is killed. A message whose text
is ``--stubborn`` ignores cancellation for ``--stubborn-seconds`` the first time it is handled
(in any process: ``stubborn.<update_id>`` in ``DIR`` marks it), writing ``cancelled.<update_id>``
when a cancellation reaches it. With ``--conversation`` the handler is the second step of a
``ConversationHandler`` (per-process state, as with no persistence): ``/book`` enters it, the
next text message of the chat runs the handler above and ends the conversation; other messages
match no handler.

Files in ``DIR``: ``ready.<pid>`` once polling/running; ``started.<update_id>.<pid>`` when a
handler begins, ``ended.<update_id>.<pid>`` when its completing transaction committed (both hold
``time.time()``); ``log.<pid>`` the process log.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from typing import Any, List

HERE = os.path.dirname(os.path.abspath(__file__))
# the project root (two levels up: tests/processes/), for ``import ptb_fence``
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from telegram import Update  # noqa: E402
from telegram.ext import (  # noqa: E402
    Application,
    CommandHandler,
    ConversationHandler,
    MessageHandler,
    filters,
)

from ptb_fence.ptb import DurableUpdateProcessor, FencedUpdateProcessor  # noqa: E402
from worker_support import (  # noqa: E402
    add_worker_arguments,
    announce_ready,
    crash_if,
    dump_stacks_on_sigusr1,
    extra_options,
    fail_if,
    serve_metrics,
    fork_child,
    make_store,
    touch,
)


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_worker_arguments(parser)
    parser.add_argument(
        "--conversation", action="store_true", help="handle messages as a /book conversation"
    )
    parser.add_argument(
        "--stubborn", default="", help="text of messages whose first handler ignores cancellation"
    )
    parser.add_argument("--stubborn-seconds", type=float, default=60.0)
    parser.add_argument(
        "--run-polling",
        action="store_true",
        help="run app.run_polling() (stopped by SIGTERM/SIGINT) instead of the stop file",
    )
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> Any:
    pid = os.getpid()
    store = make_store(args.store, args.table)
    mark = "?" if args.store.startswith("sqlite:///") else "%s"
    insert = (
        f"INSERT INTO {args.domain} (update_id, attempt, claim_id, pid) "  # noqa: S608
        f"VALUES ({mark}, {mark}, {mark}, {mark})"
    )

    async def on_message(update: Update, context: Any) -> Any:
        touch(os.path.join(args.dir, f"started.{update.update_id}.{pid}"))
        crash_if(args, update.message.text)
        if args.unary:  # no attempt: the processor settles when the handler returns
            return ConversationHandler.END
        attempt = context.attempt
        if args.hang and update.message.text == args.hang:
            await asyncio.sleep(3600)  # until SIGKILL
        marker = os.path.join(args.dir, f"stubborn.{update.update_id}")
        if args.stubborn and update.message.text == args.stubborn and not os.path.exists(marker):
            touch(marker)
            end = time.monotonic() + args.stubborn_seconds
            while time.monotonic() < end:  # a cleanup that swallows every cancellation
                try:
                    await asyncio.sleep(end - time.monotonic())
                except asyncio.CancelledError:
                    touch(os.path.join(args.dir, f"cancelled.{update.update_id}"))
        if args.slow and update.message.text == args.slow:
            await asyncio.sleep(args.slow_seconds)
        fail_if(args, update.message.text, attempt.attempt)

        def write(conn: Any) -> None:
            cur = conn.cursor()
            cur.execute(insert, (update.update_id, attempt.attempt, attempt.claim_id, pid))
            if args.txn and update.message.text == args.txn:
                if args.fork_in_txn:
                    fork_child(args.dir, pid)
                touch(os.path.join(args.dir, f"in_txn.{update.update_id}.{pid}"))
                time.sleep(args.txn_seconds)  # the fenced transaction stays open meanwhile

        await attempt.run_in_transaction(write, complete=True)
        touch(os.path.join(args.dir, f"ended.{update.update_id}.{pid}"))
        return ConversationHandler.END

    async def book(update: Update, context: Any) -> int:
        await context.attempt.run_in_transaction(lambda conn: None, complete=True)
        return 0

    processor = (DurableUpdateProcessor if args.unary else FencedUpdateProcessor)(
        store,
        lease_seconds=args.lease,
        sweep_every_seconds=args.sweep,
        pending_grace_seconds=args.grace,
        max_concurrent=args.max_concurrent,
        retry=lambda error, attempt: args.retry,
        **extra_options(args),
    )
    serve_metrics(args, processor)
    app = processor.install(
        Application.builder().token(args.token).base_url(args.base_url)
    ).build()
    if args.conversation:
        app.add_handler(
            ConversationHandler(
                entry_points=[CommandHandler("book", book)],
                states={0: [MessageHandler(filters.TEXT & ~filters.COMMAND, on_message)]},
                fallbacks=[],
            )
        )
    else:
        app.add_handler(MessageHandler(filters.TEXT, on_message))
    if args.run_polling:

        async def ready(application: Any) -> None:
            touch(os.path.join(args.dir, f"ready.{pid}"))

        app.post_init = ready
        return app, store  # run_polling() runs it in its own loop (see the end of this file)
    deadline = time.monotonic() + args.max_life
    stop_file = os.path.join(args.dir, "stop")
    async with app:
        await app.start()
        if args.poll:
            assert app.updater is not None
            await app.updater.start_polling(poll_interval=0.0, timeout=1)
        if args.fork_child:
            fork_child(args.dir, pid)
        announce_ready(args.dir, pid, store)
        while not os.path.exists(stop_file) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if app.updater is not None and app.updater.running:
            await app.updater.stop()
        await app.stop()
    store.close()


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
    if built is not None:  # --run-polling: PTB's own loop and signal handling
        application, update_store = built
        # post_init runs before polling starts; "ready" is close enough for the tests
        application.run_polling(poll_interval=0.0, timeout=1)
        update_store.close()
        logging.getLogger("ptb_bot_worker").info("run_polling returned; exiting")
