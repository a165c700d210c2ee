"""Smoke test of benchmarks/recovery.py (recovery after crashes and stops) at tiny settings.

Runs the real harness as a subprocess on SQLite: two signal scenarios with both front ends (PTB
and UpdateIntake), a few dozen updates, and the backlog-share scenario with a small backlog;
checks the tables are printed and nothing was lost or handled twice (exit code 0; the harness
also fails when a process held more than its claim bound).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks", "recovery.py")


def _run(*args: str) -> List[str]:
    proc = subprocess.run([sys.executable, BENCH, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return proc.stdout.splitlines()


def test_recovery_benchmark_quick_runs() -> None:
    lines = _run("--quick", "--updates", "30", "--cap", "40", "--stores", "sqlite",
                 "--front", "ptb,intake", "--only", "sigterm-burst,sigkill-restart")
    assert lines[0].split()[:3] == ["scenario", "front", "store"]
    for name in ("sigterm-burst", "sigkill-restart"):
        rows = [line.split() for line in lines if line.startswith(name)]
        assert sorted(row[1] for row in rows) == ["intake", "ptb"], lines
        for row in rows:
            assert row[2] == "sqlite"
            assert float(row[3]) < 30, row  # far below the 120 s lease


def test_recovery_benchmark_backlog_share_runs() -> None:
    lines = _run("--only", "backlog-share", "--backlog", "200", "--cap", "60", "--stores",
                 "sqlite", "--front", "ptb")
    assert lines[0].split()[:4] == ["scenario", "front", "store", "backlog"]
    rows = [line.split() for line in lines[1:]]
    assert len(rows) == 2, lines  # one row per process
    for row in rows:
        assert row[:4] == ["backlog-share", "ptb", "sqlite", "200"]
        claims, bound = row[7].split("/")
        assert 0 < int(claims) <= int(bound), row
    assert sum(float(row[8].rstrip("%")) for row in rows) > 99, rows  # every update, by one of them


def test_recovery_benchmark_slow_crash_rows_run() -> None:
    """The two rows of a crash with slow handlers in flight: an ordinary SIGKILL (goal: 3
    handlers' time + 5 s) and a crash loop (goal: the poison abandoned after its attempts, a
    healthy update run at most twice), each with its TARGETS line."""
    lines = _run("--only", "sigkill-slow,crash-loop", "--stores", "sqlite", "--front", "ptb",
                 "--slow-handlers", "4", "--handler-seconds", "1", "--cap", "90")
    slow = [line.split() for line in lines if line.startswith("sigkill-slow ")]
    assert len(slow) == 1 and slow[0][:5] == ["sigkill-slow", "ptb", "sqlite", "4", "1.0s"], lines
    assert int(slow[0][7]) <= 2 and slow[0][8:] == ["0", "0"], slow  # runs, lost, dups
    loop = [line.split() for line in lines if line.startswith("crash-loop ")]
    assert len(loop) == 1 and loop[0][:4] == ["crash-loop", "ptb", "sqlite", "4"], lines
    assert loop[0][7:] == [loop[0][7], "abandoned", "0", "0"] and int(loop[0][7]) <= 2, loop
    targets = lines[lines.index("TARGETS") + 1:]
    assert [t.split()[0] for t in targets] == ["sigkill-slow", "crash-loop"], targets
    assert targets[1].endswith(": met"), targets  # the crash-loop bounds hold on any machine
