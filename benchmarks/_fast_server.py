"""A fast fake Bot API server for the benchmark's polling rows (standard library only).

:class:`ptb_fence.testing.FakeBotApi` is a faithful test double: it parses every request,
records every call, deep-copies and JSON-encodes each ``getUpdates`` answer on a thread per
connection. That is what tests need, and it is slower than PTB's polling: plain PTB polled it at
about 1,650 updates/s, so a polling row that used it measured the fake server, not the bot.

This server does only what the polling rows need, as cheaply as possible, in a process of its
own (its CPU is not the bot's):

- every ``getUpdates`` page (100 updates, the answer to ``offset=first id of the page``) is a
  complete HTTP response whose bytes are built before the server says it is ready, so
  answering a page is one ``transport.write``;
- HTTP/1.1 keep-alive on one event loop (``asyncio.Protocol``); a request is parsed only as far
  as needed: the method from the request line, ``Content-Length``, and ``offset`` / ``timeout``
  from a ``getUpdates`` form body (PTB sends ``application/x-www-form-urlencoded``);
- once every update was handed out, ``getUpdates`` is a long poll: it answers ``[]`` after its
  ``timeout`` (as Telegram does), so an idle bot does not spin;
- ``getMe``, ``deleteWebhook``, ``sendMessage`` and every other method get a fixed answer built
  in advance (``sendMessage``: one fixed ``Message``; unknown methods: ``true``).

Run it as ``python benchmarks/_fast_server.py '{"count": N, "chats": C}'`` (``"first_id": F``:
update ids from F, default 1): it prints one JSON
line ``{"token": ..., "base_url": ..., "pid": ...}`` once listening, and serves until its stdin
is closed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _path in (HERE, ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)

TOKEN = "424242:FAST-bench-token"
PAGE = 100
"""Updates per ``getUpdates`` answer (the Bot API's maximum ``limit``)."""

_OFFSET_RE = re.compile(rb"(?:^|&)offset=(-?\d+)")
_TIMEOUT_RE = re.compile(rb"(?:^|&)timeout=(\d+(?:\.\d+)?)")
_MAX_HEAD = 64 * 1024


def http_response(body: bytes, status: bytes = b"200 OK") -> bytes:
    """A complete HTTP/1.1 keep-alive response carrying the JSON ``body``."""
    return (
        b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode("ascii") + b"\r\n\r\n" + body
    )


def _ok(result: Any) -> bytes:
    return http_response(json.dumps({"ok": True, "result": result}, separators=(",", ":")).encode())


class Pages:
    """The pre-serialised answers: one HTTP response per ``getUpdates`` page, and the rest."""

    __slots__ = ("by_offset", "first_id", "last_id", "empty", "fixed", "default", "updates", "_ids")

    def __init__(self, updates: Sequence[Dict[str, Any]]) -> None:
        from ptb_fence.testing import make_bot_user, make_message

        ids = [int(u["update_id"]) for u in updates]
        if ids != sorted(ids) or len(set(ids)) != len(ids):
            raise ValueError("updates must have increasing, distinct update_ids")
        self.updates: List[bytes] = [json.dumps(u, separators=(",", ":")).encode() for u in updates]
        self.first_id = ids[0] if ids else 1
        self.last_id = ids[-1] if ids else 0
        self.by_offset: Dict[int, bytes] = {}
        for start in range(0, len(updates), PAGE):
            body = (
                b'{"ok":true,"result":[' + b",".join(self.updates[start : start + PAGE]) + b"]}"
            )
            self.by_offset[ids[start]] = http_response(body)
        self.empty = _ok([])
        bot_id = int(TOKEN.split(":", 1)[0])
        self.fixed: Dict[bytes, bytes] = {
            b"getMe": _ok(make_bot_user(bot_id, get_me=True)),
            b"sendMessage": _ok(
                make_message(message_id=1, chat_id=1, text="ok", sender=make_bot_user(bot_id))
            ),
            b"getWebhookInfo": _ok({"url": "", "has_custom_certificate": False, "pending_update_count": 0}),
        }
        self.default = _ok(True)  # deleteWebhook, setMyCommands, close, logOut, ...
        self._ids = ids

    def answer(self, offset: int) -> Optional[bytes]:
        """The response to ``getUpdates(offset=offset)``; None when nothing is left."""
        if offset <= 0:
            offset = self.first_id  # no confirmation yet: everything is pending
        page = self.by_offset.get(offset)
        if page is not None:
            return page
        if offset > self.last_id:
            return None
        # not page-aligned (never on PTB's path): built on the fly
        import bisect

        start = bisect.bisect_left(self._ids, offset)
        body = b'{"ok":true,"result":[' + b",".join(self.updates[start : start + PAGE]) + b"]}"
        return http_response(body)


class _Protocol(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, pages: Pages, stats: Dict[str, int]) -> None:
        self.pages = pages
        self.stats = stats
        self.buffer = b""
        self.transport: Optional[asyncio.Transport] = None
        self.waiting: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        if self.waiting is not None:
            self.waiting.cancel()
            self.waiting = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > _MAX_HEAD:
                    self.transport.close()
                return
            head = self.buffer[:end]
            length = 0
            lowered = head.lower()
            at = lowered.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = lowered.find(b"\r\n", at + 2)
                length = int(lowered[at + 17 : stop if stop >= 0 else len(lowered)])
            total = end + 4 + length
            if len(self.buffer) < total:
                return
            body = self.buffer[end + 4 : total]
            self.buffer = self.buffer[total:]
            line_end = head.find(b"\r\n")
            request_line = head if line_end < 0 else head[:line_end]
            parts = request_line.split(b" ")
            path = parts[1] if len(parts) > 1 else b"/"
            method = path.split(b"?", 1)[0].rsplit(b"/", 1)[-1]
            self.respond(method, body)

    def respond(self, method: bytes, body: bytes) -> None:
        assert self.transport is not None
        stats = self.stats
        stats["requests"] += 1
        if method != b"getUpdates":
            self.transport.write(self.pages.fixed.get(method, self.pages.default))
            return
        stats["getUpdates"] += 1
        match = _OFFSET_RE.search(body)
        offset = int(match.group(1)) if match else 0
        answer = self.pages.answer(offset)
        if answer is not None:
            stats["pages"] += 1
            self.transport.write(answer)
            return
        match = _TIMEOUT_RE.search(body)
        timeout = min(float(match.group(1)), 50.0) if match else 0.0
        if timeout <= 0:
            self.transport.write(self.pages.empty)
            return
        loop = asyncio.get_running_loop()
        self.waiting = loop.call_later(timeout, self._empty)

    def _empty(self) -> None:
        self.waiting = None
        if self.transport is not None:
            self.transport.write(self.pages.empty)


async def _serve(
    pages: Pages, ready: "Any", stop: "asyncio.Future[None]", stats: Dict[str, int]
) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Protocol(pages, stats), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    ready(port)
    try:
        await stop
    finally:
        server.close()


def base_url(port: int) -> str:
    """The ``base_url`` to give PTB's ``ApplicationBuilder`` for a server on ``port``."""
    return f"http://127.0.0.1:{port}/bot"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Serve ``count`` pre-serialised updates (``update_dicts``) until stdin closes."""
    from _common import update_dicts

    args = list(sys.argv[1:] if argv is None else argv)
    cfg = json.loads(args[0]) if args else {}
    updates = update_dicts(
        int(cfg.get("count", 0)), int(cfg.get("first_id", 1)), chats=int(cfg.get("chats", 200))
    )
    pages = Pages(updates)  # every byte of every answer is built before "ready"
    del updates
    stats = {"requests": 0, "getUpdates": 0, "pages": 0}

    async def run() -> None:
        loop = asyncio.get_running_loop()
        stop: "asyncio.Future[None]" = loop.create_future()

        def ready(port: int) -> None:
            sys.stdout.write(
                json.dumps({"token": TOKEN, "base_url": base_url(port), "pid": os.getpid()}) + "\n"
            )
            sys.stdout.flush()

        def stdin_closed() -> None:
            if not stop.done():
                stop.set_result(None)

        def watch_stdin() -> None:
            sys.stdin.read()
            loop.call_soon_threadsafe(stdin_closed)

        threading.Thread(target=watch_stdin, daemon=True).start()
        await _serve(pages, ready, stop, stats)

    asyncio.run(run())
    sys.stderr.write(json.dumps(stats) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
