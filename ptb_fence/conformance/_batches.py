"""The parts of a batch commit, one by one.

Each part of a :class:`~ptb_fence.contract.Batch` equals the loop of its single-row form.
The records equal ``add``, the claimed records ``add`` then ``claim_owned``, the claims
``claim_owned`` and the settlements ``settle_owned``.
They match position by position, refusals included.
Each rule runs only for a batch store (one that declares ``features`` and has ``commit``).
"""

from __future__ import annotations

from typing import Any, List, Tuple

from ptb_fence._values import Abandoned, AttemptIdentity, Completed, Failed, Settlement
from ptb_fence.contract import Batch, ClaimTerms
from ptb_fence.conformance._probe import (
    FAR,
    L,
    T,
    Probe,
    bool_list,
    claimed_identity,
    identity_list,
    is_batch_store,
    other_claim_id,
    stamp,
)

_APPLIES = "only for a batch store (``features`` and ``commit``)"
from ptb_fence.conformance._rule import rule


@rule(
    "batch-add",
    "base",
    "the records of a commit equal the loop of add calls row by row: existing and repeated "
    "ids are refused and left unchanged, new ids are pending once.",
    applies=_APPLIES,
)
def rule_batch_add(p: Probe, fenced: bool, durable: bool) -> None:
    """``commit(Batch(records=rows))`` equals the loop of single ``add`` calls row by row.

    An existing id (pending or processing) returns :obj:`False` and changes nothing.
    So does an id repeated in the batch.
    The first body is kept and a live lease is not reset.
    New ids return :obj:`True` and are pending once.
    """
    if not is_batch_store(p.store):
        return
    p.require(p.add(1, "b1", T), "add of a new update_id returned False")
    p.require(p.add(2, "b2", T), "add of a new update_id returned False")
    p.require(p.claim(2, now=T, lease_until=T + L) == 1, "claim of a pending update failed")
    rows = [(1, "b1", T + 1), (3, "b3", T), (2, "b2", T + 1), (3, "b3", T + 2), (4, "b4", T)]
    got = bool_list(p, "commit", list(p.commit(Batch(records=tuple(rows))).recorded), len(rows))
    want = [False, True, False, False, True]
    p.expect(
        got == want,
        f"commit of the records {[(u, b) for u, b, _ in rows]} recorded {got}; the loop of single add calls "
        f"returns {want} (existing pending; new; existing processing; repeated in the batch; new)",
    )
    listed = p.due(now=T + 1, pending_before=FAR)
    p.expect(
        listed == [(1, "b1"), (3, "b3"), (4, "b4")],
        f"after commit of records, due(now={stamp(T + 1)}) returned {listed}; expected [(1, 'b1'), "
        "(3, 'b3'), (4, 'b4')]: existing rows unchanged (update 2 keeps its live lease), each "
        "new row pending once with its first body",
    )
    taken = p.claim(2, now=T + L, lease_until=FAR)
    p.expect(taken is None, f"claim of update 2 at {stamp(T + L)} returned {taken!r}: a "
             "record of an existing id reset its live lease")


@rule(
    "batch-claim-at-ingest",
    "fenced",
    "the claimed records of a commit equal add + claim_owned for attempt 1 per new id; "
    "existing and repeated ids give None and stay unchanged.",
    applies=_APPLIES,
)
def rule_batch_claim_at_ingest(p: Probe, fenced: bool, durable: bool) -> None:
    """``commit(Batch(terms, claimed_records=rows))`` equals ``add`` + ``claim_owned`` per new id.

    A new id returns an identity with attempt 1, a fresh claim id and the given lease.
    It is owned up to and including ``lease_until``, not after.
    An existing id returns :obj:`None` and stays unchanged.
    So does an id repeated in the batch.
    """
    if not is_batch_store(p.store):
        return
    p.require(p.add(1, "b1", T), "add of a new update_id returned False")
    rows = [(1, "b1", T), (2, "b2", T), (2, "b2", T), (3, "b3", T)]
    terms = ClaimTerms(now=T, lease_until=T + L, max_attempts=5)
    value = list(p.commit(Batch(terms, claimed_records=tuple(rows))).claimed_records)
    got = identity_list(p, "commit", value, len(rows))
    shape = [None if i is None else (i.update_id, i.attempt) for i in got]
    p.require(
        shape == [None, (2, 1), None, (3, 1)],
        f"commit of the claimed records {[(u, b) for u, b, _ in rows]} with "
        f"lease_until={stamp(T + L)} "
        f"returned {shape} as (update_id, attempt); the loop of add + claim_owned gives "
        "[None, (2, 1), None, (3, 1)] (existing id untouched; new id claimed for attempt 1; "
        "repeated in the batch; new id claimed)",
    )
    two, three = got[1], got[3]
    p.expect(two.claim_id != three.claim_id, "commit gave two claimed records the same claim id")
    for identity in (two, three):
        p.expect(p.owns(identity, T + L), f"owns({identity}) at {stamp(T + L)} returned False "
                 "right after the commit that claimed it")
        p.expect(not p.owns(identity, T + L + 1), f"owns({identity}) at {stamp(T + L + 1)} "
                 f"returned True; the commit was given lease_until={stamp(T + L)}")
    taken = p.claim_owned(2, now=T + L, lease_until=FAR)
    p.expect(taken is None, f"claim_owned of update 2 at {stamp(T + L)} took the live lease "
             f"the commit gave it (returned {taken!r})")
    first = p.claim_owned(1, now=T, lease_until=T + L)
    p.expect(
        first is not None and first.attempt == 1,
        f"claim_owned of the existing pending update 1 returned {first!r}; a claimed record "
        "must leave an existing id unchanged (expected attempt 1)",
    )


