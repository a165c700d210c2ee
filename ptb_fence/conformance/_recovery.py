"""Recovery.

Giving claims back (``release_many``), the liveness of an instance (``hold_liveness``,
``release_liveness``, ``take_over_dead``) and the isolation of a suspect claim
(``claimed_suspect``, ``mark_isolated``, ``end_probation``).
Each rule runs only for a store with its methods.
Some of it needs two processes: taking over a dead instance's claims, its rows becoming suspect.
The shipped stores test that with real processes and signals, not here.
"""

from __future__ import annotations

from ptb_fence._values import AttemptIdentity, Completed
from ptb_fence.conformance._probe import (
    FAR,
    L,
    T,
    Probe,
    bool_list,
    claimed_identity,
    has_method,
    other_claim_id,
    stamp,
)
from ptb_fence.conformance._rule import rule


@rule(
    "release",
    "fenced",
    "release_many (when present) gives exact claims back at once without spending the "
    "attempt: listed by due, reclaimed with the same attempt and a fresh claim id, the "
    "released identity refused.",
    applies="only for a store with ``release_many``",
)
def rule_release(p: Probe, fenced: bool, durable: bool) -> None:
    """``release_many(identities, at=...)`` releases exactly the claims that are ``processing``.

    A claim must match the attempt and claim id. A lapsed lease is included.
    It returns one real bool per position.
    A wrong claim id, a completed row and an unknown id are not released.
    ``owns``, ``renew_owned`` and ``settle_owned`` refuse a released identity at once.
    ``due`` lists the released rows at once whatever ``pending_before``.
    A fresh pending row still waits for ``pending_before``.
    The next claim gets the same attempt number and a fresh claim id.
    It does so even with ``max_attempts`` equal to that number, since the attempt was not spent.
    The released identity is then neither owned nor releasable.
    ``release_many([])`` returns ``[]``.
    """
    if not has_method(p.store, "release_many"):
        return
    a = claimed_identity(p, 1, T + L)
    b = claimed_identity(p, 2, T + L)
    c = claimed_identity(p, 3, T + L)
    p.require(p.settle_owned(c, Completed(at=T + 1)), "settle_owned of a live claim failed")
    d = claimed_identity(p, 4, T + 5)  # its lease lapses before the release, still releasable
    p.require(p.add(5, "b5", T + 100), "add of a new update_id returned False")
    wrong = AttemptIdentity(2, b.attempt, other_claim_id(b.claim_id))
    at = T + 10
    items = [a, wrong, c, AttemptIdentity(99, 1, "x"), b, d]
    got = bool_list(p, "release_many", p.call("release_many", items, at=at), len(items))
    want = [True, False, False, False, True, True]
    p.expect(
        got == want,
        f"release_many returned {got}; expected {want} (live claim; wrong claim id; completed "
        "row; unknown id; live claim; processing row with a lapsed lease)",
    )
    p.expect(not p.owns(a, at), f"owns({a}) returned True right after its release")
    p.expect(not p.renew_owned(a, FAR, now=at), "renew_owned of a released identity returned "
             "True")
    p.expect(not p.settle_owned(a, Completed(at=at)), "settle_owned of a released identity "
             "returned True")
    listed = p.due_ids(now=at, pending_before=T - 1)
    p.expect(
        listed == [1, 2, 4],
        f"after release_many, due(now={stamp(at)}, pending_before={stamp(T - 1)}) returned "
        f"{listed}; expected [1, 2, 4]: released rows are listed at once whatever "
        "pending_before (3 is completed, 5 is a fresh pending row received after "
        "pending_before)",
    )
    again = p.claim_owned(1, now=at + 1, lease_until=T + L, max_attempts=1)
    p.require(
        again is not None,
        "claim_owned(max_attempts=1) of a row released after its first attempt returned None: "
        "the release counted the attempt as spent",
    )
    assert again is not None
    p.expect(
        again.attempt == a.attempt and again.claim_id != a.claim_id,
        f"the claim after a release returned {again}; expected the same attempt number "
        f"{a.attempt} (not counted as spent) with a fresh claim id (released: {a.claim_id!r})",
    )
    p.expect(not p.owns(a, at + 1), "the released identity is owned again after a new claim")
    p.expect(p.owns(again, at + 1), "the claim after a release is not owned")
    p.expect(not p.release_many_one(a, at + 2), "release_many of an identity released before "
             "(the row was claimed again since) returned True")
    p.expect(
        bool_list(p, "release_many", p.call("release_many", [], at=at), 0) == [],
        "release_many([]) must return []",
    )


