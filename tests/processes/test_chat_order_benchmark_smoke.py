"""Smoke test of benchmarks/chat_order.py (the cost of strict chat order) at tiny settings: the
table is printed with a default and a strict row, every update was handled, none out of order
(exit code 0)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_chat_order_benchmark_quick_runs() -> None:
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "chat_order.py"), "--quick",
         "--updates", "60", "--chats", "20", "--stores", "sqlite", "--cap", "60"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["store", "mode", "chats", "updates", "seconds", "upd/s",
                                "ratio", "order"]
    rows = {line.split()[1]: line.split() for line in lines[1:]}
    assert set(rows) == {"default", "strict"}, lines
    for row in rows.values():
        assert row[0] == "sqlite" and row[2:4] == ["20", "60"] and row[7] == "0", row
