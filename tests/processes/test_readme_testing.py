"""README.rst's "Testing your bot" runs as written: its pytest file passes, in a process of its
own, against the installed FakeBotApi (press_button, fail_next, cut_next, delay, hold,
effective_calls and the refusal of an edit that changes nothing)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def _section_code(title: str) -> str:
    readme = (ROOT / "README.rst").read_text()
    match = re.search(rf"^{re.escape(title)}\n-+\n(.*?)(?=^\S[^\n]*\n-+\n)", readme, re.M | re.S)
    assert match, f"README.rst has no section {title!r}"
    text = match.group(1)
    lines = text[text.index(".. code-block:: python"):].splitlines()[1:]
    block = []
    for line in lines:
        if line.strip() and not line.startswith(" "):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)).strip("\n") + "\n"


def test_the_readme_booking_test_passes_as_written(tmp_path: Path) -> None:
    code = _section_code("Testing your bot")
    for name in ("press_button", "fail_next", "cut_next", "delay", "hold", "effective_calls",
                 "not modified"):
        assert name in code, name
    (tmp_path / "test_booking.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
         "test_booking.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout, done.stdout
