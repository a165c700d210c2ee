"""Persisted bot state's SQL (:class:`~ptb_fence.StateStore`), shared by the SQLite and
PostgreSQL stores: the table ``<table>_persistence`` of ``user_data``, ``chat_data``,
``bot_data``, conversation states and the callback-data cache, one row per
:class:`~ptb_fence.StateKey` with its version, and every statement on it, written once with
``:name`` placeholders (PostgreSQL gets ``%(name)s``).

A write is one conditional statement: a row the writer read at version ``v`` is updated only
``WHERE version = v``; a row it read as absent is inserted ``ON CONFLICT DO NOTHING``. Either
returns a row exactly when it landed, so a moved version is seen without a second read, and
two transactions racing on one key never both land (PostgreSQL: the second waits for the
first's row lock or its insert, then finds the new version and changes nothing).

PostgreSQL first takes a transaction advisory lock per key written (one statement, the keys
in ascending order), so transactions that write overlapping keys queue in one order instead of
deadlocking on each other's row locks and inserts; the items of one call then run in their
input order, as in SQLite (which holds the write lock) and the memory store.

An attempt's writes land all together or not at all: they run inside a savepoint that also
holds the attempt's settle, rolled back to when one of them (or the settle) does not land, so
the other attempts of a grouped completion still commit.

Table names are validated before they reach this module and always double-quoted.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ptb_fence._values import STATE_KINDS, StateEntry, StateKey, StateWrite

__all__ = [
    "GROUP_SAVEPOINT",
    "SAVEPOINT",
    "StateStatements",
    "apply_writes",
    "check_kind",
    "check_writes",
    "settled_together",
    "state_table_name",
    "write_params",
]

SAVEPOINT = "ptb_fence_state"
"""The savepoint that holds one attempt's settle and state writes."""

GROUP_SAVEPOINT = "ptb_fence_group"
"""The savepoint of a grouped completion's try with the versions its attempts read."""

LOCK_CLASS = 0x70746273  # "ptbs": the advisory-lock namespace of state keys (two-int form)
"""The first key of the PostgreSQL advisory locks on state keys (instances use another)."""

_LOCK = (
    f"SELECT count(pg_advisory_xact_lock({LOCK_CLASS}, k)) FROM "
    "(SELECT DISTINCT unnest({keys}::int[]) AS k ORDER BY k) AS keys"
)


