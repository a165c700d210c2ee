"""Persisted bot state (:class:`~ptb_fence.StateStore`) for the SQLite and PostgreSQL stores.

The table ``<table>_persistence`` holds ``user_data``, ``chat_data``, ``bot_data``,
conversation states and the callback-data cache. It has one row per
:class:`~ptb_fence.StateKey` with its version. Its statements are in each dialect's
``state.sql``. This module checks writes and builds their parameters.
:func:`apply_writes` says how a write lands.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ptb_fence._values import STATE_KINDS, StateEntry, StateKey, StateWrite

__all__ = [
    "LOCK_CLASS",
    "apply_writes",
    "check_kind",
    "check_writes",
    "list_params",
    "lock_params",
    "read_params",
    "settled_together",
    "state_table_name",
    "write_params",
]

LOCK_CLASS = 0x70746273  # "ptbs": the advisory-lock namespace of state keys (two-int form)
"""The first key of the PostgreSQL advisory locks on state keys (instances use another)."""

def state_table_name(table: str) -> str:
    """The state table of the update table ``table``: ``<table>_persistence``, or a name
    derived from a digest when that would be longer than 63 characters (PostgreSQL would
    truncate it silently)."""
    name = f"{table}_persistence"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(table.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_persistence"


def check_kind(kind: Optional[str]) -> None:
    """Refuse an unknown state kind (:exc:`ValueError` naming the kinds)."""
    if kind is not None and kind not in STATE_KINDS:
        raise ValueError(f"state kind {kind!r} is not one of {', '.join(STATE_KINDS)}")


def check_writes(writes: Sequence[StateWrite]) -> List[StateWrite]:
    """The writes as a list, checked: known kinds, text keys, versions ``>= 0``, text or
    :obj:`None` values, no key twice (its second write could never land)."""
    checked = list(writes)
    seen = set()
    for write in checked:
        key = write.key if type(write) is StateWrite else None
        if (  # the writes ptb_fence makes itself: checked without the messages' detours
            key is not None and type(key) is StateKey and key.kind in STATE_KINDS
            and type(key.name) is str and type(key.key) is str
            and type(write.version) is int and write.version >= 0
            and (write.value is None or type(write.value) is str) and key not in seen
        ):
            seen.add(key)
            continue
        if not isinstance(write, StateWrite):
            raise TypeError(f"not a StateWrite: {write!r}")
        check_kind(write.key.kind)
        if not isinstance(write.key.name, str) or not isinstance(write.key.key, str):
            raise TypeError(f"a StateKey's name and key are text: {write.key!r}")
        if isinstance(write.version, bool) or not isinstance(write.version, int) or (
            write.version < 0
        ):
            raise ValueError(f"a StateWrite's version is an int >= 0, got {write.version!r}")
        if write.value is not None and not isinstance(write.value, str):
            raise TypeError(f"a StateWrite's value is text or None, got {type(write.value)}")
        if write.key in seen:
            raise ValueError(f"{write.key!r} is written twice in one attempt")
        seen.add(write.key)
    return checked


def settled_together(
    stateful: Mapping[int, Sequence[StateWrite]], current: Mapping[StateKey, int]
) -> Set[int]:
    """The completions whose state writes can go with the completions without state.

    ``stateful`` maps each position to its writes, all in one transaction. The chosen ones
    settle with the completions without state and write afterwards in one go. For them no
    other completion writes any of their keys. Each key's version in ``current`` is the one
    the write read. ``current`` is read under the lock that keeps the keys, with ``0`` for an
    absent key. The others take the per-completion path, in input order. Their version moved,
    or two of them write a key. That path is a savepoint, the settle, and the conditional
    writes."""
    users: Dict[StateKey, int] = {}
    for writes in stateful.values():
        for write in writes:
            users[write.key] = users.get(write.key, 0) + 1
    return {
        position for position, writes in stateful.items()
        if all(users[w.key] == 1 and current.get(w.key, 0) == w.version for w in writes)
    }


def lock_params(state: str, writes: Sequence[StateWrite]) -> Dict[str, Any]:
    """The parameters of the PostgreSQL state lock on the table ``state``: a stable 32-bit
    number per key of ``writes`` (a collision only makes two keys queue together)."""
    numbers = set()
    for write in writes:
        text = "\x00".join((state, write.key.kind, write.key.name, write.key.key))
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        numbers.add(int.from_bytes(digest[:4], "big", signed=True))
    return {"keys": sorted(numbers)}


def read_params(keys: Sequence[StateKey]) -> Dict[str, Any]:
    """The parameters of the PostgreSQL ``state_read`` of ``keys``: three parallel arrays."""
    unique = list(dict.fromkeys(keys))
    return {
        "read_kinds": [key.kind for key in unique],
        "read_names": [key.name for key in unique],
        "read_keys": [key.key for key in unique],
    }


def list_params(
    kind: Optional[str], name: Optional[str], after: Optional[StateKey], limit: int
) -> Dict[str, Any]:
    """The parameters of the statement that lists state rows."""
    return {
        "kind": kind, "name": name, "limit": int(limit),
        "after_kind": None if after is None else after.kind,
        "after_name": None if after is None else after.name,
        "after_key": None if after is None else after.key,
    }


def write_params(write: StateWrite, at: int) -> Dict[str, Any]:
    """The parameters of one write's statement."""
    return {
        "kind": write.key.kind, "name": write.key.name, "key": write.key.key,
        "value": write.value, "version": int(write.version), "at": int(at),
    }


