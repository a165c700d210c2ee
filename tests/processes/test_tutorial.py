"""The tutorial's steps (``examples/tutorial/``) run as written and print what the pages show.

Each step runs as its own process against ``FakeBotApi``, offline. Its output must equal the
``.out`` file the page includes beside the code, so the page cannot show what the code does
not do. Step 4 runs ``examples/webhook_postgres.py``, which tests/processes/test_examples.py
runs as two processes on PostgreSQL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "examples" / "tutorial"
STEPS = [TUTORIAL / name for name in (
    "step1_fenced_write.py",
    "step2_replies_through_the_outbox.py",
    "step3_persistence_and_a_conversation.py",
    "step5_watching_it_run.py",  # step 4 is examples/webhook_postgres.py
)]


def test_every_step_has_its_output_and_its_page() -> None:
    assert sorted(TUTORIAL.glob("step*.py")) == STEPS
    pages = "\n".join(page.read_text() for page in (ROOT / "docs" / "tutorial").glob("*.rst"))
    for step in STEPS:
        assert step.with_suffix(".out").is_file(), step
        assert f"examples/tutorial/{step.name}" in pages, step
        assert f"examples/tutorial/{step.stem}.out" in pages, step


@pytest.mark.parametrize("step", STEPS, ids=[step.stem for step in STEPS])
def test_the_step_prints_what_its_page_shows(step: Path) -> None:
    # the command the page gives, from the repository's root
    command = f"python {step.relative_to(ROOT).as_posix()}"
    page = "\n".join(page.read_text() for page in (ROOT / "docs" / "tutorial").glob("*.rst"))
    assert f"    {command}\n" in page, command
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, *command.split()[1:]], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == step.with_suffix(".out").read_text(), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "Warning" not in result.stderr, result.stderr


def test_the_steps_are_mypy_strict_clean(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir",
         str(tmp_path / ".mypy"), *[str(step) for step in STEPS]],
        cwd=ROOT, env=dict(os.environ, MYPYPATH=str(ROOT)),
        capture_output=True, text=True, timeout=170,
    )
    assert result.returncode == 0, result.stdout + result.stderr
