"""How persisted bot state is encoded in a state row (shared by FencedPersistence and the
``ptb-fence persistence`` commands): pickled, as PicklePersistence keeps it (any picklable
object, exactly), in base64 text so every store keeps it in a text column; the conversation
key of a row is the key's JSON list."""

from __future__ import annotations

import binascii
import json
import pickle
from typing import Any, Tuple

from ptb_fence._values import StateKey

__all__ = ["conversation_state_key", "decode_state", "encode_state", "state_key_tuple"]

_PREFIX = "pickle:"


def encode_state(value: Any) -> str:
    """The text a state row holds for ``value``."""
    # binascii directly: base64's wrappers add a Python call per row on the hot path
    return _PREFIX + binascii.b2a_base64(pickle.dumps(value, protocol=4), newline=False).decode(
        "ascii"
    )


def decode_state(text: str) -> Any:
    """The value of a state row's text.

    Raises:
        ValueError: The text is not encoded state (the row was not written by ptb_fence).
    """
    if not text.startswith(_PREFIX):
        raise ValueError(f"not encoded bot state: {text[:40]!r}")
    return pickle.loads(binascii.a2b_base64(text[len(_PREFIX):]))


def conversation_state_key(name: str, key: Tuple[Any, ...]) -> StateKey:
    """The :class:`~ptb_fence.StateKey` of conversation ``key`` of the handler ``name``."""
    if len(key) == 2 and type(key[0]) is int and type(key[1]) is int:
        # the usual (chat id, user id), once per update: JSON's text without json
        return StateKey("conversation", name, f"[{key[0]},{key[1]}]")
    if all(type(part) is int for part in key):
        return StateKey("conversation", name, "[" + ",".join(map(str, key)) + "]")
    return StateKey("conversation", name, json.dumps(list(key), separators=(",", ":")))


def state_key_tuple(key: StateKey) -> Tuple[Any, ...]:
    """The conversation key of a ``conversation`` row, as PTB has it (a tuple)."""
    return tuple(json.loads(key.key))
