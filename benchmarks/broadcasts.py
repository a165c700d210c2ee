"""Broadcasts under Telegram's limits (issue 38, item 6): the rate, the 429s and the commits.

A blocking ``UpdateIntake`` with ``outbox_pacing=OutboxPacing(per_second=LIMIT)`` broadcasts
to ``--recipients`` chats through an in-process ``testing.FakeBotApi`` that enforces a global
limit of ``LIMIT`` messages a second (``RateLimits(global_limit=LIMIT)``). Usage::

    python benchmarks/broadcasts.py --store sqlite                   # 10,000 recipients
    python benchmarks/broadcasts.py --store pg --recipients 2000 --limit 200

It reports the sustained send rate as a share of the limit (over the busy stretch: the 50th
send to the last), the 429 answers per 10,000 sends, and the commits at the driver per sent
recipient (recording the recipients not included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (HERE, ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)

FULL = {"recipients": 10_000, "limit": 300}
QUICK = {"recipients": 2_000, "limit": 300}


def measure_broadcasts(cfg: Dict[str, Any], counter: Any = None) -> Dict[str, Any]:
    """Broadcast ``cfg["broadcast_recipients"]`` recipients at ``cfg["broadcast_limit"]`` a
    second on ``cfg["store"]`` and return the figures."""
    from ptb_fence import OutboxPacing, PostgresUpdateStore, SQLiteUpdateStore, UpdateIntake
    from ptb_fence.testing import FakeBotApi, RateLimits

    recipients = int(cfg["broadcast_recipients"])
    limit = int(cfg["broadcast_limit"])
    table = f"bench_broadcast_{uuid.uuid4().hex[:8]}"
    store: Any
    if cfg["store"] == "pg":
        store = PostgresUpdateStore(cfg["dsn"], table=table)
    else:
        folder = cfg.get("workdir") or tempfile.mkdtemp(prefix="ptb_fence_broadcast_")
        store = SQLiteUpdateStore(os.path.join(folder, f"{table}.sqlite3"))
    result: Dict[str, Any] = {"recipients": recipients, "limit": limit}
    try:
        with FakeBotApi(rate_limits=RateLimits(global_limit=limit)) as fake:
            intake = UpdateIntake(store, handle_attempt=lambda update, attempt: None,
                                  bot_token=fake.token, bot_base_url=fake.base_url,
                                  outbox_pacing=OutboxPacing(per_second=limit))
            intake.start()
            try:
                intake.broadcast("bench", range(1, recipients + 1), text="bench")
                if counter is not None:
                    counter.reset()
                started = time.monotonic()
                cpu = time.process_time()
                deadline = started + recipients / limit * 3 + 60
                while len(fake.sent_messages) < recipients and time.monotonic() < deadline:
                    time.sleep(0.05)
                elapsed = time.monotonic() - started
                cpu = time.process_time() - cpu
                commits = None if counter is None else counter.snapshot()["commits"]
                final = intake.get_broadcast("bench")
            finally:
                intake.close(10)
            times = fake.sent_times()
            sent = len(fake.sent_messages)
            copies = len({int(m["chat_id"]) for m in fake.sent_messages})
            stretch = times[50:] if len(times) > 100 else times
            rate: Optional[float] = None
            if len(stretch) > 1 and stretch[-1] > stretch[0]:
                rate = (len(stretch) - 1) / (stretch[-1] - stretch[0])
            result.update({
                "sent": sent,
                "reached": copies,
                "duplicates": sent - copies,
                "recorded_sent": final.sent,
                "seconds": elapsed,
                "rate_per_second": rate,
                "rate_share": None if rate is None else rate / limit,
                "answered_429": fake.rate_limited,
                "per_10k_429": fake.rate_limited * 10_000 / max(sent, 1),
                "inside_hold": fake.requests_in_hold,
                "commits_per_sent": None if commits is None else commits / max(sent, 1),
                "cpu_us_per_sent": cpu * 1e6 / max(sent, 1),
            })
    finally:
        store.close()
        if cfg["store"] == "pg":  # the update table and the tables beside it, not the shared
            from _common import drop_tables

            from ptb_fence.contrib._tables import META_TABLE, INSTANCES_TABLE, owned_tables

            drop_tables(cfg["dsn"], *sorted(owned_tables([table]) - {META_TABLE,
                                                                      INSTANCES_TABLE}))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "pg"), default="sqlite")
    parser.add_argument("--recipients", type=int, default=FULL["recipients"])
    parser.add_argument("--limit", type=int, default=FULL["limit"])
    args = parser.parse_args()
    from _common import DriverCounter, pg_dsn

    counter = DriverCounter()
    counter.install()
    print(json.dumps(measure_broadcasts({
        "store": args.store, "broadcast_recipients": args.recipients,
        "broadcast_limit": args.limit, "dsn": pg_dsn()}, counter), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
