"""The tests pass in an environment used by path, never activated.

``/path/to/venv/bin/python -m pytest`` puts nothing of the venv on ``PATH``: a test that runs
the ``ptb-fence`` console script must find it beside the interpreter, not on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cli_script_tests_pass_without_the_scripts_on_path() -> None:
    env = dict(os.environ)
    # what a shell has before any activation: the system folders only
    env["PATH"] = os.defpath
    assert shutil.which("ptb-fence", path=env["PATH"]) is None
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q",
         "tests/integration/test_cli.py", "-k", "installed_script or verbose_logs"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=170,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout, done.stdout[-3000:]
