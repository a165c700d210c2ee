"""Smoke test of benchmarks/recovery.py (issue 12 item 5) at tiny settings.

Runs the real harness as a subprocess on SQLite, two scenarios, a few dozen updates; checks
the table is printed and nothing was lost or handled twice (exit code 0).
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_recovery_benchmark_quick_runs() -> None:
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "recovery.py"), "--quick",
         "--updates", "30", "--cap", "40", "--stores", "sqlite",
         "--only", "sigterm-burst,sigkill-restart"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["scenario", "store"]
    for name in ("sigterm-burst", "sigkill-restart"):
        (row,) = [line for line in lines if line.startswith(name)]
        assert row.split()[1] == "sqlite"
        seconds = float(row.split()[2])
        assert seconds < 30, row  # far below the 120 s lease
