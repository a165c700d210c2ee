"""update_fingerprint: stable across Telegram's raw JSON and PTB's to_json, different updates differ."""

from __future__ import annotations

import copy
import json
from typing import Any, Dict

import pytest
from telegram import Update

from ptb_fence._fingerprint import update_fingerprint

USER = {"id": 42, "is_bot": False, "first_name": "Ann", "language_code": "en"}
GROUP = {"id": -1001, "type": "supergroup", "title": "G", "is_forum": None}
MESSAGE = {
    "message_id": 7, "date": 1_700_000_000, "chat": GROUP, "from": USER, "text": "hi",
    "entities": None, "some_future_field": {"x": 1},
}
RAW: Dict[str, Dict[str, Any]] = {
    "message": {"update_id": 1, "message": MESSAGE},
    "edited_message": {"update_id": 2, "edited_message": dict(MESSAGE, edit_date=1_700_000_100)},
    "callback_query": {"update_id": 3, "callback_query": {
        "id": "4382", "from": USER, "chat_instance": "-99", "data": "ok", "message": MESSAGE}},
    "inline_query": {"update_id": 4, "inline_query": {
        "id": "77", "from": USER, "query": "cats", "offset": "", "chat_type": "sender"}},
    "channel_post": {"update_id": 5, "channel_post": {
        "message_id": 9, "date": 1_700_000_001, "sender_chat": {"id": -1002, "type": "channel"},
        "chat": {"id": -1002, "type": "channel", "title": "C"}, "text": "news"}},
    "my_chat_member": {"update_id": 6, "my_chat_member": {
        "chat": GROUP, "from": USER, "date": 1_700_000_002,
        "old_chat_member": {"status": "left", "user": USER},
        "new_chat_member": {"status": "member", "user": USER}}},
}


@pytest.mark.parametrize("kind", sorted(RAW))
def test_raw_json_and_ptb_to_json_have_one_fingerprint(kind: str) -> None:
    raw = RAW[kind]
    polled = json.dumps(raw, ensure_ascii=False)
    put = Update.de_json(copy.deepcopy(raw), None).to_json()  # type: ignore[arg-type]
    assert polled != put  # the serializations really differ
    assert update_fingerprint(polled) == update_fingerprint(put)
    assert update_fingerprint(json.dumps(raw, sort_keys=True, indent=2)) == update_fingerprint(
        polled
    )


@pytest.mark.parametrize("kind", sorted(RAW))
def test_a_different_update_with_the_same_id_differs(kind: str) -> None:
    raw = RAW[kind]
    other = copy.deepcopy(raw)
    inner = other[kind]
    if "id" in inner:
        inner["id"] = inner["id"] + "1"  # another query
    elif "message_id" in inner:
        inner["message_id"] += 1  # another message
    else:
        inner["date"] += 1  # another event
    assert update_fingerprint(json.dumps(raw)) != update_fingerprint(json.dumps(other))
    elsewhere = copy.deepcopy(raw)
    if "chat" in elsewhere[kind] and "id" not in elsewhere[kind]:
        elsewhere[kind]["chat"] = dict(elsewhere[kind]["chat"], id=-5)  # another chat
        assert update_fingerprint(json.dumps(raw)) != update_fingerprint(json.dumps(elsewhere))


def test_one_message_delivered_twice_with_a_new_date_is_the_same_update() -> None:
    """A message is identified by chat and message id (a helper may stamp a fresh date)."""
    first = {"update_id": 1, "message": MESSAGE}
    again = {"update_id": 1, "message": dict(MESSAGE, date=MESSAGE["date"] + 5)}
    assert update_fingerprint(json.dumps(first)) == update_fingerprint(json.dumps(again))
    edited = {"update_id": 1, "edited_message": dict(MESSAGE, edit_date=1_700_000_100)}
    edited_again = {"update_id": 1, "edited_message": dict(MESSAGE, edit_date=1_700_000_200)}
    assert update_fingerprint(json.dumps(edited)) != update_fingerprint(json.dumps(edited_again))


def test_kind_and_bodies_without_a_kind() -> None:
    message = {"update_id": 1, "message": MESSAGE}
    edited = {"update_id": 1, "edited_message": MESSAGE}
    fingerprint = update_fingerprint(json.dumps(message))
    assert fingerprint is not None and len(fingerprint) == 16
    assert fingerprint != update_fingerprint(json.dumps(edited))
    for body in ("x", "{}", '{"update_id": 1}', "[1]", '"\\ud83d"', '{"update_id": 1, "a": {}}'):
        assert update_fingerprint(body) is None, body