@rule(
    "liveness",
    "fenced",
    "hold_liveness/release_liveness/take_over_dead (when present): the instance id is "
    "stable, and take_over_dead never touches the caller's own or a released "
    "instance's live claims.",
    applies="only with ``hold_liveness``, ``release_liveness``, ``take_over_dead``",
)
def rule_liveness(p: Probe, fenced: bool, durable: bool) -> None:
    """``hold_liveness()`` returns a non-empty str, and the same one again.

    ``take_over_dead(now=...)`` returns an int.
    It never makes a live claim of the caller's own instance claimable.
    ``release_liveness()`` is idempotent.
    After it, the claims made before keep their live leases.
    So does a claim made without liveness.
    Taking over a dead process's claims needs two processes.
    The shipped stores test it with real processes and signals.
    """
    needed = ("hold_liveness", "release_liveness", "take_over_dead")
    if not all(has_method(p.store, m) for m in needed):
        return
    first = p.call("hold_liveness")
    p.require(
        isinstance(first, str) and first != "",
        f"hold_liveness() returned {first!r}; it must return a non-empty str instance id",
    )
    second = p.call("hold_liveness")
    p.expect(second == first, f"hold_liveness() again returned {second!r}, not {first!r}: it "
             "must be idempotent")
    a = claimed_identity(p, 1, T + L)
    taken = p.call("take_over_dead", now=T + 10)
    p.check_type("take_over_dead", type(taken) is int, "an int count", taken)
    p.expect(p.owns(a, T + 10), "take_over_dead made a claim of the caller's own, live "
             "instance claimable")
    p.expect(p.claim_owned(1, now=T + 10, lease_until=FAR) is None, "after take_over_dead "
             "another claim took a live lease of the caller's own instance")
    p.call("release_liveness")
    p.call("release_liveness")  # idempotent
    b = claimed_identity(p, 2, T + L)
    p.call("take_over_dead", now=T + 20)
    p.expect(p.owns(a, T + 20), "take_over_dead after release_liveness took over a claim "
             "whose lease is live (a gracefully stopped instance is not dead)")
    p.expect(p.owns(b, T + 20), "take_over_dead took over a live claim made without "
             "liveness")


