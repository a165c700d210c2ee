"""A SQLite liveness check that races with the owner holding its instance again.

The checker opens the owner's lock file, and before it tries the lock the file is deleted and
the live owner, at its own check, locks a new file in its place and closes the old one. The
checker's descriptor is then the old, unlinked file: free, naming the instance, yet no proof
that the instance is dead (it holds the file now at that path). The window between the open
and the lock is microseconds, so the test makes it happen deterministically: the checker's
``flock`` call (the stdlib function, as the store module sees it) first lets the deletion and
the owner's check happen, then locks. Two real store objects on one real file.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any, Dict

import pytest

from ptb_fence import SQLiteUpdateStore

LEASE = 120_000


def test_a_lock_file_replaced_while_it_is_checked_is_no_proof(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "race.db")
    with SQLiteUpdateStore(path) as owner, SQLiteUpdateStore(path) as checker:
        instance = owner.hold_liveness()
        lock_file = f"{path}.instances/{instance}.lock"
        held = os.stat(lock_file).st_ino
        owner.add(1, "x", 0)
        mine = owner.claim_owned(1, now=1, lease_until=LEASE, max_attempts=5)
        assert mine is not None
        real_flock = fcntl.flock
        raced: Dict[str, Any] = {"done": False}

        def flock(fd: int, operation: int) -> None:
            if not raced["done"] and os.fstat(fd).st_ino == held:
                raced["done"] = True  # the checker has the owner's file open: now the race
                os.unlink(lock_file)
                assert owner.take_over_dead(now=2) == 0  # holds its instance again
                assert os.stat(lock_file).st_ino != held
            real_flock(fd, operation)

        monkeypatch.setattr(fcntl, "flock", flock)
        taken = checker.take_over_dead(now=3)
        monkeypatch.undo()
        assert raced["done"], "the checker never tried the owner's lock file"
        assert taken == 0, "a live instance was taken for dead"
        assert owner.owns(mine, 4)
        assert os.path.exists(lock_file), "the live owner's new lock file was removed"
        assert checker.take_over_dead(now=5) == 0 and owner.owns(mine, 5)

