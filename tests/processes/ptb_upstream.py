"""Run python-telegram-bot's own offline tests with every Application wired through install().

Prepare once (the package index is the only network needed)::

    python tests/processes/ptb_upstream.py prepare DEST

It downloads the sdist of the installed python-telegram-bot version with pip (PTB ships its
tests in it), extracts ``src/``, ``tests/`` and ``pyproject.toml`` into DEST and makes a
separate virtual environment DEST/.venv with PTB's own pinned test dependencies (its
``tests`` dependency group: pytest, pytest-asyncio, flaky, ...) and every optional extra its
tests expect, plus ptb_fence's runtime dependencies. ptb_fence itself is imported from this
checkout. A separate environment, because PTB pins a pytest-asyncio that would change how this
project's own tests run. Then::

    PTB_FENCE_PTB_TESTS=DEST python -m pytest tests/processes/test_ptb_upstream.py

or by hand: ``python tests/processes/ptb_upstream.py run DEST [--processor fenced|durable]
[--store memory|sqlite] [--plain]``, which prints the failing test ids. The failures must be
exactly those listed for that wiring in ``tests/processes/ptb_upstream_expected_failures.txt``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import List, Optional, Sequence, Set, Tuple

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
TEST_FILES = (
    "tests/ext/test_application.py",
    "tests/ext/test_applicationbuilder.py",
    "tests/ext/test_updater.py",
    "tests/ext/test_jobqueue.py",
)
PROCESSORS = ("fenced", "durable")
STORES = ("memory", "sqlite")
# Used when PTB's pyproject.toml cannot be read (Python 3.10 has no tomllib): PTB 22.8's pins.
FALLBACK_TEST_DEPS = (
    "pytest==9.0.3",
    "pytest-asyncio==0.21.2",
    "flaky>=3.8.1",
    "pytz",
    "tzdata",
)
# PTB's tests group also builds wheels, parses the online docs and measures coverage: not needed.
_SKIPPED_TEST_DEPS = ("build", "beautifulsoup4", "pytest-cov", "pytest-xdist")
EXPECTED = HERE / "ptb_upstream_expected_failures.txt"
# a test id may hold spaces (parametrize ids such as "invalid data"); a message follows " - "
_RESULT = re.compile(r"^(FAILED|ERROR) (tests/\S.*?)(?: - .*)?$")  # not "ERROR    <log line>"
_TAGS = re.compile(r"^\[([a-z,]+)\]\s+(.+)$")


def ptb_version() -> str:
    """The installed python-telegram-bot version."""
    import telegram

    return str(telegram.__version__)


def venv_python(dest: pathlib.Path) -> pathlib.Path:
    """The interpreter of DEST's separate environment."""
    return dest / ".venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _test_dependencies(pyproject: pathlib.Path) -> List[str]:
    """PTB's own pinned test dependencies (its ``tests`` dependency group)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return list(FALLBACK_TEST_DEPS)
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    group = data.get("dependency-groups", {}).get("tests", [])
    deps = [d for d in group if isinstance(d, str)]
    keep = [d for d in deps if re.split(r"[=<>~!\[; ]", d, 1)[0] not in _SKIPPED_TEST_DEPS]
    return keep or list(FALLBACK_TEST_DEPS)


def prepare(dest: pathlib.Path, sdist: Optional[pathlib.Path] = None) -> None:
    """Extract PTB's sdist into ``dest`` and make ``dest/.venv`` with its test dependencies."""
    version = ptb_version()
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if sdist is None:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                 "--no-binary", ":all:", "--dest", tmp, f"python-telegram-bot=={version}"],
                check=True,
            )
            found = sorted(pathlib.Path(tmp).glob("*.tar.gz"))
            if not found:
                raise RuntimeError(f"pip found no sdist of python-telegram-bot {version}")
            sdist = found[0]
        with tarfile.open(sdist) as archive:
            top = archive.getnames()[0].split("/", 1)[0]
            wanted = [
                m for m in archive.getmembers()
                if m.name.split("/", 2)[1:2] and m.name.split("/", 2)[1] in
                ("src", "tests", "pyproject.toml")
            ]
            archive.extractall(tmp, members=wanted)
        for name in ("src", "tests"):
            shutil.rmtree(dest / name, ignore_errors=True)
            shutil.move(os.path.join(tmp, top, name), dest / name)
        shutil.copy(os.path.join(tmp, top, "pyproject.toml"), dest / "pyproject.toml")
    if not venv_python(dest).exists():
        subprocess.run([sys.executable, "-m", "venv", str(dest / ".venv")], check=True)
    subprocess.run(
        [str(venv_python(dest)), "-m", "pip", "install", "--quiet",
         *_test_dependencies(dest / "pyproject.toml"),
         # every optional extra PTB's tests expect, at the installed version (tests import
         # PTB from src/, the same version)
         f"python-telegram-bot[all]=={version}",
         # ptb_fence's own runtime dependencies (ptb_fence is imported from this checkout)
         "psycopg2-binary>=2.9"],
        check=True,
    )
    print(f"PTB {version} tests prepared in {dest}; run: PTB_FENCE_PTB_TESTS={dest} "
          "python -m pytest tests/processes/test_ptb_upstream.py")


