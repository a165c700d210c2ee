"""Every code block of the tutorial and the how-to guides is a file that a test runs.

A page may only include code (``literalinclude``) from a file that a test names, so the code a
reader copies is the code the tests ran. The only commands typed into a page are the install
command, the tutorial's steps (tests/processes/test_tutorial.py runs each as its page gives it) and the commands of
an example's docstring (tests/processes/test_examples.py runs those as written).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs" / "tutorial").glob("*.rst")) + sorted(
    (ROOT / "docs" / "howto").glob("*.rst"))
INSTALL = "python -m pip install -e ."


def includes(page: Path) -> List[Path]:
    return [(page.parent / target).resolve() for target in
            re.findall(r"^\s*\.\. literalinclude:: (\S+)$", page.read_text(), re.M)]


def typed_blocks(page: Path) -> List[Tuple[str, str]]:
    """(language, text) of each ``code-block`` and ``::`` literal block of ``page``."""
    lines = page.read_text().splitlines()
    blocks = []
    for index, line in enumerate(lines):
        found = re.match(r"^(\s*)\.\. code-block:: (\S+)$", line)
        literal = line.rstrip().endswith("::") and not line.lstrip().startswith("..")
        if not (found or literal):
            continue
        indent = len(line) - len(line.lstrip())
        body = []
        for following in lines[index + 1:]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            body.append(following.strip())
        text = re.sub(r"\\\s+", "", " ".join(part for part in body if part))
        blocks.append((found.group(2) if found else "literal", " ".join(text.split())))
    return blocks


def runner_tests() -> Dict[str, str]:
    """The text of every test module, by path."""
    return {str(path.relative_to(ROOT)): path.read_text()
            for path in (ROOT / "tests").rglob("test_*.py")}


def docstring_commands() -> str:
    texts = []
    for example in (ROOT / "examples").glob("*.py"):
        doc = ast.get_docstring(ast.parse(example.read_text())) or ""
        texts.append(" ".join(re.sub(r"\\\n\s*", "", doc).split()))
    return "\n".join(texts)


def test_the_pages_exist() -> None:
    names = {page.relative_to(ROOT / "docs").as_posix() for page in PAGES}
    for expected in ("tutorial/01-first-fenced-write.rst", "howto/monitoring.rst",
                     "howto/migrate-picklepersistence.rst",
                     "howto/several-processes-and-webhooks.rst"):
        assert expected in names, names


def test_every_included_file_is_named_by_a_test() -> None:
    tests = runner_tests()
    for page in PAGES:
        for target in includes(page):
            assert target.is_file(), (page.name, target)
            # an output file is checked by the test that runs its script
            ran = target.with_suffix(".py") if target.suffix == ".out" else target
            relative = ran.relative_to(ROOT).as_posix()
            names = (relative, ran.name, f'"{ran.stem}"')
            runners = [path for path, text in tests.items()
                       if path != "tests/unit/test_docs_code_is_tested.py"
                       and any(name in text for name in names)]
            assert runners, f"{page.name} includes {relative}, which no test names"


def test_every_typed_block_is_a_command_a_test_runs() -> None:
    commands = docstring_commands()
    steps = {f"python examples/tutorial/{step.name}"
             for step in (ROOT / "examples" / "tutorial").glob("step*.py")}
    for page in PAGES:
        for language, text in typed_blocks(page):
            assert language == "console", (page.name, language, text)
            ran = " ".join(text.split()[:2])  # a tutorial step, with or without its --dsn
            assert text == INSTALL or ran in steps or text in commands, (page.name, text)
