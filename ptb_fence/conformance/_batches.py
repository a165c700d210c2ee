"""The batched forms of the store methods.

``add_many``, ``add_claimed_many``, ``claim_owned_many``, ``settle_owned_many``,
``add_claimed_and_settle_many`` and ``settle_and_claim_many`` each equal the loop of their
single-row forms, position by position, refusals included. Each rule runs only for a store with
its method.
"""

from __future__ import annotations

from typing import List, Tuple

from ptb_fence._values import Abandoned, AttemptIdentity, Completed, Failed, Settlement
from ptb_fence.contract import ClaimTerms
from ptb_fence.conformance._probe import (
    FAR,
    L,
    T,
    Probe,
    bool_list,
    claimed_identity,
    has_method,
    identity_list,
    other_claim_id,
    stamp,
)
from ptb_fence.conformance._rule import rule


@rule(
    "batch-add",
    "base",
    "add_many (when present) equals the loop of add calls row by row: existing and "
    "repeated ids are refused and left unchanged, new ids are pending once.",
    applies="only for a store with ``add_many``",
)
def rule_batch_add(p: Probe, fenced: bool, durable: bool) -> None:
    """``add_many`` equals the loop of single ``add`` calls row by row: an existing id (pending or
    processing) and an id repeated in the batch return :obj:`False` and change nothing (the first
    body is kept, a live lease is not reset), new ids return :obj:`True` and are pending once;
    ``add_many([])`` returns ``[]``.
    """
    if not has_method(p.store, "add_many"):
        return
    p.require(p.add(1, "b1", T), "add of a new update_id returned False")
    p.require(p.add(2, "b2", T), "add of a new update_id returned False")
    p.require(p.claim(2, now=T, lease_until=T + L) == 1, "claim of a pending update failed")
    rows = [(1, "b1", T + 1), (3, "b3", T), (2, "b2", T + 1), (3, "b3", T + 2), (4, "b4", T)]
    got = bool_list(p, "add_many", p.call("add_many", rows), len(rows))
    want = [False, True, False, False, True]
    p.expect(
        got == want,
        f"add_many({[(u, b) for u, b, _ in rows]}) returned {got}; the loop of single add calls "
        f"returns {want} (existing pending; new; existing processing; repeated in the batch; new)",
    )
    listed = p.due(now=T + 1, pending_before=FAR)
    p.expect(
        listed == [(1, "b1"), (3, "b3"), (4, "b4")],
        f"after add_many, due(now={stamp(T + 1)}) returned {listed}; expected [(1, 'b1'), "
        "(3, 'b3'), (4, 'b4')]: existing rows unchanged (update 2 keeps its live lease), each "
        "new row pending once with its first body",
    )
    taken = p.claim(2, now=T + L, lease_until=FAR)
    p.expect(taken is None, f"claim of update 2 at {stamp(T + L)} returned {taken!r}: add_many "
             "of an existing id reset its live lease")
    p.expect(
        bool_list(p, "add_many", p.call("add_many", []), 0) == [],
        "add_many([]) must return []",
    )


@rule(
    "batch-claim-at-ingest",
    "fenced",
    "add_claimed_many (when present) equals add + claim_owned for attempt 1 per new id; "
    "existing and repeated ids give None and stay unchanged.",
    applies="only for a store with ``add_claimed_many``",
)
def rule_batch_claim_at_ingest(p: Probe, fenced: bool, durable: bool) -> None:
    """``add_claimed_many(rows, lease_until=...)`` equals ``add`` + ``claim_owned`` for attempt 1
    per new id: a new id returns an identity with attempt 1, a fresh claim id and the given lease
    (owned up to and including ``lease_until``, not after); an existing id or one repeated in the
    batch returns :obj:`None` and stays unchanged.
    """
    if not has_method(p.store, "add_claimed_many"):
        return
    p.require(p.add(1, "b1", T), "add of a new update_id returned False")
    rows = [(1, "b1", T), (2, "b2", T), (2, "b2", T), (3, "b3", T)]
    value = p.call("add_claimed_many", rows, lease_until=T + L)
    got = identity_list(p, "add_claimed_many", value, len(rows))
    shape = [None if i is None else (i.update_id, i.attempt) for i in got]
    p.require(
        shape == [None, (2, 1), None, (3, 1)],
        f"add_claimed_many({[(u, b) for u, b, _ in rows]}, lease_until={stamp(T + L)}) "
        f"returned {shape} as (update_id, attempt); the loop of add + claim_owned gives "
        "[None, (2, 1), None, (3, 1)] (existing id untouched; new id claimed for attempt 1; "
        "repeated in the batch; new id claimed)",
    )
    two, three = got[1], got[3]
    p.expect(two.claim_id != three.claim_id, "add_claimed_many gave two rows the same claim id")
    for identity in (two, three):
        p.expect(p.owns(identity, T + L), f"owns({identity}) at {stamp(T + L)} returned False "
                 "right after add_claimed_many")
        p.expect(not p.owns(identity, T + L + 1), f"owns({identity}) at {stamp(T + L + 1)} "
                 f"returned True; add_claimed_many was given lease_until={stamp(T + L)}")
    taken = p.claim_owned(2, now=T + L, lease_until=FAR)
    p.expect(taken is None, f"claim_owned of update 2 at {stamp(T + L)} took the live lease "
             f"add_claimed_many gave it (returned {taken!r})")
    first = p.claim_owned(1, now=T, lease_until=T + L)
    p.expect(
        first is not None and first.attempt == 1,
        f"claim_owned of the existing pending update 1 returned {first!r}; add_claimed_many "
        "must leave an existing id unchanged (expected attempt 1)",
    )


