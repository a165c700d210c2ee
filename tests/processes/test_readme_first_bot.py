"""README.rst's "Your first bot" runs as written and prints what the README says it prints;
its "Examples" commands are the ones the examples' docstrings give (and
tests/processes/test_examples.py runs)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.rst").read_text()


def section(title: str) -> str:
    match = re.search(rf"^{re.escape(title)}\n-+\n(.*?)(?=^\S[^\n]*\n-+\n)", README, re.M | re.S)
    assert match, f"README.rst has no section {title!r}"
    return match.group(1)


def indented_block_after(text: str, marker: str) -> str:
    """The indented block that follows the first line containing ``marker``."""
    lines = text[text.index(marker):].splitlines()[1:]
    block: List[str] = []
    for line in lines:
        if line.strip() and not line.startswith(" "):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)).strip("\n") + "\n"


def test_first_bot_runs_as_written_and_prints_the_readme_output(tmp_path: Path) -> None:
    first = section("Your first bot")
    code = indented_block_after(first, ".. code-block:: python")
    command = indented_block_after(first, "Run it").strip()
    expected = indented_block_after(first, "It prints")
    assert command == "python first_bot.py"
    assert 30 <= len(code.splitlines()) < 60  # a first bot a reader takes in at once
    (tmp_path / "first_bot.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for run in range(2):  # a second run starts afresh too
        result = subprocess.run(
            [sys.executable, "first_bot.py"], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout == expected, (run, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr


def test_first_bot_is_mypy_strict_clean(tmp_path: Path) -> None:
    code = indented_block_after(section("Your first bot"), ".. code-block:: python")
    (tmp_path / "first_bot.py").write_text(code)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir",
         str(tmp_path / ".mypy"), "first_bot.py"],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT), MYPYPATH=str(ROOT)),
        capture_output=True, text=True, timeout=110,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_examples_commands_match_the_docstrings() -> None:
    examples = section("Examples")
    flat = re.sub(r"\\\n\s*", "", examples)
    commands = [line.strip() for line in flat.splitlines()
                if line.strip().startswith("python examples/")]
    scripts = {c.split()[1] for c in commands}
    assert scripts == {f"examples/{p.name}" for p in (ROOT / "examples").glob("*.py")}, scripts
    for command in commands:
        script = command.split()[1]
        doc = ast.get_docstring(ast.parse((ROOT / script).read_text())) or ""
        doc_flat = " ".join(re.sub(r"\\\n\s*", "", doc).split())
        assert " ".join(command.split()) in doc_flat, (command, script)
    assert 'python -m ptb_fence.testing serve' in examples


def test_readme_keeps_the_two_commands() -> None:
    assert "    python -m pip install -e . && python -m ptb_fence demo\n" in README
    assert re.search(r"^ +python -m pip install -e '\.\[test\]' && python -m pytest$", README,
                     re.M)


def test_before_production_follows_the_first_bot() -> None:
    """The traps a real deployment meets come right after the first bot, not deep inside."""
    titles = re.findall(r"^(\S[^\n]*)\n-+\n", README, re.M)
    assert titles[titles.index("Your first bot") + 1] == "Before production", titles
    before = section("Before production")
    for trap in ("Replies sent directly are not fenced", "outbox.reply_text",
                 "PTB persistence is per process",
                 "every 60 s", "jobs are in memory", "durable_jobs=True", "One table per bot",
                 "python -m pip install -e '.[webhooks]'"):
        assert trap in before, trap


def test_performance_tables_live_in_the_explanation_and_benchmarks_readme() -> None:
    """The README stays short: the figures are on the site's performance page, every table
    in benchmarks/README.rst, which renders as reStructuredText without a warning."""
    assert "Performance\n---" not in README and "poll-fenced-pg-32" not in README
    performance = (ROOT / "docs" / "explanation" / "performance.rst").read_text()
    assert "benchmarks/README.rst" in performance and "bots per PG core" in performance
    bench = (ROOT / "benchmarks" / "README.rst").read_text()
    assert "poll-fenced-pg-32" in bench and "python benchmarks/run.py" in bench
    assert "include benchmarks/README.rst" in (ROOT / "MANIFEST.in").read_text()
    docutils_core = pytest.importorskip("docutils.core")
    import io

    warnings = io.StringIO()
    docutils_core.publish_string(
        bench, writer_name="null",
        settings_overrides={"warning_stream": warnings, "report_level": 2, "halt_level": 5},
    )
    assert warnings.getvalue() == ""


def test_readme_is_short_and_links_into_the_docs() -> None:
    """At most 300 lines, and every relative link it makes names a file of the repository."""
    assert len(README.splitlines()) <= 300
    links = re.findall(r"<((?:docs/|CHANGES)[^>]+)>`__", README)
    assert "docs/explanation/guarantees.rst" in links and "CHANGES.rst" in links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert missing == [], missing