def test_unknown_kinds_and_extra_fields_never_make_a_different_update() -> None:
    """Only known update kinds count: extra or future top-level fields are ignored."""
    plain = json.dumps({"update_id": 9, "x_a": {"k": 1}})
    other = json.dumps({"update_id": 9, "x_b": {"k": 2}, "future_kind": {"date": 5}})
    assert update_fingerprint(plain) is None and update_fingerprint(other) is None
    message = {"update_id": 9, "message": MESSAGE}
    extra = dict(message, x_field={"anything": True})
    assert update_fingerprint(json.dumps(message)) == update_fingerprint(json.dumps(extra))


def test_a_polled_body_is_fingerprinted_from_its_parsed_update_as_from_its_text() -> None:
    from ptb_fence import _fingerprint
    from ptb_fence.ptb._bodies import raw_body

    raw = {
        "update_id": 7,
        "message": {"message_id": 3, "date": 1, "chat": {"id": -5, "type": "group"},
                    "text": "lone \ud800 surrogate"},
    }
    body = raw_body(raw)  # ASCII escapes: the lone surrogate cannot be UTF-8
    remembered = _fingerprint.update_fingerprint(body)  # taken from what raw_body noted
    assert body not in _fingerprint._KNOWN  # once
    assert remembered == _fingerprint.update_fingerprint(body) is not None  # parsed this time
    other = dict(raw, message=dict(raw["message"], message_id=4))
    assert _fingerprint.update_fingerprint(raw_body(other)) != remembered
    # bodies no store asks about never make the table grow past its bound
    for n in range(_fingerprint._KNOWN_MOST + 10):
        raw_body({"update_id": n, "message": {"message_id": n, "chat": {"id": 1}}})
    assert len(_fingerprint._KNOWN) <= _fingerprint._KNOWN_MOST


# Fingerprints computed by the implementation before the message fast path: stored rows are
# compared with them, so they must never change.
_GOLDEN = [
    ({"update_id": 1, "message": {"message_id": 1, "date": 1700000000,
                                  "chat": {"id": 5, "type": "private"}, "text": "hi"}},
     "f5980cee6df546ef"),
    ({"update_id": 2**40, "channel_post": {"message_id": 77, "date": 1,
                                           "chat": {"id": -1001234567890, "type": "channel"}}},
     "839eb17a98996cea"),
    ({"update_id": 3, "edited_message": {"message_id": 9, "edit_date": 5,
                                         "chat": {"id": 5, "type": "private"}}},
     "3fe404607fe9f168"),
    ({"update_id": 4, "message": {"message_id": True, "chat": {"id": 5}}}, "7729dc5779ac9cd7"),
    ({"update_id": 5, "callback_query": {"id": "abc", "from": {"id": 3}}}, "1fb630ef8158e364"),
    ({"update_id": 6, "message": {"message_id": 1, "chat": {"id": 5.0}}}, "50892fd9ee12bc93"),
]


@pytest.mark.parametrize("data,expected", _GOLDEN)
def test_fingerprints_of_stored_rows_never_change(data: Dict[str, Any], expected: str) -> None:
    assert update_fingerprint(json.dumps(data)) == expected


def test_the_message_fast_path_writes_the_general_rules_text() -> None:
    import random

    from ptb_fence._fingerprint import KINDS, _identity_text, _message_text

    rnd = random.Random(7)
    values: list = [0, 1, -5, 2**62, 2**70, True, False, None, 1.5, "7", {"id": 3}, [1]]
    fast = 0
    for _ in range(20000):
        kind = rnd.choice(["message", "edited_message", "channel_post", "business_message"])
        obj: Dict[str, Any] = {}
        for name in ("message_id", "chat", "id", "edit_date", "date", "from"):
            if rnd.random() < 0.6:
                value = rnd.choice(values)
                if name == "chat" and rnd.random() < 0.7:
                    value = {"id": rnd.choice(values), "type": "private"}
                obj[name] = value
        data = {"update_id": rnd.choice(values), kind: obj}
        text = _message_text(data, kind)
        if text is not None:
            fast += 1
            assert text == _identity_text(data, [kind]), data
            assert kind in KINDS
    assert fast > 50  # the fast path was exercised (66 times with this seed)
