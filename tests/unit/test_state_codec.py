"""How persisted state is named and encoded: a conversation key's text is its JSON list (the
key of a row a restarted or other process must find again), whatever its parts; values round
trip exactly through the pickle text."""

from __future__ import annotations

import json
from typing import Any, Tuple

import pytest

from ptb_fence import StateKey
from ptb_fence._state_codec import (
    conversation_state_key,
    decode_state,
    encode_state,
    state_key_tuple,
)


@pytest.mark.parametrize("key", [
    (5,), (5, 7), (-1001234567890, 42), (0,), (), (True, 1), ("inline-id",), (5, "x", 3),
    (10 ** 20, -3), (1.5, 2),
])
def test_a_conversation_key_is_named_by_its_json_list(key: Tuple[Any, ...]) -> None:
    state = conversation_state_key("booking", key)
    assert state == StateKey("conversation", "booking",
                             json.dumps(list(key), separators=(",", ":")))
    assert state_key_tuple(state) == tuple(json.loads(state.key))


def test_values_round_trip_exactly() -> None:
    value = {"slots": ["10:00", "11:00"], "n": 3, "tags": frozenset({"a"}), "none": None}
    text = encode_state(value)
    assert isinstance(text, str) and decode_state(text) == value
    with pytest.raises(ValueError, match="not encoded bot state"):
        decode_state('{"n": 3}')