def _claim_scene(p: Probe, now: int) -> None:
    """Rows 1-8 for the batch-claim rules, seen at ``now`` with ``max_attempts=2``: 1 pending,
    2 live lease, 3 lease held exactly at ``now``, 4 lapsed lease (attempt 1), 5 failed and due
    at ``now``, 6 failed and due at ``now + 1``, 7 lapsed lease with its attempts spent, 8
    completed."""
    for update_id in range(1, 9):
        p.require(p.add(update_id, f"b{update_id}", T), "add of a new update_id returned False")
    for update_id, lease_until in ((2, T + L), (3, now), (4, now - 1), (5, now), (6, now),
                                   (7, T + 1), (8, now)):
        identity = p.claim_owned(update_id, now=T, lease_until=lease_until)
        p.require(identity is not None, "claim_owned of a pending update returned None")
        assert identity is not None
        if update_id in (5, 6):
            retry = Failed(at=T + 1, retry_at=now + (update_id - 5), error="e")
            p.require(p.settle_owned(identity, retry), "settle_owned of a live claim failed")
        elif update_id == 8:
            p.require(p.settle_owned(identity, Completed(at=T + 1)), "settle_owned failed")
    again = p.claim_owned(7, now=T + 2, lease_until=now - 1)
    p.require(again is not None and again.attempt == 2, "claim_owned of a lapsed lease failed")


@rule(
    "batch-claim",
    "fenced",
    "claim_owned_many (when present) equals the loop of claim_owned calls: live and "
    "exact-boundary leases, early retries, settled, unknown and repeated ids give None; "
    "spent rows are abandoned.",
    applies="only for a store with ``claim_owned_many``",
)
def rule_batch_claim(p: Probe, fenced: bool, durable: bool) -> None:
    """``claim_owned_many(ids, ...)`` equals the loop of ``claim_owned`` position by position: a
    pending row, a lapsed lease (attempt + 1) and a failed row at its retry time are taken with
    fresh, distinct claim ids and the given lease; a live lease, a lease held exactly at ``now``, a
    failed row 1 ms before its retry time, a completed row, an unknown id and an id repeated in the
    input give :obj:`None` and change nothing; a claimable row whose attempts are spent gives
    :obj:`None` and is abandoned (durable: an exhaustion with ``durable_exhaustion=True``).
    ``claim_owned_many([])`` returns ``[]``.
    """
    if not has_method(p.store, "claim_owned_many"):
        return
    now = T + 10
    _claim_scene(p, now)
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 99, 1]
    terms = ClaimTerms(now=now, lease_until=now + L, max_attempts=2)
    got = identity_list(p, "claim_owned_many", p.claim_owned_many(ids, terms), len(ids))
    shape = [None if i is None else (i.update_id, i.attempt) for i in got]
    want = [(1, 1), None, None, (4, 2), (5, 2), None, None, None, None, None]
    p.require(
        shape == want,
        f"claim_owned_many({ids}, now={stamp(now)}, lease_until={stamp(now + L)}, max_attempts=2) "
        f"returned {shape} as (update_id, attempt); the loop of claim_owned gives {want} "
        "(pending; live lease; lease held at now; lapsed lease; failed due at now; failed due "
        "at now + 1; attempts spent; completed; unknown; repeated)",
    )
    taken = [i for i in got if i is not None]
    p.expect(len({i.claim_id for i in taken}) == len(taken),
             "claim_owned_many gave two rows the same claim id")
    for identity in taken:
        p.expect(p.owns(identity, now + L) and not p.owns(identity, now + L + 1),
                 f"{identity} taken by claim_owned_many does not own its row exactly up to "
                 f"lease_until={stamp(now + L)}")
    listed = p.due_ids(now=now + 1, pending_before=FAR)
    p.expect(
        listed == [3, 6],
        f"after claim_owned_many, due(now={stamp(now + 1)}) returned {listed}; expected [3, 6] "
        "(3's lease lapsed, 6 due; 1, 4, 5 claimed, 2 leased, 7 spent: abandoned, 8 completed)",
    )
    p.expect(
        identity_list(p, "claim_owned_many", p.claim_owned_many([], terms), 0) == [],
        "claim_owned_many([]) must return []",
    )
    if durable:
        p.require(p.add(9, "b9", T), "add of a new update_id returned False")
        p.require(p.claim_owned(9, now=T, lease_until=T + 1) is not None, "claim failed")
        terms = ClaimTerms(now=now, lease_until=now + L, max_attempts=1, durable_exhaustion=True)
        spent = p.claim_owned_many([9, 99], terms)
        p.expect(spent == [None, None], f"claim_owned_many of a spent row returned {spent!r}")
        p.expect(9 in p.exhaustion_ids(), "claim_owned_many(durable_exhaustion=True) of a "
                 "spent row did not leave an exhaustion")


