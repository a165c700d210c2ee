"""The base contract.

One record per update, the lease, attempt ownership, retry and spend, the due listing and
pruning.
These rules run for every store.
A fenced store may have the ``*_owned`` twin of a base method.
The rule then checks that twin too, in its fenced tail.
"""

from __future__ import annotations

from typing import List

from ptb_fence._values import Abandoned, AttemptIdentity, Completed, Failed
from ptb_fence.conformance._probe import FAR, L, T, Probe, other_claim_id, stamp
from ptb_fence.conformance._rule import rule


@rule(
    "one-record-per-update",
    "base",
    "A second add of an update_id returns False in every state and changes nothing.",
)
def rule_one_record(p: Probe, fenced: bool, durable: bool) -> None:
    """A second ``add`` of the same update returns :obj:`False` in every state.

    The states are pending, processing, failed, completed and abandoned.
    A durable store adds one more, an unacknowledged exhaustion.
    The refused ``add`` leaves the row as it was.
    The first body stays and the lease is not reset.
    A different body is refused the same way while the row is live.
    A live row is pending, processing, failed or an unacknowledged exhaustion.
    A store may replace a *settled* row when a different update arrives with its id.
    This rule does not check that.
    """
    p.require(p.add(1, "first", T), "add of a new update_id 1 returned False")
    p.expect(
        not p.add(1, "second", T + 1),
        "a second add of update 1 while it is pending returned True",
    )
    listed = p.due(now=T + 1, pending_before=T + 1)
    p.expect(
        listed == [(1, "first")],
        f"after a refused duplicate add, due listed {listed}; expected update 1 once, with its "
        "first body 'first'",
    )
    p.expect(p.add(2, "two", T), "add of a new update_id 2 next to update 1 returned False")

    attempt = p.claim(1, now=T + 2, lease_until=T + 2 + L)
    p.require(attempt == 1, f"claim of pending update 1 returned {attempt!r}; expected attempt 1")
    p.expect(
        not p.add(1, "third", T + 3),
        "a second add of update 1 while it is processing returned True",
    )
    again = p.claim(1, now=T + 4, lease_until=T + 4 + L)
    p.expect(
        again is None,
        f"after a refused add of a processing update, claim at {stamp(T + 4)} returned {again!r}; "
        "the add must leave the row (and its live lease) untouched",
    )

    p.settle(1, 1, Failed(at=T + 5, retry_at=T + 100, error="boom"))
    p.expect(not p.add(1, "fourth", T + 6), "a second add of a failed update returned True")
    attempt = p.claim(1, now=T + 100, lease_until=T + 100 + L)
    p.require(
        attempt == 2,
        f"claim of failed update 1 at its retry time returned {attempt!r}; expected attempt 2 "
        "(the refused add must not reset the row)",
    )
    p.settle(1, 2, Completed(at=T + 101))
    # the same update again (a *different* update may replace a settled row)
    p.expect(not p.add(1, "first", T + 102), "a second add of a completed update returned True")
    listed_ids = p.due_ids(now=FAR, pending_before=FAR)
    p.expect(
        1 not in listed_ids,
        "after a refused add of a completed update, due listed it again; the add must not "
        "revive a completed row",
    )

    p.require(p.claim(2, now=T, lease_until=T + L) == 1, "claim of pending update 2 failed")
    p.settle(2, 1, Abandoned(at=T + 1, error="given up"))
    p.expect(not p.add(2, "two", T + 2), "a second add of an abandoned update returned True")

    p.require(p.add(3, "three", T), "add of a new update_id 3 returned False")
    p.require(
        p.claim(3, now=T, lease_until=T + 10, max_attempts=1) == 1,
        "claim of pending update 3 failed",
    )
    spent = p.claim(3, now=T + 11, lease_until=T + 11 + L, max_attempts=1)
    p.expect(spent is None, f"spending claim of update 3 returned {spent!r}; expected None")
    p.expect(
        not p.add(3, "three", T + 12),
        "a second add of an update abandoned by spent attempts returned True",
    )

    if durable:
        p.require(p.add(4, "four", T), "add of a new update_id 4 returned False")
        identity = p.claim_owned(4, now=T, lease_until=T + L)
        p.require(identity is not None, "claim_owned of pending update 4 returned None")
        assert identity is not None
        p.require(
            p.exhaust(identity, at=T + 1, error="terminal"),
            "exhaust of the live claim of update 4 returned False",
        )
        p.expect(
            not p.add(4, "again", T + 2),
            "a second add of an unacknowledged exhaustion returned True",
        )


