"""Per-chat order and the concurrency bound of UpdateIntake (real worker threads)."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from typing import Any, Dict, List

import pytest

from ptb_fence import MemoryUpdateStore, UpdateIntake
from ptb_fence.runtime._chats import chat_key
from runtime_support import FakeClock, body, row

CHATS, PER_CHAT, MAX = 20, 15, 8


class Tracker:
    """Records per-chat sequences and the peak number of handlers running at once."""

    def __init__(self, sleep: float = 0.002) -> None:
        self.sleep = sleep
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.running_chats: Dict[Any, int] = defaultdict(int)
        self.chat_overlap = False
        self.sequences: Dict[Any, List[int]] = defaultdict(list)
        self.runs: Dict[int, int] = defaultdict(int)

    def __call__(self, update: Dict[str, Any]) -> None:
        chat = update["message"]["chat"]["id"]
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.running_chats[chat] += 1
            if self.running_chats[chat] > 1:
                self.chat_overlap = True
            self.sequences[chat].append(update["update_id"])
            self.runs[update["update_id"]] += 1
        try:
            time.sleep(self.sleep)
        finally:
            with self.lock:
                self.running -= 1
                self.running_chats[chat] -= 1


def workload(seed: int) -> List[str]:
    """20 chats x 15 updates with interleaved ids, in a shuffled arrival order."""
    rng = random.Random(seed)
    ids = rng.sample(range(1, 100_000), CHATS * PER_CHAT)
    bodies = [body(uid, chat=-1000 - (i % CHATS)) for i, uid in enumerate(ids)]
    rng.shuffle(bodies)
    return bodies


def check(tracker: Tracker) -> None:
    assert len(tracker.sequences) == CHATS
    for chat, sequence in tracker.sequences.items():
        assert len(sequence) == PER_CHAT, chat
        assert sequence == sorted(sequence), f"chat {chat} ran out of order: {sequence}"
    assert set(tracker.runs.values()) == {1}
    assert not tracker.chat_overlap
    assert 1 < tracker.peak <= MAX


def test_per_chat_order_for_a_backlog_handled_at_start(intakes) -> None:
    store, tracker = MemoryUpdateStore(), Tracker()
    intake = UpdateIntake(store, handle=tracker, max_concurrent=MAX, clock=FakeClock())
    intakes.append(intake)
    for text in workload(1):
        assert intake.accept(text) == "accepted"
    intake.start()
    assert intake.idle(20)
    check(tracker)


def test_per_chat_order_for_live_updates_from_many_threads(intakes) -> None:
    store, tracker = MemoryUpdateStore(), Tracker()
    intake = UpdateIntake(store, handle=tracker, max_concurrent=MAX, clock=FakeClock())
    intakes.append(intake)
    intake.start()
    by_chat: Dict[int, List[str]] = defaultdict(list)
    for text in workload(2):
        update = json.loads(text)
        by_chat[update["message"]["chat"]["id"]].append(text)

    def post(texts: List[str]) -> None:  # one sender per chat, in update_id order
        for text in sorted(texts, key=lambda t: json.loads(t)["update_id"]):
            assert intake.accept(text) == "accepted"

    senders = [threading.Thread(target=post, args=(texts,)) for texts in by_chat.values()]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(10)
    assert intake.idle(20)
    check(tracker)


def test_a_slow_chat_does_not_block_the_others(intakes) -> None:
    store = MemoryUpdateStore()
    release = threading.Event()
    entered = threading.Event()
    done: List[int] = []
    lock = threading.Lock()

    def handle(update: Dict[str, Any]) -> None:
        if update["message"]["chat"]["id"] == 1 and not release.is_set():
            entered.set()
            assert release.wait(10)
        with lock:
            done.append(update["update_id"])

    intake = UpdateIntake(store, handle=handle, max_concurrent=2, clock=FakeClock())
    intakes.append(intake)
    intake.start()
    for uid in (1, 2, 3, 4, 5):  # the slow chat: its first update blocks
        intake.accept(body(uid, chat=1))
    assert entered.wait(5)
    others = list(range(100, 130))
    for uid in others:
        intake.accept(body(uid, chat=uid))  # 30 other chats, one worker left
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with lock:
            if len(done) == len(others):
                break
        time.sleep(0.005)
    with lock:
        assert sorted(done) == others  # all handled while chat 1 is blocked
    assert not intake.idle(0.05)
    release.set()
    assert intake.idle(10)
    assert done[len(others):] == [1, 2, 3, 4, 5]
    assert all(row(store, uid).state == "completed" for uid in [1, 2, 3, 4, 5] + others)


def test_a_sweep_does_not_hand_over_an_update_already_queued_here(intakes) -> None:
    store, clock = MemoryUpdateStore(), FakeClock()
    release, entered = threading.Event(), threading.Event()
    runs: List[int] = []

    def handle(update: Dict[str, Any]) -> None:
        runs.append(update["update_id"])
        if update["update_id"] == 1:
            entered.set()
            assert release.wait(5)

    intake = UpdateIntake(store, handle=handle, clock=clock)
    intakes.append(intake)
    intake.start()
    intake.accept(body(1, chat=7))
    intake.accept(body(2, chat=7))  # waits for its turn
    assert entered.wait(5)
    clock.advance(61)  # update 2 is past the pending grace
    assert intake.sweep() == 0  # it is already queued here
    release.set()
    assert intake.idle(5)
    assert runs == [1, 2]


@pytest.mark.parametrize(
    ("update", "key"),
    [
        ({"update_id": 1, "message": {"chat": {"id": -5}, "from": {"id": 9}}}, -5),
        ({"update_id": 2, "edited_message": {"chat": {"id": 42}}}, 42),
        ({"update_id": 3, "callback_query": {"from": {"id": 9}, "message": {"chat": {"id": -7}}}}, -7),
        ({"update_id": 4, "callback_query": {"from": {"id": 9}, "inline_message_id": "x"}}, 9),
        ({"update_id": 5, "inline_query": {"from": {"id": 11}}}, 11),
        ({"update_id": 6, "my_chat_member": {"chat": {"id": -3}, "from": {"id": 9}}}, -3),
        ({"update_id": 7, "poll": {"id": "p"}}, ("update", 7)),
        ({"update_id": 8, "message_reaction": {"chat": {"id": -8}, "user": {"id": 1}}}, -8),
        ({"update_id": 9, "poll_answer": {"user": {"id": 12}}}, 12),
    ],
)
def test_chat_key(update: Dict[str, Any], key: Any) -> None:
    assert chat_key(update) == key


def test_waiting_updates_of_a_chat_run_in_update_id_order(intakes) -> None:
    store = MemoryUpdateStore()
    release, entered = threading.Event(), threading.Event()
    runs: List[int] = []

    def handle(update: Dict[str, Any]) -> None:
        runs.append(update["update_id"])
        if update["update_id"] == 10:
            entered.set()
            assert release.wait(5)

    intake = UpdateIntake(store, handle=handle, clock=FakeClock())
    intakes.append(intake)
    intake.start()
    intake.accept(body(10, chat=3))
    assert entered.wait(5)
    for uid in (50, 30, 40, 20):  # arrive out of order while the chat is busy
        intake.accept(body(uid, chat=3))
    release.set()
    assert intake.idle(5)
    assert runs == [10, 20, 30, 40, 50]
