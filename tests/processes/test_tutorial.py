"""The tutorial's steps (``examples/tutorial/``) run as written and print what the pages show.

Each step runs as its own process against ``FakeBotApi``, offline. Its output must equal the
``.out`` file the page includes beside the code, so the page cannot show what the code does
not do. Step 5 starts two bot processes on PostgreSQL and kills one in a handler.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "examples" / "tutorial"
STEPS = [TUTORIAL / name for name in (
    "step1_fenced_write.py",
    "step2_replies_through_the_outbox.py",
    "step3_persistence_and_a_conversation.py",
    "step4_durable_jobs.py",
    "step5_two_processes_on_postgresql.py",
    "step6_watching_it_run.py",
)]
ON_POSTGRES = "step5_two_processes_on_postgresql.py"


def test_every_step_has_its_output_and_its_page() -> None:
    assert sorted(TUTORIAL.glob("step*.py")) == STEPS
    pages = "\n".join(page.read_text() for page in (ROOT / "docs" / "tutorial").glob("*.rst"))
    for step in STEPS:
        assert step.with_suffix(".out").is_file(), step
        assert f"examples/tutorial/{step.name}" in pages, step
        assert f"examples/tutorial/{step.stem}.out" in pages, step


def page_command(step: Path) -> List[str]:
    """The command the tutorial gives for ``step``, from the repository's root."""
    script = f"python {step.relative_to(ROOT).as_posix()}"
    page = "\n".join(page.read_text() for page in (ROOT / "docs" / "tutorial").glob("*.rst"))
    (line,) = [line.strip() for line in page.splitlines() if line.strip().startswith(script)]
    return line.split()


def run_step(command: List[str]) -> "subprocess.CompletedProcess[str]":
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *command[1:]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=150)


def check(step: Path, result: "subprocess.CompletedProcess[str]") -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == step.with_suffix(".out").read_text(), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "Warning" not in result.stderr, result.stderr


OFFLINE = [step for step in STEPS if step.name != ON_POSTGRES]


@pytest.mark.parametrize("step", OFFLINE, ids=[step.stem for step in OFFLINE])
def test_the_step_prints_what_its_page_shows(step: Path) -> None:
    command = page_command(step)
    assert len(command) == 2, command  # no arguments: it runs as given
    check(step, run_step(command))


def test_two_processes_on_postgresql_the_sweeper_finishes_the_killed_pollers_booking(
    pg_dsn: str, pg_table: str, pg_tables: List[str]
) -> None:
    """The poller is SIGKILLed inside the handler. The sweeper takes the update over: one
    booking, written by the sweeper, and one reply."""
    pg_tables += [f"{pg_table}_{suffix}" for suffix in ("outbox", "persistence", "bookings")]
    step = TUTORIAL / ON_POSTGRES
    command = page_command(step)
    assert command[2] == "--dsn" and len(command) == 4, command
    # the page's command, on the test's database and a table of its own
    check(step, run_step(command[:3] + [pg_dsn, "--table", pg_table]))


def test_the_steps_are_mypy_strict_clean(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir",
         str(tmp_path / ".mypy"), *[str(step) for step in STEPS]],
        cwd=ROOT, env=dict(os.environ, MYPYPATH=str(ROOT)),
        capture_output=True, text=True, timeout=170,
    )
    assert result.returncode == 0, result.stdout + result.stderr
