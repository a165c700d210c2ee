"""The package builds into an sdist and a wheel that carry what they should.

Builds from a copy of the working tree (the files git would ship: tracked and new, not ignored)
with ``python -m build --no-isolation`` (offline: it uses this environment's setuptools and
wheel), checks the metadata and contents, unpacks the sdist and runs a smoke test from it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import List

import pytest

import ptb_fence

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]

CLASSIFIERS = {
    "Development Status :: 4 - Beta",
    "Intended Audience :: Developers",
    "License :: OSI Approved :: MIT License",
    "Operating System :: OS Independent",
    "Framework :: AsyncIO",
    "Topic :: Communications :: Chat",
    "Topic :: Database",
    "Typing :: Typed",
    *(f"Programming Language :: Python :: 3.{minor}" for minor in (10, 11, 12, 13)),
}


def shipped_files() -> List[str]:
    if shutil.which("git") and (ROOT / ".git").exists():
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
            capture_output=True, text=True,
        ).stdout
        return [line for line in out.splitlines() if (ROOT / line).is_file()]
    skip = {".git", "__pycache__", "build", "dist", ".mypy_cache", ".pytest_cache"}
    return [
        str(path.relative_to(ROOT)) for path in ROOT.rglob("*")
        if path.is_file() and not skip & set(path.relative_to(ROOT).parts)
        and not path.name.endswith((".pyc", ".db", ".db-wal", ".db-shm"))
        and ".egg-info" not in str(path)
    ]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if any(importlib.util.find_spec(name) is None for name in ("build", "setuptools", "wheel")):
        pytest.skip("needs the test extra's build, setuptools and wheel (pip install -e '.[test]')")
    src = tmp_path_factory.mktemp("src")
    for name in shipped_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "-o", str(out)],
        cwd=src, capture_output=True, text=True, timeout=150,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def only(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, found
    return found[0]


def test_wheel_metadata_and_contents(dist: Path) -> None:
    wheel = only(dist, f"ptb_fence-{ptb_fence.__version__}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(archive.read(meta_name).decode())
        license_names = [n for n in names if re.search(r"\.dist-info/(licenses/)?LICENSE$", n)]
        assert license_names, names
        assert "Copyright (c) 2026 ptb_fence contributors" in archive.read(
            license_names[0]).decode()
    assert "ptb_fence/py.typed" in names
    # the monitoring kit (ptb_fence.metrics.alert_rules_path(), grafana_dashboard_path())
    assert {"ptb_fence/monitoring/alerts.yml", "ptb_fence/monitoring/grafana.json"} <= set(names)
    assert "ptb_fence/testing/__main__.py" in names
    # the stores' named statements (ptb_fence/stores/_queries.py reads them from the package)
    assert {"ptb_fence/stores/postgres/updates.sql", "ptb_fence/stores/postgres/schema.sql"} <= set(names)
    assert not any(n.startswith(("tests/", "examples/", "benchmarks/")) for n in names)
    assert meta["Name"].replace("-", "_") == "ptb_fence" and meta["Version"] == ptb_fence.__version__
    assert CLASSIFIERS <= set(meta.get_all("Classifier") or [])
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["Requires-Python"] == ">=3.10"
    assert set(meta.get_all("Provides-Extra") or []) >= {"webhooks", "test", "bench"}
    requires = meta.get_all("Requires-Dist") or []
    apscheduler = [r for r in requires if r.lower().startswith("apscheduler")]
    assert apscheduler and "<3.12" in apscheduler[0] and ">=3.10.4" in apscheduler[0], requires
    webhooks = [r for r in requires if 'extra == "webhooks"' in r]
    assert webhooks and webhooks[0].startswith("python-telegram-bot[webhooks]"), requires
    assert meta["Description-Content-Type"] == "text/x-rst"
    assert "Your first bot" in meta.get_payload()


def test_apscheduler_range_matches_ptbs_job_queue_extra() -> None:
    import configparser
    import importlib.metadata as metadata

    ptb = [r for r in metadata.requires("python-telegram-bot") or [] if "job-queue" in r]
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    ours = [line.strip() for line in config["options"]["install_requires"].splitlines()
            if line.strip().lower().startswith("apscheduler")]

    def pins(requirement: str) -> "set[str]":
        spec = requirement.split(";")[0].strip()[len("apscheduler"):]
        return {part.strip().lower() for part in spec.split(",")}

    assert ptb and ours and pins(ptb[0]) == pins(ours[0]), (ptb, ours)


def test_sdist_has_what_its_tests_need_and_runs_from_itself(
    dist: Path, tmp_path: Path
) -> None:
    sdist = only(dist, f"ptb_fence-{ptb_fence.__version__}.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data") if sys.version_info >= (3, 12) else \
            archive.extractall(tmp_path)  # noqa: S202 - our own archive
    tree = tmp_path / f"ptb_fence-{ptb_fence.__version__}"
    for name in ("LICENSE", "README.rst", "CHANGES.rst", "docs/_inventories/telegram.inv",
                 "pyproject.toml", "setup.cfg", "setup.py",
                 "ptb_fence/py.typed", "ptb_fence/monitoring/alerts.yml",
                 "ptb_fence/monitoring/grafana.json", "ptb_fence/stores/postgres/updates.sql",
                 "examples/polling_sqlite.py", "benchmarks/run.py",
                 "tests/conftest.py", "tests/support/ptb_support.py",
                 "tests/unit/test_durations.py"):
        assert (tree / name).is_file(), name
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    where = subprocess.run(
        [sys.executable, "-c", "import ptb_fence; print(ptb_fence.__file__)"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=60,
    )
    assert Path(where.stdout.strip()).resolve() == (tree / "ptb_fence/__init__.py").resolve()
    version = subprocess.run(
        [sys.executable, "-m", "ptb_fence", "--version"], cwd=tree, env=env,
        capture_output=True, text=True, timeout=60,
    )
    assert version.returncode == 0 and ptb_fence.__version__ in version.stdout, version
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/unit/test_durations.py", "tests/processes/test_serve.py::test_serve_help"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=120,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]
    assert re.search(r"\d+ passed", tests.stdout)


def test_long_description_renders_cleanly(dist: Path) -> None:
    """What ``twine check`` checks: the README renders as reStructuredText without warnings."""
    if shutil.which("twine") or importlib.util.find_spec("twine") is not None:
        result = subprocess.run(
            [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
            capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return
    docutils_core = pytest.importorskip("docutils.core")
    import io

    warnings = io.StringIO()
    docutils_core.publish_string(
        (ROOT / "README.rst").read_text(), writer_name="null",
        settings_overrides={"warning_stream": warnings, "report_level": 2, "halt_level": 5},
    )
    assert warnings.getvalue() == ""