@rule(
    "batch-settle",
    "fenced",
    "settle_owned_many (when present) equals the loop of settle_owned calls, refusals "
    "(wrong claim id, expired lease, repeated, unknown) included.",
    applies="only for a store with ``settle_owned_many``",
)
def rule_batch_settle(p: Probe, fenced: bool, durable: bool) -> None:
    """``settle_owned_many`` equals the loop of ``settle_owned`` position by position: completed,
    failed and abandoned settlements of live claims land; a wrong claim id, an expired lease, the
    same completion repeated in the batch and an unknown id return :obj:`False` and change nothing;
    ``settle_owned_many([])`` returns ``[]``.
    """
    if not has_method(p.store, "settle_owned_many"):
        return
    a, b, c, d = (claimed_identity(p, u, T + L) for u in (1, 2, 3, 4))
    e = claimed_identity(p, 5, T + 10)
    wrong = AttemptIdentity(2, b.attempt, other_claim_id(b.claim_id))
    at = T + 20
    items: List[Tuple[AttemptIdentity, Settlement]] = [
        (a, Completed(at=at)),
        (wrong, Completed(at=at)),
        (c, Failed(at=at, retry_at=T + 100, error="boom")),
        (d, Abandoned(at=at, error="gave up")),
        (e, Completed(at=at)),
        (a, Completed(at=at)),
        (AttemptIdentity(99, 1, "x"), Completed(at=at)),
    ]
    got = bool_list(p, "settle_owned_many", p.call("settle_owned_many", items), len(items))
    want = [True, False, True, True, False, False, False]
    p.expect(
        got == want,
        f"settle_owned_many returned {got}; the loop of settle_owned gives {want} (completed; "
        "wrong claim id; failed; abandoned; lease expired at T+10; the same completion again; "
        "unknown id)",
    )
    p.expect(p.owns(b, at), "settle_owned_many with a wrong claim id changed the real claim's row")
    p.expect(not p.owns(a, at), "a completion landed by settle_owned_many left the lease owned")
    listed = p.due_ids(now=T + 100, pending_before=FAR)
    p.expect(
        listed == [3, 5],
        f"after settle_owned_many, due(now={stamp(T + 100)}) returned {listed}; expected [3, 5] "
        "(3 failed and due at its retry time, 5 lapsed; 1 completed, 4 abandoned, 2 still "
        "leased)",
    )
    p.expect(
        bool_list(p, "settle_owned_many", p.call("settle_owned_many", []), 0) == [],
        "settle_owned_many([]) must return []",
    )


