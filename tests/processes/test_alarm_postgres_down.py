"""The ingest-failing alarm while the machine's PostgreSQL is really down: said once per
interval (never once per failed recording), with how long Telegram still keeps the oldest update
not recorded, and cleared once recording works again.

Stops and starts the local PostgreSQL server: runs only with ``PTB_FENCE_ALLOW_PG_RESTART=1``
(``.ci/run`` sets it), as root with ``pg_ctlcluster``, while no other test runs (marker
``restarts_postgres``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from typing import Any, List

import pytest

from ptb_fence import AlarmThresholds, PostgresUpdateStore, UpdateIntake
from ptb_fence.chaos._runner import wait_for_postgres
from store_support import fresh_table_name

OPT_IN = "PTB_FENCE_ALLOW_PG_RESTART"


def _cluster(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True, timeout=120,
    )


def _possible() -> bool:
    return (
        os.environ.get(OPT_IN) == "1"
        and os.geteuid() == 0
        and shutil.which("pg_ctlcluster") is not None
        and os.path.isdir("/etc/postgresql")
    )


def _update(update_id: int, date: int) -> str:
    return json.dumps({"update_id": update_id, "message": {
        "message_id": update_id, "date": date, "chat": {"id": 1, "type": "private"}, "text": "x"}})


@pytest.mark.timeout(240)
@pytest.mark.restarts_postgres
@pytest.mark.skipif(not _possible(), reason=f"stops PostgreSQL: set {OPT_IN}=1 (as root)")
def test_the_ingest_alarm_is_said_once_per_interval_while_postgresql_is_down(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ptb_fence.alarms")
    table = fresh_table_name()
    store = PostgresUpdateStore(pg_dsn, table=table)
    intake = UpdateIntake(
        store,
        handle=lambda update: None,
        alarms=AlarmThresholds(ingest_failing_seconds=1.0, interval_seconds=2.0),
    )
    sent = int(time.time()) - 600  # Telegram received the first one 10 minutes ago
    failures = 0
    try:
        assert intake.accept(_update(1, sent)) == "accepted"
        _cluster("stop")
        try:
            started = time.monotonic()
            while time.monotonic() - started < 7.0:
                with pytest.raises(Exception):
                    intake.accept(_update(100 + failures, sent))
                failures += 1
                time.sleep(0.05)
            elapsed = time.monotonic() - started
        finally:
            _cluster("start")
            assert wait_for_postgres(pg_dsn, 120), "PostgreSQL did not come back"
        said: List[logging.LogRecord] = [
            r for r in caplog.records
            if r.name == "ptb_fence.alarms" and getattr(r, "alarm", None) == "ingest_failing"
            and r.levelno == logging.WARNING
        ]
        assert failures >= 20, failures
        # at 1 s, then every 2 s: 3 or 4 in 7 s, never one per failure
        assert 2 <= len(said) <= int((elapsed - 1.0) / 2.0) + 1, [r.getMessage() for r in said]
        assert "dropped by Telegram in 23h" in said[0].getMessage(), said[0].getMessage()
        assert intake.stats().ingest_errors == failures
        deadline = time.monotonic() + 60
        while True:  # the pool reconnects to the restarted server
            try:
                assert intake.accept(_update(999, sent)) == "accepted"
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        intake.runtime.alarms.check()
        cleared = [r for r in caplog.records if r.name == "ptb_fence.alarms"
                   and r.levelno == logging.INFO and "cleared" in r.getMessage()]
        assert [getattr(r, "alarm", None) for r in cleared] == ["ingest_failing"]
    finally:
        intake.close()
        store.close()
        _drop(pg_dsn, table)


def _drop(dsn: str, table: str) -> None:
    import psycopg2

    conn: Any = psycopg2.connect(dsn, connect_timeout=10)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{table}"')
            cur.execute(f'DROP TABLE IF EXISTS "{table}_outbox"')
    finally:
        conn.close()
