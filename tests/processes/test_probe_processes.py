"""The probe server (``probe_port=``) of real bot processes, PTB ``Application`` or
``UpdateIntake`` (tests/processes/ptb_bot_worker.py, intake_worker.py), on PostgreSQL behind a TCP
proxy (tests/support/tcp_proxy.py): ``/healthz``, ``/readyz`` and ``/metrics`` while it runs,
and through a real outage of its store, ``/readyz`` 503 while ``/healthz`` stays 200 (a store
outage must not restart every pod), both 200 again once the store answers. Two processes sharing a store: their store-wide gauges
aggregate with ``max()`` to the store's figure, their counters with ``sum()`` to the store's.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, List, Tuple

import psycopg2.extensions
import pytest

from prometheus_client.parser import text_string_to_metric_families

from ptb_fence.testing import FakeBotApi, make_message_update
from ptb_support import wait_sync
from recovery_support import INTAKE_WORKER, Bed, Bots, bots, make_bed  # noqa: F401 - a fixture
from tcp_proxy import TcpProxy
from worker_support import make_store


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


def scrape(port: int) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    status, text = probe(port, "/metrics")
    assert status == 200, text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.timeout(120)
def test_two_processes_metrics_add_up_to_the_stores_figures(bed: Bed, tmp_path: Any) -> None:
    """Two ``UpdateIntake`` processes share a PostgreSQL table holding 6 updates whose every
    attempt fails (retried in 10 minutes): each process exports the store's 6 unsettled updates
    (``scope="store"``), so ``max()`` over the processes is 6 where ``sum()`` says 12, and the
    processes' attempts summed are the attempts the store counted."""
    directory = tmp_path / "bots"
    directory.mkdir()
    procs = Bots(str(directory), INTAKE_WORKER)
    store = make_store(bed.url, bed.table)
    now = int(time.time() * 1000)
    try:
        store.add_many([(u, json.dumps(make_message_update(u, u, "doomed", message_id=u)), now)
                        for u in range(1, 7)])
    finally:
        store.close()
    ports = [free_port(), free_port()]
    try:
        with FakeBotApi() as fake:
            started = [procs.spawn(fake, bed.url, bed.table, bed.domain, "--sweep", "0.2",
                                   "--grace", "0.01", "--retry", "600", "--fail-always",
                                   "doomed", "--probe-port", str(port)) for port in ports]
            procs.wait_ready(*started, timeout=60)
            attempts = lambda: bed.query(  # noqa: E731
                f"SELECT COALESCE(SUM(attempts), 0) FROM {bed.table} WHERE state = 'failed'")
            wait_sync("every update failed once", lambda: attempts()[0][0] == 6, 30)
            unsettled = ("ptb_fence_unsettled_updates", (("scope", "store"),))
            # each sweep reads the store's figures at most every 10 s
            wait_sync("both processes read the store's figures after the failures",
                      lambda: all(scrape(port).get(unsettled) == 6 for port in ports), 30)
            samples = [scrape(port) for port in ports]
    finally:
        procs.stop_all()
    assert [s[unsettled] for s in samples] == [6, 6]
    assert max(s[unsettled] for s in samples) == 6  # what the rules and the dashboard use
    assert sum(s[unsettled] for s in samples) == 12  # why they never sum() it
    started_total = sum(s[("ptb_fence_attempts_started_total", ())] for s in samples)
    failed_total = sum(s[("ptb_fence_attempts_ended_total", (("outcome", "failed"),))]
                       for s in samples)
    assert started_total == failed_total == 6
