"""The testing how-to's booking test (``examples/howto/test_booking.py``, included in
docs/howto/testing-with-fakebotapi.rst) runs as written: it passes, in a process of its own,
against the installed FakeBotApi (press_button, fail_next, cut_next, delay, hold,
effective_calls and the refusal of an edit that changes nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
BOOKING_TEST = ROOT / "examples" / "howto" / "test_booking.py"


def test_the_howto_booking_test_passes_as_written(tmp_path: Path) -> None:
    code = BOOKING_TEST.read_text()
    page = (ROOT / "docs" / "howto" / "testing-with-fakebotapi.rst").read_text()
    assert ".. literalinclude:: ../../examples/howto/test_booking.py" in page
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
