"""A PTB bot process that replies through the outbox, for tests/processes/test_outbox_processes.py
(run with ``sys.executable``).

Usage::

    python tests/processes/outbox_worker.py BASE_URL TOKEN STORE TABLE --dir DIR --domain DOMAIN
        [--poll] [--lease S] [--sweep S] [--grace S] [--jitter-ms N] [--slow-seconds S] ...

``BASE_URL``/``TOKEN`` point at a :class:`ptb_fence.testing.FakeBotApi` in the test process;
``STORE`` is ``sqlite:///absolute/path`` or a PostgreSQL DSN. The process builds the store and
``FencedUpdateProcessor(...).install(Application.builder()...)``. With ``--poll`` it runs
``app.run_polling()`` (PTB's own loop and signal handling: SIGTERM stops it gracefully);
without it it runs the Application without polling (its sweep hands over the updates another
process recorded) until SIGTERM.

Every handler writes one fenced row ``(update_id, attempt, claim_id, pid)`` into ``DOMAIN`` and
queues one reply to the update's chat, ``reply <update_id> a<attempt> <claim_id>``, so the test
can tell from what FakeBotApi received which attempt's reply was sent. The message text picks
how (the first word):

- ``plain``: the reply is queued outside any transaction (held by the attempt), the write is a
  plain ``run_in_transaction``; the runtime's grouped completion carries the reply. Sleeps a
  random 0..``--jitter-ms`` before and after queueing.
- ``inside``: the reply is queued inside ``run_in_transaction(..., complete=True)``, through
  that transaction.
- ``order``: as ``inside``, and the transaction first bumps the chat's counter in
  ``DOMAIN_seq`` (a row lock held to the commit, so the counter's order is the chats' commit
  order); the reply ends with ``seq <n>``.
- ``fail``: queues its reply, then attempt 1 raises; later attempts reply and write as
  ``plain``.
- ``slow``: queues its reply; attempt 1 announces ``slow.<update_id>.<pid>``, sleeps
  ``--slow-seconds`` and announces ``woke.<update_id>.<pid>``; then it writes (a stale
  attempt is refused there) unless the second word is ``nowrite`` (then it returns, and the
  runtime's completion of a stale attempt is refused).
- ``once``: as ``plain`` with the reply queued ``at_most_once``.
- ``pay``: charges ``--pay`` (a :class:`ptb_fence.testing.FakePaymentApi`) in
  ``attempt.step("charge", ...)``, then as ``inside`` with the charge's id appended to the
  reply (``paid <id>``). With a second word ``fail`` attempt 1 raises after the charge. With
  ``slow`` attempt 1 announces ``slow.<update_id>.<pid>`` after its charge, inside its step,
  sleeps ``--slow-seconds`` and announces ``woke.<update_id>.<pid>``.
- ``hold``: queues its reply; attempt 1's fenced write announces ``holding.<update_id>.<pid>``
  inside its transaction and sleeps ``--slow-seconds`` there (on SQLite: holding the
  database's write lock, as a long fenced transaction of one chat does); later attempts
  write as ``plain``.

``handle_send_failure`` appends each failure as a JSON line to ``DIR/failures.<pid>``.
Files in ``DIR``: ``ready.<pid>`` once running; ``log.<pid>`` the process log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import sys
import time
from typing import Any, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from telegram import Update  # noqa: E402
from telegram.ext import Application, MessageHandler, filters  # noqa: E402

from ptb_fence.ptb import FencedUpdateProcessor  # noqa: E402
from ptb_fence.testing import charge_async  # noqa: E402
from worker_support import dump_stacks_on_sigusr1, make_store, touch  # noqa: E402


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("token")
    parser.add_argument("store")
    parser.add_argument("table")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--domain", required=True)
    parser.add_argument("--poll", action="store_true")
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--sweep", type=float, default=0.1)
    parser.add_argument("--grace", type=float, default=0.2)
    parser.add_argument("--retry", type=float, default=0.1, help="retry delay in seconds")
    parser.add_argument("--max-concurrent", type=int, default=16)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--slow-seconds", type=float, default=5.0)
    parser.add_argument("--stop-timeout", type=float, default=None)
    parser.add_argument("--pay", default="", help="FakePaymentApi's url (mode pay)")
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> Any:
    pid = os.getpid()
    store = make_store(args.store, args.table)
    mark = "?" if args.store.startswith("sqlite:///") else "%s"
    insert = (
        f"INSERT INTO {args.domain} (update_id, attempt, claim_id, pid) "  # noqa: S608
        f"VALUES ({mark}, {mark}, {mark}, {mark})"
    )
    bump = (
        f"INSERT INTO {args.domain}_seq (chat, n) VALUES ({mark}, 1) "  # noqa: S608
        f"ON CONFLICT (chat) DO UPDATE SET n = {args.domain}_seq.n + 1 RETURNING n"
    )
    rng = random.Random(pid)

    async def jitter() -> None:
        if args.jitter_ms > 0:
            await asyncio.sleep(rng.uniform(0, args.jitter_ms) / 1000.0)

    async def on_message(update: Update, context: Any) -> None:
        attempt = context.attempt
        assert update.message is not None and update.message.text is not None
        mode = update.message.text.split()[0]
        uid = update.update_id
        reply = f"reply {uid} a{attempt.attempt} {attempt.claim_id}"

        def write(conn: Any) -> None:
            conn.cursor().execute(insert, (uid, attempt.attempt, attempt.claim_id, pid))

        if mode == "pay":

            async def charge(key: str) -> Any:
                await jitter()
                charged = await charge_async(args.pay, key, amount=100, reference=str(uid))
                if update.message.text.split()[1:] == ["slow"] and attempt.attempt == 1:
                    touch(os.path.join(args.dir, f"slow.{uid}.{pid}"))
                    await asyncio.sleep(args.slow_seconds)
                    touch(os.path.join(args.dir, f"woke.{uid}.{pid}"))
                return {"id": charged["id"]}

            await jitter()
            paid = await attempt.step("charge", charge)
            await jitter()
            if update.message.text.split()[1:] == ["fail"] and attempt.attempt == 1:
                raise RuntimeError("the first attempt fails after its charge")
            reply += f" paid {paid['id']}"
            mode = "inside"
        if mode in ("inside", "order"):

            def write_and_reply(conn: Any) -> None:
                text = reply
                if mode == "order":
                    cur = conn.cursor()
                    cur.execute(bump, (update.message.chat_id,))
                    text += f" seq {cur.fetchone()[0]}"
                write(conn)
                attempt.outbox.reply_text(text)

            await jitter()
            await attempt.run_in_transaction(write_and_reply, complete=True)
            return
        if mode == "hold":
            attempt.outbox.reply_text(reply)

            def write_holding(conn: Any) -> None:
                write(conn)
                if attempt.attempt == 1:
                    touch(os.path.join(args.dir, f"holding.{uid}.{pid}"))
                    time.sleep(args.slow_seconds)

            await attempt.run_in_transaction(write_holding)
            return
        await jitter()
        attempt.outbox.reply_text(reply, at_most_once=(mode == "once"))
        await jitter()
        if mode == "fail" and attempt.attempt == 1:
            raise RuntimeError("the first attempt fails after queueing its reply")
        if mode == "slow" and attempt.attempt == 1:
            touch(os.path.join(args.dir, f"slow.{uid}.{pid}"))
            await asyncio.sleep(args.slow_seconds)
            touch(os.path.join(args.dir, f"woke.{uid}.{pid}"))
            if update.message.text.split()[1:] == ["nowrite"]:
                return
        await attempt.run_in_transaction(write)

    def handle_send_failure(failure: Any) -> None:
        record = {name: getattr(failure, name, None)
                  for name in ("call_id", "update_id", "method", "error", "chat_key")}
        with open(os.path.join(args.dir, f"failures.{pid}"), "a", encoding="utf-8") as file:
            file.write(json.dumps(record, default=str) + "\n")

    options: dict = {}
    if args.stop_timeout is not None:
        options["stop_timeout_seconds"] = args.stop_timeout
    processor = FencedUpdateProcessor(
        store,
        lease_seconds=args.lease,
        sweep_every_seconds=args.sweep,
        pending_grace_seconds=args.grace,
        max_concurrent=args.max_concurrent,
        retry=lambda error, attempt: args.retry,
        handle_send_failure=handle_send_failure,
        **options,
    )
    app = processor.install(
        Application.builder().token(args.token).base_url(args.base_url)
    ).build()
    app.add_handler(MessageHandler(filters.TEXT, on_message))
    return app, store


async def run_without_polling(app: Any) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with app:
        await app.start()
        touch(os.path.join(arguments.dir, f"ready.{os.getpid()}"))
        await stop.wait()
        await app.stop()


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    dump_stacks_on_sigusr1()
    logging.basicConfig(
        filename=os.path.join(arguments.dir, f"log.{os.getpid()}"),
        level=logging.INFO,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    application, update_store = build(arguments)
    if arguments.poll:

        async def ready(_: Any) -> None:
            touch(os.path.join(arguments.dir, f"ready.{os.getpid()}"))

        application.post_init = ready
        application.run_polling(poll_interval=0.0, timeout=1)
    else:
        asyncio.run(run_without_polling(application))
    update_store.close()
    logging.getLogger("outbox_worker").info("stopped; exiting")
