"""Lease renewal.

A renewal never shortens a lease.
A batched renewal equals the loop of single renewals.
"""

from __future__ import annotations

from typing import Any, List

from ptb_fence._values import AttemptIdentity
from ptb_fence.conformance._probe import FAR, L, T, Probe, other_claim_id, stamp
from ptb_fence.conformance._rule import rule


@rule(
    "renewal-never-shortens",
    "base",
    "renew/renew_owned with an earlier lease_until returns True and keeps the later "
    "lease.",
)
def rule_renewal(p: Probe, fenced: bool, durable: bool) -> None:
    """``renew`` with an earlier ``lease_until`` returns :obj:`True` and keeps the later lease.

    The rule checks this by claimability at the times in between.
    It holds with and without ``now``.
    A later ``lease_until`` extends the lease.
    Fenced tail: the same holds for ``renew_owned``, checked with ``owns``.
    """
    p.require(p.add(1, "b", T), "add of a new update_id returned False")
    p.require(p.claim(1, now=T, lease_until=T + L) == 1, "claim of a pending update failed")
    lease = T + L
    p.expect(
        p.renew(1, 1, T + 10, now=T + 5),
        "renew with an earlier lease_until returned False; a matching renewal returns True even "
        "when the lease stays as it was",
    )
    p.expect(
        p.renew(1, 1, T + 20),
        "renew (without now) with an earlier lease_until returned False",
    )
    for now in (T + 11, T + 21, lease):
        taken = p.claim(1, now=now, lease_until=now + L)
        p.require(
            taken is None,
            f"after renewals with earlier lease_until values, claim at {stamp(now)} took the "
            f"update (returned {taken!r}); the lease until {stamp(lease)} was shortened",
        )
    longer = T + 2 * L
    p.expect(p.renew(1, 1, longer, now=lease), "renew extending a live lease returned False")
    p.expect(
        p.renew(1, 1, lease, now=lease + 5),
        "renew with an earlier lease_until after an extension returned False",
    )
    for now in (lease + 1, longer):
        taken = p.claim(1, now=now, lease_until=now + L)
        p.require(
            taken is None,
            f"claim at {stamp(now)} took a lease extended to {stamp(longer)} (returned "
            f"{taken!r}); renewal must set due_at = max(due_at, lease_until)",
        )
    taken = p.claim(1, now=longer + 1, lease_until=longer + 1 + L)
    p.expect(
        taken == 2,
        f"claim at {stamp(longer + 1)} after the extended lease lapsed returned {taken!r}; "
        "expected 2",
    )

    if not fenced:
        return
    p.require(p.add(2, "b2", T), "add of a new update_id returned False")
    identity = p.claim_owned(2, now=T, lease_until=lease)
    p.require(identity is not None, "claim_owned of a pending update returned None")
    assert identity is not None
    p.expect(
        p.renew_owned(identity, T + 10, now=T + 5),
        "renew_owned with an earlier lease_until returned False",
    )
    p.expect(
        p.renew_owned(identity, T + 20),
        "renew_owned (without now) with an earlier lease_until returned False",
    )
    p.expect(
        p.owns(identity, lease),
        f"after renew_owned with earlier lease_until values, owns at {stamp(lease)} returned "
        "False: the lease was shortened",
    )
    p.expect(not p.owns(identity, lease + 1), "owns returned True after the lease's due_at")
    p.expect(p.renew_owned(identity, longer, now=lease), "renew_owned extending returned False")
    p.expect(
        p.renew_owned(identity, lease, now=lease + 5),
        "renew_owned with an earlier lease_until after an extension returned False",
    )
    p.expect(
        p.owns(identity, longer),
        f"owns at {stamp(longer)} returned False after renew_owned extended the lease to it",
    )
    p.expect(not p.owns(identity, longer + 1), "owns returned True after the extended due_at")
    taken_owned = p.claim_owned(2, now=longer, lease_until=longer + L)
    p.expect(
        taken_owned is None,
        f"claim_owned at {stamp(longer)} took a lease extended to it ({taken_owned!r})",
    )


