"""attempt.outbox: a call a handler queues lands in the outbox iff the commit carrying it lands.

Real stores (memory, SQLite file, PostgreSQL table) behind a real ``UpdateIntake`` whose
sender talks to a ``FakeBotApi``; what landed is read back with the store's own
``list_calls``. These tests look at what is *committed*; sending is tested in
test_outbox_dispatch.py.
"""

from __future__ import annotations

import io
import json
import threading
from typing import Any, Dict, List

import pytest

from ptb_fence import AttemptFinished, HeldCall, OwnershipLost, UpdateIntake
from ptb_fence.testing import FakeBotApi
from runtime_support import ALL_METHODS, FakeClock, StoreWrapper, body, wait_until


@pytest.fixture(scope="module")
def fake() -> Any:
    with FakeBotApi() as api:
        yield api


def _intake(store: Any, intakes: List[UpdateIntake], handle: Any, **options: Any) -> UpdateIntake:
    """A started intake on ``store`` (closed after the test: ``intakes``) sending to the
    module's FakeBotApi (``options["fake"]``)."""
    fake = options.pop("fake")
    options.setdefault("retry", lambda error, attempt: 0.01)
    intake = UpdateIntake(
        store, handle_attempt=handle, bot_token=fake.token, bot_base_url=fake.base_url, **options
    )
    intakes.append(intake)
    intake.start()
    return intake


def _settled(intake: UpdateIntake, store: Any, count: int) -> None:
    assert wait_until(lambda: intake.idle(0.05) and len(store.list_calls()) >= count, 15)
    assert intake.idle(5)


def test_held_call_is_written_by_the_completion(
    store: Any, intakes: List[UpdateIntake], fake: FakeBotApi
) -> None:
    handles: Dict[int, Any] = {}

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        handles[update["update_id"]] = attempt.outbox.reply_text("hello")
        # held, not written: nothing is in the outbox while the handler runs
        assert store.list_calls() == [] or update["update_id"] != 1

    intake = _intake(store, intakes, handle, fake=fake)
    intake.accept(body(1, chat=501))
    _settled(intake, store, 1)
    (entry,) = store.list_calls()
    assert (entry.update_id, entry.attempt, entry.seq, entry.chat_key) == (1, 1, 0, 501)
    assert entry.method == "sendMessage" and entry.state in ("pending", "sending", "sent")
    # a private chat: PTB's reply_text does not quote there
    assert json.loads(entry.params_json) == {"chat_id": 501, "text": "hello"}
    held = handles[1]
    assert isinstance(held, HeldCall) and held.committed and held.identity.update_id == 1


def test_call_inside_transaction_commits_with_it(
    store: Any, intakes: List[UpdateIntake], fake: FakeBotApi
) -> None:
    got: Dict[str, Any] = {}

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        with attempt.transaction():
            got["id"] = attempt.outbox.send_message(7, "in the transaction")
        try:
            with attempt.transaction():
                attempt.outbox.send_message(7, "rolled back")
                raise KeyError("the block fails")
        except KeyError:
            pass

    intake = _intake(store, intakes, handle, fake=fake)
    intake.accept(body(1))
    _settled(intake, store, 1)
    (entry,) = store.list_calls()
    assert isinstance(got["id"], int) and entry.call_id == got["id"]
    assert json.loads(entry.params_json)["text"] == "in the transaction"
    assert entry.seq == 0


def test_complete_transaction_writes_held_calls_with_their_ids(
    store: Any, intakes: List[UpdateIntake], fake: FakeBotApi
) -> None:
    got: Dict[str, Any] = {}

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        got["held"] = attempt.outbox.send_message(8, "first, held")
        with attempt.transaction(complete=True):
            got["inside"] = attempt.outbox.send_message(8, "second, inside")
        with pytest.raises(AttemptFinished, match="queue outbox calls before or inside"):
            attempt.outbox.send_message(8, "too late")

    intake = _intake(store, intakes, handle, fake=fake)
    intake.accept(body(1))
    _settled(intake, store, 2)
    entries = store.list_calls()
    assert [json.loads(e.params_json)["text"] for e in entries] == ["second, inside", "first, held"] \
        or [json.loads(e.params_json)["text"] for e in entries] == ["first, held", "second, inside"]
    held = got["held"]
    assert held.committed and held.call_id in {e.call_id for e in entries}
    assert int(held) == held.call_id
    assert sorted(e.seq for e in entries) == [0, 1]


def test_failed_attempt_calls_are_discarded_retry_queues_its_own(
    store: Any, intakes: List[UpdateIntake], fake: FakeBotApi
) -> None:
    handles: List[HeldCall] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        handles.append(attempt.outbox.reply_text(f"attempt {attempt.attempt}"))
        if attempt.attempt == 1:
            raise RuntimeError("fails after queueing")

    intake = _intake(store, intakes, handle, fake=fake)
    intake.accept(body(1))
    _settled(intake, store, 1)
    assert wait_until(lambda: len(handles) == 2 and handles[1].committed)
    (entry,) = store.list_calls()
    assert entry.attempt == 2 and json.loads(entry.params_json)["text"] == "attempt 2"
    assert handles[0].discarded and handles[0].call_id is None
    with pytest.raises(LookupError, match="never written"):
        int(handles[0])