@rule(
    "combined-write",
    "fenced",
    "add_claimed_and_settle_many (when present) equals add_claimed_many plus "
    "settle_owned_many.",
    applies="only for a store with ``add_claimed_and_settle_many``",
)
def rule_combined_write(p: Probe, fenced: bool, durable: bool) -> None:
    """``add_claimed_and_settle_many`` returns what ``add_claimed_many`` and ``settle_owned_many``
    return for the same input (the store makes both land in one commit).
    """
    if not has_method(p.store, "add_claimed_and_settle_many"):
        return
    a = claimed_identity(p, 1, T + L)
    wrong = AttemptIdentity(1, a.attempt, other_claim_id(a.claim_id))
    rows = [(2, "b2", T), (1, "b", T)]
    settlements: List[Tuple[AttemptIdentity, Settlement]] = [
        (wrong, Completed(at=T + 5)),
        (a, Completed(at=T + 5)),
    ]
    value = p.call(
        "add_claimed_and_settle_many", rows, lease_until=T + L, settlements=settlements
    )
    ok = isinstance(value, tuple) and len(value) == 2
    p.check_type("add_claimed_and_settle_many", ok, "a tuple (identities, landed)", value)
    p.require(ok, "add_claimed_and_settle_many did not return (identities, landed)")
    added = identity_list(p, "add_claimed_and_settle_many", value[0], len(rows))
    landed = bool_list(p, "add_claimed_and_settle_many", value[1], len(settlements))
    shape = [None if i is None else (i.update_id, i.attempt) for i in added]
    p.expect(
        shape == [(2, 1), None] and landed == [False, True],
        f"add_claimed_and_settle_many returned {shape} (as (update_id, attempt)) and {landed}; "
        "add_claimed_many + settle_owned_many give [(2, 1), None] and [False, True]",
    )
    if added and added[0] is not None:
        p.expect(p.owns(added[0], T + L), "the row claimed by add_claimed_and_settle_many is "
                 "not owned by the identity it returned")
    p.expect(not p.owns(a, T + 5), "the completion of add_claimed_and_settle_many did not land")


@rule(
    "settle-and-claim",
    "fenced",
    "settle_and_claim_many (when present) equals settle_owned_many then claim_owned_many.",
    applies="only for a store with ``settle_and_claim_many``",
)
def rule_settle_and_claim(p: Probe, fenced: bool, durable: bool) -> None:
    """``settle_and_claim_many(settlements, update_ids, terms)`` returns what
    ``settle_owned_many(settlements)`` and then ``claim_owned_many(update_ids, terms)`` return
    (the store makes both land in one commit): the settle of a wrong claim id is refused, a
    completed row is not claimed, a pending row is claimed once (an id repeated gives None).
    """
    if not has_method(p.store, "settle_and_claim_many"):
        return
    a = claimed_identity(p, 1, T + 3)  # lapsed at the claims' now: claimable unless settled
    p.require(p.add(2, "b2", T), "add of a new update_id returned False")
    wrong = AttemptIdentity(1, a.attempt, other_claim_id(a.claim_id))
    settlements: List[Tuple[AttemptIdentity, Settlement]] = [
        (wrong, Completed(at=T + 2)),
        (a, Completed(at=T + 2)),
    ]
    terms = ClaimTerms(T + 4, T + 4 + L, 5, False)
    value = p.call("settle_and_claim_many", settlements, [1, 2, 2], terms)
    ok = isinstance(value, tuple) and len(value) == 2
    p.check_type("settle_and_claim_many", ok, "a tuple (landed, identities)", value)
    p.require(ok, "settle_and_claim_many did not return (landed, identities)")
    landed = bool_list(p, "settle_and_claim_many", value[0], len(settlements))
    claimed = identity_list(p, "settle_and_claim_many", value[1], 3)
    shape = [None if i is None else (i.update_id, i.attempt) for i in claimed]
    p.expect(
        landed == [False, True] and shape == [None, (2, 1), None],
        f"settle_and_claim_many returned {landed} and {shape} (as (update_id, attempt)); "
        "settle_owned_many + claim_owned_many give [False, True] and [None, (2, 1), None] "
        "(update 1, its lease lapsed at the claims' time, completed before the claims)",
    )
    p.expect(not p.owns(a, T + 2), "the completion of settle_and_claim_many did not land")
    if len(claimed) > 1 and claimed[1] is not None:
        p.expect(p.owns(claimed[1], T + 4 + L), "the row claimed by settle_and_claim_many is "
                 "not owned by the identity it returned")
