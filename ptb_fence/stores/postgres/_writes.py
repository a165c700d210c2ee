"""The batched statements of a PostgresUpdateStore's commit.

They record rows (plain and claimed at ingest, with duplicate-conflict warnings) and settle
several attempts in one transaction. The renewal results are read here too."""

from __future__ import annotations

import uuid
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ptb_fence._fingerprint import update_fingerprint
from ptb_fence._values import (
    Abandoned,
    AttemptEffects,
    AttemptIdentity,
    Completed,
    Failed,
    Landing,
    Settlement,
    StateConflict,
    StateWrite,
)
from ptb_fence.stores._duplicates import warn_conflict
from ptb_fence.stores._names import validate_update_id
from ptb_fence.stores._outbox_sql import effects_params, outbox_table_name
from ptb_fence.stores._queries import Statements
from ptb_fence.stores._state_sql import (
    apply_writes,
    check_writes,
    entries_of,
    lock_params,
    read_params,
    settled_together,
    state_table_name,
)
from ptb_fence.stores.postgres._executor import PgExecutor, returns_row
from ptb_fence.stores.postgres._broadcasts import write_broadcasts_in
from ptb_fence.stores.postgres._jobs import write_jobs_in

__all__ = [
    "CallsWritten",
    "Records",
    "batch_results",
    "insert_calls",
    "settle_owned_work",
    "settle_params",
    "write_state_in",
]

_Row = Tuple[int, str, int]


def batch_results(rows: List[Tuple[Any, ...]], count: int) -> List[Optional[bool]]:
    """``(position, renewed, still_matches)`` rows -> True / None (row locked) / False."""
    results: List[Optional[bool]] = [False] * count
    for position, renewed, matches in rows:
        results[int(position)] = True if renewed else (None if matches else False)
    return results


def _conflicts(
    sql: Statements, cur: Any, missing: List[Tuple[int, Optional[str]]]
) -> List[Tuple[Any, ...]]:
    """Rows of ids not inserted that hold a different update (for the WARNING)."""
    missing = [(u, f) for u, f in missing if f is not None]
    if not missing:
        return []
    cur.execute(sql["conflicts"], {
        "update_ids": [u for u, _ in missing], "fingerprints": [f for _, f in missing],
    })
    return [tuple(row) for row in cur.fetchall()]


def _warn(conflicts: List[Tuple[Any, ...]]) -> None:
    for update_id, stored, state, settled_at, new in conflicts:
        warn_conflict(int(update_id), stored, new, str(state), settled_at)


def _first_positions(rows: List[_Row]) -> Dict[int, int]:
    for row in rows:
        validate_update_id(row[0])
    first: Dict[int, int] = {}
    for position, (update_id, _body, _at) in enumerate(rows):
        first.setdefault(update_id, position)
    return first


class CallsWritten:
    """The outbox ids a transaction wrote per completion, and those inserted claimed."""

    __slots__ = ("ids", "sending")

    def __init__(self) -> None:
        self.ids: Dict[AttemptIdentity, List[int]] = {}
        self.sending: Set[int] = set()

    def written(
        self, owners: List[Tuple[AttemptIdentity, Any]], ids: List[int], sending: Set[int]
    ) -> None:
        """Note ``ids``, one per ``(identity, params)`` of ``owners``, in order."""
        self.ids.clear()  # a retried transaction writes them again
        for (identity, _), call_id in zip(owners, ids):
            self.ids.setdefault(identity, []).append(call_id)
        self.sending = set(sending)


