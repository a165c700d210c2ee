"""The benchmark's fast fake Bot API server (benchmarks/_fast_server.py), driven by a real PTB Bot.

It runs as the polling rows run it: a process of its own, started with the updates to serve,
that prints its address and serves until its stdin closes.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse
from typing import Any, Dict, Iterator

import pytest
from telegram import Bot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.path.join(ROOT, "benchmarks", "_fast_server.py")


@pytest.fixture
def server() -> Iterator[Dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, SERVER, json.dumps({"count": 250, "chats": 7})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["pid"] == proc.pid
        yield info
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""


def test_pages_to_a_real_bot(server: Dict[str, Any]) -> None:
    async def main() -> None:
        async with Bot(server["token"], base_url=server["base_url"]) as bot:
            assert (await bot.get_me()).is_bot
            assert await bot.delete_webhook() is True
            first = await bot.get_updates(offset=0, timeout=1)
            assert [u.update_id for u in first] == list(range(1, 101))
            assert {u.effective_chat.id for u in first} == set(range(1, 8))  # type: ignore[union-attr]
            second = await bot.get_updates(offset=101, timeout=1)
            third = await bot.get_updates(offset=201, timeout=1)
            assert [u.update_id for u in second + third] == list(range(101, 251))
            assert [u.update_id for u in await bot.get_updates(offset=150)] == list(range(150, 250))
            started = time.monotonic()
            assert await bot.get_updates(offset=251, timeout=1) == ()  # a long poll, then []
            assert time.monotonic() - started >= 0.9
            assert await bot.get_updates(offset=251, timeout=0) == ()
            message = await bot.send_message(chat_id=5, text="hi")
            assert message.message_id >= 1

    asyncio.run(main())


def test_keep_alive_on_one_connection(server: Dict[str, Any]) -> None:
    url = urllib.parse.urlsplit(server["base_url"])
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
    try:
        path = f"{url.path}{server['token']}/getUpdates"
        bodies = []
        for offset in (1, 101):
            conn.request("POST", path, body=f"offset={offset}&timeout=1&limit=100",
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
            response = conn.getresponse()
            assert response.status == 200
            bodies.append(json.loads(response.read()))
        sock = conn.sock
        conn.request("POST", f"{url.path}{server['token']}/getMe", body=b"")
        assert json.loads(conn.getresponse().read())["ok"] is True
        assert conn.sock is sock  # the same connection throughout
    finally:
        conn.close()
    assert [u["update_id"] for b in bodies for u in b["result"]] == list(range(1, 201))
