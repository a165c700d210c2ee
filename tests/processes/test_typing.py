"""ptb_fence is mypy --strict clean, and its public API types check in typed user code.

mypy runs in a subprocess from the project root, so it reads the ``[mypy]`` section of
setup.cfg and caches in ``.mypy_cache`` (a warm run takes seconds).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("mypy") is None,
        reason="mypy is not installed (pip install -e .[test] installs it)",
    ),
    pytest.mark.timeout(600),
]


def _mypy(*targets: str) -> "subprocess.CompletedProcess[str]":
    command: List[str] = [sys.executable, "-m", "mypy", "--strict", "--no-color-output", *targets]
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=540, check=False
    )


def test_library_is_mypy_strict_clean() -> None:
    result = _mypy("ptb_fence")
    assert result.returncode == 0, (
        f"mypy --strict ptb_fence failed (exit {result.returncode}):\n"
        f"{result.stdout}{result.stderr}"
    )
    assert "Success: no issues found" in result.stdout


def test_public_api_types_check_in_user_code() -> None:
    result = _mypy("tests/processes/typing_usage.py")
    assert result.returncode == 0, (
        f"typed use of the public API does not check:\n{result.stdout}{result.stderr}"
    )


def test_examples_type_check_against_the_api() -> None:
    """The runnable examples use only real names and signatures (and stay strict-clean)."""
    result = _mypy("examples")
    assert result.returncode == 0, (
        f"examples/ do not type-check against ptb_fence:\n{result.stdout}{result.stderr}"
    )


def test_mypy_reports_misuse_of_the_public_api(tmp_path: Path) -> None:
    """The check bites: wrong argument types against ptb_fence's annotations are errors."""
    wrong = tmp_path / "wrong_usage.py"
    wrong.write_text(
        "from ptb_fence import AttemptIdentity, MemoryUpdateStore, UpdateStore\n"
        "identity = AttemptIdentity(update_id='1', attempt=1, claim_id='c')\n"
        "store: UpdateStore = MemoryUpdateStore()\n"
        "attempt: str = store.claim(1, now=0, lease_until=1, max_attempts=5)\n"
        "class NotAStore:\n"
        "    def add(self, update_id: int) -> bool:\n"
        "        return True\n"
        "other: UpdateStore = NotAStore()\n"
        "from ptb_fence import UpdateIntake\n"
        "intake = UpdateIntake(NotAStore(), handle=print)\n"
    )
    result = _mypy(str(wrong))
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert 'wrong_usage.py:2: error: Argument "update_id" to "AttemptIdentity"' in out, out
    assert "wrong_usage.py:4: error: Incompatible types in assignment" in out, out
    assert "wrong_usage.py:8: error: Incompatible types in assignment" in out, out
    assert 'wrong_usage.py:10: error: Argument 1 to "UpdateIntake"' in out, out
