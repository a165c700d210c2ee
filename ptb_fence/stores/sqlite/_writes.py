"""The statements of a SQLiteUpdateStore that several of its methods share: record (plain
and claimed at ingest, with duplicate-conflict warnings), claim, settle (single and several in
one transaction), argument checks."""

from __future__ import annotations

import json
import operator
import sqlite3
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

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
    StateEntry,
    StateKey,
    StateWrite,
)
from ptb_fence.contract import ClaimTerms
from ptb_fence.stores._duplicates import warn_conflict
from ptb_fence.stores._outbox_sql import effects_params
from ptb_fence.stores._queries import Statements
from ptb_fence.stores._state_sql import (
    apply_writes,
    check_writes,
    entries_of,
    settled_together,
    write_params,
)
from ptb_fence.stores.sqlite._connections import SQLiteConnections
from ptb_fence.stores.sqlite._broadcasts import write_broadcasts_in
from ptb_fence.stores.sqlite._jobs import write_jobs_in
from ptb_fence.stores.sqlite._schema import new_claim_id
from ptb_fence.stores._suspects import SuspectClaims

__all__ = [
    "claim_params",
    "add_claimed_in",
    "add_in",
    "insert_calls",
    "int_arg",
    "settle_owned_in",
    "settle_params",
    "settle_statement",
    "take",
]



def int_arg(name: str, value: Any) -> int:
    """``value`` as an int, else a clear :exc:`TypeError`, since NULL must never reach SQL."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an int (epoch milliseconds or a count), got {value!r}"
        ) from None


def add_in(
    sql: Statements, conn: sqlite3.Connection, update_id: int, body: str, received_at: int
) -> bool:
    """Insert a pending row inside ``conn``'s transaction (an existing id: see ``_duplicates``)."""
    fingerprint = update_fingerprint(body)
    params = {
        "update_id": update_id,
        "body": body,
        "received_at": received_at,
        "fingerprint": fingerprint,
    }
    if conn.execute(sql["add"], params).rowcount == 1:
        return True
    _warn_if_different(sql, conn, update_id, fingerprint)
    return False


def _warn_if_different(
    sql: Statements, conn: sqlite3.Connection, update_id: int, fingerprint: Optional[str]
) -> None:
    """After an insert that did not happen: log a different update held by a live row."""
    row = conn.execute(sql["stored_fingerprint"], {"update_id": update_id}).fetchone()
    if row is not None:
        warn_conflict(update_id, row[0], fingerprint, str(row[1]), row[2])


def add_claimed_in(
    sql: Statements,
    conn: sqlite3.Connection,
    rows: Sequence[Tuple[int, str, int]],
    lease_until: int,
    instance: Optional[str] = None,
) -> List[Optional[AttemptIdentity]]:
    """Insert ``rows`` claimed for attempt 1 (by ``instance``) inside ``conn``'s transaction
    (None: existed)."""
    result: List[Optional[AttemptIdentity]] = []
    for update_id, body, received_at in rows:
        fingerprint = update_fingerprint(body)
        found = conn.execute(
            sql["add_claimed"],
            {
                "update_id": update_id,
                "body": body,
                "received_at": received_at,
                "lease_until": lease_until,
                "claim_id": new_claim_id(),
                "fingerprint": fingerprint,
                "instance": instance,
            },
        ).fetchall()
        if not found:
            _warn_if_different(sql, conn, update_id, fingerprint)
        result.append(
            AttemptIdentity(update_id, int(found[0][0]), str(found[0][1])) if found else None
        )
    return result


def claim_params(terms: ClaimTerms, instance: Optional[str]) -> Dict[str, Any]:
    """The parameters every claim statement takes, as checked integers (``durable`` as 0/1)."""
    return {
        "now": int_arg("now", terms.now),
        "lease_until": int_arg("lease_until", terms.lease_until),
        "max_attempts": int_arg("max_attempts", terms.max_attempts),
        "durable": 1 if terms.durable_exhaustion else 0,
        "instance": instance,
    }


def take(
    conns: SQLiteConnections,
    sql: Statements,
    update_id: int,
    terms: ClaimTerms,
    instance: Optional[str] = None,
    statement: Optional[str] = None,
    suspects: Optional[SuspectClaims] = None,
) -> Optional[AttemptIdentity]:
    """Claim ``update_id`` for ``instance`` in one write transaction.

    It returns the identity, or None if the row was not taken. ``statement`` is another claim
    statement with the same parameters, such as the chat-order claim. It defaults to
    ``sql["claim_owned"]``. The suspicion of the row it took is noted in ``suspects``."""
    params = claim_params(terms, instance)
    params.update(update_id=update_id, claim_id=new_claim_id())
    with conns.immediate() as conn:
        rows = conn.execute(statement or sql["claim_owned"], params).fetchall()
    if not rows or rows[0][0] != "processing":
        return None
    _, attempt, claim_id, suspicion = rows[0]
    identity = AttemptIdentity(update_id, int(attempt), str(claim_id))
    if suspects is not None:
        suspects.note(identity, int(suspicion))
    return identity


