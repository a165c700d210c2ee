"""The batched statements of a PostgresUpdateStore: record (plain and claimed at ingest, with
duplicate-conflict warnings), settle several attempts in one transaction, renewal results."""

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
from ptb_fence.stores._outbox_sql import effects_params
from ptb_fence.stores._state_sql import (
    apply_writes,
    check_writes,
    entries_of,
    settled_together,
)
from ptb_fence.stores.postgres._executor import PgExecutor, returns_row
from ptb_fence.stores.postgres._sql import PostgresStatements

__all__ = [
    "add_claimed",
    "add_many",
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
    sql: PostgresStatements, cur: Any, missing: List[Tuple[int, Optional[str]]]
) -> List[Tuple[Any, ...]]:
    """Rows of ids not inserted that hold a different update (for the WARNING)."""
    missing = [(u, f) for u, f in missing if f is not None]
    if not missing:
        return []
    cur.execute(sql.conflicts, ([u for u, _ in missing], [f for _, f in missing]))
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


def add_many(db: PgExecutor, rows: Sequence[_Row]) -> List[bool]:
    """Insert ``rows`` in one statement and commit (see ``PostgresUpdateStore.add_many``)."""
    rows = list(rows)
    first = _first_positions(rows)
    if not rows:
        return []
    batch = [rows[position] for position in sorted(first.values())]
    prints = [update_fingerprint(body) for _, body, _ in batch]

    def make_work(fingerprint: bool) -> Callable[[Any], Tuple[Set[int], List[Any]]]:
        sql = db.sql.add_many(len(batch), fingerprint)
        params: List[Any] = []
        for row, fp in zip(batch, prints):
            params += [*row, fp] if fingerprint else list(row)

        def work(cur: Any) -> Tuple[Set[int], List[Any]]:
            cur.execute(sql, params)
            done = {int(row[0]) for row in cur.fetchall()}
            if not fingerprint:
                return done, []
            missing = [(u, fp) for (u, _, _), fp in zip(batch, prints) if u not in done]
            return done, _conflicts(db.sql, cur, missing)

        return work

    inserted, conflicts = db.run_fingerprinted(make_work)
    _warn(conflicts)
    return [
        first[update_id] == position and update_id in inserted
        for position, (update_id, _body, _at) in enumerate(rows)
    ]


def add_claimed(
    db: PgExecutor,
    rows: Sequence[_Row],
    lease_until: int,
    settlements: Sequence[Tuple[AttemptIdentity, Settlement]],
    instance: Optional[str] = None,
    effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
) -> Tuple[List[Optional[AttemptIdentity]], List[Landing]]:
    """Record-and-claim ``rows`` (recording ``instance`` where the table has that column) and
    settle ``settlements`` (with the outbox calls of ``effects``) in one transaction; log the
    conflicts (a different update held by a live row) after the commit."""
    rows = list(rows)
    first = _first_positions(rows)
    items = list(settlements)
    settle_work = settle_owned_work(db.sql, items, effects) if items else None
    batch = [rows[position] for position in sorted(first.values())]
    prints = [update_fingerprint(body) for _, body, _ in batch]
    with_instance = bool(batch) and db.has_column("instance")

    def make_work(
        fingerprint: bool,
    ) -> Callable[[Any], Tuple[Dict[int, AttemptIdentity], List[Any], List[Landing]]]:
        recorded = fingerprint and with_instance
        sql = db.sql.add_claimed_many(len(batch), fingerprint, recorded) if batch else ""
        params: List[Any] = [int(lease_until)]
        if recorded:
            params.append(instance)
        for (update_id, body, received_at), fp in zip(batch, prints):
            params += [update_id, body, received_at, uuid.uuid4().hex]
            if fingerprint:
                params.append(fp)

        def work(cur: Any) -> Tuple[Dict[int, AttemptIdentity], List[Any], List[Landing]]:
            inserted: Dict[int, AttemptIdentity] = {}
            conflicts: List[Any] = []
            if batch:
                cur.execute(sql, params)
                inserted = {
                    int(u): AttemptIdentity(int(u), int(a), str(c)) for u, a, c in cur.fetchall()
                }
                if fingerprint:
                    missing = [
                        (u, fp) for (u, _, _), fp in zip(batch, prints) if u not in inserted
                    ]
                    conflicts = _conflicts(db.sql, cur, missing)
            landed: List[Landing] = settle_work(cur) if settle_work is not None else []
            return inserted, conflicts, landed

        return work

    inserted, conflicts, landed = db.run_fingerprinted(make_work)
    _warn(conflicts)
    claimed = [
        inserted.get(update_id) if first[update_id] == position else None
        for position, (update_id, _body, _at) in enumerate(rows)
    ]
    return claimed, landed


def settle_params(
    sql: PostgresStatements, update_id: int, attempt: int, settlement: Settlement, owned: bool
) -> Tuple[str, Dict[str, Any]]:
    """The statement and parameters that settle ``attempt`` (fenced if ``owned``)."""
    params: Dict[str, Any] = {"update_id": update_id, "attempt": attempt}
    if isinstance(settlement, Completed):
        statement = sql.settle_completed_owned if owned else sql.settle_completed
        params.update(at=settlement.at)
    elif isinstance(settlement, Failed):
        statement = sql.settle_failed_owned if owned else sql.settle_failed
        params.update(at=settlement.at, retry_at=settlement.retry_at, error=settlement.error)
    elif isinstance(settlement, Abandoned):
        statement = sql.settle_abandoned_owned if owned else sql.settle_abandoned
        params.update(at=settlement.at, error=settlement.error)
    else:
        raise TypeError(f"not a settlement: {settlement!r}")
    return statement, params


