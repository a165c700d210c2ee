"""python-telegram-bot's own offline tests (Application, ApplicationBuilder, Updater, JobQueue)
with every Application wired through ``FencedUpdateProcessor`` or ``DurableUpdateProcessor``
(``install(builder)``), over the memory and the SQLite store.

Needs PTB's tests prepared from its sdist (``.ci/run`` does this; no network but the package
index)::

    python tests/processes/ptb_upstream.py prepare /tmp/ptb-tests
    PTB_FENCE_PTB_TESTS=/tmp/ptb-tests python -m pytest tests/processes/test_ptb_upstream.py

The failures must be exactly the intended differences listed (each with its reason) for that
wiring in ``tests/processes/ptb_upstream_expected_failures.txt``: a new failure fails, and so does a
listed one that passes, so the list stays true.
"""

from __future__ import annotations

import fcntl
import os
import pathlib

import pytest

from ptb_upstream import PROCESSORS, STORES, TEST_FILES, expected_failures, run

_PATH = os.environ.get("PTB_FENCE_PTB_TESTS")


@pytest.mark.timeout(1800)
@pytest.mark.skipif(
    not _PATH,
    reason="PTB_FENCE_PTB_TESTS is not set: prepare PTB's tests with "
    "'python tests/processes/ptb_upstream.py prepare DEST' and set PTB_FENCE_PTB_TESTS=DEST",
)
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("processor", PROCESSORS)
def test_ptb_offline_tests_fail_only_where_documented(processor: str, store: str) -> None:
    dest = pathlib.Path(str(_PATH))
    missing = [name for name in TEST_FILES if not (dest / name).is_file()]
    assert not missing, f"{dest} is not a prepared PTB checkout (missing {missing})"
    # one wiring at a time (xdist workers take them in parallel otherwise): PTB's webhook tests
    # bind ports of their own choosing, and two runs at once fail on each other's ports
    with open(dest / ".run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _check(dest, processor, store)


def _check(dest: pathlib.Path, processor: str, store: str) -> None:
    failures = run(dest, processor=processor, store=store)
    expected = expected_failures(processor, store)
    unexpected = sorted(failures - expected)
    if unexpected:
        # PTB's tests use fixed ports and short sleeps: an unexpected failure counts only if
        # it fails again when run on its own
        failures = (failures & expected) | run(
            dest, processor=processor, store=store, test_ids=unexpected
        )
    assert sorted(failures - expected) == [], "new failures (bugs or undocumented differences)"
    assert sorted(expected - failures) == [], (
        "documented differences that no longer fail: remove them from "
        "tests/processes/ptb_upstream_expected_failures.txt"
    )


def test_expectations_name_only_known_wirings() -> None:
    for processor in PROCESSORS:
        for store in STORES:
            assert expected_failures(processor, store), "every wiring has its listed differences"
