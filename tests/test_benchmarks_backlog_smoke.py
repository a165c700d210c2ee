"""Smoke test of benchmarks/backlog.py (issue 14 item 2) at tiny settings: the real harness
as a subprocess, both front ends on SQLite, a few hundred updates; every row is drained and
the table is printed (exit code 0)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_backlog_benchmark_drains_a_small_backlog() -> None:
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "backlog.py"), "--updates", "300",
         "--stores", "sqlite", "--fronts", "ptb,intake", "--cap", "60"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["store", "front"]
    for front in ("ptb", "intake"):
        (row,) = [line for line in lines[1:] if line.split()[:2] == ["sqlite", front]]
        assert row.split()[2] == "300" and row.endswith("yes"), row