class Records:
    """The insert of fresh rows, pending or claimed for attempt 1, as work on a cursor.

    Duplicates within the rows count at their first position only. The conflicts (a
    different update under an existing id) are logged after the commit.
    """

    __slots__ = ("_batch", "_claimed", "_first", "_legacy", "_params", "_prints", "_rows",
                 "_sql", "_statement", "conflicts", "inserted")

    def __init__(
        self,
        db: PgExecutor,
        rows: Sequence[_Row],
        *,
        lease_until: Optional[int] = None,
        instance: Optional[str] = None,
    ) -> None:
        self._rows = list(rows)
        self._first = _first_positions(self._rows)
        self._batch = [self._rows[position] for position in sorted(self._first.values())]
        self._prints = [update_fingerprint(body) for _, body, _ in self._batch]
        self._claimed = lease_until is not None
        # the seed's legacy table has no fingerprint: an existing id is always left alone
        self._legacy = not self._claimed and db.legacy()
        self._sql = db.sql
        self._params: Dict[str, Any] = {
            "update_ids": [row[0] for row in self._batch],
            "bodies": [row[1] for row in self._batch],
            "received_ats": [row[2] for row in self._batch],
        }
        if self._claimed:
            self._statement = db.sql["add_claimed"]
            self._params.update(
                lease_until=int(lease_until or 0), instance=instance,
                claim_ids=[uuid.uuid4().hex for _ in self._batch],
            )
        else:
            self._statement = db.sql["add_many_legacy" if self._legacy else "add_many"]
        if not self._legacy:
            self._params["fingerprints"] = self._prints
        self.inserted: Dict[int, Optional[AttemptIdentity]] = {}
        self.conflicts: List[Any] = []

    def run(self, cur: Any) -> None:
        """Insert the rows on ``cur`` (inside the caller's transaction)."""
        self.inserted, self.conflicts = {}, []
        if not self._batch:
            return
        cur.execute(self._statement, self._params)
        for row in cur.fetchall():
            identity = AttemptIdentity(int(row[0]), int(row[1]), str(row[2])) if self._claimed else None
            self.inserted[int(row[0])] = identity
        if not self._legacy:
            missing = [(u, fp) for (u, _, _), fp in zip(self._batch, self._prints)
                       if u not in self.inserted]
            self.conflicts = _conflicts(self._sql, cur, missing)

    def recorded(self) -> List[bool]:
        """Per row: new (inserted here) or a duplicate. Logs the conflicts."""
        _warn(self.conflicts)
        return [
            self._first[update_id] == position and update_id in self.inserted
            for position, (update_id, _body, _at) in enumerate(self._rows)
        ]

    def identities(self) -> List[Optional[AttemptIdentity]]:
        """Per claimed row: its identity, or :obj:`None` for a duplicate. Logs the conflicts."""
        return [
            self.inserted.get(update_id) if recorded else None
            for recorded, (update_id, _body, _at) in zip(self.recorded(), self._rows)
        ]


def settle_params(
    sql: Statements, update_id: int, attempt: int, settlement: Settlement, owned: bool
) -> Tuple[str, Dict[str, Any]]:
    """The statement and parameters that settle ``attempt`` (fenced if ``owned``)."""
    params: Dict[str, Any] = {"update_id": update_id, "attempt": attempt}
    if isinstance(settlement, Completed):
        name = "settle_completed"
        params.update(at=settlement.at)
    elif isinstance(settlement, Failed):
        name = "settle_failed"
        params.update(at=settlement.at, retry_at=settlement.retry_at, error=settlement.error)
    elif isinstance(settlement, Abandoned):
        name = "settle_abandoned"
        params.update(at=settlement.at, error=settlement.error)
    else:
        raise TypeError(f"not a settlement: {settlement!r}")
    return sql[name + "_owned" if owned else name], params