def settle_owned_work(
    sql: PostgresStatements,
    items: List[Tuple[AttemptIdentity, Settlement]],
    effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
) -> Callable[[Any], List[Landing]]:
    """The statements of ``settle_owned_many`` (completions in one statement, failures and
    abandonments one statement each), to run on a cursor; then, in the same transaction, the
    outbox calls of ``effects`` for each completion that landed.

    The completions with state writes first take the advisory locks of every key written
    and read those keys' versions (one round trip). Those whose versions still hold and whose
    keys no other of them writes settle with the completions without state, their writes in
    the same statement (landing with their completion only). Any other settles on its own, in
    a savepoint with its writes (all land or none; a moved version gives its
    :class:`~ptb_fence.StateConflict`), in input order."""
    for each in (effects or {}).values():
        check_writes(each.state)  # refused before anything is written

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
    lock_keys = sql.state.lock_params(written)["keys"] if stateful else []

    def complete(
        cur: Any, completed: List[Tuple[int, AttemptIdentity, Settlement]], prefix: str,
        prefix_params: List[Any],
    ) -> Optional[Set[Tuple[int, int, str]]]:
        """Complete ``completed`` in one statement (after ``prefix``, sent in the same round
        trip), with the state writes of those of them that have any; the identities that
        matched, or None when a write of a matched completion did not land."""
        # one row per distinct identity (VALUES must not repeat a target row); the state
        # writes of the first position of each identity, the one that lands
        seen: Set[AttemptIdentity] = set()
        unique = []
        writing: Dict[AttemptIdentity, Tuple[StateWrite, ...]] = {}
        for position, identity, settlement in completed:
            if identity not in seen:
                seen.add(identity)
                unique.append((identity, settlement))
                if writes_of.get(position):
                    writing[identity] = writes_of[position]
        values: List[Any] = list(prefix_params)
        for identity, settlement in unique:
            values += [identity.update_id, identity.attempt, identity.claim_id, settlement.at]
        if writing:
            rows = 0
            for identity, settlement in unique:
                for write in writing.get(identity, ()):
                    values += [identity.update_id, identity.attempt, identity.claim_id,
                               write.key.kind, write.key.name, write.key.key, write.value,
                               settlement.at, int(write.version)]
                    rows += 1
            cur.execute(prefix + sql.complete_owned_writing(len(unique), rows), values)
        else:
            cur.execute(prefix + sql.complete_owned_many(len(unique)), values)
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
            matched = complete(cur, completed, sql.state.savepoint_then_lock, [lock_keys])
            if matched is None:
                cur.execute(sql.state.rollback_group)
                together = set()
        if matched is None:
            if stateful:
                # every writer of these keys takes their locks first: the versions read
                # once they are held are the ones the writes meet
                groups, read_params = sql.state.read_any_params(keys)
                cur.execute(sql.state.lock_then_read(groups), [lock_keys, *read_params])
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
                matched = complete(cur, completed, "", [])
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
            insert_calls(sql, cur, [
                params
                for position, identity, settlement in sorted(ended, key=lambda item: item[0])
                if landed[position]
                for params in effects_params(identity, effects.get(identity), settlement.at)
            ])
        return landed

    return work


def _settle_with_state(
    sql: PostgresStatements,
    cur: Any,
    statement: str,
    params: Dict[str, Any],
    writes: Sequence[StateWrite],
    at: int,
) -> Landing:
    """One completion and its state writes in a savepoint: all land, or none."""
    cur.execute(sql.state.savepoint)
    if not returns_row(cur, statement, params):
        cur.execute(sql.state.rollback_to)
        cur.execute(sql.state.release)
        return False
    moved = write_state_in(sql, cur, writes, at)
    if moved:
        cur.execute(sql.state.rollback_to)
        cur.execute(sql.state.release)
        return StateConflict(tuple(moved))
    cur.execute(sql.state.release)
    return True


def write_state_in(
    sql: PostgresStatements, cur: Any, writes: Sequence[StateWrite], at: int
) -> List[Any]:
    """The conditional state writes in the cursor's transaction; the keys that moved (the
    caller rolls back what the others wrote)."""
    return apply_writes(sql.state, lambda s, p: returns_row(cur, s, p), writes, at)


def insert_calls(
    sql: PostgresStatements, cur: Any, calls: Sequence[Dict[str, Any]]
) -> List[int]:
    """Insert outbox calls in the cursor's transaction; their call ids, in order.

    Calls to insert claimed first lock their chats (sorted: two transactions never wait on
    each other in a cycle), so that a concurrent transaction's claimed insert for the same
    chat is committed, and seen by the chat check, before this one's: a chat never gets two
    claimed calls at once. The locks come after every other statement of the transaction
    (the settles), and nothing after them waits for a row lock."""
    chats = sorted({int(p["chat_key"]) for p in calls if p["claim"] and p["chat_key"] is not None})
    for chat in chats:
        cur.execute(sql.outbox.lock_chat, {"chat_key": chat})
    ids = []
    for params in calls:
        cur.execute(sql.outbox.insert, params)
        ids.append(int(cur.fetchone()[0]))
    return ids
