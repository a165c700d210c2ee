"""Switching PTB bots to ``strict_chat_order`` with updates recorded without it, in real
processes (``tests/processes/ptb_bot_worker.py``: a PTB ``Application`` with
``FencedUpdateProcessor``), on a SQLite file and on PostgreSQL, against a ``FakeBotApi``.

A process without the option polls the fake Bot API and records 10 chats x 8 messages (ids
interleaved across chats, as Telegram numbers them); it claims some of them at ingest, their
handlers hang, and it is SIGKILLed. Two processes with the option (sweeping only, not polling)
handle all of it: per chat one at a time (the handler intervals never overlap) in ``update_id``
order, each update exactly once, both processes handling some. ``backlog``: the strict processes
start after the kill (a restart with the option); ``rolling``: they already run while the process
without the option records (a rolling switch).
"""

from __future__ import annotations

import glob
import os
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from ptb_fence.testing import FakeBotApi
from ptb_support import wait_sync
from recovery_support import Bed, make_bed
from test_ptb_processes import WORKER, Bots

CHATS = 10
PER_CHAT = 8

pytestmark = pytest.mark.timeout(150)

COMMON = ["--lease", "20", "--sweep", "0.1", "--grace", "0.1"]


@pytest.fixture(params=["sqlite", "postgres"])
def bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    yield from make_bed(request, tmp_path)


def _stamp(path: str) -> float:
    with open(path, encoding="utf-8") as file:
        return float(file.read())


def _intervals(directory: str, pids: List[int]) -> List[Tuple[int, int, float, float]]:
    """``(update_id, pid, started, ended)`` of every handler run of ``pids`` that ended."""
    runs = []
    for pid in pids:
        for path in glob.glob(os.path.join(directory, f"ended.*.{pid}")):
            update_id = int(os.path.basename(path).split(".")[1])
            started = os.path.join(directory, f"started.{update_id}.{pid}")
            runs.append((update_id, pid, _stamp(started), _stamp(path)))
    return runs


@pytest.mark.parametrize("when", ["backlog", "rolling"])
def test_ptb_switch_to_strict_chat_order_keeps_each_chat_in_order(
    bed: Bed, tmp_path: Any, when: str
) -> None:
    directory = tmp_path / "bots"
    directory.mkdir()
    bots = Bots(str(directory), WORKER)
    strict_args = [*COMMON, "--strict-chat-order", "--slow", "m", "--slow-seconds", "0.02",
                   "--max-concurrent", "2"]
    try:
        with FakeBotApi() as fake:
            chats: Dict[int, int] = {}
            for n in range(CHATS * PER_CHAT):
                chat = 100 + n % CHATS
                chats[fake.inject_message(chat_id=chat, text="m")] = chat
            strict = []
            if when == "rolling":  # running before anything is recorded: nothing to key at start
                strict = [bots.spawn(fake, bed.url, bed.table, bed.domain, *strict_args)
                          for _ in range(2)]
                bots.wait_ready(*strict)
            lax = bots.spawn(fake, bed.url, bed.table, bed.domain, *COMMON, "--poll",
                             "--hang", "m")
            bots.wait_ready(lax)
            wait_sync("every update recorded", lambda: len(bed.states()) == len(chats), 30)
            if when == "backlog":
                # started after the lax process recorded the backlog (keyed at their start),
                # both ready before its claims are freed, each holding few chats at a time:
                # the backlog is shared between them, whatever the machine's load
                strict = [bots.spawn(fake, bed.url, bed.table, bed.domain, *strict_args)
                          for _ in range(2)]
                bots.wait_ready(*strict)
            bots.kill(lax)
            wait_sync(
                f"every update handled ({directory})",
                lambda: len(bed.written()) >= len(chats)
                and set(bed.states().values()) == {"completed"},
                90,
            )
            bots.stop_all()
    finally:
        for proc in bots.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    written = bed.written()
    assert sorted(row[0] for row in written) == sorted(chats), "each update handled once"
    pids = [proc.pid for proc in strict]
    assert {row[3] for row in written} == set(pids), "both strict processes handled updates"
    runs = _intervals(str(directory), pids)
    assert sorted(run[0] for run in runs) == sorted(chats)
    by_chat: Dict[int, List[Tuple[int, int, float, float]]] = {}
    for run in runs:
        by_chat.setdefault(chats[run[0]], []).append(run)
    for chat, chat_runs in sorted(by_chat.items()):
        chat_runs.sort(key=lambda run: run[2])
        order = [run[0] for run in chat_runs]
        assert order == sorted(order), f"chat {chat}: handled out of order {order}"
        for before, after in zip(chat_runs, chat_runs[1:]):
            assert after[2] >= before[3], (
                f"chat {chat}: update {after[0]} (pid {after[1]}) started before update "
                f"{before[0]} (pid {before[1]}) ended"
            )
    logs = bots.output()
    if when == "rolling":
        assert "without strict_chat_order records into" in logs, logs
    else:
        assert "recorded without a chat key" in logs, logs
