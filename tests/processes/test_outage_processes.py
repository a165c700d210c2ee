"""A PostgreSQL outage under a running bot (tests/processes/outbox_worker.py: a PTB
``Application`` with ``run_polling()``, replies through the outbox, FakeBotApi as Telegram;
tests/processes/intake_worker.py: an ``UpdateIntake`` whose sweeps find what another process
recorded), made by a TCP proxy between the bot and the server (tests/support/tcp_proxy.py): every
connection is closed and new ones are refused for the outage, then accepted again, while the
server keeps running for everyone else.

During the outage every background loop must back off: a few ERROR lines per component (not
thousands a second), the process's CPU no more than half again what it takes idle, and one line
once the store answers again; the work the outage held up must go on within a second of it.

``PTB_FENCE_OUTAGE_SECONDS`` sets how long the outage lasts (default 12 s).
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from typing import Any, Iterator, List, Tuple

import psycopg2.extensions
import pytest

from ptb_fence.testing import FakeBotApi, make_message_update
from ptb_support import wait_sync
from recovery_support import Bed, make_bed
from tcp_proxy import TcpProxy
from test_ptb_processes import Bots
from worker_support import make_store

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = {"ptb": os.path.join(HERE, "outbox_worker.py"),
           "intake": os.path.join(HERE, "intake_worker.py")}
OUTAGE = float(os.environ.get("PTB_FENCE_OUTAGE_SECONDS", "12"))
TICK = os.sysconf("SC_CLK_TCK")
ERRORS_PER_COMPONENT = 3


@pytest.fixture(params=["postgres"])
def bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    yield from make_bed(request, tmp_path)


@pytest.fixture(params=["ptb", "intake"])
def bots(request: Any, tmp_path: Any) -> Iterator[Bots]:
    """The bot processes of one front end: a PTB Application polling FakeBotApi, replying
    through the outbox (``ptb``), or an ``UpdateIntake`` handed what the test records
    (``intake``: its sweeps find it)."""
    directory = tmp_path / "bots"
    directory.mkdir()
    started = Bots(str(directory), WORKERS[request.param])
    yield started
    for proc in started.procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def cpu_seconds(pid: int) -> float:
    """User and system CPU of the process (every thread), from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def log_lines(bots: Bots, pid: int) -> List[str]:
    with open(os.path.join(bots.dir, f"log.{pid}"), encoding="utf-8", errors="replace") as file:
        return file.read().splitlines()


def errors_by_component(lines: List[str]) -> List[Tuple[str, int]]:
    """``(component, ERROR lines)`` of the log lines (format: time pid logger LEVEL message):
    the logger, with the step of a store error (``ptb_fence.runtime/outbox``)."""
    counts: "dict[str, int]" = {}
    for line in lines:
        # the intake worker's lines name the thread before the logger
        match = re.match(r"\S+ \S+ \d+ (?:\S+ )?(\S+) ERROR (store error during (\w+))?", line)
        if match:
            name = match.group(1) + (f"/{match.group(3)}" if match.group(3) else "")
            counts[name] = counts.get(name, 0) + 1
    return sorted(counts.items())


def replied(fake: FakeBotApi, update_id: int) -> bool:
    return any(str(m.get("text", "")).startswith(f"reply {update_id} ")
               for m in fake.sent_messages)


@pytest.mark.timeout(180)
def test_an_outage_backs_every_loop_off_and_work_resumes_at_once(
    bed: Bed, bots: Bots
) -> None:
    params = psycopg2.extensions.parse_dsn(bed.url)
    proxy = TcpProxy((params.get("host", "127.0.0.1"), int(params.get("port", 5432)))).start()
    params.update(host="127.0.0.1", port=str(proxy.port))
    dsn = psycopg2.extensions.make_dsn(**params)
    direct = make_store(bed.url, bed.table)  # the test's own way in: not through the proxy
    ptb = bots.worker == WORKERS["ptb"]
    try:
        with FakeBotApi() as fake:

            def give(chat: int) -> int:
                """An update for the bot: from Telegram (PTB), or recorded by another
                process (the intake's sweep finds it)."""
                if ptb:
                    return fake.inject_message(chat_id=chat, text="inside")
                update = make_message_update(1000 + chat, chat, "x")
                direct.add(update["update_id"], json.dumps(update), int(time.time() * 1000))
                return int(update["update_id"])

            def done(update_id: int) -> bool:
                if ptb:
                    return replied(fake, update_id)
                return bool(glob.glob(os.path.join(bots.dir, f"started.{update_id}.*")))

            extra = (("--poll", "--sweep", "1", "--grace", "1") if ptb
                     else ("--sweep", "0.5", "--grace", "0.01"))
            proc = bots.spawn(fake, dsn, bed.table, bed.domain, "--lease", "5", *extra)
            bots.wait_ready(proc, timeout=60)
            first = [give(10 + i) for i in range(3)]
            wait_sync("the first updates handled", lambda: all(done(u) for u in first), 30)

            time.sleep(1.0)
            idle_from = cpu_seconds(proc.pid)
            time.sleep(OUTAGE)
            idle = cpu_seconds(proc.pid) - idle_from

            before = len(log_lines(bots, proc.pid))
            proxy.cut()
            outage_from = cpu_seconds(proc.pid)
            time.sleep(1.0)
            held = give(20)  # waits for the store
            time.sleep(OUTAGE - 1.0)
            outage = cpu_seconds(proc.pid) - outage_from
            during = log_lines(bots, proc.pid)[before:]
            assert proc.poll() is None, bots.output()
            assert not done(held)

            proxy.restore()
            back = time.monotonic()
            wait_sync("the held update handled", lambda: done(held), 30, step=0.01)
            resumed = time.monotonic() - back
            time.sleep(2.0)
            after = log_lines(bots, proc.pid)[before + len(during):]
    finally:
        proxy.close()
        direct.close()
    errors = errors_by_component(during)
    print(f"\noutage {OUTAGE:g} s: {sum(n for _, n in errors)} ERROR lines {errors}, "
          f"{len(during)} lines in all; CPU {outage:.2f} s (idle {idle:.2f} s over as long); "
          f"resumed {resumed:.2f} s after the store came back; "
          + "".join(line.split(" WARNING ", 1)[1] for line in after if "answers again" in line))
    assert all(n <= ERRORS_PER_COMPONENT for _, n in errors), (errors, during[-20:])
    assert outage <= 1.5 * idle + 0.1, (outage, idle)
    assert resumed <= 1.0, resumed
    assert sum("answers again" in line for line in after) == 1, after[-20:]
