"""The API reference builds with Sphinx, warnings as errors, and names every public name."""

import importlib
import posixpath
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC_MODULES = (
    "ptb_fence",
    "ptb_fence.ptb",
    "ptb_fence.testing",
    "ptb_fence.conformance",
    "ptb_fence.cli",
    "ptb_fence.chaos",
)


@pytest.fixture(scope="module")
def built_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert result.returncode == 0, f"sphinx -W failed:\n{result.stdout}\n{result.stderr}"
    return out


def _documented_names(build: Path) -> "set[str]":
    from sphinx.util.inventory import InventoryFile

    with open(build / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", posixpath.join)
    names: "set[str]" = set()
    for entries in inventory.values():
        names.update(entries)
    return names


def test_every_public_name_has_a_reference_entry(built_reference: Path) -> None:
    documented = _documented_names(built_reference)
    missing = [
        f"{module}.{name}"
        for module in PUBLIC_MODULES
        for name in importlib.import_module(module).__all__
        if not name.startswith("__") and f"{module}.{name}" not in documented
    ]
    assert missing == [], f"public names missing from docs/api/*.rst: {missing}"


def test_the_guide_is_the_readme(built_reference: Path) -> None:
    html = (built_reference / "guide.html").read_text(encoding="utf-8")
    guide = re.sub(r"<[^>]+>", "", html)  # code blocks are split into highlighted spans
    # The two fresh-machine commands are the README's first instructions.
    assert "python -m ptb_fence demo" in guide
    assert "FencedUpdateProcessor" in guide
