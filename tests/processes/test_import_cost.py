"""``import ptb_fence`` does not import APScheduler nor psycopg2 until a runtime (or a
PostgreSQL store) is created."""

from __future__ import annotations

import json
import subprocess
import sys


def _loaded_after(code: str) -> "dict[str, bool]":
    script = (
        code
        + "\nimport sys, json\n"
        + "print(json.dumps({m: m in sys.modules for m in ('apscheduler', 'psycopg2', 'telegram')}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_ptb_fence_is_light() -> None:
    loaded = _loaded_after("import ptb_fence")
    assert loaded["apscheduler"] is False
    assert loaded["telegram"] is False
    # psycopg2 is imported when a PostgresUpdateStore is created, not with ptb_fence
    assert loaded["psycopg2"] is False


def test_a_started_runtime_loads_apscheduler() -> None:
    loaded = _loaded_after(
        "from ptb_fence import MemoryUpdateStore, UpdateIntake\n"
        "intake = UpdateIntake(MemoryUpdateStore(), handle=lambda u: None)\n"
        "intake.start(); intake.close()"
    )
    assert loaded["apscheduler"] is True