def entries_of(
    rows: Sequence[Sequence[Any]], asked: Optional[Sequence[StateKey]] = None
) -> Dict[StateKey, StateEntry]:
    """``(kind, name, key, value, version)`` rows as entries.

    The columns are text and integers in both dialects, so there is no conversion.
    ``asked`` are the keys the rows were read for, and their objects are reused.
    A read's keys are looked up right away in dicts keyed by the asked ones. So the same
    object is found without comparing, and none is built per row."""
    if asked is None:
        return {
            StateKey(kind, name, key): StateEntry(value, version)
            for kind, name, key, value, version in rows
        }
    known = {(k.kind, k.name, k.key): k for k in asked}
    out: Dict[StateKey, StateEntry] = {}
    for kind, name, key, value, version in rows:
        state_key = known.get((kind, name, key))
        if state_key is None:
            state_key = StateKey(kind, name, key)
        out[state_key] = StateEntry(value, version)
    return out


def apply_writes(
    statements: Tuple[str, str],
    returns_row: Callable[[str, Dict[str, Any]], bool],
    writes: Sequence[StateWrite],
    at: int,
) -> List[StateKey]:
    """Run each write's conditional statement and return the keys whose write did not land.

    ``statements`` are the insert of a key read as absent and the update of one read at a
    version. ``returns_row(statement, params)`` tells whether the statement returned a row.
    A write does not land when its version had moved. The caller rolls back to its savepoint
    when there are any.

    A row the writer read at version ``v`` is updated only ``WHERE version = v``.
    A row it read as absent is inserted ``ON CONFLICT DO NOTHING``.
    Either returns a row exactly when it landed. So a moved version is seen without a second
    read, and two transactions racing on one key never both land. On PostgreSQL the second
    waits for the first's row lock or its insert. Then it finds the new version and changes
    nothing.

    PostgreSQL first takes a transaction advisory lock per key written (:func:`lock_params`).
    It is one statement, with the keys in ascending order. So transactions that write
    overlapping keys queue in one order instead of deadlocking on each other's row locks and
    inserts. The items of one call then run in their input order. SQLite, which holds the
    write lock, and the memory store do the same.

    An attempt's writes land all together or not at all. They run inside a savepoint that
    also holds the attempt's settle. The store rolls back to it when one of them, or the
    settle, does not land. So the other attempts of a grouped completion still commit."""
    insert, update = statements
    moved = []
    for write in writes:
        params = write_params(write, at)
        statement = insert if write.version == 0 else update
        if not returns_row(statement, params):
            moved.append(write.key)
    return moved
