"""How persisted bot state is encoded in a state row (shared by FencedPersistence and the
``ptb-fence persistence`` commands): pickled, as PicklePersistence keeps it (any picklable
object, exactly), in base64 text so every store keeps it in a text column. The conversation
key of a row is the key's JSON list.

A pickle is not a canonical form: a ``set`` or ``frozenset`` is pickled in the order of its
elements' hashes, which differ between processes (``PYTHONHASHSEED``: any second process, any
restart). So two texts that differ may hold the same state: :func:`same_state` tells."""

from __future__ import annotations

import binascii
import json
import pickle
from typing import Any, Tuple

from ptb_fence._values import StateKey

__all__ = [
    "conversation_state_key",
    "decode_state",
    "encode_state",
    "same_state",
    "state_key_tuple",
]

_PREFIX = "pickle:"

_HASH_ORDERED = (b"\x8f", b"\x91")
"""The pickle opcodes that begin a ``set`` (``EMPTY_SET``) and end a ``frozenset``
(``FROZENSET``): a stored text without either byte holds no hash-ordered container."""


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


def same_state(stored: str, value: Any, encoded: str) -> bool:
    """Whether ``value`` (``encoded``: its text here) is the state the row text ``stored`` holds.

    Equal texts are the same state. Texts that differ are the same state when ``stored``
    holds sets or frozensets (pickled in another process's hash order) and either its value
    pickles here to ``encoded`` (it was read and not changed) or it equals ``value`` strictly
    (:func:`_strictly_equal`). Anything else is a change.
    """
    if stored == encoded:
        return True
    if not stored.startswith(_PREFIX):
        return False
    raw = binascii.a2b_base64(stored[len(_PREFIX):])
    if _HASH_ORDERED[0] not in raw and _HASH_ORDERED[1] not in raw:
        return False  # no hash order in it: the bytes differ because the state does
    try:
        old = pickle.loads(raw)
        # decoded again here, the stored value is built as the attempt's copy was: it
        # pickles to the same bytes unless the attempt changed its copy
        return encode_state(old) == encoded or _strictly_equal(old, value)
    except Exception:  # cannot be told apart: written, as a change would be
        return False


def _strictly_equal(a: Any, b: Any) -> bool:
    """``a == b`` with the same types throughout the built-in containers (``1``, ``1.0``
    and ``True`` are equal in Python, yet a change of state) and dicts in the same order."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return (len(a) == len(b) and _strictly_equal(list(a), list(b))
                and all(_strictly_equal(a[k], b[k]) for k in a))
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_strictly_equal(x, y) for x, y in zip(a, b))
    if type(a) in (set, frozenset):
        return {(type(x), x) for x in a} == {(type(x), x) for x in b}
    return bool(a == b)


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
