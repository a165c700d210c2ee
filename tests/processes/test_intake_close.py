"""UpdateIntake.close() waits for (or bounds and names) every thread it started:
a following store.close() never races a delivery or a sweep of the intake.

Runs tests/processes/close_worker.py in a real subprocess; its exit code says what went wrong.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def test_close_then_store_close_under_load_exits_cleanly(tmp_path: Any) -> None:
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "close_worker.py"), str(tmp_path), "6"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