def settle_statement(sql: Statements, settlement: Settlement, *, owned: bool) -> str:
    """The statement that settles an attempt with ``settlement`` (fenced if ``owned``)."""
    if isinstance(settlement, Completed):
        return sql["settle_completed_owned"] if owned else sql["settle_completed"]
    if isinstance(settlement, Failed):
        return sql["settle_failed_owned"] if owned else sql["settle_failed"]
    if isinstance(settlement, Abandoned):
        return sql["settle_abandoned_owned"] if owned else sql["settle_abandoned"]
    raise TypeError(
        f"not a settlement: {settlement!r} (use Completed, Failed or Abandoned)"
    )


def settle_params(
    update_id: int, attempt: int, settlement: Settlement, claim_id: Optional[str]
) -> Dict[str, Any]:
    """The parameters of :func:`settle_statement`."""
    return {
        "update_id": update_id,
        "attempt": attempt,
        "claim_id": claim_id,
        "at": settlement.at,
        "retry_at": getattr(settlement, "retry_at", None),
        "error": getattr(settlement, "error", None),
    }


def settle_owned_in(
    sql: Statements,
    conn: sqlite3.Connection,
    items: Sequence[Tuple[AttemptIdentity, Settlement]],
    effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    calls: Optional[Dict[AttemptIdentity, Tuple[int, ...]]] = None,
    sending: Optional[Set[int]] = None,
) -> List[Landing]:
    """Fenced settles inside ``conn``'s transaction.

    It returns per item whether it landed, or the :class:`~ptb_fence.StateConflict` that
    stopped it. The calls, state writes, jobs and broadcasts of ``effects`` ride with each completion that
    landed, in the same transaction. ``calls`` and ``sending`` collect the call ids written
    and those inserted claimed.
    """
    for each in (effects or {}).values():
        check_writes(each.state)  # refused before anything is written
    stateful: Dict[int, Sequence[StateWrite]] = {}
    for position, (identity, settlement) in enumerate(items):
        queued = effects.get(identity) if effects else None
        if queued is not None and queued.state and isinstance(settlement, Completed):
            stateful[position] = queued.state
    # the write lock is held: the versions read now are the ones the writes meet
    together = settled_together(stateful, _versions(sql, conn, stateful)) if stateful else set()
    landed: List[Landing] = [False] * len(items)
    # The completions without state writes, and those whose writes were checked, take one
    # statement per chunk. The others go one by one, in input order.
    grouped = [position for position, (_, settlement) in enumerate(items)
               if isinstance(settlement, Completed)
               and (position not in stateful or position in together)]
    _complete_many(sql, conn, [(position, items[position]) for position in grouped], landed)
    single = set(grouped)
    for position, (identity, settlement) in enumerate(items):
        if position in single:
            continue
        statement = settle_statement(sql, settlement, owned=True)
        params = settle_params(
            identity.update_id, identity.attempt, settlement, identity.claim_id
        )
        if position in stateful:
            landed[position] = settle_with_state(sql, conn, statement, params,
                                                 stateful[position], settlement.at)
        else:
            landed[position] = bool(conn.execute(statement, params).fetchall())
    checked = [write_params(w, settlement.at)
               for position, (_, settlement) in enumerate(items)
               if position in together and landed[position] is True
               for w in stateful[position]]
    if checked:
        _write_checked(sql, conn, checked)
    if effects:  # in input order: a claimed insert sees the calls inserted before it
        for position, (identity, settlement) in enumerate(items):
            if landed[position] is True and isinstance(settlement, Completed):
                queued = effects.get(identity)
                if queued is not None:
                    write_jobs_in(sql, conn, queued, settlement.at)
                    write_broadcasts_in(sql, conn, queued.broadcasts, settlement.at)
                ids = insert_calls(
                    sql, conn, effects_params(identity, effects.get(identity), settlement.at),
                    sending,
                )
                if calls is not None and ids:
                    calls[identity] = tuple(ids)
    return landed


