"""A batch store's commit returns the ids of the calls it inserted claimed: the sender sends
them without reading its calls back from the store."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Dict, List

from ptb_fence import MemoryUpdateStore, OutboxEntry, UpdateIntake
from ptb_fence.testing import FakeBotApi
from runtime_support import body, wait_until

UPDATES = 40


class CountingReads(MemoryUpdateStore):
    """Counts the read backs of claimed calls."""

    __slots__ = ("reads", "reads_lock")

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.reads_lock = threading.Lock()

    def claimed_calls(self, sender: str, *, limit: int) -> List[OutboxEntry]:
        with self.reads_lock:
            self.reads += 1
        return super().claimed_calls(sender, limit=limit)


class EarlierOutboxStore(CountingReads):
    """The same store, seen as one of the earlier contract: no commit, no declared features."""

    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        if name in ("commit", "features"):
            raise AttributeError(name)
        return super().__getattribute__(name)


def _replies(store: CountingReads) -> "tuple[Counter[Any], int]":
    def handle(update: Dict[str, Any], attempt: Any) -> None:
        attempt.outbox.reply_text("got it")

    with FakeBotApi() as fake:
        intake = UpdateIntake(
            store, handle_attempt=handle, bot_token=fake.token, bot_base_url=fake.base_url,
            max_concurrent=8, outbox_concurrency=8, lease_seconds=60.0,
        )
        intake.start()
        try:
            for update_id in range(1, UPDATES + 1):
                intake.accept(body(update_id, chat=update_id))
            assert wait_until(lambda: len(fake.sent_messages) >= UPDATES, 60)
            assert wait_until(
                lambda: len(store.list_calls(state="sent", limit=UPDATES + 1)) == UPDATES, 30
            )
            reads = store.reads  # before the stop, which reads what it holds once
        finally:
            intake.close()
        return Counter(m["chat_id"] for m in fake.sent_messages), reads


def test_a_batch_store_hands_its_claimed_calls_over_without_a_read_back() -> None:
    replies, reads = _replies(CountingReads())
    assert sorted(replies) == list(range(1, UPDATES + 1)) and set(replies.values()) == {1}
    assert reads == 0


def test_a_store_of_the_earlier_contract_has_no_outbox_and_the_error_names_the_fix() -> None:
    """Outbox methods without ``commit`` and declared features are never used."""
    failures: List[BaseException] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        try:
            attempt.outbox.reply_text("got it")
        except Exception as exc:
            failures.append(exc)

    with UpdateIntake(EarlierOutboxStore(), handle_attempt=handle) as intake:
        assert intake.accept(body(1, chat=1)) == "accepted"
        assert wait_until(lambda: len(failures) == 1, 10)
    assert "StoreFeatures(outbox=True)" in str(failures[0])