def _claim_scene(p: Probe, now: int) -> None:
    """Rows 1-8 for the batch-claim rules, seen at ``now`` with ``max_attempts=2``.

    Row 1 is pending.
    Row 2 has a live lease.
    Row 3 has a lease held exactly at ``now``.
    Row 4 has a lapsed lease (attempt 1).
    Row 5 failed and is due at ``now``.
    Row 6 failed and is due at ``now + 1``.
    Row 7 has a lapsed lease with its attempts spent.
    Row 8 is completed.
    """
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


def _claims(p: Probe, ids: List[int], terms: ClaimTerms) -> List[Any]:
    """The identities of ``commit(Batch(terms, claims=ids))``, one per id."""
    value = list(p.commit(Batch(terms, claims=tuple(ids))).claims)
    return identity_list(p, "commit", value, len(ids))


@rule(
    "batch-claim",
    "fenced",
    "the claims of a commit equal the loop of claim_owned calls: live and exact-boundary "
    "leases, early retries, settled, unknown and repeated ids give None; spent rows are "
    "abandoned.",
    applies=_APPLIES,
)
def rule_batch_claim(p: Probe, fenced: bool, durable: bool) -> None:
    """``commit(Batch(terms, claims=ids))`` equals the loop of ``claim_owned`` position by position.

    A pending row is taken.
    A lapsed lease is taken with attempt + 1.
    A failed row at its retry time is taken.
    Each taken row gets a fresh, distinct claim id and the given lease.
    The following give :obj:`None` and change nothing: a live lease, a lease held exactly at
    ``now``, a failed row 1 ms before its retry time, a completed row, an unknown id and an id
    repeated in the input.
    A claimable row whose attempts are spent gives :obj:`None` and is abandoned.
    Durable: with ``durable_exhaustion=True`` it becomes an exhaustion.
    """
    if not is_batch_store(p.store):
        return
    now = T + 10
    _claim_scene(p, now)
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 99, 1]
    terms = ClaimTerms(now=now, lease_until=now + L, max_attempts=2)
    got = _claims(p, ids, terms)
    shape = [None if i is None else (i.update_id, i.attempt) for i in got]
    want = [(1, 1), None, None, (4, 2), (5, 2), None, None, None, None, None]
    p.require(
        shape == want,
        f"commit of the claims {ids} (now={stamp(now)}, lease_until={stamp(now + L)}, "
        f"max_attempts=2) returned {shape} as (update_id, attempt); the loop of claim_owned "
        f"gives {want} (pending; live lease; lease held at now; lapsed lease; failed due at "
        "now; failed due at now + 1; attempts spent; completed; unknown; repeated)",
    )
    taken = [i for i in got if i is not None]
    p.expect(len({i.claim_id for i in taken}) == len(taken),
             "commit gave two claimed rows the same claim id")
    for identity in taken:
        p.expect(p.owns(identity, now + L) and not p.owns(identity, now + L + 1),
                 f"{identity} taken by commit does not own its row exactly up to "
                 f"lease_until={stamp(now + L)}")
    listed = p.due_ids(now=now + 1, pending_before=FAR)
    p.expect(
        listed == [3, 6],
        f"after the claims of a commit, due(now={stamp(now + 1)}) returned {listed}; expected "
        "[3, 6] (3's lease lapsed, 6 due; 1, 4, 5 claimed, 2 leased, 7 spent: abandoned, 8 "
        "completed)",
    )
    if durable:
        p.require(p.add(9, "b9", T), "add of a new update_id returned False")
        p.require(p.claim_owned(9, now=T, lease_until=T + 1) is not None, "claim failed")
        terms = ClaimTerms(now=now, lease_until=now + L, max_attempts=1, durable_exhaustion=True)
        spent = _claims(p, [9, 99], terms)
        p.expect(spent == [None, None], f"commit of the claim of a spent row returned {spent!r}")
        p.expect(9 in p.exhaustion_ids(), "a claim with durable_exhaustion=True of a spent "
                 "row did not leave an exhaustion")