@rule(
    "lease",
    "base",
    "A live lease (due_at >= now) is not taken, a lapsed one (due_at < now) is; due "
    "lists it with its body; renew with now never revives an expired lease.",
)
def rule_lease(p: Probe, fenced: bool, durable: bool) -> None:
    """A live lease is not taken. A lapsed lease is.

    ``claim`` at ``now == due_at`` returns :obj:`None`.
    ``claim`` at ``now == due_at + 1`` takes the update with attempt + 1.
    ``due`` does not list a live lease.
    It lists a lapsed one with its body.
    ``renew`` with ``now`` works at ``now == due_at``.
    It never revives an expired lease.
    Fenced tail: the same holds for ``claim_owned`` and ``renew_owned``, with a new claim id.
    """
    unknown = p.claim(404, now=T, lease_until=T + L)
    p.expect(unknown is None, f"claim of an unknown update_id returned {unknown!r}")
    p.require(p.add(1, "body-1", T), "add of a new update_id returned False")
    attempt = p.claim(1, now=T, lease_until=T + L)
    p.require(attempt == 1, f"claim of a pending update returned {attempt!r}; expected 1")
    due_at = T + L

    for now in (T + 1, due_at - 1, due_at):
        taken = p.claim(1, now=now, lease_until=now + L)
        p.expect(
            taken is None,
            f"claim at {stamp(now)} took a live lease expiring at {stamp(due_at)} (returned "
            f"{taken!r}); a lease is held while due_at >= now",
        )
    listed = p.due(now=due_at, pending_before=due_at)
    p.expect(
        listed == [],
        f"due(now={stamp(due_at)}) listed {listed} while the lease (due_at {stamp(due_at)}) "
        "is live",
    )
    p.expect(
        p.renew(1, 1, due_at, now=due_at),
        f"renew with now == due_at ({stamp(due_at)}) returned False; the lease is still live then",
    )
    listed = p.due(now=due_at + 1, pending_before=due_at + 1)
    p.expect(
        listed == [(1, "body-1")],
        f"due(now={stamp(due_at + 1)}) listed {listed}; expected the lapsed update 1 with its "
        "body 'body-1'",
    )
    p.expect(
        not p.renew(1, 1, T + 10 * L, now=due_at + 1),
        f"renew with now={stamp(due_at + 1)} after the lease expired at {stamp(due_at)} returned "
        "True: a renewal with now must never revive an expired lease",
    )
    taken = p.claim(1, now=due_at + 1, lease_until=due_at + 1 + L)
    p.expect(
        taken == 2,
        f"claim at {stamp(due_at + 1)} of a lease lapsed at {stamp(due_at)} returned {taken!r}; "
        "expected attempt 2 (a lapsed lease is taken over when due_at < now)",
    )

    if fenced:
        p.require(p.add(2, "body-2", T), "add of a new update_id returned False")
        first = p.claim_owned(2, now=T, lease_until=due_at)
        p.require(
            first is not None and first.attempt == 1 and first.update_id == 2,
            f"claim_owned of a pending update returned {first!r}; expected update 2, attempt 1",
        )
        assert first is not None
        taken_owned = p.claim_owned(2, now=due_at, lease_until=due_at + L)
        p.expect(
            taken_owned is None,
            f"claim_owned at now == due_at ({stamp(due_at)}) took a live lease ({taken_owned!r})",
        )
        p.expect(
            not p.renew_owned(first, T + 10 * L, now=due_at + 1),
            "renew_owned with now after the lease expired returned True (revived it)",
        )
        second = p.claim_owned(2, now=due_at + 1, lease_until=due_at + 1 + L)
        p.expect(
            second is not None and second.attempt == 2 and second.claim_id != first.claim_id,
            f"claim_owned at {stamp(due_at + 1)} of a lapsed lease returned {second!r}; expected "
            "attempt 2 with a new claim id",
        )


