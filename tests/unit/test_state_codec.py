"""How persisted state is named and encoded: a conversation key's text is its JSON list (the
key of a row a restarted or other process must find again), whatever its parts; values round
trip exactly through the pickle text; a set pickled in another process's hash order is the
same state, a change of value or of type is not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Tuple

import pytest

from ptb_fence import StateKey
from ptb_fence._state_codec import (
    conversation_state_key,
    decode_state,
    encode_state,
    same_state,
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


TAGS = {"tags": {f"tag-{i}" for i in range(64)}, "frozen": frozenset({"a", "b", "c", "d"})}


def _encoded_with_seed(seed: str) -> str:
    """``encode_state(TAGS)`` in a Python process with ``PYTHONHASHSEED=seed``."""
    code = ("from ptb_fence._state_codec import encode_state; "
            "print(encode_state({'tags': {f'tag-{i}' for i in range(64)}, "
            "'frozen': frozenset({'a', 'b', 'c', 'd'})}))")
    env = dict(os.environ, PYTHONHASHSEED=seed)
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


def test_a_set_pickled_under_another_hash_seed_is_the_same_state() -> None:
    stored = _encoded_with_seed("1")
    assert stored != _encoded_with_seed("2")  # the bytes differ with the seed
    copy = decode_state(stored)  # an attempt's copy, not changed
    assert same_state(stored, copy, encode_state(copy))
    rebuilt = {"tags": set(sorted(copy["tags"], reverse=True)), "frozen": copy["frozen"]}
    assert same_state(stored, rebuilt, encode_state(rebuilt))  # equal, built otherwise


@pytest.mark.parametrize("changed", [
    {"tags": {f"tag-{i}" for i in range(63)}, "frozen": frozenset({"a", "b", "c", "d"})},
    {"frozen": frozenset({"a", "b", "c", "d"}), "tags": {f"tag-{i}" for i in range(64)}},
    {"tags": {f"tag-{i}" for i in range(64)}, "frozen": {"a", "b", "c", "d"}},
    {"tags": {f"tag-{i}" for i in range(64)}, "frozen": frozenset({"a", "b", "c", "d"}),
     "n": 1},
])
def test_a_change_of_a_set_holding_state_is_a_change(changed: Any) -> None:
    stored = _encoded_with_seed("1")
    assert not same_state(stored, changed, encode_state(changed))


def test_equal_values_of_other_types_are_a_change() -> None:
    stored = encode_state({"s": {1}, "n": 1})
    for value in ({"s": {True}, "n": 1}, {"s": {1}, "n": 1.0}, {"s": {1}, "n": True}):
        assert value == decode_state(stored)
        assert not same_state(stored, value, encode_state(value))
