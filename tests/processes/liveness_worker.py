"""A process that holds a store's liveness and claims rows (tests/processes/test_store_liveness.py).

Usage: python liveness_worker.py sqlite|postgres <path-or-dsn> <table> <first_id> <count> [tick]

Records and claims ``count`` updates from ``first_id`` with a 120 s lease through a store
object holding liveness, marks the first claim isolated (``mark_isolated``) and the second
one isolated, then past its probation (``end_probation``), prints
``READY <instance>`` and waits for a line on stdin: ``exit`` releases liveness, closes the
store and exits 0. With ``tick`` it also calls ``take_over_dead`` every half second, as the
runtime of a running bot does (errors, e.g. while the server is down, are ignored).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any


def tick(store: Any, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        try:
            store.take_over_dead(now=int(time.time() * 1000))
        except Exception:  # noqa: BLE001 - the database may be down: the next tick retries
            pass


def main() -> int:
    kind, where, table, first, count = sys.argv[1:6]
    if kind == "sqlite":
        from ptb_fence import SQLiteUpdateStore

        store = SQLiteUpdateStore(where, table=table)
    else:
        from ptb_fence import PostgresUpdateStore

        store = PostgresUpdateStore(where, table=table)
    instance = store.hold_liveness()
    now = int(time.time() * 1000)
    rows = [(u, f'{{"update_id": {u}}}', now) for u in range(int(first), int(first) + int(count))]
    half = len(rows) // 2
    from ptb_fence import Batch, ClaimTerms

    terms = ClaimTerms(now, now + 120_000, 5)
    claimed = list(store.commit(Batch(terms, claimed_records=tuple(rows[:half]))).claimed_records)
    for update_id, body, at in rows[half:]:
        store.add(update_id, body, at)
        claimed.append(
            store.claim_owned(update_id, now=now, lease_until=now + 120_000, max_attempts=5)
        )
    assert all(identity is not None for identity in claimed), claimed
    # the first claim's handler "started alone": a crash now counts against it only; the
    # second one's "started on probation" and ran past it: a crash is not its alone
    assert store.mark_isolated(claimed[0], at=now)
    assert store.mark_isolated(claimed[1], at=now)
    assert store.end_probation(claimed[1], at=now)
    print(f"READY {instance}", flush=True)
    stop = threading.Event()
    if sys.argv[6:7] == ["tick"]:
        threading.Thread(target=tick, args=(store, stop), daemon=True).start()
    for line in sys.stdin:
        if line.strip() == "exit":
            break
    stop.set()
    store.release_liveness()
    store.close()
    print("BYE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