@rule(
    "attempt-ownership",
    "base",
    "Only the attempt holding the update renews or settles it; a settle lands up to "
    "and including due_at; fenced: wrong identities and expired leases cannot "
    "settle_owned.",
)
def rule_ownership(p: Probe, fenced: bool, durable: bool) -> None:
    """Only the attempt holding the update renews or settles it.

    ``renew`` and ``settle`` refuse another attempt number.
    A settle at ``at == due_at`` lands.
    A settle at ``due_at + 1`` does not.
    Fenced tail: ``renew_owned``, ``owns`` and ``settle_owned`` refuse a wrong attempt.
    They refuse a wrong claim id too.
    An expired lease cannot ``settle_owned``.
    A ``settle_owned`` at exactly ``due_at`` lands and returns :obj:`True`.
    A second one returns :obj:`False`.
    """
    p.require(p.add(1, "b", T), "add of a new update_id returned False")
    p.require(p.claim(1, now=T, lease_until=T + L) == 1, "claim of a pending update failed")
    p.expect(
        not p.renew(1, 2, T + 2 * L, now=T),
        "renew by attempt 2 while attempt 1 holds the update returned True",
    )
    p.expect(
        p.renew(1, 1, T + 2 * L, now=T),
        "renew by the attempt holding the live lease returned False",
    )
    due_at = T + 2 * L
    p.settle(1, 2, Completed(at=T + 1))
    p.settle(1, 2, Failed(at=T + 1, retry_at=T + 2, error="wrong attempt"))
    p.settle(1, 2, Abandoned(at=T + 1, error="wrong attempt"))
    p.settle(1, 0, Completed(at=T + 1))
    p.expect(
        p.renew(1, 1, due_at, now=due_at),
        "after settles by a wrong attempt number, attempt 1 no longer held its live lease: a "
        "settle by an attempt that does not hold the update landed",
    )
    p.settle(1, 1, Completed(at=due_at + 1))
    taken = p.claim(1, now=due_at + 1, lease_until=due_at + 1 + L)
    p.expect(
        taken == 2,
        f"after attempt 1 settled at {stamp(due_at + 1)}, 1 ms after its lease expired, claim "
        f"returned {taken!r}; expected attempt 2 (a settle lands only where due_at >= at)",
    )
    if taken != 2:
        return
    due_at2 = due_at + 1 + L
    p.expect(
        not p.renew(1, 1, T + 10 * L, now=due_at + 1),
        "renew by the old attempt 1 after attempt 2 took the update returned True",
    )
    p.settle(1, 1, Completed(at=due_at + 2))
    p.expect(
        p.renew(1, 2, due_at2, now=due_at + 2),
        "a settle by the old attempt 1 landed on the update now held by attempt 2",
    )
    p.settle(1, 2, Failed(at=due_at2, retry_at=due_at2 + 10, error="boom"))
    retaken = p.claim(1, now=due_at2 + 9, lease_until=due_at2 + 9 + L)
    p.expect(
        retaken is None,
        f"after attempt 2 settled Failed(at == due_at, retry 10 ms later), claim 1 ms before "
        f"the retry time returned {retaken!r}: a settle at exactly due_at must land",
    )
    if retaken is None:
        retaken = p.claim(1, now=due_at2 + 10, lease_until=due_at2 + 10 + L)
        p.expect(
            retaken == 3,
            f"claim at the retry time of a failed update returned {retaken!r}; expected 3",
        )

    if not fenced:
        return
    p.require(p.add(2, "b2", T), "add of a new update_id returned False")
    first = p.claim_owned(2, now=T, lease_until=T + L)
    p.require(first is not None, "claim_owned of a pending update returned None")
    assert first is not None
    lease = T + L
    wrong_attempt = AttemptIdentity(2, first.attempt + 1, first.claim_id)
    wrong_claim = AttemptIdentity(2, first.attempt, other_claim_id(first.claim_id))
    for label, wrong in (("a wrong attempt", wrong_attempt), ("a wrong claim id", wrong_claim)):
        p.expect(not p.owns(wrong, T), f"owns with {label} returned True")
        p.expect(
            not p.renew_owned(wrong, lease + L, now=T),
            f"renew_owned with {label} returned True",
        )
        p.expect(
            not p.settle_owned(wrong, Completed(at=T + 1)),
            f"settle_owned with {label} returned True",
        )
        p.expect(
            not p.settle_owned(wrong, Failed(at=T + 1, retry_at=T + 2, error="x")),
            f"settle_owned(Failed) with {label} returned True",
        )
    p.expect(
        p.owns(first, lease) and not p.owns(first, lease + 1),
        "after refused calls with wrong identities, the owner's lease changed or was lost",
    )
    p.expect(
        not p.settle_owned(first, Completed(at=lease + 1)),
        f"settle_owned at {stamp(lease + 1)}, 1 ms after the lease expired, returned True",
    )
    second = p.claim_owned(2, now=lease + 1, lease_until=lease + 1 + L)
    p.require(
        second is not None and second.attempt == 2,
        f"claim_owned of the lapsed update returned {second!r}; expected attempt 2 (did the "
        "expired settle_owned land?)",
    )
    assert second is not None
    lease2 = lease + 1 + L
    p.expect(
        not p.settle_owned(first, Completed(at=lease + 2)),
        "settle_owned by the old attempt after a reclaim returned True",
    )
    p.expect(
        p.settle_owned(second, Failed(at=lease2, retry_at=lease2 + 10, error="boom")),
        "settle_owned at exactly due_at (the last live millisecond) returned False",
    )
    p.expect(
        not p.settle_owned(second, Completed(at=lease2)),
        "a second settle_owned of an already settled attempt returned True",
    )
    third = p.claim_owned(2, now=lease2 + 10, lease_until=lease2 + 10 + L)
    p.expect(
        third is not None and third.attempt == 3,
        f"claim_owned at the retry time after a settle_owned(Failed) returned {third!r}; "
        "expected attempt 3",
    )