def settle_owned_work(
    db: PgExecutor,
    items: List[Tuple[AttemptIdentity, Settlement]],
    effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    calls: Optional["CallsWritten"] = None,
) -> Callable[[Any], List[Landing]]:
    """The settlements of a commit, as work to run on a cursor.

    Completions go in one statement, failures and abandonments in one statement each.
    Then, in the same transaction, come the jobs, the broadcasts and the outbox calls of
    ``effects`` for each completion that landed.

    The completions with state writes first take the advisory locks of every key written.
    They read those keys' versions in the same round trip. Some of them have versions that
    still hold and keys no other of them writes. Those settle with the completions without
    state, with their writes in the same statement. The writes land with their completion
    only. Any other settles on its own, in input order, in a savepoint with its writes.
    There all its writes land or none. A moved version gives its
    :class:`~ptb_fence.StateConflict`."""
    for each in (effects or {}).values():
        check_writes(each.state)  # refused before anything is written
    sql, table = db.sql, db.table

    def state_of(identity: AttemptIdentity) -> Tuple[StateWrite, ...]:
        queued = effects.get(identity) if effects else None
        return () if queued is None else queued.state

    stateful = [
        (position, identity, settlement, state_of(identity))
        for position, (identity, settlement) in enumerate(items)
        if isinstance(settlement, Completed) and state_of(identity)
    ]
    with_state = {position for position, _, _, _ in stateful}
    plain = [
        (position, identity, settlement)
        for position, (identity, settlement) in enumerate(items)
        if isinstance(settlement, Completed) and position not in with_state
    ]
    others = [
        (position, identity, settlement)
        for position, (identity, settlement) in enumerate(items)
        if not isinstance(settlement, Completed)
    ]
    prepared = []
    for position, identity, settlement in others:
        statement, params = settle_params(
            sql, identity.update_id, identity.attempt, settlement, owned=True
        )
        params["claim_id"] = identity.claim_id
        prepared.append((position, statement, params))

    writes_of = {position: writes for position, _, _, writes in stateful}
    written = [write for writes in writes_of.values() for write in writes]
    keys = list(dict.fromkeys(write.key for write in written))
    # a key two of them write: never settled together (see settled_together)
    disjoint = len(keys) == len(written)
    lock_keys = lock_params(state_table_name(table), written)["keys"] if stateful else []

    def complete(
        cur: Any, completed: List[Tuple[int, AttemptIdentity, Settlement]], grouped: bool
    ) -> Optional[Set[Tuple[int, int, str]]]:
        """Complete ``completed`` in one statement, with the state writes of those that have any.

        With ``grouped`` the statement follows the savepoint and the keys' locks, sent in the
        same round trip. It returns the identities that matched. It returns None when a
        write of a matched completion did not land."""
        # One row per distinct identity, since VALUES must not repeat a target row. The state
        # writes are those of the first position of each identity, the one that lands.
        seen: Set[AttemptIdentity] = set()
        unique = []
        writing: Dict[AttemptIdentity, Tuple[StateWrite, ...]] = {}
        for position, identity, settlement in completed:
            if identity not in seen:
                seen.add(identity)
                unique.append((identity, settlement))
                if writes_of.get(position):
                    writing[identity] = writes_of[position]
        values: Dict[str, Any] = {
            "keys": lock_keys,
            "update_ids": [identity.update_id for identity, _ in unique],
            "attempts": [identity.attempt for identity, _ in unique],
            "claim_ids": [identity.claim_id for identity, _ in unique],
            "ats": [settlement.at for _, settlement in unique],
        }
        if writing:
            rows = [
                (identity, settlement.at, write)
                for identity, settlement in unique for write in writing.get(identity, ())
            ]
            values.update(
                w_update_ids=[identity.update_id for identity, _, _ in rows],
                w_attempts=[identity.attempt for identity, _, _ in rows],
                w_claim_ids=[identity.claim_id for identity, _, _ in rows],
                w_kinds=[write.key.kind for _, _, write in rows],
                w_names=[write.key.name for _, _, write in rows],
                w_keys=[write.key.key for _, _, write in rows],
                w_values=[write.value for _, _, write in rows],
                w_ats=[at for _, at, _ in rows],
                w_versions=[int(write.version) for _, _, write in rows],
            )
        statement = sql["complete_owned_writing" if writing else "complete_owned_many"]
        # the savepoint and the locks, then the completions: one query, one round trip
        prefix = sql["state_group_then_lock"] + "\n" if grouped else ""
        cur.execute(prefix + statement, values)
        results = cur.fetchall()
        matched = {(int(row[0]), int(row[1]), str(row[2])) for row in results}
        if writing:
            expected = sum(
                len(writes) for identity, writes in writing.items()
                if (identity.update_id, identity.attempt, identity.claim_id) in matched
            )
            if (int(results[0][3]) if results else 0) != expected:
                return None
        return matched

    def work(cur: Any) -> List[Landing]:
        landed: List[Landing] = [False] * len(items)
        together: Set[int] = set()
        matched: Optional[Set[Tuple[int, int, str]]] = None
        completed: List[Tuple[int, AttemptIdentity, Settlement]] = []
        if stateful and disjoint:
            # The common case, in one round trip: every version the attempts read still
            # holds. A savepoint, the keys' locks, then the completions with every write,
            # each landing only if its version did. One that did not: back to the savepoint,
            # and the versions are read to tell which attempts it stops.
            together = set(writes_of)
            completed = sorted(plain + [(p, i, s) for p, i, s, _ in stateful],
                               key=lambda item: item[0])
            matched = complete(cur, completed, True)
            if matched is None:
                cur.execute(sql["state_rollback_group"])
                together = set()
        if matched is None:
            if stateful:
                # every writer of these keys takes their locks first: the versions read
                # once they are held are the ones the writes meet
                cur.execute(sql["state_lock_then_read"], {"keys": lock_keys, **read_params(keys)})
                current = {key: entry.version
                           for key, entry in entries_of(cur.fetchall(), keys).items()}
                together = settled_together(writes_of, current)
            completed = sorted(plain + [(p, i, s) for p, i, s, _ in stateful if p in together],
                               key=lambda item: item[0])
            for position, identity, settlement, writes in stateful:
                if position in together:
                    continue  # settles with the completions below, writes with them
                statement, params = settle_params(
                    sql, identity.update_id, identity.attempt, settlement, owned=True
                )
                params["claim_id"] = identity.claim_id
                landed[position] = _settle_with_state(sql, cur, statement, params, writes,
                                                      settlement.at)
            if completed:
                matched = complete(cur, completed, False)
                if matched is None:  # the whole transaction rolls back
                    raise RuntimeError(
                        "state rows changed while their locks were held: a checked write "
                        "did not land"
                    )
        claimed: Set[Tuple[int, int, str]] = set()
        for position, identity, _ in completed:
            key = (identity.update_id, identity.attempt, identity.claim_id)
            if matched is not None and key in matched and key not in claimed:
                claimed.add(key)
                landed[position] = True
        for position, statement, params in prepared:
            landed[position] = returns_row(cur, statement, params)
        if effects:  # one insert_calls: its chat locks sorted across the attempts
            ended = completed + [(p, i, s) for p, i, s, _ in stateful if p not in together]
            # the jobs and broadcasts before the calls: the chat locks come last
            for position, identity, done in sorted(ended, key=lambda item: item[0]):
                queued = effects.get(identity)
                if landed[position] is True and queued is not None:
                    write_jobs_in(sql, cur, queued, done.at)
                    write_broadcasts_in(sql, cur, queued.broadcasts, done.at)
            owners = [
                (identity, params)
                for position, identity, settlement in sorted(ended, key=lambda item: item[0])
                if landed[position]
                for params in effects_params(identity, effects.get(identity), settlement.at)
            ]
            sending: Set[int] = set()
            ids = insert_calls(sql, table, cur, [params for _, params in owners], sending)
            if calls is not None:
                calls.written(owners, ids, sending)
        return landed

    return work


