"""The probe server (``probe_port=``) of a real bot process, PTB ``Application`` or
``UpdateIntake`` (tests/processes/ptb_bot_worker.py, intake_worker.py), on PostgreSQL behind a TCP
proxy (tests/support/tcp_proxy.py): ``/healthz``, ``/readyz`` and ``/metrics`` while it runs,
and through a real outage of its store, ``/readyz`` 503 while ``/healthz`` stays 200 (a store
outage must not restart every pod), both 200 again once the store answers.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Iterator, List, Tuple

import psycopg2.extensions
import pytest

from ptb_fence.testing import FakeBotApi
from ptb_support import wait_sync
from recovery_support import Bed, Bots, bots, make_bed  # noqa: F401 - bots: a fixture
from tcp_proxy import TcpProxy


@pytest.fixture(params=["postgres"])
def bed(request: Any, tmp_path: Any) -> Iterator[Bed]:
    yield from make_bed(request, tmp_path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe(port: int, path: str) -> Tuple[int, str]:
    """``(status, body)`` of ``GET path`` on the probe server (0: nothing listens)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8")
    except (ConnectionError, urllib.error.URLError):
        return 0, ""


@pytest.mark.timeout(120)
def test_probes_of_a_bot_process_through_a_store_outage(bed: Bed, bots: Bots) -> None:
    params = psycopg2.extensions.parse_dsn(bed.url)
    proxy = TcpProxy((params.get("host", "127.0.0.1"), int(params.get("port", 5432)))).start()
    params.update(host="127.0.0.1", port=str(proxy.port))
    dsn = psycopg2.extensions.make_dsn(**params)
    port = free_port()
    try:
        with FakeBotApi() as fake:
            proc = bots.spawn(fake, dsn, bed.table, bed.domain, "--lease", "2", "--sweep", "0.5",
                              "--probe-port", str(port))
            bots.wait_ready(proc, timeout=60)
            wait_sync("the probes ready", lambda: probe(port, "/readyz")[0] == 200, 20)
            status, body = probe(port, "/healthz")
            assert (status, json.loads(body)) == (200, {"healthy": True, "problems": []})
            status, metrics = probe(port, "/metrics")
            assert status == 200
            assert 'ptb_fence_store_errors_total{step="sweep"} 0.0' in metrics
            wait_sync("a lease tick in /metrics", lambda: "ptb_fence_last_lease_tick_timestamp"
                      "_seconds" in probe(port, "/metrics")[1], 10)
            assert probe(port, "/nothing")[0] == 404

            proxy.cut()
            wait_sync("/readyz 503 in the outage", lambda: probe(port, "/readyz")[0] == 503, 10)
            ready_status, ready_body = probe(port, "/readyz")
            seen: List[int] = []
            until = time.monotonic() + 6.0  # three leases: a keeper that stopped would show
            while time.monotonic() < until:
                seen.append(probe(port, "/healthz")[0])
                time.sleep(0.25)
            assert proc.poll() is None, bots.output()
            proxy.restore()
            wait_sync("/readyz 200 after the outage", lambda: probe(port, "/readyz")[0] == 200,
                      10)
            assert probe(port, "/healthz")[0] == 200
            bots.stop_all()
    finally:
        proxy.close()
    assert ready_status == 503 and "the store has not answered" in ready_body, ready_body
    assert set(seen) == {200}, seen
