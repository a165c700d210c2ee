"""The prose of the package follows the developer guide.

No docstring and no ``#`` comment holds a semicolon. A module docstring has at most 10 lines.
A docstring here is any string statement: a module, class or function docstring, or the
docstring Sphinx reads after an assignment. SQL text assigned to a name is no docstring.
"""

from __future__ import annotations

import ast
import inspect
import io
import tokenize
from pathlib import Path
from typing import Dict, Iterator, List

PACKAGE = Path(__file__).resolve().parents[2] / "ptb_fence"
MODULE_DOCSTRING_LINES = 10

# Paths under ptb_fence/ whose prose is still being rewritten, each with the reason.
# A directory entry covers every module below it. The list only shrinks.
PENDING: Dict[str, str] = {
}


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _pending(path: Path) -> bool:
    relative = _relative(path)
    return any(relative == entry or relative.startswith(entry + "/") for entry in PENDING)


def _strings(tree: ast.Module) -> Iterator[ast.Constant]:
    """Every string statement of ``tree``, docstrings and attribute docstrings alike."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            yield node.value


def violations(path: Path, name: str = "") -> List[str]:
    """Each breach of the prose rules in ``path``, as ``file:line: what``."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    name = name or f"ptb_fence/{_relative(path)}"
    found = []
    for string in _strings(tree):
        for offset, line in enumerate(str(string.value).splitlines()):
            if ";" in line:
                found.append(f"{name}:{string.lineno + offset}: semicolon in a docstring")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and ";" in token.string:
            found.append(f"{name}:{token.start[0]}: semicolon in a comment")
    docstring = ast.get_docstring(tree, clean=False)
    if docstring is not None:
        lines = len(inspect.cleandoc(docstring).splitlines())
        if lines > MODULE_DOCSTRING_LINES:
            found.append(f"{name}:1: module docstring of {lines} lines"
                         f" (at most {MODULE_DOCSTRING_LINES})")
    return found


def test_violations_are_found(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    body = "\n".join(f"Line {number}." for number in range(11))
    sample.write_text(f'"""{body}\n"""\n\nX = 1\n"""One; two."""\n\n\n'
                      'def f() -> None:\n    """Three.\n\n    Four; five."""\n    # six; seven\n'
                      'SQL = "SELECT 1; SELECT 2"\n',
                      encoding="utf-8")
    assert violations(sample, "sample.py") == [
        "sample.py:15: semicolon in a docstring",
        "sample.py:21: semicolon in a docstring",
        "sample.py:22: semicolon in a comment",
        "sample.py:1: module docstring of 11 lines (at most 10)",
    ]


def test_prose_of_every_module() -> None:
    found = [entry for path in sorted(PACKAGE.rglob("*.py")) if not _pending(path)
             for entry in violations(path)]
    assert not found, "\n" + "\n".join(found)


def test_pending_entries_still_pend() -> None:
    """A pending entry names real modules that still break a rule, so the list only shrinks."""
    stale = []
    for entry, reason in PENDING.items():
        assert reason
        target = PACKAGE / entry
        paths = sorted(target.rglob("*.py")) if target.is_dir() else [target]
        if not any(path.is_file() and violations(path) for path in paths):
            stale.append(entry)
    assert not stale, f"clean or missing, remove from PENDING: {stale}"