def _settle_with_state(
    sql: Statements,
    cur: Any,
    statement: str,
    params: Dict[str, Any],
    writes: Sequence[StateWrite],
    at: int,
) -> Landing:
    """One completion and its state writes in a savepoint: all land, or none."""
    cur.execute(sql["state_savepoint"])
    if not returns_row(cur, statement, params):
        cur.execute(sql["state_rollback_to"])
        cur.execute(sql["state_release"])
        return False
    moved = write_state_in(sql, cur, writes, at)
    if moved:
        cur.execute(sql["state_rollback_to"])
        cur.execute(sql["state_release"])
        return StateConflict(tuple(moved))
    cur.execute(sql["state_release"])
    return True


def write_state_in(
    sql: Statements, cur: Any, writes: Sequence[StateWrite], at: int
) -> List[Any]:
    """Run the conditional state writes in the cursor's transaction.

    It returns the keys that moved. The caller rolls back what the others wrote."""
    return apply_writes(
        (sql["state_insert"], sql["state_update"]),
        lambda s, p: returns_row(cur, s, p), writes, at,
    )


def insert_calls(
    sql: Statements,
    table: str,
    cur: Any,
    calls: Sequence[Dict[str, Any]],
    sending: Optional[Set[int]] = None,
) -> List[int]:
    """Insert outbox calls in the cursor's transaction and return their call ids, in order.

    ``sending`` collects the ids inserted claimed for their sender.

    Calls to insert claimed first lock their chats, sorted so that two transactions never
    wait on each other in a cycle. So a concurrent transaction's claimed insert for the same
    chat is committed, and seen by the chat check, before this one's. A chat never gets two
    claimed calls at once. The locks come after every other statement of the transaction
    (the settles), and nothing after them waits for a row lock."""
    chats = sorted({int(p["chat_key"]) for p in calls if p["claim"] and p["chat_key"] is not None})
    outbox = outbox_table_name(table)
    for chat in chats:
        cur.execute(sql["outbox_lock_chat"], {"outbox": outbox, "chat_key": chat})
    ids = []
    for params in calls:
        cur.execute(sql["outbox_insert"], params)
        call_id, state = cur.fetchone()
        ids.append(int(call_id))
        if sending is not None and state == "sending":
            sending.add(int(call_id))
    return ids