@rule(
    "retry-and-spend",
    "base",
    "A failed update is due exactly at its retry time; spent attempts abandon it "
    "(settled at the spend's now, prunable).",
)
def rule_retry_and_spend(p: Probe, fenced: bool, durable: bool) -> None:
    """A failed update is due exactly at its retry time (``due_at <= now``).

    It is not due 1 ms before.
    A claim with ``attempts >= max_attempts`` abandons the update and returns :obj:`None`.
    The update is then never claimable or due again.
    Its ``settled_at`` is the spend's ``now``, so ``prune`` deletes it from ``now + 1``.
    A claim at a live lease never spends.
    Fenced tail: the same holds for ``claim_owned``.
    Durable: a spend without ``durable_exhaustion`` is not an exhaustion.
    """
    p.require(p.add(1, "b1", T), "add of a new update_id returned False")
    p.require(
        p.claim(1, now=T, lease_until=T + L, max_attempts=2) == 1,
        "claim of a pending update failed",
    )
    retry_at = T + 1000
    p.settle(1, 1, Failed(at=T + 1, retry_at=retry_at, error="boom"))
    early = p.claim(1, now=retry_at - 1, lease_until=retry_at - 1 + L, max_attempts=2)
    p.expect(
        early is None,
        f"claim 1 ms before the retry time of a failed update returned {early!r}",
    )
    listed = p.due(now=retry_at - 1, pending_before=retry_at - 1)
    p.expect(listed == [], f"due 1 ms before the retry time listed {listed}")
    listed = p.due(now=retry_at, pending_before=retry_at)
    p.expect(
        listed == [(1, "b1")],
        f"due at exactly the retry time listed {listed}; expected the failed update 1 with its "
        "body (a failed row is due when due_at <= now)",
    )
    attempt = p.claim(1, now=retry_at, lease_until=retry_at + L, max_attempts=2)
    p.require(
        attempt == 2,
        f"claim at exactly the retry time of a failed update returned {attempt!r}; expected 2",
    )
    retry2 = retry_at + 1000
    p.settle(1, 2, Failed(at=retry_at + 1, retry_at=retry2, error="boom"))
    spent = p.claim(1, now=retry2, lease_until=retry2 + L, max_attempts=2)
    p.expect(
        spent is None,
        f"claim with attempts spent (2 of max_attempts=2) returned {spent!r}; expected None",
    )
    if durable:
        exhausted = p.exhaustion_ids()
        p.expect(
            1 not in exhausted,
            "a spend without durable_exhaustion was listed by due_exhaustions",
        )
    revived = p.claim(1, now=retry2 + 1, lease_until=retry2 + 1 + L, max_attempts=10)
    p.expect(
        revived is None,
        f"after its attempts were spent, the update was claimable again (claim with a higher "
        f"max_attempts returned {revived!r}); a spend must abandon it",
    )
    ids = p.due_ids(now=FAR, pending_before=FAR)
    p.expect(1 not in ids, "due listed an update abandoned by spent attempts")
    pruned = p.prune(retry2)
    p.expect(
        pruned == 0,
        f"prune(before == the spend's now) deleted {pruned} row(s); a spend sets settled_at = "
        "now and prune deletes only settled_at < before",
    )
    pruned = p.prune(retry2 + 1)
    p.expect(
        pruned == 1,
        f"prune(the spend's now + 1) returned {pruned}; expected 1 (a spent update is settled "
        "at the spend's now when durable_exhaustion is off)",
    )

    p.require(p.add(2, "b2", T), "add of a new update_id returned False")
    p.require(
        p.claim(2, now=T, lease_until=T + L, max_attempts=1) == 1,
        "claim of a pending update failed",
    )
    lease = T + L
    live = p.claim(2, now=lease, lease_until=lease + L, max_attempts=1)
    p.expect(live is None, f"claim of a live lease with attempts spent returned {live!r}")
    p.expect(
        p.renew(2, 1, lease, now=lease),
        "a claim at a live lease with attempts spent abandoned the update (the holder can no "
        "longer renew it); only a claimable row is spent",
    )
    spent = p.claim(2, now=lease + 1, lease_until=lease + 1 + L, max_attempts=1)
    p.expect(spent is None, f"claim of a lapsed lease with attempts spent returned {spent!r}")
    p.expect(
        not p.renew(2, 1, lease + L),
        "renew of an update abandoned by spent attempts returned True",
    )
    pruned = p.prune(lease + 1)
    p.expect(pruned == 0, f"prune(the spend's now) deleted {pruned} row(s); expected 0")
    pruned = p.prune(lease + 2)
    p.expect(pruned == 1, f"prune(the spend's now + 1) returned {pruned}; expected 1")

    if not fenced:
        return
    p.require(p.add(3, "b3", T), "add of a new update_id returned False")
    first = p.claim_owned(3, now=T, lease_until=T + L, max_attempts=1)
    p.require(first is not None, "claim_owned of a pending update returned None")
    spent_owned = p.claim_owned(3, now=lease + 1, lease_until=lease + 1 + L, max_attempts=1)
    p.expect(
        spent_owned is None,
        f"claim_owned with attempts spent returned {spent_owned!r}; expected None",
    )
    if durable:
        p.expect(
            3 not in p.exhaustion_ids(),
            "a claim_owned spend without durable_exhaustion was listed by due_exhaustions",
        )
    p.expect(
        p.claim_owned(3, now=lease + 2, lease_until=lease + 2 + L, max_attempts=10) is None,
        "after claim_owned spent its attempts, the update was claimable again",
    )
    pruned = p.prune(lease + 1)
    p.expect(pruned == 0, f"prune(the claim_owned spend's now) deleted {pruned} row(s)")
    pruned = p.prune(lease + 2)
    p.expect(pruned == 1, f"prune(the claim_owned spend's now + 1) returned {pruned}; expected 1")


