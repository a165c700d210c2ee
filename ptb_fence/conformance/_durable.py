"""Durable exhaustion.

An update may have spent its attempts, or a handler may have given up on it.
It then stays visible until its exact attempt acknowledges it.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from ptb_fence._values import AttemptIdentity, Exhaustion
from ptb_fence.conformance._probe import FAR, L, T, Probe, other_claim_id, stamp
from ptb_fence.conformance._rule import rule


def _describe(exhaustion: Exhaustion) -> str:
    return (
        f"Exhaustion(update_id={exhaustion.update_id}, attempt={exhaustion.attempt}, "
        f"claim_id={exhaustion.claim_id!r}, body={exhaustion.body!r}, "
        f"exhausted_at={stamp(exhaustion.exhausted_at)}, error={exhaustion.error!r})"
    )


def _find(p: Probe, update_id: int) -> Optional[Exhaustion]:
    for item in p.due_exhaustions(limit=1000):
        if item.update_id == update_id:
            return item
    return None


@rule(
    "durable-exhaustion",
    "durable",
    "Spent and exhausted updates stay listed and unprunable until the exact identity "
    "acknowledges them; cursor paging sees each once.",
)
def rule_durable_exhaustion(p: Probe, fenced: bool, durable: bool) -> None:
    """A spent ``claim_owned(..., durable_exhaustion=True)`` becomes a visible exhaustion.

    It is listed with the last attempt and claim id, the body and ``'attempts spent'``.
    Its ``exhausted_at`` is the spend's ``now``.
    It is not due and not prunable.
    Acknowledgements with a wrong claim id or attempt are refused.
    The exact one returns :obj:`True` once, then :obj:`False`.
    The row is then prunable, with a strict bound.
    ``exhaust`` works at ``at == due_at``.
    It keeps its error and sets ``exhausted_at = at``.
    An expired attempt cannot exhaust and does not block a reclaim.
    Wrong identities cannot exhaust.
    Paging with ``limit`` and ``after_update_id`` sees every exhaustion once, in order.
    A base ``claim(..., durable_exhaustion=True)`` spend is visible too.
    Its claim id is non-empty even when the earlier claims wrote none.
    """
    lease = T + L
    # A: a spent claim_owned(durable_exhaustion=True) after the owner was lost.
    p.require(p.add(1, "body-1", T), "add of a new update_id returned False")
    first = p.claim_owned(1, now=T, lease_until=lease, max_attempts=1, durable_exhaustion=True)
    p.require(first is not None, "claim_owned of a pending update returned None")
    assert first is not None
    spent = p.claim_owned(
        1, now=lease + 1, lease_until=lease + 1 + L, max_attempts=1, durable_exhaustion=True
    )
    p.expect(spent is None, f"a spending claim_owned returned {spent!r}; expected None")
    found = _find(p, 1)
    p.require(
        found is not None,
        "a claim_owned(durable_exhaustion=True) spend is not listed by due_exhaustions",
    )
    assert found is not None
    wanted = Exhaustion(
        update_id=1,
        attempt=1,
        claim_id=first.claim_id,
        body="body-1",
        exhausted_at=lease + 1,
        error="attempts spent",
    )
    p.expect(
        found == wanted,
        f"the spent update was listed as {_describe(found)}; expected {_describe(wanted)} (the "
        "last attempt and claim id, exhausted_at = the spend's now)",
    )
    ids = p.due_ids(now=FAR, pending_before=FAR)
    p.expect(1 not in ids, "due listed an unacknowledged exhaustion")
    again = p.claim_owned(1, now=FAR, lease_until=FAR + L, max_attempts=10)
    p.expect(again is None, f"an exhausted update was claimable again ({again!r})")
    pruned = p.prune(FAR)
    p.expect(pruned == 0, f"prune deleted {pruned} row(s) with an unacknowledged exhaustion")
    p.expect(_find(p, 1) is not None, "an unacknowledged exhaustion disappeared after prune")

    identity = found.identity
    wrong_claim = AttemptIdentity(1, identity.attempt, other_claim_id(identity.claim_id))
    wrong_attempt = AttemptIdentity(1, identity.attempt + 1, identity.claim_id)
    p.expect(
        not p.acknowledge_exhaustion(wrong_claim, lease + 10),
        "acknowledge_exhaustion with a wrong claim id returned True",
    )
    p.expect(
        not p.acknowledge_exhaustion(wrong_attempt, lease + 10),
        "acknowledge_exhaustion with a wrong attempt returned True",
    )
    p.expect(
        _find(p, 1) is not None,
        "a refused acknowledgement removed the exhaustion from due_exhaustions",
    )
    ack_at = lease + 20
    p.expect(
        p.acknowledge_exhaustion(identity, ack_at),
        "acknowledge_exhaustion with the exact identity returned False",
    )
    p.expect(
        not p.acknowledge_exhaustion(identity, ack_at + 1),
        "a second acknowledge_exhaustion of the same exhaustion returned True",
    )
    p.expect(_find(p, 1) is None, "an acknowledged exhaustion is still listed")
    pruned = p.prune(ack_at)
    p.expect(pruned == 0, f"prune(before == the acknowledgement time) deleted {pruned} row(s)")
    pruned = p.prune(ack_at + 1)
    p.expect(
        pruned == 1,
        f"prune(acknowledgement time + 1) returned {pruned}; an acknowledged exhaustion is "
        "prunable history (settled_at = the acknowledgement's at)",
    )

    # B: a handler-terminal exhaust at the last live millisecond.
    p.require(p.add(2, "body-2", T), "add of a new update_id returned False")
    owner = p.claim_owned(2, now=T, lease_until=lease)
    p.require(owner is not None, "claim_owned of a pending update returned None")
    assert owner is not None
    for label, wrong in (
        ("a wrong claim id", AttemptIdentity(2, owner.attempt, other_claim_id(owner.claim_id))),
        ("a wrong attempt", AttemptIdentity(2, owner.attempt + 1, owner.claim_id)),
    ):
        p.expect(
            not p.exhaust(wrong, at=T + 1, error="wrong"),
            f"exhaust with {label} returned True",
        )
    p.expect(
        _find(p, 2) is None and p.owns(owner, lease),
        "a refused exhaust changed the update (listed as exhausted or the owner lost it)",
    )
    p.expect(
        p.exhaust(owner, at=lease, error="handler gave up"),
        "exhaust at exactly due_at (the last live millisecond) returned False",
    )
    found = _find(p, 2)
    wanted = Exhaustion(
        update_id=2,
        attempt=owner.attempt,
        claim_id=owner.claim_id,
        body="body-2",
        exhausted_at=lease,
        error="handler gave up",
    )
    p.expect(
        found == wanted,
        f"the exhausted update was listed as {None if found is None else _describe(found)}; "
        f"expected {_describe(wanted)} (error kept, exhausted_at = exhaust's at)",
    )
    p.expect(not p.owns(owner, lease), "owns returned True after the attempt exhausted")
    p.expect(
        not p.exhaust(owner, at=lease, error="again"),
        "a second exhaust of the same attempt returned True",
    )
    p.expect(
        p.claim_owned(2, now=FAR, lease_until=FAR + L) is None,
        "an update exhausted by exhaust was claimable again",
    )
    p.expect(p.prune(FAR) == 0, "prune deleted an update exhausted by exhaust")

    # C: an expired attempt cannot exhaust, and does not block a reclaim.
    p.require(p.add(3, "body-3", T), "add of a new update_id returned False")
    stale = p.claim_owned(3, now=T, lease_until=lease)
    p.require(stale is not None, "claim_owned of a pending update returned None")
    assert stale is not None
    p.expect(
        not p.exhaust(stale, at=lease + 1, error="too late"),
        "exhaust 1 ms after the attempt's lease expired returned True",
    )
    p.expect(_find(p, 3) is None, "an expired attempt's refused exhaust listed the update")
    fresh = p.claim_owned(3, now=lease + 1, lease_until=lease + 1 + L)
    p.expect(
        fresh is not None and fresh.attempt == 2,
        f"reclaim after an expired attempt's exhaust returned {fresh!r}; expected attempt 2",
    )

    # D: cursor paging over 7 exhaustions (plus update 2 from B).
    page_ids = [10, 20, 30, 40, 50, 60, 70]
    for update_id in page_ids:
        p.require(p.add(update_id, f"body-{update_id}", T), "add of a new update_id failed")
        claimed = p.claim_owned(update_id, now=T, lease_until=lease)
        p.require(claimed is not None, f"claim_owned of update {update_id} returned None")
        assert claimed is not None
        p.require(
            p.exhaust(claimed, at=T + update_id, error=f"e{update_id}"),
            f"exhaust of the live claim of update {update_id} returned False",
        )
    expected = [2] + page_ids
    seen: List[int] = []
    cursor: Optional[int] = None
    for _ in range(len(expected) + 2):
        page = p.due_exhaustions(limit=3, after_update_id=cursor)
        p.expect(len(page) <= 3, f"due_exhaustions(limit=3) returned {len(page)} rows")
        if not page:
            break
        ids_page = [e.update_id for e in page]
        p.expect(
            cursor is None or all(u > cursor for u in ids_page),
            f"due_exhaustions(after_update_id={cursor}) returned {ids_page}; only ids above the "
            "cursor belong on the page",
        )
        seen.extend(ids_page)
        cursor = ids_page[-1]
    p.expect(
        seen == expected,
        f"paging due_exhaustions with limit=3 and after_update_id saw {seen}; expected "
        f"{expected} (every exhaustion once, by update_id)",
    )

    # E: a base claim(..., durable_exhaustion=True) spend is visible too.
    base_spends: List[Tuple[str, Exhaustion]] = []
    for update_id, first_flag in ((80, True), (90, None)):
        p.require(p.add(update_id, f"body-{update_id}", T), "add of a new update_id failed")
        got = p.claim(
            update_id, now=T, lease_until=lease, max_attempts=1, durable_exhaustion=first_flag
        )
        p.require(got == 1, f"claim of pending update {update_id} returned {got!r}")
        spent_base = p.claim(
            update_id,
            now=lease + 1,
            lease_until=lease + 1 + L,
            max_attempts=1,
            durable_exhaustion=True,
        )
        p.expect(spent_base is None, f"a spending base claim returned {spent_base!r}")
        how = (
            "claim(..., durable_exhaustion=True)"
            if first_flag
            else "claim() then a spending claim(..., durable_exhaustion=True)"
        )
        found = _find(p, update_id)
        if not p.expect(found is not None, f"a base {how} spend is not listed"):
            continue
        assert found is not None
        p.expect(
            found.attempt == 1
            and found.body == f"body-{update_id}"
            and found.exhausted_at == lease + 1
            and found.error == "attempts spent"
            and isinstance(found.claim_id, str)
            and found.claim_id != "",
            f"a base {how} spend was listed as {_describe(found)}; expected attempt 1, its body, "
            f"exhausted_at {stamp(lease + 1)}, error 'attempts spent' and a non-empty claim id",
        )
        base_spends.append((how, found))
    pruned = p.prune(FAR)
    p.expect(pruned == 0, f"prune deleted {pruned} base claim spend exhaustion(s)")
    for how, found in base_spends:
        p.expect(
            p.acknowledge_exhaustion(found.identity, lease + 2),
            f"acknowledge_exhaustion of the base {how} exhaustion's identity returned False",
        )