def _batch(p: Probe, method: str, keys: List[Any], lease_until: int, now: int) -> List[Any]:
    value = p.call(method, keys, lease_until, now)
    ok = (
        isinstance(value, list)
        and len(value) == len(keys)
        and all(type(item) is bool for item in value)
    )
    p.check_type(
        method,
        ok,
        f"a list of {len(keys)} real bools, one per input (None only for a row locked by "
        "another open transaction; this check holds no locks)",
        value,
    )
    return list(value) if isinstance(value, list) else []


@rule(
    "batch-renewal",
    "base",
    "renew_many/renew_owned_many (when present) equal the loop of single renewals, "
    "refusals included; None only for a row locked by another open transaction.",
    applies="only for a store with ``renew_many`` / ``renew_owned_many``",
)
def rule_batch_renewal(p: Probe, fenced: bool, durable: bool) -> None:
    """A batched renewal equals the loop of single renewals position by position.

    A live lease, given twice, is renewed.
    A wrong attempt or claim id, an expired lease and an unknown id are refused.
    The renewed lease holds and the refused ones are not revived.
    An entry may be :obj:`None` only for a row locked by another open transaction.
    The check holds no locks, so every entry here must be a real bool.
    """
    has_many = callable(getattr(p.store, "renew_many", None))
    has_owned_many = fenced and callable(getattr(p.store, "renew_owned_many", None))
    if not (has_many or has_owned_many):
        return
    for update_id in (1, 2, 3):
        p.require(p.add(update_id, "b", T), "add of a new update_id returned False")
    longer, now = T + 2 * L, T + 20
    if has_many:
        p.require(p.claim(1, now=T, lease_until=T + L) == 1, "claim of a pending update failed")
        p.require(p.claim(2, now=T, lease_until=T + 10) == 1, "claim of a pending update failed")
        keys = [(1, 1), (2, 1), (1, 2), (3, 1), (99, 1), (1, 1)]
        got = _batch(p, "renew_many", keys, longer, now)
        want = [p.renew(u, a, longer, now=now) for u, a in keys]
        p.expect(
            got == want == [True, False, False, False, False, True],
            f"renew_many({keys}, lease_until={stamp(longer)}, now={stamp(now)}) returned {got}; "
            f"the single renew calls return {want}; expected [True, False, False, False, False, "
            "True] (live; expired; wrong attempt; pending; unknown; live again)",
        )
        taken = p.claim(1, now=T + L + 1, lease_until=FAR)
        p.expect(taken is None, f"claim at {stamp(T + L + 1)} took a lease renew_many extended "
                 f"to {stamp(longer)} (returned {taken!r})")
        taken = p.claim(2, now=now + 1, lease_until=FAR)
        p.expect(taken == 2, f"claim at {stamp(now + 1)} of the lease that expired at "
                 f"{stamp(T + 10)} returned {taken!r}; renew_many must not revive it (expected 2)")
    if has_owned_many:
        live = p.claim_owned(3, now=T, lease_until=T + L)
        p.require(live is not None, "claim_owned of a pending update returned None")
        assert live is not None
        p.require(p.add(4, "b", T), "add of a new update_id returned False")
        expired = p.claim_owned(4, now=T, lease_until=T + 10)
        p.require(expired is not None, "claim_owned of a pending update returned None")
        assert expired is not None
        wrong = AttemptIdentity(3, live.attempt, other_claim_id(live.claim_id))
        identities = [live, expired, wrong, AttemptIdentity(99, 1, "x"), live]
        got = _batch(p, "renew_owned_many", identities, longer, now)
        want = [p.renew_owned(i, longer, now=now) for i in identities]
        p.expect(
            got == want == [True, False, False, False, True],
            f"renew_owned_many(lease_until={stamp(longer)}, now={stamp(now)}) returned {got}; the "
            f"single renew_owned calls return {want}; expected [True, False, False, False, True] "
            "(live; expired; wrong claim id; unknown; live again)",
        )
        p.expect(p.owns(live, longer), f"owns at {stamp(longer)} returned False after "
                 "renew_owned_many extended the lease to it")
        p.expect(not p.owns(expired, now), "renew_owned_many revived an expired lease")
