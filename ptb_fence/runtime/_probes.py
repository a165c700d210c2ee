"""ProbeServer: this process's probes over HTTP (``probe_port=``), on the standard library only.

``/healthz`` answers 200 while the process's loops tick (the lease keeper and the sweep ran
recently), 503 otherwise: a liveness probe, which a store outage does not fail (restarting every
pod would not bring the database back). ``/readyz`` answers 200 while the store answers, 503
during an outage: a readiness probe. ``/metrics`` is the process's metrics in Prometheus's text
format (with the ``[metrics]`` extra, else 404 naming it). Each probe reads what the
runtime already counted: no store call per request.

The server runs on a daemon thread from the front end's start to its stop.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional, Tuple

from ptb_fence._events import event
from ptb_fence.runtime._alarms import Health

__all__ = ["METRICS_EXTRA", "ProbeServer"]

_LOGGER = logging.getLogger("ptb_fence.probes")

METRICS_EXTRA = (
    "/metrics needs prometheus_client: pip install 'ptb_fence[metrics]'\n"
)
"""The body of ``/metrics`` when ``prometheus_client`` is not installed."""


class _Server(ThreadingHTTPServer):
    """The HTTP server, with the probes it answers for."""

    daemon_threads = True  # a hung scraper never holds the process's exit
    probes: "ProbeServer"


class _Handler(BaseHTTPRequestHandler):
    """One request to the probe server."""

    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        path = self.path.split("?", 1)[0]
        probes = self.server.probes
        if path == "/healthz":
            self._health(probes.liveness())
        elif path == "/readyz":
            self._health(probes.readiness())
        elif path == "/metrics":
            self._metrics(probes)
        else:
            self._send(404, "text/plain; charset=utf-8",
                       b"not found: the probes are /healthz, /readyz and /metrics\n")

    def do_HEAD(self) -> None:  # noqa: N802 - the name http.server calls
        self.do_GET()

    def _health(self, health: Health) -> None:
        body = json.dumps({"healthy": health.healthy, "problems": list(health.problems)})
        self._send(200 if health else 503, "application/json", body.encode("utf-8") + b"\n")

    def _metrics(self, probes: "ProbeServer") -> None:
        try:
            content_type, body = probes.metrics()
        except ImportError:
            self._send(404, "text/plain; charset=utf-8", METRICS_EXTRA.encode("utf-8"))
            return
        self._send(200, content_type, body)

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        # probes come every few seconds: DEBUG, never stderr
        _LOGGER.debug("probe %s: " + format, self.client_address[0], *args)


class ProbeServer:
    """The probe server of one front end (started and stopped with it).

    Args:
        host: The address to listen on.
        port: The port (``0`` for a free one, :obj:`None` for no server).
        liveness: Whether the loops tick now.
        readiness: Whether the store answers now.
        stats: A :class:`~ptb_fence.Stats` snapshot now (for ``/metrics``).
    """

    __slots__ = ("_host", "_liveness", "_lock", "_port", "_readiness", "_registry", "_server",
                 "_stats", "_thread")

    def __init__(
        self,
        host: str,
        port: Optional[int],
        liveness: Callable[[], Health],
        readiness: Callable[[], Health],
        stats: Callable[[], Any],
    ) -> None:
        self._host = host
        self._port = port
        self._liveness = liveness
        self._readiness = readiness
        self._stats = stats
        self._lock = threading.Lock()
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._registry: Any = None

    @property
    def address(self) -> Optional[Tuple[str, int]]:
        """``(host, port)`` the server listens on now (:obj:`None`: not serving)."""
        server = self._server
        if server is None:
            return None
        host, port = server.server_address[:2]
        return str(host), int(port)

    def liveness(self) -> Health:
        """What ``/healthz`` answers."""
        return self._liveness()

    def readiness(self) -> Health:
        """What ``/readyz`` answers."""
        return self._readiness()

    def metrics(self) -> Tuple[str, bytes]:
        """What ``/metrics`` answers: its content type and body.

        Raises:
            ImportError: ``prometheus_client`` is not installed.
        """
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from ptb_fence.metrics import register

        with self._lock:
            if self._registry is None:  # a registry of its own: never the global one's names
                registry = CollectorRegistry()
                register(self._stats, registry)
                self._registry = registry
            registry = self._registry
        return str(CONTENT_TYPE_LATEST), bytes(generate_latest(registry))

    def start(self) -> None:
        """Listen and serve on a daemon thread, if there is a port. Idempotent.

        Raises:
            OSError: The address cannot be listened on (the message names ``probe_port``).
        """
        if self._port is None:
            return
        with self._lock:
            if self._server is not None:
                return
            try:
                server = _Server((self._host, self._port), _Handler)
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"the probe server cannot listen on {self._host}:{self._port} ({exc}): "
                    "give another probe_port (0: any free port) or probe_host, or "
                    "probe_port=None for none",
                ) from exc
            server.probes = self
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.2},
                name="ptb_fence-probes",
                daemon=True,
            )
            self._server, self._thread = server, thread
        thread.start()
        host, port = server.server_address[:2]
        _LOGGER.info("probes on http://%s:%d (/healthz, /readyz, /metrics)", host, port,
                     extra=event("probes_started"))

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        with self._lock:
            server, self._server = self._server, None
            thread, self._thread = self._thread, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(5.0)
