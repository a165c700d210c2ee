"""``examples/booking_bot.py``, the production recipe, runs offline in two processes.

The polling process is SIGKILLed while every chat's last step works. The second process
(``--no-polling``) continues each conversation from the state ``FencedPersistence`` committed,
books each slot once and sends each reply and each durable reminder once. A conversation left
open times out once, in a process started after the one that asked. Every wait is bounded and
every process still running at the end is killed.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest

from ptb_fence.testing import FakeBotApi

pytestmark = pytest.mark.timeout(150)

ROOT = Path(__file__).resolve().parents[2]
BOT = ROOT / "examples" / "booking_bot.py"
CHATS = {1: "09:00", 2: "10:00", 3: "11:00"}


class Processes:
    """The bot processes of one test, their output in files, killed at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.procs: Dict[str, "subprocess.Popen[bytes]"] = {}

    def start(self, name: str, *args: str) -> "subprocess.Popen[bytes]":
        env = {k: v for k, v in os.environ.items() if not k.startswith("TELEGRAM_")}
        env["PYTHONPATH"] = str(ROOT)
        env["PYTHONUNBUFFERED"] = "1"
        with (self.dir / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen([sys.executable, str(BOT), *args], stdout=out,
                                    stderr=subprocess.STDOUT, cwd=self.dir, env=env)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"----- {name} -----\n{self.log(name)[-5000:]}" for name in self.procs)

    def wait_for(self, what: str, condition: Callable[[], Any], timeout: float,
                 alive: List[str]) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for name in alive:
                if self.procs[name].poll() is not None:
                    raise AssertionError(f"waiting for {what}: {name} exited\n{self.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.05)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.kill_all()


def texts_to(fake: FakeBotApi, chat_id: int) -> List[str]:
    return [m["text"] for m in fake.sent_messages if m["chat_id"] == chat_id]


def test_second_process_finishes_the_conversations_of_a_killed_one(
    processes: Processes, tmp_path: Path
) -> None:
    db = str(tmp_path / "booking.sqlite3")
    with FakeBotApi() as fake:
        common = ["--db", db, "--base-url", fake.base_url, "--remind-after", "2"]
        processes.start("poller", *common, "--work-seconds", "60")
        processes.start("second", *common, "--no-polling", "--sweep-every", "1")
        both = ["poller", "second"]

        for chat in CHATS:
            fake.inject_message(chat_id=chat, text="/book")
        processes.wait_for("the slot keyboards", lambda: all(
            fake.last_keyboard(chat) is not None for chat in CHATS), 60, both)
        for chat, slot in CHATS.items():
            fake.press_button(chat, slot)
        processes.wait_for("the name questions", lambda: all(
            len(texts_to(fake, chat)) == 2 for chat in CHATS), 30, both)
        for chat in CHATS:
            fake.inject_message(chat_id=chat, text=f"Ada{chat}")
        processes.wait_for("the poller working on every last step", lambda: processes.log(
            "poller").count(": booking ") == len(CHATS), 30, both)

        processes.procs["poller"].send_signal(signal.SIGKILL)
        processes.procs["poller"].wait(timeout=10)
        processes.wait_for("every booking reply and reminder", lambda: all(
            len(texts_to(fake, chat)) == 4 for chat in CHATS), 60, ["second"])
        time.sleep(1.5)  # a reply or a reminder sent twice would show up by now

        for chat, slot in CHATS.items():
            assert texts_to(fake, chat) == [
                "Pick a slot:",
                f"{slot}: what name should I book it under?",
                f"Booked {slot} for Ada{chat}.",
                f"Reminder: {slot} is booked for Ada{chat}.",
            ], processes.logs()
        assert len(fake.calls_to("answerCallbackQuery")) == len(CHATS)
        processes.procs["second"].send_signal(signal.SIGTERM)
        assert processes.procs["second"].wait(timeout=30) == 0, processes.logs()

    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT chat_id, slot, name FROM bookings ORDER BY chat_id").fetchall()
    finally:
        conn.close()
    assert rows == [(chat, slot, f"Ada{chat}") for chat, slot in CHATS.items()]
    assert processes.log("second").count(": booking ") == len(CHATS)  # it did the last steps


def test_a_conversation_left_open_times_out_once_after_a_restart(
    processes: Processes, tmp_path: Path
) -> None:
    """The poller asks for a slot and is stopped, as a deploy stops it. The conversation's
    timeout is a durable job: a process started later ends the conversation and says so once."""
    db = str(tmp_path / "booking.sqlite3")
    with FakeBotApi() as fake:
        common = ["--db", db, "--base-url", fake.base_url, "--conversation-timeout", "5"]
        processes.start("poller", *common)
        fake.inject_message(chat_id=1, text="/book")
        processes.wait_for("the slot keyboard", lambda: fake.last_keyboard(1) is not None, 60,
                           ["poller"])
        processes.procs["poller"].send_signal(signal.SIGTERM)
        assert processes.procs["poller"].wait(timeout=30) == 0, processes.logs()
        assert texts_to(fake, 1) == ["Pick a slot:"]  # it stopped before the timeout

        processes.start("second", *common, "--no-polling")
        processes.wait_for("the timeout's reply", lambda: len(texts_to(fake, 1)) == 2, 60,
                           ["second"])
        time.sleep(1.5)  # a timeout run twice would show up by now
        assert texts_to(fake, 1) == ["Pick a slot:", "No booking made. Send /book to start again."]
        processes.procs["second"].send_signal(signal.SIGTERM)
        assert processes.procs["second"].wait(timeout=30) == 0, processes.logs()


def test_docstring_commands_name_this_script() -> None:
    doc = BOT.read_text()
    assert "python examples/booking_bot.py --db booking.sqlite3 --base-url " \
           "http://127.0.0.1:8081/bot --no-polling" in doc
    assert 'python -m ptb_fence.testing serve --message "/book"' in doc
