"""Run python-telegram-bot's own offline tests with every Application wired through install().

Prepare a checkout once (needs the network or a local git mirror of PTB)::

    python tests/ptb_upstream.py prepare DEST [--git-dir GIT_DIR | --repo URL]

It extracts ``src/``, ``tests/`` and ``pyproject.toml`` of the tag matching the installed
python-telegram-bot into DEST and installs PTB's test-only dependencies (pytest-asyncio,
flaky, pytz, tzdata, and the optional cachetools / aiolimiter its tests expect) into
DEST/.deps (a ``pip --target`` directory, not the environment: pytest-asyncio would change
how this project's own tests run). Then::

    PTB_FENCE_PTB_TESTS=DEST python -m pytest tests/test_ptb_upstream.py

or by hand: ``python tests/ptb_upstream.py run DEST [--plain]``, which prints the failing
test ids. Compared against ``tests/ptb_upstream_expected_failures.txt``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import List, Optional, Sequence, Set

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
TEST_FILES = (
    "tests/ext/test_application.py",
    "tests/ext/test_applicationbuilder.py",
    "tests/ext/test_updater.py",
    "tests/ext/test_jobqueue.py",
)
TEST_DEPS = (
    "pytest-asyncio==0.21.2",
    "flaky>=3.8.1",
    "pytz",
    "tzdata",
    "cachetools>=7.0.0,<8.0.0",
    "aiolimiter>=1.1,<1.3",
)
EXPECTED = HERE / "ptb_upstream_expected_failures.txt"
_RESULT = re.compile(r"^(FAILED|ERROR) (\S+)")


def ptb_version() -> str:
    """The installed python-telegram-bot version (its tag is ``v<version>``)."""
    import telegram

    return str(telegram.__version__)


def prepare(dest: pathlib.Path, git_dir: Optional[str], repo_url: Optional[str]) -> None:
    """Extract PTB's tag into ``dest`` and install its test dependencies into ``dest/.deps``."""
    tag = f"v{ptb_version()}"
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if git_dir is None:
            git_dir = os.path.join(tmp, "ptb.git")
            url = repo_url or "https://github.com/python-telegram-bot/python-telegram-bot"
            subprocess.run(
                ["git", "clone", "--bare", "--depth", "1", "--branch", tag, url, git_dir],
                check=True,
            )
        archive = subprocess.run(
            ["git", "--git-dir", git_dir, "archive", tag, "src", "tests", "pyproject.toml"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(dest / ".deps"),
         *TEST_DEPS],
        check=True,
    )
    print(f"PTB {tag} tests prepared in {dest}; run: PTB_FENCE_PTB_TESTS={dest} "
          "python -m pytest tests/test_ptb_upstream.py")


def run(
    dest: pathlib.Path,
    *,
    plain: bool = False,
    timeout: float = 1800,
    test_ids: Optional[Sequence[str]] = None,
) -> Set[str]:
    """Run PTB's offline tests in ``dest`` (all of :data:`TEST_FILES`, or ``test_ids``);
    return the ids of failing and erroring tests."""
    env = dict(os.environ)
    path = [str(dest / ".deps")]
    if not plain:
        path += [str(HERE), str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("GITHUB_ACTIONS", None)  # PTB's "local" settings: optional dependencies installed
    command: List[str] = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
        "-m", "not req",
    ]
    if not plain:
        command += ["-p", "ptb_upstream_plugin"]
    command += list(test_ids) if test_ids else list(TEST_FILES)
    result = subprocess.run(
        command, cwd=dest, env=env, capture_output=True, text=True, timeout=timeout
    )
    failures = set()
    for line in result.stdout.splitlines():
        match = _RESULT.match(line)
        if match:
            failures.add(match.group(2))
    if result.returncode not in (0, 1):
        raise RuntimeError(
            f"PTB's tests did not run (exit {result.returncode}):\n{result.stdout[-3000:]}"
            f"\n{result.stderr[-3000:]}"
        )
    return failures


def expected_failures() -> Set[str]:
    """The documented, intended differences (test ids) from the expectations file."""
    ids = set()
    for line in EXPECTED.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            ids.add(line)
    return ids


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_prepare = sub.add_parser("prepare", help="extract PTB's tests and their dependencies")
    p_prepare.add_argument("dest", type=pathlib.Path)
    p_prepare.add_argument("--git-dir", help="a local (bare) git repository of PTB")
    p_prepare.add_argument("--repo", help="PTB's git URL (default: GitHub)")
    p_run = sub.add_parser("run", help="run PTB's offline tests, print the failing ids")
    p_run.add_argument("dest", type=pathlib.Path)
    p_run.add_argument("--plain", action="store_true", help="without install() (baseline)")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.dest, args.git_dir, args.repo)
        return 0
    failures = run(args.dest, plain=args.plain)
    for test_id in sorted(failures):
        print(test_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
