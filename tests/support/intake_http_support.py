"""Helpers of test_hostile_input.py and test_intake_concurrency.py: real HTTP servers in threads.

- :class:`ThreadedWsgi`: a threaded wsgiref server (``ThreadingMixIn``) in front of a WSGI app.
- :class:`PtbWebhookThread`: a real PTB Application (``FencedUpdateProcessor`` over SQLite,
  wired with ``processor.install``) serving PTB's own webhook (``app.updater.start_webhook``)
  on its own event loop in a background thread, so synchronous test code (and hypothesis) can
  POST to it. Its handler writes one fenced domain row per attempt in the attempt's
  transaction (``run_in_transaction(..., complete=True)``).
- :func:`http_post`: one POST with raw bytes and raw headers (http.client), returning status
  and body.

Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import sqlite3
import threading
from collections import Counter
from socketserver import ThreadingMixIn
from typing import Any, Dict, Mapping, Optional, Tuple, Union
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from telegram import Update
from telegram.ext import TypeHandler

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import DOMAIN_DDL, FAST, build

HeaderValue = Union[str, bytes]


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_post(
    port: int,
    path: str,
    body: Optional[bytes],
    headers: Mapping[str, HeaderValue],
    *,
    timeout: float = 15.0,
) -> Tuple[int, bytes]:
    """POST ``body`` with exactly ``headers`` (http.client adds Content-Length for bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest("POST", path, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if body is not None and not any(k.lower() == "content-length" for k in headers):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 128  # 40 simultaneous connects must not overflow the listen backlog


class ThreadedWsgi:
    """A threaded wsgiref server on 127.0.0.1 (free port), one thread per request."""

    def __init__(self, app: Any) -> None:
        self.httpd = make_server(
            "127.0.0.1", 0, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
        )
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    def __enter__(self) -> "ThreadedWsgi":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class PtbWebhookThread:
    """PTB's own webhook server over a durable SQLite store, in a background event loop.

    Attributes:
        handled: ``Counter`` of update ids whose handler committed its domain row.
        port, url: Where PTB listens (``/hook``).
    """

    def __init__(self, path: str, fake: FakeBotApi, secret: str, **options: Any) -> None:
        self.path = path
        self.fake = fake
        self.secret = secret
        self.options = {**FAST, **options}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.handled: "Counter[int]" = Counter()
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._error: Optional[BaseException] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stop: Optional[asyncio.Event] = None
        self._thread = threading.Thread(target=self._run, name="ptb-webhook", daemon=True)
        conn = sqlite3.connect(path, timeout=10)
        try:
            conn.execute(DOMAIN_DDL)
            conn.commit()
        finally:
            conn.close()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by start()/stop()
            self._error = exc
        finally:
            self._ready.set()

    async def _handle(self, update: Update, context: Any) -> None:
        attempt = context.attempt
        uid = update.update_id

        def write(conn: Any) -> None:
            conn.execute(
                "INSERT INTO domain (update_id, attempt, claim_id) VALUES (?, ?, ?)",
                (uid, attempt.attempt, attempt.claim_id),
            )

        await attempt.run_in_transaction(write, complete=True)
        with self._lock:
            self.handled[uid] += 1

    async def _main(self) -> None:
        store = SQLiteUpdateStore(self.path)
        try:
            processor = FencedUpdateProcessor(store, **self.options)
            app = build(processor, self.fake)
            app.add_handler(TypeHandler(Update, self._handle))
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with app:
                await app.start()
                assert app.updater is not None
                await app.updater.start_webhook(
                    listen="127.0.0.1",
                    port=self.port,
                    url_path="hook",
                    secret_token=self.secret,
                    webhook_url=self.url,
                )
                self._ready.set()
                try:
                    await asyncio.wait_for(self._stop.wait(), 300)
                finally:
                    await app.updater.stop()
                    await app.stop()
        finally:
            store.close()

    def start(self) -> "PtbWebhookThread":
        self._thread.start()
        if not self._ready.wait(30):
            raise AssertionError("PTB webhook did not start within 30 s")
        if self._error is not None:
            raise AssertionError(f"PTB webhook failed to start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # the loop already ended
                pass
        self._thread.join(30)
        assert not self._thread.is_alive(), "PTB webhook thread did not stop within 30 s"
        if self._error is not None:
            raise AssertionError(f"PTB webhook thread failed: {self._error!r}")

    def post(self, body: bytes, headers: Optional[Dict[str, HeaderValue]] = None) -> Tuple[int, bytes]:
        """POST as Telegram does (JSON content type, the right secret) unless ``headers``."""
        if headers is None:
            headers = {
                "Content-Type": "application/json",
                "X-Telegram-Bot-Api-Secret-Token": self.secret,
            }
        return http_post(self.port, "/hook", body, headers)

    def handled_snapshot(self) -> "Counter[int]":
        with self._lock:
            return Counter(self.handled)

    def __enter__(self) -> "PtbWebhookThread":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def table_rows(path: str, table: str = "telegram_updates") -> Dict[Any, Tuple[str, Any]]:
    """Every row of the SQLite table: ``{update_id: (state, body)}`` (a fresh connection)."""
    conn = sqlite3.connect(path, timeout=10)
    try:
        return {
            r[0]: (r[1], r[2])
            for r in conn.execute(f"SELECT update_id, state, body FROM {table}")  # noqa: S608
        }
    finally:
        conn.close()


def domain_counts(path: str) -> "Counter[int]":
    """How many fenced domain rows each update id has (SQLite ``domain`` table)."""
    conn = sqlite3.connect(path, timeout=10)
    try:
        return Counter(r[0] for r in conn.execute("SELECT update_id FROM domain"))
    finally:
        conn.close()


__all__ = [
    "PtbWebhookThread",
    "ThreadedWsgi",
    "domain_counts",
    "free_port",
    "http_post",
    "table_rows",
]