@rule(
    "batch-settle",
    "fenced",
    "the settlements of a commit equal the loop of settle_owned calls, refusals (wrong claim "
    "id, expired lease, repeated, unknown) included.",
    applies=_APPLIES,
)
def rule_batch_settle(p: Probe, fenced: bool, durable: bool) -> None:
    """``commit(Batch(settlements=items))`` equals the loop of ``settle_owned`` position by position.

    Completed, failed and abandoned settlements of live claims land.
    The following return :obj:`False` and change nothing: a wrong claim id, an expired lease, the
    same completion repeated in the batch and an unknown id.
    """
    if not is_batch_store(p.store):
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
    got = bool_list(p, "commit", p.settle_batch(Batch(settlements=tuple(items))), len(items))
    want = [True, False, True, True, False, False, False]
    p.expect(
        got == want,
        f"commit of the settlements landed {got}; the loop of settle_owned gives {want} "
        "(completed; wrong claim id; failed; abandoned; lease expired at T+10; the same "
        "completion again; unknown id)",
    )
    p.expect(p.owns(b, at), "a settlement with a wrong claim id changed the real claim's row")
    p.expect(not p.owns(a, at), "a completion landed by commit left the lease owned")
    listed = p.due_ids(now=T + 100, pending_before=FAR)
    p.expect(
        listed == [3, 5],
        f"after the settlements of a commit, due(now={stamp(T + 100)}) returned {listed}; "
        "expected [3, 5] (3 failed and due at its retry time, 5 lapsed; 1 completed, 4 "
        "abandoned, 2 still leased)",
    )


@rule(
    "combined-write",
    "fenced",
    "a commit with claimed records and settlements equals the two parts in turn.",
    applies=_APPLIES,
)
def rule_combined_write(p: Probe, fenced: bool, durable: bool) -> None:
    """Claimed records and settlements in one commit give what each part gives alone.

    A settlement with a wrong claim id is refused.
    The owner's completion lands.
    A new claimed record is claimed for attempt 1.
    The record of the settled update's id is a duplicate.
    """
    if not is_batch_store(p.store):
        return
    a = claimed_identity(p, 1, T + L)
    wrong = AttemptIdentity(1, a.attempt, other_claim_id(a.claim_id))
    rows = ((2, "b2", T), (1, "b", T))
    settlements: Tuple[Tuple[AttemptIdentity, Settlement], ...] = (
        (wrong, Completed(at=T + 5)),
        (a, Completed(at=T + 5)),
    )
    terms = ClaimTerms(now=T, lease_until=T + L, max_attempts=5)
    got = p.commit(Batch(terms, claimed_records=rows, settlements=settlements))
    added = identity_list(p, "commit", list(got.claimed_records), len(rows))
    landed = bool_list(p, "commit", list(got.landed), len(settlements))
    shape = [None if i is None else (i.update_id, i.attempt) for i in added]
    p.expect(
        shape == [(2, 1), None] and landed == [False, True],
        f"commit of claimed records and settlements returned {shape} (as (update_id, "
        f"attempt)) and {landed}; the two parts alone give [(2, 1), None] and [False, True]",
    )
    if added and added[0] is not None:
        p.expect(p.owns(added[0], T + L), "the row claimed by the commit is not owned by the "
                 "identity it returned")
    p.expect(not p.owns(a, T + 5), "the completion of the commit did not land")


@rule(
    "settle-and-claim",
    "fenced",
    "a commit with settlements and claims settles first, then claims.",
    applies=_APPLIES,
)
def rule_settle_and_claim(p: Probe, fenced: bool, durable: bool) -> None:
    """``commit(Batch(terms, settlements=..., claims=...))`` settles, then claims.

    It returns what the settlements alone and then the claims alone return.
    The settle of a wrong claim id is refused.
    A row completed in the commit is not claimed.
    A pending row is claimed once.
    An id repeated in the input gives :obj:`None`.
    """
    if not is_batch_store(p.store):
        return
    a = claimed_identity(p, 1, T + 3)  # lapsed at the claims' now: claimable unless settled
    p.require(p.add(2, "b2", T), "add of a new update_id returned False")
    wrong = AttemptIdentity(1, a.attempt, other_claim_id(a.claim_id))
    settlements: Tuple[Tuple[AttemptIdentity, Settlement], ...] = (
        (wrong, Completed(at=T + 2)),
        (a, Completed(at=T + 2)),
    )
    terms = ClaimTerms(T + 4, T + 4 + L, 5, False)
    got = p.commit(Batch(terms, settlements=settlements, claims=(1, 2, 2)))
    landed = bool_list(p, "commit", list(got.landed), len(settlements))
    claimed = identity_list(p, "commit", list(got.claims), 3)
    shape = [None if i is None else (i.update_id, i.attempt) for i in claimed]
    p.expect(
        landed == [False, True] and shape == [None, (2, 1), None],
        f"commit of settlements and claims returned {landed} and {shape} (as (update_id, "
        "attempt)); the settlements then the claims give [False, True] and [None, (2, 1), "
        "None] (update 1, its lease lapsed at the claims' time, completed before the claims)",
    )
    p.expect(not p.owns(a, T + 2), "the completion of the commit did not land")
    if len(claimed) > 1 and claimed[1] is not None:
        p.expect(p.owns(claimed[1], T + 4 + L), "the row claimed by the commit is not owned "
                 "by the identity it returned")
