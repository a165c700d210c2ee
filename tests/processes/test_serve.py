"""``python -m ptb_fence.testing serve``: a fake Bot API in its own process for a real bot."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, List

import pytest
from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.ext import (
    Application,
    CallbackQueryHandler,
    CommandHandler,
    ContextTypes,
    MessageHandler,
    filters,
)

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import FencedCallbackContext, FencedUpdateProcessor

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]


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


def token_and_base_url(serve: Serve) -> "tuple[str, str]":
    serve.wait_for("base URL:")
    lines = dict(line.strip().split(":", 1) for line in serve.out.splitlines()
                 if line.strip().startswith(("token:", "base URL:")))
    return lines["token"].strip(), lines["base URL"].strip()


async def run_button_bot(token: str, base_url: str, serve: Serve, db: Path) -> None:
    """A fenced booking bot with inline buttons: /start offers slots, a slot asks to confirm,
    the confirmation books it; every press is answered and edits the message."""

    async def start(update: Update, context: FencedCallbackContext) -> None:
        assert update.effective_message is not None
        await update.effective_message.reply_text("Pick a slot:", reply_markup=InlineKeyboardMarkup(
            [[InlineKeyboardButton("10:00", callback_data="slot:10:00"),
              InlineKeyboardButton("11:00", callback_data="slot:11:00")],
             [InlineKeyboardButton("Help", url="https://example.org/help")]]))

    async def slot(update: Update, context: FencedCallbackContext) -> None:
        query = update.callback_query
        assert query is not None and query.data is not None and query.message is not None
        assert query.message.reply_markup is not None  # the keyboard that was pressed
        await query.answer(f"{query.data[5:]} it is")
        await query.edit_message_text(
            f"Book {query.data[5:]}?", reply_markup=InlineKeyboardMarkup(
                [[InlineKeyboardButton("Yes", callback_data=f"confirm:{query.data[5:]}"),
                  InlineKeyboardButton("No", callback_data="confirm:no")]]))

    async def confirm(update: Update, context: FencedCallbackContext) -> None:
        query = update.callback_query
        assert query is not None and query.data is not None
        attempt = context.require_attempt()
        booked = query.data[8:]

        def write(conn: Any) -> None:
            conn.execute("INSERT INTO bookings VALUES (?, ?)", (booked, query.from_user.id))

        await attempt.run_in_transaction(write, complete=True)
        await query.answer("Booked!", show_alert=True)
        await query.edit_message_text(f"Booked {booked}.")  # no keyboard any more

    store = SQLiteUpdateStore(str(db))
    with store.transaction() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bookings (slot TEXT, user_id INTEGER)")
    builder = (Application.builder().token(token).base_url(base_url)
               .context_types(ContextTypes(context=FencedCallbackContext)))
    app = FencedUpdateProcessor(store).install(builder).build()
    app.add_handlers([CommandHandler("start", start),
                      CallbackQueryHandler(slot, pattern="^slot:"),
                      CallbackQueryHandler(confirm, pattern="^confirm:")])
    try:
        async with app:
            await app.start()
            assert app.updater is not None
            await app.updater.start_polling(poll_interval=0.0, timeout=1)
            try:
                for line, wait in [
                    ("/start", "Pick a slot:"),
                    ("!button slot:10:00", "Book 10:00?"),
                    ("!button Yes", "Booked 10:00."),  # by the button's text
                    ("!button slot:11:00", "the bot shows no inline keyboard in chat 1"),
                    ("@42 /start", "-> sendMessage to chat 42: Pick a slot:"),
                    ("@42 !button nope", "no button 'nope'"),
                    ("@42 !button slot:11:00", "Book 11:00?"),
                    ("@42 !button confirm:11:00", "Booked 11:00."),
                ]:
                    serve.type(line)
                    await asyncio.to_thread(serve.wait_for, wait)
            finally:
                await app.updater.stop()
                await app.stop()
    finally:
        store.close()


def test_serve_presses_inline_buttons_of_a_fenced_bot(tmp_path: Path, serves: List[Serve]) -> None:
    serve = Serve(tmp_path, "--port", str(free_port()))
    serves.append(serve)
    token, base_url = token_and_base_url(serve)
    db = tmp_path / "buttons.db"

    asyncio.run(asyncio.wait_for(run_button_bot(token, base_url, serve, db), 60))

    serve.proc.send_signal(signal.SIGINT)
    assert serve.proc.wait(timeout=15) == 0, serve.out
    out = serve.out
    assert "Traceback" not in out, out
    # the keyboard, button by button, with how to press one
    assert "-> sendMessage to chat 1: Pick a slot:\n   [10:00 -> slot:10:00] [11:00 -> slot:11:00]\n"\
        "   [Help (url https://example.org/help)]\n   (press one: !button CALLBACK_DATA" in out, out
    assert "from chat 1: pressed 'slot:10:00' under message 2" in out, out
    assert ": 10:00 it is\n" in out and "-> answerCallbackQuery " in out, out
    assert "-> editMessageText message 2 in chat 1: Book 10:00?\n"\
        "   [Yes -> confirm:10:00] [No -> confirm:no]\n" in out, out
    assert "from chat 1: pressed 'confirm:10:00' under message 2" in out, out
    assert ": Booked! (as an alert)" in out, out
    assert "-> editMessageText message 2 in chat 1: Booked 10:00.\n   (no inline keyboard now)" \
        in out, out
    assert "buttons with callback data: 'slot:10:00', 'slot:11:00'" in out, out
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT slot, user_id FROM bookings ORDER BY slot").fetchall() == [
            ("10:00", 1), ("11:00", 42)]


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
    for option in ("--port", "--message", "--token", "--chat-id", "--no-stdin",
                   "--first-update-id", "!button"):
        assert option in result.stdout
