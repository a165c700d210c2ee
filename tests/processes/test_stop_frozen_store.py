"""SIGTERM while PostgreSQL does not answer: the bot still exits in bounded time, losing nothing.

The bot (tests/processes/ptb_bot_worker.py under ``run_polling()``) reaches PostgreSQL through a
small TCP proxy in this test process; "freezing" the proxy makes the server silent for the bot
exactly as a frozen server or a network partition would (its TCP peer accepts and says nothing; a
server-side ``statement_timeout`` cannot help), without touching the shared server. SIGTERM arrives
while handlers run and claimed updates wait: the process must exit within ``stop_timeout_seconds``
plus the stated margin. Then the proxy thaws, and a second bot handles every update (after the short
lease, or at once once the dead process's liveness is gone), each exactly once. Also when new
updates arrive during the partition: recording them waits for the silent server when SIGTERM
comes; they were not confirmed to Telegram, so the next process gets them.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
import urllib.parse
from types import SimpleNamespace
from typing import Any, Iterator, List

import pytest

from ptb_fence.testing import FakeBotApi
from ptb_support import wait_sync
from recovery_support import (  # noqa: F401 - fixtures
    Bed, _all_handled, _exactly_once, _stop, bots, make_bed,
)
from test_ptb_processes import Bots


class FreezableProxy:
    """A TCP proxy on 127.0.0.1 that forwards to ``(host, port)`` until frozen.

    Frozen, it still accepts connections and reads (at most one chunk per direction) but
    forwards nothing: to its clients the server has gone silent.
    """

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        self._sockets: List[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def freeze(self) -> None:
        self._open.clear()

    def thaw(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._closed = True
        self._open.set()
        for sock in [self._listener] + self._sockets:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            self._open.wait()  # frozen: hold what was read, forward nothing
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return


@pytest.fixture
def bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    """The PostgreSQL store of tests/processes/recovery_support.py."""
    yield from make_bed(SimpleNamespace(param="postgres", getfixturevalue=request.getfixturevalue),
                        tmp_path)


@pytest.fixture
def proxy(pg_dsn: str) -> Iterator[FreezableProxy]:
    parts = urllib.parse.urlsplit(pg_dsn)
    started = FreezableProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    yield started
    started.close()


def _through(dsn: str, port: int) -> str:
    parts = urllib.parse.urlsplit(dsn)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


STOP_TIMEOUT = 2.0
BOUND = STOP_TIMEOUT + 13.0
"""``stop_timeout_seconds`` + 2 s (the stop's margin, ``STOP_MARGIN_SECONDS``) + about 3 s
(shutdown: the last jobs, the liveness signal) + at most about 6 s (the worker's
``PostgresUpdateStore.close()`` with a silent server) + 2 s for a loaded machine. Measured:
10.5 s with ``stop_timeout_seconds=2``; without the bounds the bot never exits while frozen."""


def test_sigterm_while_postgres_does_not_answer_exits_in_bounded_time(
    bots: Bots, bed: Bed, proxy: FreezableProxy
) -> None:
    options = ("--lease", "4", "--sweep", "0.5", "--grace", "0.5", "--max-concurrent", "2",
               "--slow", "slow", "--slow-seconds", "1.5", "--fail-once", "slow",
               "--stop-timeout", str(STOP_TIMEOUT))
    with FakeBotApi() as fake:
        # two slow handlers running (max_concurrent=2) and the rest claimed, waiting; the slow
        # ones fail after their sleep, so their settle waits for the silent store
        ids = [fake.inject_message(chat_id=1 + i, text="slow" if i < 2 else f"m{i}") for i in range(8)]
        first = bots.spawn(fake, _through(bed.url, proxy.port), bed.table, bed.domain,
                           "--run-polling", *options)
        bots.wait_ready(first)
        wait_sync("the slow handlers running",
                  lambda: all(first.pid in bots.started(u) for u in ids[:2]), 20)
        proxy.freeze()
        time.sleep(0.5)  # the store calls made now (renewals, sweeps, takeovers) hang
        took = _stop(bots, first, signal.SIGTERM, BOUND)
        assert took < BOUND, took
        proxy.thaw()
        second = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *options)
        bots.wait_ready(second)
        # the first process's claims: after their 4 s lease at the latest
        _all_handled(bots, bed, ids, 30, "every update handled after the thaw")
        # its store answers, so it stops in about a second (its poll ends, close() finds nothing
        # running); BOUND, the bound for a silent store, holds for any store, plus 5 s of load
        _stop(bots, second, signal.SIGTERM, BOUND + 5)
    _exactly_once(bed, ids)


def test_sigterm_while_postgres_does_not_answer_and_updates_arrive_exits_in_bounded_time(
    bots: Bots, bed: Bed, proxy: FreezableProxy
) -> None:
    """The partition begins, then new updates arrive: recording them waits for the silent
    server (the process holds them, unconfirmed) when SIGTERM comes. The stop is bounded all
    the same; Telegram (the fake) still has the unrecorded updates, so the next process gets
    them after the thaw."""
    options = ("--lease", "4", "--sweep", "0.5", "--grace", "0.5", "--max-concurrent", "2",
               "--slow", "slow", "--slow-seconds", "1.5", "--stop-timeout", str(STOP_TIMEOUT))
    with FakeBotApi() as fake:
        ids = [fake.inject_message(chat_id=1 + i, text="slow" if i < 2 else f"m{i}") for i in range(4)]
        first = bots.spawn(fake, _through(bed.url, proxy.port), bed.table, bed.domain,
                           "--run-polling", *options)
        bots.wait_ready(first)
        wait_sync("the slow handlers running",
                  lambda: all(first.pid in bots.started(u) for u in ids[:2]), 20)
        proxy.freeze()
        late = [fake.inject_message(chat_id=10 + i, text=f"late {i}") for i in range(3)]
        # the long poll hands the late updates over at once; recording them then waits for
        # the silent server
        time.sleep(2.0)
        took = _stop(bots, first, signal.SIGTERM, BOUND)
        assert took < BOUND, took
        assert not fake.confirmed_update_ids & set(late), "confirmed but never recorded"
        proxy.thaw()
        second = bots.spawn(fake, bed.url, bed.table, bed.domain, "--run-polling", *options)
        bots.wait_ready(second)
        _all_handled(bots, bed, ids + late, 30, "every update handled after the thaw")
        _stop(bots, second, signal.SIGTERM, BOUND + 5)
        print(f"SIGTERM to exit with a recording waiting for the silent server: {took:.2f} s")
    _exactly_once(bed, ids + late)