@rule(
    "due-listing",
    "base",
    "due lists by update_id, at most limit rows, pending rows only when "
    "received_at <= pending_before.",
)
def rule_due_listing(p: Probe, fenced: bool, durable: bool) -> None:
    """``due`` lists by numeric ``update_id``.

    ``2**40`` is included and the bodies are exact.
    It lists at most ``limit`` rows.
    It lists pending rows only when ``received_at <= pending_before``, at the exact boundary.
    It lists failed rows from their retry time.
    It lists processing rows after their lease.
    It never lists completed rows.
    A store with ``release_many`` also lists a released row at once (see ``release``).
    """
    big = 2**40
    rows = [(100, T), (7, T + 10), (big, T), (12, T + 20), (9, T + 10), (30, T)]
    for update_id, received_at in rows:
        p.require(
            p.add(update_id, f"body-{update_id}", received_at),
            f"add of a new update_id {update_id} returned False",
        )

    def expect_ids(now: int, pending_before: int, limit: int, expected: List[int]) -> None:
        listed = p.due(now=now, pending_before=pending_before, limit=limit)
        wanted = [(u, f"body-{u}") for u in expected]
        p.expect(
            listed == wanted,
            f"due(now={stamp(now)}, pending_before={stamp(pending_before)}, limit={limit}) listed "
            f"{[u for u, _ in listed]}; expected {expected} (by update_id, bodies exact)"
            + ("" if [u for u, _ in listed] != expected else f"; bodies were {listed}"),
        )

    expect_ids(T, T + 20, 100, [7, 9, 12, 30, 100, big])
    expect_ids(T, T + 19, 100, [7, 9, 30, 100, big])
    expect_ids(T, T + 10, 100, [7, 9, 30, 100, big])
    expect_ids(T, T + 9, 100, [30, 100, big])
    expect_ids(T, T - 1, 100, [])
    expect_ids(T, T + 20, 2, [7, 9])
    expect_ids(T, T + 20, 1, [7])

    p.require(p.claim(9, now=T + 30, lease_until=T + 400) == 1, "claim of update 9 failed")
    p.require(p.claim(12, now=T + 30, lease_until=T + L) == 1, "claim of update 12 failed")
    p.settle(12, 1, Failed(at=T + 31, retry_at=T + 500, error="boom"))
    p.require(p.claim(100, now=T + 30, lease_until=T + L) == 1, "claim of update 100 failed")
    p.settle(100, 1, Completed(at=T + 31))
    # Rows 7, 30 and big are pending, 9 is processing (lease T+400), 12 failed (retry T+500).
    # Row 100 is done.
    expect_ids(T + 400, T + 1000, 100, [7, 30, big])
    expect_ids(T + 401, T + 1000, 100, [7, 9, 30, big])
    expect_ids(T + 500, T + 1000, 100, [7, 9, 12, 30, big])
    expect_ids(T + 500, T + 1000, 3, [7, 9, 12])
    expect_ids(T + 500, T + 9, 100, [9, 12, 30, big])
    expect_ids(T + 499, T - 1, 100, [9])