@rule(
    "isolation",
    "fenced",
    "claimed_suspect/mark_isolated/end_probation (when present): marks land only for the "
    "exact live claim (inclusive at due_at) and change nothing else; claimed_suspect is 0 "
    "for fresh and unknown claims, 2 once for the next claim of a marked row, 1 once for "
    "the next claim of a row whose probation ended.",
    applies="only with ``claimed_suspect``, ``mark_isolated`` and ``end_probation``",
)
def rule_isolation(p: Probe, fenced: bool, durable: bool) -> None:
    """``claimed_suspect`` returns 0 for a claim of a fresh row.

    It also returns 0 for an unknown identity and for a claim already answered.
    It returns an :obj:`int`, never a :obj:`bool`.
    ``mark_isolated(identity, at=...)`` lands (:obj:`True`) for the exact live claim.
    It lands up to and including ``at == due_at``.
    It returns :obj:`False` at ``due_at + 1`` and with a wrong claim id or attempt.
    It returns :obj:`False` for a completed row and for an unknown id too.
    A landed mark changes nothing else. The claim is still owned and settles.
    ``end_probation`` lands only for a marked live claim, once.
    The next claim of a marked row (after its lease) is suspect again.
    ``claimed_suspect`` returns 2 for it, once.
    For the next claim of a row whose probation ended it returns 1.
    A dead instance's rows becoming suspect needs two processes.
    The shipped stores test it with real processes and signals.
    """
    if not all(has_method(p.store, m) for m in ("claimed_suspect", "mark_isolated",
                                                "end_probation")):
        return

    def suspicion(identity: AttemptIdentity) -> int:
        value = p.call("claimed_suspect", identity)
        p.check_type("claimed_suspect", type(value) is int and value in (0, 1, 2),
                     "an int: 0, 1 or 2", value)
        return int(value)

    def mark(identity: AttemptIdentity, at: int) -> bool:
        return p.real_bool("mark_isolated", p.call("mark_isolated", identity, at=at))

    def end(identity: AttemptIdentity, at: int) -> bool:
        return p.real_bool("end_probation", p.call("end_probation", identity, at=at))

    lease = T + L
    a = claimed_identity(p, 1, lease)
    p.expect(suspicion(a) == 0, f"claimed_suspect({a}) of a fresh row's claim was not 0")
    p.expect(suspicion(AttemptIdentity(99, 1, "x")) == 0, "claimed_suspect of an identity the "
             "store never returned was not 0")
    p.expect(not end(a, T + 1), "end_probation of a claim never marked returned True")
    wrong = AttemptIdentity(1, a.attempt, other_claim_id(a.claim_id))
    p.expect(not mark(wrong, T + 1), "mark_isolated with a wrong claim id returned True")
    p.expect(not mark(AttemptIdentity(1, a.attempt + 1, a.claim_id), T + 1),
             "mark_isolated with a wrong attempt returned True")
    p.expect(not mark(AttemptIdentity(99, 1, "x"), T + 1), "mark_isolated of an unknown id "
             "returned True")
    p.expect(not mark(a, lease + 1), f"mark_isolated at {stamp(lease + 1)}, after the lease "
             f"(due_at {stamp(lease)}), returned True")
    p.expect(mark(a, lease), f"mark_isolated of the live claim at {stamp(lease)} (= due_at: the "
             "lease still holds) returned False")
    p.expect(p.owns(a, lease), "the claim is no longer owned after mark_isolated")
    b = claimed_identity(p, 2, lease)
    p.require(p.settle_owned(b, Completed(at=T + 1)), "settle_owned of a live claim failed")
    p.expect(not mark(b, T + 2), "mark_isolated of a completed row returned True")
    # A marked row is suspect again. Its next claim (after the lease) runs alone.
    again = p.claim_owned(1, now=lease + 1, lease_until=FAR)
    p.require(again is not None, "claim_owned of a lapsed lease returned None")
    assert again is not None
    p.expect(suspicion(again) == 2, f"claimed_suspect({again}) was not 2: the row was marked "
             "isolated, so it is suspect again")
    p.expect(suspicion(again) == 0, f"claimed_suspect({again}) was not 0 the second time: "
             "each claim is answered once")
    p.expect(p.settle_owned(again, Completed(at=lease + 2)), "settle_owned of the claim of a "
             "marked row failed")
    # After its probation ended the row stays suspect. Its next claim starts on probation.
    c = claimed_identity(p, 3, lease)
    p.require(mark(c, T + 1), "mark_isolated of a live claim returned False")
    wrong = AttemptIdentity(3, c.attempt, other_claim_id(c.claim_id))
    p.expect(not end(wrong, T + 1), "end_probation with a wrong claim id returned True")
    p.expect(not end(c, lease + 1), f"end_probation at {stamp(lease + 1)}, after the lease "
             f"(due_at {stamp(lease)}), returned True")
    p.expect(end(c, lease), f"end_probation of the marked live claim at {stamp(lease)} "
             "returned False")
    p.expect(not end(c, lease), "end_probation of a claim no longer marked returned True")
    p.expect(p.owns(c, lease), "the claim is no longer owned after end_probation")
    later = p.claim_owned(3, now=lease + 1, lease_until=FAR)
    p.require(later is not None, "claim_owned of a lapsed lease returned None")
    assert later is not None
    p.expect(suspicion(later) == 1, f"claimed_suspect({later}) was not 1: its probation "
             "ended, so the row is suspect (not again)")
