"""The probe server (``probe_port=``/``probe_host=``) of a real ``UpdateIntake`` and a real PTB
``Application`` with its processor: ``/healthz``, ``/readyz`` and ``/metrics`` over HTTP from
start to stop, the options' validation, a port in use, ``/metrics`` without
``prometheus_client``, and a PTB handler that blocks the event loop (the sweep stops: ``/healthz``
503, ``/readyz`` still 200). A store outage under a real process is in
tests/processes/test_probe_processes.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, List, Optional, Tuple

import pytest
from prometheus_client.parser import text_string_to_metric_families
from telegram.ext import MessageHandler, filters

import ptb_fence
from ptb_fence import MemoryUpdateStore, RuntimeOptions, SQLiteUpdateStore, UpdateIntake
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import build, polling, run, wait_for, wait_sync
from runtime_support import body


def probe(port: int, path: str, method: str = "GET") -> Tuple[int, str]:
    """``(status, body)`` of a request to the probe server (0: nothing listens)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8")
    except (ConnectionError, urllib.error.URLError):
        return 0, ""


def port_of(intake: UpdateIntake) -> int:
    address = intake.runtime.probes.address
    assert address is not None
    return address[1]


def test_the_options_are_off_by_default_and_validated() -> None:
    options = RuntimeOptions()
    assert (options.probe_port, options.probe_host) == (None, "127.0.0.1")
    assert RuntimeOptions(probe_port=0, probe_host="0.0.0.0").probe_port == 0
    for bad in (-1, 65536, "8080", True, 80.5):
        with pytest.raises(ValueError, match="probe_port must be a TCP port"):
            RuntimeOptions(probe_port=bad)  # type: ignore[arg-type]
    for bad_host in ("", None, 127):
        with pytest.raises(TypeError, match="probe_host must be a host name"):
            RuntimeOptions(probe_host=bad_host)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="probe_port"):
        UpdateIntake(MemoryUpdateStore(), handle=lambda u: None, probe_port=-5)


def test_an_intake_serves_its_probes_from_start_to_close(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    handled: List[int] = []
    intake = UpdateIntake(store, handle=lambda update: handled.append(update["update_id"]),
                          probe_port=0, sweep_every_seconds=0.2, lease_seconds=2)
    try:
        assert intake.runtime.probes.address is None  # nothing before start()
        intake.start()
        port = port_of(intake)
        assert intake.accept(body(1)) == "accepted"
        wait_sync("update 1 handled", lambda: handled == [1])
        wait_sync("a lease tick", lambda: intake.stats().last_renewal_tick_at is not None)
        status, text = probe(port, "/healthz")
        assert (status, json.loads(text)) == (200, {"healthy": True, "problems": []})
        assert probe(port, "/readyz")[0] == 200
        assert probe(port, "/healthz", "HEAD") == (200, "")
        status, text = probe(port, "/metrics")
        assert status == 200
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(text) for s in f.samples}
        assert samples[("ptb_fence_updates_recorded_total", ())] == 1
        assert samples[("ptb_fence_store_errors_total", (("step", "renew"),))] == 0
        assert samples[("ptb_fence_build_info", (
            ("python", ".".join(map(str, sys.version_info[:3]))),
            ("python_telegram_bot", __import__("telegram").__version__),
            ("version", ptb_fence.__version__),
        ))] == 1
        assert ("ptb_fence_last_lease_tick_timestamp_seconds", ()) in samples
        status, text = probe(port, "/other")
        assert status == 404 and "/healthz, /readyz and /metrics" in text
    finally:
        intake.close()
        store.close()
    assert intake.runtime.probes.address is None
    assert probe(port, "/healthz")[0] == 0  # the socket is closed with the intake


def test_a_port_in_use_fails_the_start_naming_the_option(tmp_path: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
        intake = UpdateIntake(store, handle=lambda update: None, probe_port=port)
        try:
            with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}.*probe_port"):
                intake.start()
            assert not intake.runtime.jobs.running  # nothing else was started
        finally:
            intake.close()
            store.close()


