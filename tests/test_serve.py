"""``python -m ptb_fence.testing serve``: a fake Bot API in its own process for a real bot."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from telegram import Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Serve:
    """The ``serve`` subprocess with its stdout in a file and its stdin a pipe."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.log = tmp_path / f"serve-{time.monotonic_ns()}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ptb_fence.testing", "serve", *args],
                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env,
            )

    @property
    def out(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.out:
            assert self.proc.poll() is None, f"serve exited {self.proc.returncode}:\n{self.out}"
            assert time.monotonic() < deadline, f"no {text!r} within {timeout}s:\n{self.out}"
            time.sleep(0.05)

    def type(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def serves(tmp_path: Path) -> Iterator[List[Serve]]:
    started: List[Serve] = []
    yield started
    for serve in started:
        serve.kill()


async def run_echo_bot(token: str, base_url: str, serve: Serve) -> None:
    async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.effective_message is not None and update.effective_message.text
        await update.effective_message.reply_text("echo: " + update.effective_message.text)

    app = Application.builder().token(token).base_url(base_url).build()
    app.add_handler(MessageHandler(filters.TEXT, echo))
    async with app:
        await app.start()
        assert app.updater is not None
        await app.updater.start_polling(poll_interval=0.0, timeout=1)
        try:
            await asyncio.to_thread(serve.wait_for, "echo: hello from --message")
            serve.type("@42 typed on stdin")
            await asyncio.to_thread(serve.wait_for, "to chat 42: echo: typed on stdin")
        finally:
            await app.updater.stop()
            await app.stop()


def test_serve_injects_messages_and_prints_the_replies(
    tmp_path: Path, serves: List[Serve]
) -> None:
    port = free_port()
    serve = Serve(tmp_path, "--port", str(port), "--message", "hello from --message")
    serves.append(serve)
    serve.wait_for("base URL:")
    lines = dict(line.strip().split(":", 1) for line in serve.out.splitlines()
                 if line.strip().startswith(("token:", "base URL:")))
    token, base_url = lines["token"].strip(), lines["base URL"].strip()
    assert base_url == f"http://127.0.0.1:{port}/bot"

    asyncio.run(asyncio.wait_for(run_echo_bot(token, base_url, serve), 60))

    serve.proc.send_signal(signal.SIGINT)  # Ctrl-C
    assert serve.proc.wait(timeout=15) == 0, serve.out
    out = serve.out
    assert "-> sendMessage to chat 1: echo: hello from --message" in out
    assert "<- update" in out and "from chat 42: typed on stdin" in out
    assert "Traceback" not in out and out.rstrip().endswith("stopped")


def test_serve_stops_cleanly_on_sigterm(tmp_path: Path, serves: List[Serve]) -> None:
    serve = Serve(tmp_path, "--port", "0", "--no-stdin")
    serves.append(serve)
    serve.wait_for("base URL:")
    serve.proc.send_signal(signal.SIGTERM)
    assert serve.proc.wait(timeout=15) == 0, serve.out
    assert "Traceback" not in serve.out


def test_serve_refuses_a_taken_port(tmp_path: Path, serves: List[Serve]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        serve = Serve(tmp_path, "--port", str(taken.getsockname()[1]))
        serves.append(serve)
        assert serve.proc.wait(timeout=30) == 2
    assert "pick another --port" in serve.out and "Traceback" not in serve.out


def test_serve_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ptb_fence.testing", "serve", "--help"],
        capture_output=True, text=True, timeout=30,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert result.returncode == 0
    for option in ("--port", "--message", "--token", "--chat-id", "--no-stdin"):
        assert option in result.stdout