def state_table_name(table: str) -> str:
    """The state table of the update table ``table``: ``<table>_persistence``, or a name
    derived from a digest when that would be longer than 63 characters (PostgreSQL would
    truncate it silently)."""
    name = f"{table}_persistence"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(table.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_persistence"


def _postgres(sql: str) -> str:
    return re.sub(r"(?<![:\w]):([a-z_0-9]+)", r"%(\1)s", sql)


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
    """Of the completions with state writes in one transaction (position: its writes), those
    that settle with the completions without state and write afterwards in one go: no other
    of them writes any of their keys, and each key's version in ``current`` (read under the
    lock that keeps the keys, absent: ``0``) is the one the write read. The others (a version
    that moved, a key two of them write) take the per-completion path: a savepoint, the
    settle, the conditional writes, in input order."""
    users: Dict[StateKey, int] = {}
    for writes in stateful.values():
        for write in writes:
            users[write.key] = users.get(write.key, 0) + 1
    return {
        position for position, writes in stateful.items()
        if all(users[w.key] == 1 and current.get(w.key, 0) == w.version for w in writes)
    }


def write_params(write: StateWrite, at: int) -> Dict[str, Any]:
    """The parameters of one write's statement."""
    return {
        "kind": write.key.kind, "name": write.key.name, "key": write.key.key,
        "value": write.value, "version": int(write.version), "at": int(at),
    }


class StateStatements:
    """Every statement on the state table of one update table, for one dialect.

    Args:
        table: The update table (validated).
        postgres: PostgreSQL (``%(name)s``, ``BIGINT``); else SQLite.
    """

    __slots__ = (
        "create",
        "exists",
        "insert",
        "list",
        "lock",
        "name",
        "postgres",
        "prune",
        "release",
        "rollback_group",
        "rollback_to",
        "savepoint",
        "savepoint_then_lock",
        "update",
    )

    def __init__(self, table: str, *, postgres: bool) -> None:
        self.name: str = state_table_name(table)
        self.postgres = postgres
        s = f'"{self.name}"'
        integer = "BIGINT" if postgres else "INTEGER"
        dialect = _postgres if postgres else (lambda sql: sql)
        self.create: Tuple[str, ...] = (f"""
CREATE TABLE IF NOT EXISTS {s} (
    kind       TEXT      NOT NULL,  -- user, chat, bot, conversation, callback
    name       TEXT      NOT NULL,  -- the conversation handler's name, else ''
    key        TEXT      NOT NULL,  -- user/chat id, conversation key JSON, else ''
    value      TEXT,                -- the encoded state; NULL: deleted (a tombstone)
    version    {integer} NOT NULL,  -- how many writes landed on the row
    updated_at {integer} NOT NULL,  -- epoch milliseconds of the last write
    PRIMARY KEY (kind, name, key)
)""",)
        self.exists: str = (
            "SELECT to_regclass(%(state)s)" if postgres
            else "SELECT name FROM sqlite_master WHERE type = 'table' AND name = :state"
        )
        self.insert: str = dialect(f"""
INSERT INTO {s} (kind, name, key, value, version, updated_at)
VALUES (:kind, :name, :key, :value, 1, :at)
ON CONFLICT (kind, name, key) DO NOTHING
RETURNING version""")
        self.update: str = dialect(f"""
UPDATE {s} SET value = :value, version = version + 1, updated_at = :at
WHERE kind = :kind AND name = :name AND key = :key AND version = :version
RETURNING version""")
        self.list: str = dialect(f"""
SELECT kind, name, key, value, version FROM {s}
WHERE (CAST(:kind AS TEXT) IS NULL OR kind = :kind)
  AND (CAST(:name AS TEXT) IS NULL OR name = :name)
  AND (CAST(:after_kind AS TEXT) IS NULL
       OR (kind, name, key) > (:after_kind, :after_name, :after_key))
ORDER BY kind, name, key
LIMIT :limit""")
        # the callback-data cache's keyboards written before the retain period (the only
        # state prune deletes: a keyboard row is written once and never read back into
        # anything but PTB's cache, which holds at most maxsize keyboards anyway)
        self.prune: str = dialect(f"""
DELETE FROM {s} WHERE kind = 'callback' AND updated_at < :before""")
        # PostgreSQL: one advisory lock per written key, ascending (see the module)
        self.lock: str = _LOCK.format(keys="%(keys)s")
        # the savepoint of a grouped completion's one-round-trip try (PostgreSQL)
        self.savepoint_then_lock = f"SAVEPOINT {GROUP_SAVEPOINT}; {_LOCK.format(keys='%s')}; "
        self.rollback_group = f"ROLLBACK TO SAVEPOINT {GROUP_SAVEPOINT}"
        self.savepoint = f"SAVEPOINT {SAVEPOINT}"
        self.rollback_to = f"ROLLBACK TO SAVEPOINT {SAVEPOINT}"
        self.release = f"RELEASE SAVEPOINT {SAVEPOINT}"

    def read_groups(self, counts: Sequence[int]) -> str:
        """SQLite: one ``SELECT`` of the keys of several (kind, name) groups, ``counts[i]``
        keys in group ``i`` (parameters per group: kind, name, its keys), joined by ``UNION
        ALL``: a search of the primary key per key. (A row-value ``IN (VALUES ...)`` scans
        the whole table in SQLite.) It returns one row, the rows found as a JSON array of
        ``[kind, name, key, value, version]`` arrays: Python's sqlite3 lets go of the GIL for
        every row it steps to, and a store thread that wants it back waits for the event
        loop's thread to yield it (up to the switch interval, 5 ms) once per row (measured:
        300 rows beside a busy thread, about 1 s as rows, 3 ms as one JSON row)."""
        union = " UNION ALL ".join(
            f'SELECT kind, name, key, value, version FROM "{self.name}" '
            f"WHERE kind = ? AND name = ? AND key IN ({', '.join(['?'] * count)})"
            for count in counts
        )
        return (f"SELECT json_group_array(json_array(kind, name, key, value, version)) "
                f"FROM ({union})")

    def read_any(self, groups: int) -> str:
        """PostgreSQL: one ``SELECT`` of the keys of ``groups`` (kind, name) groups
        (parameters per group: the list of keys, kind, name; see :meth:`read_any_params`),
        joined by ``UNION ALL``: few parameters however many keys. Each key is one search of
        the primary key, whatever the table's statistics say: the keys are unnested and each
        looked up in a ``LATERAL`` subquery with ``LIMIT 1``, which the planner cannot turn
        into a hash join or a filter. (``key = ANY(%s)`` was planned, on a table not yet
        analyzed, as a scan of every row of the kind and name filtered by the array:
        27 ms against 1.4 ms for 97 keys among 60,000 rows.)"""
        one = ('SELECT s.kind, s.name, s.key, s.value, s.version '
               "FROM unnest(%s::text[]) AS k(key), LATERAL ("
               f'SELECT kind, name, key, value, version FROM "{self.name}" AS t '
               "WHERE t.kind = %s AND t.name = %s AND t.key = k.key LIMIT 1) AS s")
        return " UNION ALL ".join([one] * groups)

    def lock_then_read(self, groups: int) -> str:
        """PostgreSQL: :attr:`lock`, then :meth:`read_any`, sent as one query (one round trip,
        one wait of the store thread for the GIL instead of two). Parameters: the sorted lock
        numbers (the ``keys`` of :meth:`lock_params`), then those of :meth:`read_any`. Each
        statement of a multi-statement query takes its own snapshot (READ COMMITTED), so the
        read, which starts once every lock is held, sees what their previous holders
        committed; the driver returns the rows of the last statement, the read's."""
        return f"{_LOCK.format(keys='%s')}; {self.read_any(groups)}"

    @staticmethod
    def read_any_params(keys: Sequence[StateKey]) -> Tuple[int, List[Any]]:
        """The group count and the parameters of :meth:`read_any` for ``keys``."""
        groups: Dict[Tuple[str, str], List[str]] = {}
        for key in dict.fromkeys(keys):
            groups.setdefault((key.kind, key.name), []).append(key.key)
        params: List[Any] = []
        for (kind, name), names in groups.items():
            params += [names, kind, name]
        return len(groups), params

    def insert_rows(self, count: int) -> str:
        """SQLite: ``count`` checked inserts in one statement (positional parameters ``kind,
        name, key, value, at`` per row). One statement, one step: Python's sqlite3 lets go of
        the GIL at every step, and an ``executemany`` steps once per row."""
        values = ", ".join(["(?, ?, ?, ?, 1, ?)"] * count)
        return (f'INSERT INTO "{self.name}" (kind, name, key, value, version, updated_at) '
                f"VALUES {values}")

    def update_rows(self, count: int) -> str:
        """SQLite: ``count`` checked updates in one ``UPDATE ... FROM (VALUES ...)`` (positional
        parameters ``kind, name, key, value, at, version`` per row; each row a search of the
        primary key), one step as :meth:`insert_rows`."""
        values = ", ".join(["(?, ?, ?, ?, ?, ?)"] * count)
        return (
            f'UPDATE "{self.name}" AS t SET value = v.column4, version = t.version + 1, '
            f"updated_at = v.column5 FROM (VALUES {values}) AS v "
            "WHERE t.kind = v.column1 AND t.name = v.column2 AND t.key = v.column3 "
            "AND t.version = v.column6"
        )

    def lock_params(self, writes: Sequence[StateWrite]) -> Dict[str, Any]:
        """The parameters of :attr:`lock`: a stable 32-bit number per key of ``writes`` (a
        collision only makes two keys queue together)."""
        numbers = set()
        for write in writes:
            text = "\x00".join((self.name, write.key.kind, write.key.name, write.key.key))
            digest = hashlib.sha256(text.encode("utf-8")).digest()
            numbers.add(int.from_bytes(digest[:4], "big", signed=True))
        return {"keys": sorted(numbers)}

    @staticmethod
    def list_params(
        kind: Optional[str], name: Optional[str], after: Optional[StateKey], limit: int
    ) -> Dict[str, Any]:
        """The parameters of :attr:`list`."""
        return {
            "kind": kind, "name": name, "limit": int(limit),
            "after_kind": None if after is None else after.kind,
            "after_name": None if after is None else after.name,
            "after_key": None if after is None else after.key,
        }


def entries_of(
    rows: Sequence[Sequence[Any]], asked: Optional[Sequence[StateKey]] = None
) -> Dict[StateKey, StateEntry]:
    """``(kind, name, key, value, version)`` rows as entries (the columns are text and
    integers in both dialects: no conversion). ``asked``: the keys the rows were read for,
    whose objects are reused (a read's keys are looked up right away in dicts keyed by the
    asked ones: the same object is found without comparing, and none is built per row)."""
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
    sql: StateStatements,
    returns_row: Callable[[str, Dict[str, Any]], bool],
    writes: Sequence[StateWrite],
    at: int,
) -> List[StateKey]:
    """Run each write's conditional statement (``returns_row(statement, params)``: whether it
    returned a row); the keys whose write did not land (their version had moved). The caller
    rolls back to its savepoint when there are any."""
    moved = []
    for write in writes:
        params = write_params(write, at)
        statement = sql.insert if write.version == 0 else sql.update
        if not returns_row(statement, params):
            moved.append(write.key)
    return moved