def test_metrics_without_prometheus_client_is_404_naming_the_extra(tmp_path: Any) -> None:
    """In a process where ``prometheus_client`` cannot be imported (as without the extra)."""
    script = textwrap.dedent(f"""
        import sys, urllib.error, urllib.request
        sys.modules["prometheus_client"] = None  # an import of it raises ImportError
        from ptb_fence import SQLiteUpdateStore, UpdateIntake
        intake = UpdateIntake(SQLiteUpdateStore({str(tmp_path / "bot.db")!r}),
                              handle=lambda update: None, probe_port=0)
        intake.start()
        port = intake.runtime.probes.address[1]
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{{port}}/metrics", timeout=5)
        except urllib.error.HTTPError as error:
            print(error.code, error.read().decode().strip())
        print(urllib.request.urlopen(f"http://127.0.0.1:{{port}}/healthz", timeout=5).status)
        intake.close()
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "404 /metrics needs prometheus_client: pip install 'ptb_fence[metrics]'", "200"]


class Watcher:
    """Probes ``/healthz`` and ``/readyz`` every 0.2 s from a thread of its own (the test's
    event loop may be blocked)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.seen: List[Tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.seen.append((time.monotonic(), probe(self.port, "/healthz")[0],
                              probe(self.port, "/readyz")[0]))
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.timeout(90)
def test_a_ptb_handler_blocking_the_event_loop_fails_healthz_not_readyz(tmp_path: Any) -> None:
    """The sweep of a PTB processor runs on the event loop: a handler that blocks it (a
    ``time.sleep`` in an async handler) stops it, so ``/healthz`` answers 503 once the sweep is
    late (2 × sweep_every_seconds + 10 s) while the store still answers (``/readyz`` 200);
    the probes start with ``initialize()`` and stop with ``shutdown()``."""
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    blocked: List[float] = []
    returned: List[float] = []
    processor = FencedUpdateProcessor(store, probe_port=0, sweep_every_seconds=0.1,
                                      lease_seconds=4, stop_timeout_seconds=1)

    async def handler(update: Any, context: Any) -> None:
        if update.message.text == "block":
            blocked.append(time.monotonic())
            time.sleep(14)  # the event loop does nothing else meanwhile
            returned.append(time.monotonic())

    watcher: Optional[Watcher] = None
    with FakeBotApi() as fake:
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, handler))

        async def scenario() -> int:
            nonlocal watcher
            async with polling(app):
                address = processor.runtime.probes.address
                assert address is not None
                watcher = Watcher(address[1])
                await wait_for("both probes 200",
                               lambda: watcher.seen and watcher.seen[-1][1:] == (200, 200), 10)
                fake.inject_message(chat_id=1, text="block")
                await wait_for("the handler returned", lambda: returned, 30)
                await asyncio.sleep(2.0)  # the sweep runs again: healthy again
            return address[1]

        port = run(scenario(), timeout=80)
    assert watcher is not None
    watcher.stop()
    store.close()
    assert processor.runtime.probes.address is None and probe(port, "/healthz")[0] == 0
    during = [(h, r) for at, h, r in watcher.seen if blocked[0] + 10.5 < at < blocked[0] + 13.5]
    assert during and all(h == 503 and r == 200 for h, r in during), watcher.seen
    before = [(h, r) for at, h, r in watcher.seen if at < blocked[0]]
    assert before and all(pair == (200, 200) for pair in before), watcher.seen
    after = [(h, r) for at, h, r in watcher.seen if returned[0] + 1.0 < at < returned[0] + 2.0]
    assert after and all(pair == (200, 200) for pair in after), watcher.seen


# -- the monitoring how-to's Docker and Kubernetes snippets (docs/howto/monitoring.rst) -----
HOWTO = Path(__file__).resolve().parents[2] / "examples" / "howto"


def howto_file(name: str) -> str:
    return (HOWTO / name).read_text(encoding="utf-8")


def read_yaml(text: str) -> Any:
    """The mappings, lists and scalars of a YAML block in block style: enough for a Kubernetes
    snippet, so the test does not need PyYAML (not a dependency)."""
    lines = [[len(line) - len(line.lstrip()), line.strip()] for line in text.splitlines()
             if line.strip() and not line.strip().startswith("#")]

    def scalar(text: str) -> Any:
        text = text.strip().strip("\"'")
        return int(text) if text.isdigit() else text

    def block(i: int, indent: int) -> Tuple[Any, int]:
        if lines[i][1].startswith("- "):
            items = []
            while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
                lines[i] = [indent + 2, lines[i][1][2:]]  # the item's first line
                item, i = block(i, indent + 2)
                items.append(item)
            return items, i
        mapping = {}
        while i < len(lines) and lines[i][0] == indent and not lines[i][1].startswith("- "):
            key, _, rest = lines[i][1].partition(":")
            i += 1
            if rest.strip():
                mapping[key] = scalar(rest)
            else:
                mapping[key], i = block(i, lines[i][0])
        return mapping, i

    return block(0, lines[0][0])[0]


def test_the_kubernetes_snippet_probes_healthz_and_readyz() -> None:
    snippet = howto_file("kubernetes-probes.yaml")
    manifest = read_yaml(snippet)
    try:
        import yaml
    except ImportError:
        pass
    else:  # the minimal reader reads it as PyYAML does
        assert yaml.safe_load(snippet) == {"containers": manifest["containers"]} == manifest
    (container,) = manifest["containers"]
    (port,) = container["ports"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    for probe_spec in (container["livenessProbe"], container["readinessProbe"]):
        assert probe_spec["timeoutSeconds"] > 1 and probe_spec["failureThreshold"] >= 2
    # the port the processor listens on, from outside the pod
    assert f'probe_port={port["containerPort"]}, probe_host="0.0.0.0"' in howto_file("probes.py")


def test_the_docker_healthcheck_runs_against_a_real_intake(tmp_path: Any) -> None:
    (line,) = [ln.strip() for ln in howto_file("Dockerfile.healthcheck").splitlines()
               if ln.strip().startswith("HEALTHCHECK ")]
    command = line.split(" CMD ", 1)[1]
    assert "http://127.0.0.1:9102/healthz" in command and command.endswith("|| exit 1")
    store = SQLiteUpdateStore(str(tmp_path / "bot.db"))
    intake = UpdateIntake(store, handle=lambda update: None, probe_port=0)
    intake.start()
    port = port_of(intake)
    # the command as Docker runs it (/bin/sh -c), the interpreter being this one
    command = command.replace(":9102/", f":{port}/").replace("python -c", f"{sys.executable} -c", 1)
    try:
        healthy = subprocess.run(["/bin/sh", "-c", command], capture_output=True, timeout=30)
    finally:
        intake.close()
        store.close()
    stopped = subprocess.run(["/bin/sh", "-c", command], capture_output=True, timeout=30)
    assert healthy.returncode == 0, healthy.stderr
    assert stopped.returncode == 1, stopped.stderr
