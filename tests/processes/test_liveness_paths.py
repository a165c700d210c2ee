"""SQLite liveness between bot processes that reach one database through different paths.

Two real bot processes (PTB ``Application`` and blocking ``UpdateIntake``, see
tests/processes/recovery_support.py) share one SQLite file with the library's 120 s lease, so any
takeover within the test's time is the liveness check's. One of them ("here") opens the
database at its real path; the other ("there") through another path:

- ``mount``: as in a container that mounts the volume elsewhere. "There" runs in its own mount
  namespace where the volume's directory is bind-mounted at another directory and its real
  directory is hidden (a tmpfs over it): neither process can open a path the other one has.
  Needs root (``unshare -m``); skipped otherwise.
- ``symlink``: "there" opens a symbolic link to the database file that lives in another
  directory (SQLite itself follows it: the ``-wal``/``-shm`` files are next to the real file).

While "there" runs slow handlers, "here" takes none of them over and neither removes the
other's registration or lock file (no ping-pong); once "there" is SIGKILLed, "here" takes its
claims over within seconds, not after the lease.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, List, Sequence

import pytest

from ptb_fence import SQLiteUpdateStore
from ptb_fence.testing import FakeBotApi
from ptb_support import DOMAIN_DDL, rows, wait_sync
from recovery_support import DEFAULTS, Bed, _all_handled, _exactly_once, bots  # noqa: F401
from test_ptb_processes import Bots, _sqlite_domain
from test_recovery_takeover import TAKEOVER_BOUND

SLOW = 6.0
"""Seconds each slow handler runs: several liveness checks of each process happen meanwhile
(one a second), so a live process taken for dead would have its updates started by the other."""

# In its own mount namespace: the volume ($1) bind-mounted at $2, then hidden at $1.
_MOUNT_ELSEWHERE = 'mount --bind "$1" "$2" && mount -t tmpfs none "$1" && shift 2 && exec "$@"'


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


class Paths:
    """The database, the path each process opens it by, and how "there" is started."""

    def __init__(self, real: Path, there: str, prefix: Sequence[str]) -> None:
        self.real = real
        self.there = there
        self.prefix = list(prefix)

    @property
    def lock_directory(self) -> Path:
        return Path(str(self.real) + ".instances")


@pytest.fixture(params=["mount", "symlink"])
def paths(request: Any, tmp_path: Path) -> Iterator[Paths]:
    volume = tmp_path / "volume"
    volume.mkdir()
    real = volume / "bot.db"
    store = SQLiteUpdateStore(str(real))
    with store.transaction() as conn:
        conn.execute(DOMAIN_DDL)
    store.close()
    if request.param == "mount":
        if not _can_unshare():
            pytest.skip("needs root and unshare(1) to give a process its own mount namespace")
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()  # empty here; the volume is mounted on it in "there"'s namespace
        prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c", _MOUNT_ELSEWHERE,
                  "sh", str(volume), str(elsewhere)]
        yield Paths(real, str(elsewhere / "bot.db"), prefix)
    else:
        links = tmp_path / "links"
        links.mkdir()
        (links / "bot.db").symlink_to(real)
        yield Paths(real, str(links / "bot.db"), [])


def _spawn(bots: Bots, prefix: Sequence[str], fake: FakeBotApi, url: str, *extra: str) -> Any:
    """:meth:`Bots.spawn` with a command in front of the interpreter (it execs it: the pid is
    the bot's)."""
    out = open(os.path.join(bots.dir, f"out.{len(bots.procs)}"), "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [*prefix, sys.executable, bots.worker, fake.base_url, fake.token, url, "telegram_updates",
         "--dir", bots.dir, "--domain", "domain", *extra],
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    bots.procs.append(proc)
    return proc


def _instance(bots: Bots, pid: int) -> str:
    with open(os.path.join(bots.dir, f"instance.{pid}"), encoding="utf-8") as file:
        return file.read().strip()


def _registered(real: Path) -> List[str]:
    bed_conn = sqlite3.connect(str(real), timeout=10)
    try:
        return sorted(r[0] for r in bed_conn.execute(
            "SELECT instance FROM ptb_fence_instances WHERE table_name = 'telegram_updates'"))
    finally:
        bed_conn.close()


def test_processes_on_different_paths_see_each_other_alive_and_dead(
    bots: Bots, paths: Paths
) -> None:
    real = str(paths.real)
    bed = Bed("sqlite:///" + real, "telegram_updates", "domain",
              lambda: {u: r[0] for u, r in rows(real).items()},
              lambda: _sqlite_domain(real), lambda sql: [])
    with FakeBotApi() as fake:
        here = bots.spawn(fake, "sqlite:///" + real, "telegram_updates", "domain", *DEFAULTS,
                          "--max-life", "120")
        bots.wait_ready(here)
        there = _spawn(bots, paths.prefix, fake, "sqlite:///" + paths.there, "--poll", *DEFAULTS,
                       "--max-life", "120", "--slow", "slow", "--slow-seconds", str(SLOW),
                       "--hang", "hang")
        bots.wait_ready(there)
        here_id, there_id = _instance(bots, here.pid), _instance(bots, there.pid)
        assert _registered(paths.real) == sorted([here_id, there_id])
        lock_files = {i: os.stat(paths.lock_directory / f"{i}.lock").st_ino
                      for i in (here_id, there_id)}
        slow = [fake.inject_message(chat_id=10 + i, text="slow") for i in range(3)]
        wait_sync("the slow handlers to start",
                  lambda: all(there.pid in bots.started(u) for u in slow), 20)
        began = time.monotonic()
        while time.monotonic() - began < SLOW:
            started = {u: bots.started(u) for u in slow}
            assert all(here.pid not in pids for pids in started.values()), (
                f"a live process's updates were taken over: {started}\n{bots.output()}")
            assert _registered(paths.real) == sorted([here_id, there_id]), bots.output()
            time.sleep(0.1)
        _all_handled(bots, bed, slow, 2 * SLOW + 15, "the process there finishes its updates")
        assert all(bots.started(u) == [there.pid] for u in slow), {
            u: bots.started(u) for u in slow}
        # nobody removed or replaced a lock file (a takeover removes the dead one's file; its
        # owner would then have put a new one in place)
        assert {i: os.stat(paths.lock_directory / f"{i}.lock").st_ino
                for i in lock_files} == lock_files
        assert _registered(paths.real) == sorted([here_id, there_id])
        # a real death is found within seconds through the other path
        hang = fake.inject_message(chat_id=20, text="hang")
        wait_sync("a handler that never returns to start",
                  lambda: there.pid in bots.started(hang), 20)
        bots.kill(there)
        killed = time.monotonic()
        _all_handled(bots, bed, [hang], TAKEOVER_BOUND, "the process here takes over")
        took = time.monotonic() - killed
        assert took < TAKEOVER_BOUND, took
        assert _registered(paths.real) == [here_id]
        bots.stop_all()
    written = _exactly_once(bed, [*slow, hang])
    assert all(written[u][0][3] == there.pid for u in slow), written
    assert written[hang][0][3] == here.pid, written
