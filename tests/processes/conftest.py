"""Every test in this folder runs real processes, so every one is marked ``slow``.

``python -m pytest -m "not slow"`` leaves them out: the unit and integration layers alone.

With ``PTB_FENCE_PROCESS_TESTS=smoke`` only the modules in ``EVERY_PYTHON`` run here, the others
skip. ``.ci/run`` sets it for its runs on the lowest and the highest supported Python: the kill,
outage and scale tests prove the runtime's behaviour, not the interpreter's, and they run once per
CI, in its main run. A user running the README's test command runs them all.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

import pytest

HERE = Path(__file__).resolve().parent

# What an interpreter can break: installing, importing, typing, the shipped scripts and examples,
# and a PTB Application run, stopped and signalled in its own process.
EVERY_PYTHON = frozenset({
    "test_demo.py",
    "test_examples.py",
    "test_import_cost.py",
    "test_lazy_psycopg2.py",
    "test_packaging.py",
    "test_ptb_processes.py",
    "test_ptb_stop.py",
    "test_readme_first_bot.py",
    "test_readme_testing.py",
    "test_runtime_processes.py",
    "test_serve.py",
    "test_tutorial.py",
    "test_typing.py",
    "test_unactivated_env.py",
})


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    smoke = os.environ.get("PTB_FENCE_PROCESS_TESTS", "all") == "smoke"
    skip = pytest.mark.skip(
        reason="PTB_FENCE_PROCESS_TESTS=smoke: this process test runs in CI's main run only"
    )
    # a conftest hook sees the items of the whole session, not only this folder's
    for item in items:
        path = Path(item.path).resolve()
        if HERE in path.parents:
            item.add_marker(pytest.mark.slow)
            if smoke and path.name not in EVERY_PYTHON:
                item.add_marker(skip)
