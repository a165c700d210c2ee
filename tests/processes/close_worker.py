"""A process for tests/processes/test_intake_close.py: close races under load (run with
sys.executable).

Usage::

    python tests/processes/close_worker.py DIR ROUNDS

Each round: a fresh SQLite store, an UpdateIntake whose handler fails every third update for
good (max_attempts=1, so an exhaustion) and whose exhaustion handler is slow; 40 updates
accepted; ``intake.close(timeout=5)`` while work and deliveries run; then ``store.close()``.

Exit codes: 0 fine; 3 a thread the intake started was still alive after ``close()`` returned
(within its timeout); 4 an error was logged after ``store.close()``; 5 a round with a short close
timeout did not name its running threads in a WARNING.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
# the project root (two levels up: tests/processes/), for ``import ptb_fence``
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from ptb_fence import SQLiteUpdateStore, UpdateIntake  # noqa: E402


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.items: List[logging.LogRecord] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._guard:
            self.items.append(record)

    def since(self, index: int, level: int) -> List[str]:
        with self._guard:
            return [r.getMessage() for r in self.items[index:] if r.levelno >= level]

    def mark(self) -> int:
        with self._guard:
            return len(self.items)


def body(update_id: int) -> str:
    return (
        '{"update_id": %d, "message": {"message_id": 1, "date": 1700000000, '
        '"chat": {"id": %d, "type": "private"}, "text": "x"}}' % (update_id, update_id % 7)
    )


def ours() -> List[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t.is_alive() and t.name.startswith(("ptb_fence-exhaustion", "ptb_fence-refill"))
    ]


def one_round(directory: str, number: int, records: Records, short: bool) -> int:
    store = SQLiteUpdateStore(os.path.join(directory, f"close{number}.db"))

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        time.sleep(0.005)
        if update["update_id"] % 3 == 0:
            raise ValueError("final")
        with attempt.transaction(complete=True):
            pass

    def handle_exhaustion(exhaustion: Any) -> None:
        time.sleep(0.3)

    intake = UpdateIntake(
        store,
        handle_attempt=handle_attempt,
        handle_exhaustion=handle_exhaustion,
        max_attempts=1,
        max_concurrent=4,
        sweep_every_seconds=0.05,
        pending_grace_seconds=0.05,
        lease_seconds=5.0,
    )
    intake.start()
    for uid in range(1, 41):
        intake.accept(body(number * 1000 + uid))
    deadline = time.monotonic() + 10
    while not ours() and time.monotonic() < deadline:  # a delivery is running
        time.sleep(0.002)
    mark = records.mark()
    if short:
        intake.close(timeout=0.05)
        warned = [m for m in records.since(mark, logging.WARNING) if "close()" in m]
        if not any("ptb_fence-exhaustion" in m for m in warned):
            print("no WARNING naming the running delivery threads:", warned, file=sys.stderr)
            return 5
        intake.idle(30)  # the caller waits for what close() left running, then closes
        time.sleep(0.05)
    else:
        intake.close(timeout=5)
        alive = ours()
        if alive:
            print("alive after close():", alive, file=sys.stderr)
            return 3
    after = records.mark()
    store.close()
    time.sleep(0.4)  # anything still running would now fail on the closed store
    errors = records.since(after, logging.ERROR)
    if errors:
        print("errors after store.close():", errors, file=sys.stderr)
        return 4
    return 0


def main() -> int:
    directory, rounds = sys.argv[1], int(sys.argv[2])
    records = Records()
    logging.getLogger("ptb_fence").addHandler(records)
    logging.getLogger("ptb_fence").setLevel(logging.DEBUG)
    for number in range(rounds):
        code = one_round(directory, number, records, short=number % 2 == 1)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