def test_stale_attempt_commits_no_call(
    store: Any, intakes: List[UpdateIntake], fake: FakeBotApi
) -> None:
    clock = FakeClock()
    taken = threading.Event()
    queued = threading.Event()
    errors: List[BaseException] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        attempt.outbox.reply_text("from the stale attempt")
        queued.set()
        assert taken.wait(10)
        try:
            with attempt.transaction():
                attempt.outbox.reply_text("inside the refused transaction")
        except OwnershipLost as exc:
            errors.append(exc)

    intake = _intake(store, intakes, handle, fake=fake, clock=clock, lease_seconds=60, max_attempts=1)
    intake.accept(body(1))
    assert queued.wait(10)
    clock.advance(120)  # past the lease: another process takes the update over
    other = store.claim_owned(1, now=clock.ms(), lease_until=clock.ms() + 60_000, max_attempts=5)
    assert other is not None and other.attempt == 2
    taken.set()
    assert wait_until(lambda: intake.idle(0.05), 10)
    assert len(errors) == 1
    assert store.list_calls() == []


def test_a_completion_without_calls_costs_no_statement_more(
    tmp_path: Any, intakes: List[UpdateIntake], fake: FakeBotApi
) -> None:
    from counting_store import CountingStore

    from ptb_fence import SQLiteUpdateStore

    inner = SQLiteUpdateStore(str(tmp_path / "count.db"))
    store = CountingStore(inner)
    intake = _intake(store, intakes, lambda update, attempt: None, fake=fake)
    for i in range(1, 6):
        intake.accept(body(i))
    assert wait_until(lambda: intake.idle(0.05), 10)
    assert store.calls["write_effects"] == 0
    settles = store.calls["commit_settle"] + store.calls["commit_claimed_settle"]
    assert settles >= 1
    inner.close()


def test_outbox_refused_without_an_outbox_store(
    intakes: List[UpdateIntake], fake: FakeBotApi
) -> None:
    store = StoreWrapper(methods=ALL_METHODS)  # fenced and durable, no OutboxStore methods
    errors: List[BaseException] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        try:
            attempt.outbox.reply_text("x")
        except TypeError as exc:
            errors.append(exc)

    intake = _intake(store, intakes, handle, fake=fake)
    intake.accept(body(1))
    assert wait_until(lambda: intake.idle(0.05) and errors, 10)
    assert "has no outbox: attempt.outbox needs a store that keeps Bot API calls" in str(errors[0])


@pytest.mark.parametrize("store_kind", ["memory"])
def test_uploads_are_refused_and_ptb_objects_serialised(
    store: Any, intakes: List[UpdateIntake], fake: FakeBotApi
) -> None:
    from telegram import InlineKeyboardButton, InlineKeyboardMarkup, InputFile

    errors: List[str] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        outbox = attempt.outbox
        for bad in (io.BytesIO(b"x"), b"raw", InputFile(b"x", filename="a.txt"), tmp_file()):
            try:
                outbox.send_document(1, bad)
            except TypeError as exc:
                errors.append(str(exc))
        keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("ok", callback_data="ok")]])
        outbox.send_photo(1, "https://example.org/a.png", caption="c", reply_markup=keyboard)
        outbox.edit_message_text("edited", chat_id=1, message_id=5)
        outbox.delete_message(1, 6)
        outbox.call("answer_callback_query", callback_query_id="q1", at_most_once=True)

    def tmp_file() -> Any:
        import pathlib

        return pathlib.Path("/etc/hostname")

    intake = _intake(store, intakes, handle, fake=fake)
    intake.accept(body(1, chat=9))
    _settled(intake, store, 4)
    assert len(errors) == 4 and all("file_id or URL" in e for e in errors)
    photo, edit, delete, answer = store.list_calls()
    assert json.loads(photo.params_json)["reply_markup"] == {
        "inline_keyboard": [[{"text": "ok", "callback_data": "ok"}]]
    }
    assert (edit.method, delete.method, answer.method) == (
        "editMessageText", "deleteMessage", "answerCallbackQuery")
    assert answer.at_most_once and not photo.at_most_once
    assert answer.chat_key == 9  # no chat_id: the update's chat orders it


@pytest.mark.parametrize("store_kind", ["memory"])
def test_reply_text_in_a_forum_topic_quotes_and_keeps_the_thread(
    store: Any, intakes: List[UpdateIntake], fake: FakeBotApi
) -> None:
    def handle(update: Dict[str, Any], attempt: Any) -> None:
        attempt.outbox.reply_text("in the topic")
        attempt.outbox.reply_text("not quoted", do_quote=False)

    update = {
        "update_id": 1,
        "message": {
            "message_id": 40, "date": 1, "text": "hi", "message_thread_id": 12,
            "is_topic_message": True,
            "chat": {"id": -1001, "type": "supergroup", "is_forum": True},
            "from": {"id": 3, "is_bot": False, "first_name": "U"},
        },
    }
    intake = _intake(store, intakes, handle, fake=fake)
    intake.accept(json.dumps(update))
    _settled(intake, store, 2)
    quoted, plain = (json.loads(e.params_json) for e in store.list_calls())
    assert quoted == {
        "chat_id": -1001, "text": "in the topic", "message_thread_id": 12,
        "reply_parameters": {"message_id": 40},
    }
    assert plain == {"chat_id": -1001, "text": "not quoted", "message_thread_id": 12}


@pytest.mark.parametrize("store_kind", ["sqlite"])
def test_outbox_refused_by_an_intake_that_cannot_send(
    store: Any, intakes: List[UpdateIntake]
) -> None:
    errors: List[BaseException] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        try:
            attempt.outbox.reply_text("x")
        except TypeError as exc:
            errors.append(exc)

    intake = UpdateIntake(store, handle_attempt=handle)  # no bot_token
    intakes.append(intake)
    intake.start()
    intake.accept(body(1))
    assert wait_until(lambda: intake.idle(0.05) and errors, 10)
    assert "bot_token=TOKEN" in str(errors[0])
    assert store.list_calls() == []
