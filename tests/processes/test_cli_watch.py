"""``ptb-fence status --watch`` as a real process: it refreshes until SIGINT (Ctrl-C), shows
what changed meanwhile, and ends with exit status 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, List

from ptb_fence import SQLiteUpdateStore


def watch(*argv: str) -> "subprocess.Popen[str]":
    env = {k: v for k, v in os.environ.items() if k not in ("PTB_FENCE_STORE", "PTB_FENCE_TABLE")}
    return subprocess.Popen(
        [sys.executable, "-m", "ptb_fence", *argv], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env,
    )


def read_lines(proc: "subprocess.Popen[str]", count: int, timeout: float = 30) -> List[str]:
    assert proc.stdout is not None
    lines: List[str] = []
    deadline = time.monotonic() + timeout
    while len(lines) < count and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
    return lines


def test_status_watch_refreshes_until_sigint(tmp_path: Any) -> None:
    path = tmp_path / "bot.db"
    store = SQLiteUpdateStore(str(path))
    proc = None
    try:
        assert store.add(1, '{"update_id": 1}', 1_000)
        proc = watch("--store", f"sqlite:///{path}", "status", "--watch", "200ms", "--json")
        first = [json.loads(line) for line in read_lines(proc, 2)]
        assert [r["counts"]["pending"] for r in first] == [1, 1], first
        assert first[1]["now"] >= first[0]["now"] + 150  # a refresh, not a repeat
        assert store.add(2, '{"update_id": 2}', 2_000)  # recorded while it watches
        later = [json.loads(line) for line in read_lines(proc, 3)]
        assert later[-1]["counts"]["pending"] == 2, later
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    finally:
        store.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def test_status_watch_shows_an_unreachable_store_and_keeps_refreshing() -> None:
    """A PostgreSQL server that does not answer is shown at each refresh (no exit 3): the view
    stays up through an outage."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dsn = f"postgresql://bot:Wa7chSecret@127.0.0.1:{port}/bot?connect_timeout=2"
    proc = watch("--store", dsn, "status", "--watch", "100ms")
    try:
        assert proc.stdout is not None
        seen = ""
        deadline = time.monotonic() + 30
        while "(2 so far)" not in seen and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen += line
        assert seen.count("store unreachable") >= 2, seen
        assert "(2 so far)" in seen and "Wa7chSecret" not in seen
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "Wa7chSecret" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