def _complete_many(
    sql: Statements,
    conn: sqlite3.Connection,
    completions: Sequence[Tuple[int, Tuple[AttemptIdentity, Settlement]]],
    landed: List[Landing],
) -> None:
    """Complete ``(position, (identity, Completed))`` items in one statement.

    ``landed[position]`` is set for each that landed. For an identity given twice it is set
    for its first position."""
    unique: Dict[AttemptIdentity, Tuple[int, int]] = {}
    for position, (identity, settlement) in completions:
        unique.setdefault(identity, (position, int(settlement.at)))
    completions_json = json.dumps([
        [identity.update_id, identity.attempt, identity.claim_id, at]
        for identity, (_, at) in unique.items()
    ])
    done = {(int(u), int(a), str(c)) for u, a, c in conn.execute(
        sql["complete_owned_many"], {"completions": completions_json}).fetchall()}
    for identity, (position, _) in unique.items():
        if (identity.update_id, identity.attempt, identity.claim_id) in done:
            landed[position] = True


def _versions(
    sql: Statements, conn: sqlite3.Connection, stateful: Dict[int, Sequence[StateWrite]]
) -> Dict[StateKey, int]:
    """The versions of the keys written."""
    keys = [w.key for writes in stateful.values() for w in writes]
    return {key: entry.version for key, entry in read_state_in(sql, conn, keys).items()}


def read_state_in(
    sql: Statements, conn: sqlite3.Connection, keys: Sequence[StateKey]
) -> Dict[StateKey, StateEntry]:
    """The state rows of ``keys`` on ``conn``: one ``SELECT``, each key a search of the
    primary key, the rows as one JSON row."""
    unique = [[key.kind, key.name, key.key] for key in dict.fromkeys(keys)]
    if not unique:
        return {}
    (text,) = conn.execute(sql["state_read"], {"keys": json.dumps(unique)}).fetchone()
    return entries_of(json.loads(text), keys)


def _write_checked(
    sql: Statements, conn: sqlite3.Connection, checked: List[Dict[str, Any]]
) -> None:
    """Run the writes whose versions were checked under the write lock.

    The inserts go in one statement, the updates in another. Each must land, since nothing
    else writes while the lock is held."""
    inserts = [[p["kind"], p["name"], p["key"], p["value"], p["at"]]
               for p in checked if p["version"] == 0]
    updates = [[p["kind"], p["name"], p["key"], p["value"], p["at"], p["version"]]
               for p in checked if p["version"] != 0]
    changed = 0
    for rows, name in ((inserts, "state_insert_rows"), (updates, "state_update_rows")):
        if rows:
            changed += conn.execute(sql[name], {"rows": json.dumps(rows)}).rowcount
    if changed != len(checked):  # the whole transaction rolls back
        raise RuntimeError(
            f"state rows changed while the write lock was held: {changed} of {len(checked)} "
            "checked writes landed"
        )


def settle_with_state(
    sql: Statements,
    conn: sqlite3.Connection,
    statement: str,
    params: Dict[str, Any],
    writes: Sequence[StateWrite],
    at: int,
) -> Landing:
    """One completion and its state writes in a savepoint, where all land or none.

    A settle that does not land gives :obj:`False`. A moved version gives the conflict."""
    conn.execute(sql["state_savepoint"])
    try:
        if not conn.execute(statement, params).fetchall():
            conn.execute(sql["state_rollback_to"])
            return False
        moved = write_state_in(sql, conn, writes, at)
        if moved:
            conn.execute(sql["state_rollback_to"])
            return StateConflict(tuple(moved))
        return True
    finally:
        conn.execute(sql["state_release"])


def write_state_in(
    sql: Statements, conn: sqlite3.Connection, writes: Sequence[StateWrite], at: int
) -> List[Any]:
    """Run the conditional state writes inside ``conn``'s transaction.

    It returns the keys that moved. The caller rolls back what the others wrote."""
    return apply_writes(
        (sql["state_insert"], sql["state_update"]),
        lambda s, p: conn.execute(s, p).fetchone() is not None, writes, at,
    )


def insert_calls(
    sql: Statements,
    conn: sqlite3.Connection,
    calls: Sequence[Dict[str, Any]],
    sending: Optional[Set[int]] = None,
) -> List[int]:
    """Insert outbox calls inside ``conn``'s transaction and return their call ids, in order.

    ``sending`` collects the ids inserted claimed for their sender.
    """
    ids = []
    for params in calls:
        call_id, state = conn.execute(sql["outbox_insert"], params).fetchone()
        ids.append(int(call_id))
        if sending is not None and state == "sending":
            sending.add(int(call_id))
    return ids
