"""Operators' metrics, scraped over HTTP from real bot processes of both front ends.

A bot process (tests/processes/ptb_bot_worker.py: PTB ``Application``; intake_worker.py:
``UpdateIntake``) serves ``ptb_fence.metrics`` with ``prometheus_client.start_http_server``, as a
user would. It handles a run with a failure that is retried, a failure that exhausts and a
handler that never ends; it is SIGKILLed and a second process takes the hung
update over. The counters and gauges read from the Prometheus text are the figures of what
happened (SQLite file and PostgreSQL table).
"""

from __future__ import annotations

import signal
import socket
import time
import urllib.request
from typing import Dict, Tuple

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ptb_fence.testing import FakeBotApi
from ptb_support import wait_sync
from recovery_support import STOP_TIMEOUT, Bed, _all_handled, _stop, bed, bots  # noqa: F401
from test_ptb_processes import Bots

Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> Samples:
    """Every sample of the bot's metrics endpoint, by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _scrape_when(port: int, what: str, check: "object", timeout: float = 30) -> Samples:
    got: Dict[str, Samples] = {}

    def ready() -> bool:
        try:
            got["s"] = scrape(port)
        except OSError:
            return False
        return bool(check(got["s"]))  # type: ignore[operator]

    wait_sync(what, ready, timeout)
    return got["s"]


@pytest.mark.timeout(150)
def test_counters_move_through_failures_an_exhaustion_and_a_takeover(bots: Bots, bed: Bed) -> None:
    first_port, second_port = _free_port(), _free_port()
    options = ("--lease", "120", "--sweep", "30", "--grace", "60", "--retry", "0.1",
               "--max-attempts", "2", "--exhaustions", "--fail-once", "flaky",
               "--fail-always", "doomed")
    with FakeBotApi() as fake:
        fine = [fake.inject_message(chat_id=1 + i % 3, text=f"m{i}") for i in range(6)]
        flaky = fake.inject_message(chat_id=7, text="flaky")
        doomed = fake.inject_message(chat_id=8, text="doomed")
        hang = fake.inject_message(chat_id=9, text="hang")
        first = bots.spawn(fake, bed.url, bed.table, bed.domain, "--poll", *options,
                           "--hang", "hang", "--metrics-port", str(first_port))
        bots.wait_ready(first)

        def settled(samples: Samples) -> bool:
            ended = "ptb_fence_attempts_ended_total"
            return (
                value(samples, ended, outcome="completed") >= 7
                and value(samples, ended, outcome="exhausted") >= 1
                and value(samples, "ptb_fence_attempts_running") >= 1
                # a grouped completion counts its attempt ended before its commit returns
                # and the claim is let go: a scrape in between sees it still held
                and value(samples, "ptb_fence_claims_held") <= 1
            )

        samples = _scrape_when(first_port, "the first bot's run to settle", settled)
        ended = "ptb_fence_attempts_ended_total"
        assert value(samples, "ptb_fence_updates_recorded_total") == 9
        assert value(samples, ended, outcome="completed") == 7  # 6 fine + flaky's retry
        assert value(samples, ended, outcome="failed") == 2  # flaky once, doomed once
        assert value(samples, ended, outcome="exhausted") == 1  # doomed's 2nd (last) attempt
        assert value(samples, ended, outcome="lost") == 0
        # every attempt started ended, but the hung one, which still runs and is renewed
        assert value(samples, "ptb_fence_attempts_started_total") == 11
        assert value(samples, "ptb_fence_attempts_running") == 1
        assert value(samples, "ptb_fence_claims_held") == 1
        assert value(samples, "ptb_fence_handler_duration_seconds_count") == 10
        assert value(samples, "ptb_fence_store_call_duration_seconds_count",
                     operation="claim") >= 1
        assert value(samples, "ptb_fence_store_call_duration_seconds_count",
                     operation="record") >= 1
        assert value(samples, "ptb_fence_store_errors_total", step="claim") == 0

        bots.kill(first)
        second = bots.spawn(fake, bed.url, bed.table, bed.domain, "--poll", *options,
                            "--metrics-port", str(second_port))
        _all_handled(bots, bed, fine + [flaky, hang], 60, "the second bot takes the hung update over")
        samples = _scrape_when(
            second_port, "the second bot's takeover to show",
            lambda s: value(s, "ptb_fence_attempts_ended_total", outcome="completed") >= 1,
        )
        # it recorded nothing itself: it took over the dead process's claim
        assert value(samples, "ptb_fence_updates_recorded_total") == 0
        assert value(samples, "ptb_fence_attempts_started_total") == 1
        assert value(samples, ended, outcome="completed") == 1
        assert value(samples, "ptb_fence_attempts_running") == 0
        assert value(samples, "ptb_fence_claims_held") == 0
        assert value(samples, "ptb_fence_store_call_duration_seconds_count",
                     operation="liveness") >= 1
        _stop(bots, second, signal.SIGTERM, STOP_TIMEOUT + 5)
    assert bed.states()[doomed] == "abandoned"