@rule(
    "prune",
    "base",
    "prune deletes settled rows with settled_at < before only and returns the count; "
    "the id can be added again and restarts at attempt 1.",
)
def rule_prune(p: Probe, fenced: bool, durable: bool) -> None:
    """``prune(before)`` deletes completed and abandoned rows with ``settled_at < before`` only.

    ``prune(settled_at)`` deletes nothing.
    ``prune(settled_at + 1)`` deletes the row.
    ``prune`` returns the count.
    Pending, processing (live or lapsed) and failed rows are never pruned.
    A pruned ``update_id`` can be added again.
    It starts at attempt 1 with its new body.
    """
    for update_id in range(1, 9):
        p.require(p.add(update_id, f"b{update_id}", T), "add of a new update_id returned False")
    for update_id in (1, 2, 4, 5, 6, 7, 8):
        lease_until = T + 1 if update_id == 6 else T + L
        p.require(
            p.claim(update_id, now=T, lease_until=lease_until) == 1,
            f"claim of pending update {update_id} failed",
        )
    p.settle(1, 1, Completed(at=T + 100))
    p.settle(2, 1, Abandoned(at=T + 200, error="given up"))
    p.settle(5, 1, Failed(at=T + 1, retry_at=T + 10, error="boom"))
    p.settle(7, 1, Completed(at=T + 300))
    p.settle(8, 1, Abandoned(at=T + 300, error="given up"))
    # 3 pending, 4 processing (live), 5 failed, 6 processing (lapsed at T+1)

    pruned = p.prune(T + 100)
    p.expect(
        pruned == 0,
        f"prune(before == settled_at of a completed update) deleted {pruned} row(s); prune "
        "deletes only settled_at < before",
    )
    pruned = p.prune(T + 101)
    p.expect(pruned == 1, f"prune(settled_at + 1) of one completed update returned {pruned}")
    pruned = p.prune(T + 200)
    p.expect(pruned == 0, f"prune(before == settled_at of an abandoned update) deleted {pruned}")
    pruned = p.prune(T + 201)
    p.expect(pruned == 1, f"prune(settled_at + 1) of one abandoned update returned {pruned}")
    pruned = p.prune(T + 301)
    p.expect(pruned == 2, f"prune of two settled updates returned {pruned}; expected the count 2")
    pruned = p.prune(FAR)
    p.expect(
        pruned == 0,
        f"prune with a far-future bound deleted {pruned} pending/processing/failed row(s)",
    )
    for update_id, state in ((3, "pending"), (4, "processing"), (5, "failed"), (6, "lapsed")):
        p.expect(
            not p.add(update_id, "again", T + 400),
            f"prune deleted the {state} update {update_id} (it could be added again)",
        )
    ids = p.due_ids(now=FAR, pending_before=FAR)
    p.expect(
        ids == [3, 4, 5, 6],
        f"after pruning, due listed {ids}; expected the unsettled updates [3, 4, 5, 6]",
    )
    p.expect(p.add(1, "again", T + 500), "a pruned update_id could not be added again")
    listed = p.due(now=T + 500, pending_before=T + 500, limit=1)
    p.expect(
        listed == [(1, "again")],
        f"due listed {listed} for the re-added update 1; expected its new body 'again'",
    )
    attempt = p.claim(1, now=T + 500, lease_until=T + 500 + L)
    p.expect(
        attempt == 1,
        f"claim of a re-added update returned {attempt!r}; its attempts must restart at 1",
    )
