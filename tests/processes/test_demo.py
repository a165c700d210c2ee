"""The README's main job: `python -m ptb_fence demo` exits 0 and reports lost = 0, every update
replied to through the outbox, no reply from a stale attempt."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_runs_offline_and_loses_nothing() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ptb_fence", "demo", "--updates", "120", "--chats", "6"],
        capture_output=True,
        text=True,
        timeout=170,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    table = dict(
        (m.group(1).strip(), m.group(2).strip())
        for m in re.finditer(r"^\| (.+?) \|\s+(\S+) \|$", out, re.MULTILINE)
    )
    assert table["updates sent"] == "120"
    assert table["lost"] == "0"
    assert table["duplicate writes"] == "0"
    assert table["handled"] == "120"
    assert table["fenced writes"] == "120"
    assert table["confirmed to Telegram"] == "120"
    assert int(table["duplicates prevented"]) >= 1
    assert table["bot processes killed (SIGKILL)"] == "1"
    assert table["bot processes paused past lease"] == "1"
    # replies go through the outbox: sent iff the attempt's commit landed
    assert table["replies sent"] == "120"
    assert table["updates without a reply"] == "0"
    assert table["replies from stale attempts"] == "0"
    # a duplicate only from the send window of the killed bot (answered, not yet recorded)
    assert table["duplicate replies"] == table["of them from the send window"]
    assert "demo result: OK" in out
    # progress lines were printed while it ran
    assert len(re.findall(r"^\s+\[\s*\d+\.\d+s\]", out, re.MULTILINE)) >= 5
