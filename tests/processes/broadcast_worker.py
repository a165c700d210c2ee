"""A blocking bot process that sends broadcasts, for tests/processes/test_broadcast_processes.py.

Usage::

    python tests/processes/broadcast_worker.py BASE_URL TOKEN STORE TABLE --dir DIR
        [--per-second N] [--start NAME:COUNT]

It runs an ``UpdateIntake`` with a bot token, so its broadcast sender sends the store's
broadcasts through the fake Bot API at ``--per-second``. ``--start`` records
the broadcast ``NAME`` to the chats 1..COUNT with the text ``NAME``. It writes
``ready.<pid>`` once it sends, and stops gracefully on SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from ptb_fence import OutboxPacing, UpdateIntake  # noqa: E402
from worker_support import dump_stacks_on_sigusr1, make_store, touch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("token")
    parser.add_argument("store")
    parser.add_argument("table")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--per-second", type=float, default=600.0)
    parser.add_argument("--start", default="")
    args = parser.parse_args()
    dump_stacks_on_sigusr1()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    intake = UpdateIntake(
        make_store(args.store, args.table), handle_attempt=lambda update, attempt: None,
        bot_token=args.token, bot_base_url=args.base_url,
        outbox_pacing=OutboxPacing(per_second=args.per_second),
    )
    intake.start()
    if args.start:
        name, count = args.start.split(":")
        intake.broadcast(name, range(1, int(count) + 1), text=name)
    touch(os.path.join(args.dir, f"ready.{os.getpid()}"))
    stop.wait()
    intake.close(10)


if __name__ == "__main__":
    main()