def run(
    dest: pathlib.Path,
    *,
    processor: str = "fenced",
    store: str = "memory",
    plain: bool = False,
    timeout: float = 1800,
    test_ids: Optional[Sequence[str]] = None,
) -> Set[str]:
    """Run PTB's offline tests in ``dest`` (all of :data:`TEST_FILES`, or ``test_ids``) with
    every Application wired through ``processor`` over ``store``; return the ids of failing
    and erroring tests."""
    return run_with_summary(
        dest, processor=processor, store=store, plain=plain, timeout=timeout, test_ids=test_ids
    )[0]


def run_with_summary(
    dest: pathlib.Path,
    *,
    processor: str = "fenced",
    store: str = "memory",
    plain: bool = False,
    timeout: float = 1800,
    test_ids: Optional[Sequence[str]] = None,
) -> Tuple[Set[str], str]:
    """:func:`run`, and pytest's closing line ("N passed, M failed, ...")."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(name, None)
    if not plain:
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO)])
    env["PTB_FENCE_UPSTREAM_PROCESSOR"] = processor
    env["PTB_FENCE_UPSTREAM_STORE"] = store
    env.pop("GITHUB_ACTIONS", None)  # PTB's "local" settings: optional dependencies installed
    command: List[str] = [
        str(venv_python(dest)), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
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
    if result.returncode not in (0, 1) or not re.search(r"\d+ passed", result.stdout):
        raise RuntimeError(
            f"PTB's tests did not run (exit {result.returncode}):\n{result.stdout[-3000:]}"
            f"\n{result.stderr[-3000:]}"
        )
    closing = [line.strip("= ") for line in result.stdout.splitlines() if " passed" in line]
    return failures, (closing[-1] if closing else "")


def expected_failures(processor: str = "fenced", store: str = "memory") -> Set[str]:
    """The documented, intended differences (test ids) of one wiring.

    A line of the expectations file is a test id, for every wiring, or ``[tag,tag] test id``
    for the wirings that have every tag (``fenced``/``durable``, ``memory``/``sqlite``).
    """
    ids = set()
    for raw in EXPECTED.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _TAGS.match(line)
        if match:
            tags = set(match.group(1).split(","))
            unknown = tags - set(PROCESSORS) - set(STORES)
            if unknown:
                raise ValueError(f"{EXPECTED.name}: unknown tags {sorted(unknown)} in {raw!r}")
            if tags <= {processor, store}:
                ids.add(match.group(2))
        else:
            ids.add(line)
    return ids


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_prepare = sub.add_parser("prepare", help="extract PTB's tests, make their environment")
    p_prepare.add_argument("dest", type=pathlib.Path)
    p_prepare.add_argument("--sdist", type=pathlib.Path, help="a downloaded PTB sdist")
    p_run = sub.add_parser("run", help="run PTB's offline tests, print the failing ids")
    p_run.add_argument("dest", type=pathlib.Path)
    p_run.add_argument("--processor", choices=PROCESSORS, default="fenced")
    p_run.add_argument("--store", choices=STORES, default="memory")
    p_run.add_argument("--plain", action="store_true", help="without install() (baseline)")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.dest, args.sdist)
        return 0
    failures, closing = run_with_summary(
        args.dest, processor=args.processor, store=args.store, plain=args.plain
    )
    expected = expected_failures(args.processor, args.store)
    for test_id in sorted(failures):
        print(test_id + ("" if test_id in expected else "   <- not expected"))
    for test_id in sorted(expected - failures):
        print(test_id + "   <- expected, passed")
    print(f"{'plain' if args.plain else args.processor + ' x ' + args.store}: {closing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
