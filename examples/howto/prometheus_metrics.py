"""Expose a processor's figures to Prometheus (needs the [metrics] extra)."""

from prometheus_client import start_http_server

from ptb_fence.metrics import register
from ptb_fence.ptb import FencedUpdateProcessor


def expose(processor: FencedUpdateProcessor, port: int) -> None:
    """Serve ``/metrics`` on ``port`` for this processor."""
    register(processor, labels={"bot": "shop"})  # one label per bot, for the shipped alerts
    start_http_server(port)  # or mount prometheus_client's WSGI/ASGI app in your server
