"""A blocking bot process running :class:`ptb_fence.UpdateIntake` (no asyncio), for the
process recovery tests (through recovery_support.py) and benchmarks/recovery.py.

Usage (same command line as tests/processes/ptb_bot_worker.py, so the same harness drives both)::

    python tests/processes/intake_worker.py BASE_URL TOKEN STORE TABLE \\
        --dir DIR --domain DOMAIN [options]

``BASE_URL``/``TOKEN`` point at a :class:`ptb_fence.testing.FakeBotApi`. ``STORE`` is
``sqlite:///absolute/path`` or a PostgreSQL DSN. With ``--poll`` a thread long-polls
``getUpdates`` with plain ``urllib`` and calls ``intake.accept(body)`` for each update (the next
offset confirms only what was recorded); without it the process only runs the intake (its
sweeps and takeovers hand it work recorded by others). ``--run-polling`` is accepted and means
``--poll`` (the process always stops on SIGTERM/SIGINT: polling stops, then ``close()``).
It also stops when ``DIR/stop`` exists or ``--max-life`` passed.

The handler writes one fenced domain row per attempt that commits, in
``with attempt.transaction(complete=True)`` (with ``--unary`` it is ``handle=``: it only
announces itself, the intake settles when it returns). A message whose text is ``--hang`` sleeps
(after announcing itself) forever: its thread is abandoned by ``close()``, so the process
leaves with ``os._exit`` once ``close()`` returned (a blocked worker thread would keep the
interpreter alive).

Files in ``DIR``: ``ready.<pid>`` once started (and polling); ``started.<update_id>.<pid>`` when
a handler begins; ``log.<pid>`` the process log; ``closed.<pid>`` with the seconds ``close()``
took.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
# the project root (two levels up: tests/processes/), for ``import ptb_fence``
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from ptb_fence import UpdateIntake  # noqa: E402
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

LOGGER = logging.getLogger("intake_worker")


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_worker_arguments(parser)
    parser.add_argument("--run-polling", action="store_true", help="the same as --poll")
    return parser.parse_args(argv)


def get_updates(args: argparse.Namespace, offset: int) -> List[Dict[str, Any]]:
    query = urllib.parse.urlencode({"offset": offset, "timeout": 1})
    url = f"{args.base_url}{args.token}/getUpdates?{query}"
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - local fake
        answer = json.loads(response.read().decode("utf-8"))
    if not answer.get("ok"):
        raise RuntimeError(f"getUpdates: {answer}")
    return list(answer["result"])


def poll(args: argparse.Namespace, intake: UpdateIntake, stopping: threading.Event) -> None:
    offset = 0
    while not stopping.is_set():
        try:
            updates = get_updates(args, offset)
        except Exception as exc:  # noqa: BLE001 - the fake may be slow or gone: poll again
            LOGGER.warning("getUpdates failed: %s", exc)
            stopping.wait(0.2)
            continue
        for update in updates:
            if stopping.is_set():
                return  # not recorded: not confirmed either, the next process gets it
            intake.accept(json.dumps(update))  # durable before the next offset confirms it
            offset = int(update["update_id"]) + 1


def main(args: argparse.Namespace) -> None:
    pid = os.getpid()
    store = make_store(args.store, args.table)
    mark = "?" if args.store.startswith("sqlite:///") else "%s"
    insert = (
        f"INSERT INTO {args.domain} (update_id, attempt, claim_id, pid) "  # noqa: S608
        f"VALUES ({mark}, {mark}, {mark}, {mark})"
    )

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        update_id = update["update_id"]
        text = (update.get("message") or {}).get("text")
        touch(os.path.join(args.dir, f"started.{update_id}.{pid}"))
        crash_if(args, text)
        if args.hang and text == args.hang:
            while True:  # never returns: close() abandons this thread
                time.sleep(3600)
        if args.slow and text == args.slow:
            time.sleep(args.slow_seconds)
        fail_if(args, text, attempt.attempt)
        with attempt.transaction(complete=True) as conn:
            conn.cursor().execute(insert, (update_id, attempt.attempt, attempt.claim_id, pid))
            if args.txn and text == args.txn:
                if args.fork_in_txn:
                    fork_child(args.dir, pid)
                touch(os.path.join(args.dir, f"in_txn.{update_id}.{pid}"))
                time.sleep(args.txn_seconds)  # the fenced transaction stays open meanwhile

    def handle_unary(update: Dict[str, Any]) -> None:
        text = (update.get("message") or {}).get("text")
        touch(os.path.join(args.dir, f"started.{update['update_id']}.{pid}"))
        crash_if(args, text)

    handler = {"handle": handle_unary} if args.unary else {"handle_attempt": handle}
    intake = UpdateIntake(
        store,
        **handler,
        lease_seconds=args.lease,
        sweep_every_seconds=args.sweep,
        pending_grace_seconds=args.grace,
        max_concurrent=args.max_concurrent,
        retry=lambda error, attempt: args.retry,
        **extra_options(args),
    )
    serve_metrics(args, intake)
    stopping = threading.Event()
    signalled: List[str] = []

    def on_signal(signum: int, frame: Any) -> None:
        # Only a flag: the handler runs on the main thread between two of its bytecodes, maybe
        # while that thread holds the lock inside stopping.wait(); stopping.set() here would
        # then wait for that lock forever, and the process would never exit.
        signalled.append(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    intake.start()
    poller = None
    if args.poll or args.run_polling:
        poller = threading.Thread(target=poll, args=(args, intake, stopping), name="poller", daemon=True)
        poller.start()
    if args.fork_child:
        fork_child(args.dir, pid)
    announce_ready(args.dir, pid, store)
    deadline = time.monotonic() + args.max_life
    stop_file = os.path.join(args.dir, "stop")
    while not signalled and not os.path.exists(stop_file) and time.monotonic() <= deadline:
        time.sleep(0.05)  # a signal's handler runs during it (the flag is seen within 50 ms)
    if signalled:
        LOGGER.info("received %s", signalled[0])
    stopping.set()  # the poller's stop
    if poller is not None:
        # bounded: an accept() waiting for a database that does not answer must not hold the
        # stop (the poller is a daemon thread; what it did not record is not confirmed)
        poller.join(2)
    began = time.monotonic()
    intake.close()
    took = time.monotonic() - began
    with open(os.path.join(args.dir, f"closed.{pid}"), "w", encoding="utf-8") as file:
        file.write(f"{took:.3f}")
    LOGGER.info("close() returned after %.3f s; exiting", took)
    store.close()


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    dump_stacks_on_sigusr1()
    logging.basicConfig(
        filename=os.path.join(arguments.dir, f"log.{os.getpid()}"),
        level=logging.INFO,
        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    main(arguments)
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)  # abandoned handler threads (--hang) must not keep the process alive
