"""The batch commit and the declared features.

A store that declares :class:`~ptb_fence.StoreFeatures` is a :class:`~ptb_fence.BatchStore`.
Its declaration must be true.
Its ``commit`` must apply a whole batch in one transaction.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from ptb_fence._values import (
    AttemptEffects,
    AttemptIdentity,
    CallClaim,
    Completed,
    OutboxCall,
    Settlement,
    StateConflict,
)
from ptb_fence.contract import FEATURE_METHODS, Batch, ClaimTerms, Committed, StoreFeatures
from ptb_fence.conformance._probe import (
    L,
    T,
    Probe,
    claimed_identity,
    has_method,
    other_claim_id,
)
from ptb_fence.conformance._rule import rule


def _features(p: Probe) -> Optional[StoreFeatures]:
    declared = getattr(p.store, "features", None)
    return declared if isinstance(declared, StoreFeatures) else None


@rule(
    "features",
    "base",
    "A store's declared StoreFeatures are true: every declared part has its methods, and a "
    "store with commit declares its features.",
    applies="only for a store with ``features`` or ``commit``",
)
def rule_features(p: Probe, fenced: bool, durable: bool) -> None:
    """A store that has ``commit`` declares its optional parts in ``features``.

    ``features`` is a :class:`~ptb_fence.StoreFeatures`.
    Each declared part needs all its methods (:data:`~ptb_fence.contract.FEATURE_METHODS`).
    The rules of a declared part then run and check its behaviour.
    A batch store is durable, since ``commit`` settles and exhausts.
    """
    declared = getattr(p.store, "features", None)
    if declared is None and not has_method(p.store, "commit"):
        return
    p.require(
        isinstance(declared, StoreFeatures),
        f"features is {declared!r}: a store with commit declares its optional parts as a "
        "StoreFeatures (e.g. features = StoreFeatures(outbox=True))",
    )
    assert isinstance(declared, StoreFeatures)
    p.expect(has_method(p.store, "commit"), "the store declares features but has no commit")
    p.expect(durable, "the store declares features but is not durable (DurableUpdateStore)")
    for name in declared.names:
        lacking = [m for m in FEATURE_METHODS[name] if not has_method(p.store, m)]
        p.expect(
            not lacking,
            f"features declares {name}=True but the store lacks {', '.join(lacking)}",
        )


def _shape(identities: Tuple[Optional[AttemptIdentity], ...]) -> List[Any]:
    return [None if i is None else (i.update_id, i.attempt) for i in identities]


@rule(
    "batch-commit",
    "durable",
    "commit applies records, claimed records, settlements with their effects and claims in "
    "one transaction, each part as its single-row rule, and returns what it learnt.",
    applies="only for a store that declares ``features``",
)
def rule_batch_commit(p: Probe, fenced: bool, durable: bool) -> None:
    """One ``commit`` holds every part.

    Records: an existing id gives :obj:`False`, and a new one gives :obj:`True` (``pending``).
    Claimed records: a new id is claimed for attempt 1, and an existing one gives :obj:`None`.
    Settlements: a wrong claim id does not land, and the owner's completion does.
    In an outbox store the completion's outbox calls come back as ids.
    Its claim has a limit of 1, so ``sending`` names the first call only.
    Claims come after the settlements.
    The completed update is not claimed.
    A pending one is claimed.
    An id repeated gives :obj:`None`.
    The claims and the claimed records are owned by the identities returned.
    """
    features = _features(p)
    if features is None or not has_method(p.store, "commit"):
        return
    a = claimed_identity(p, 1, T + 3)  # lapsed at the claims' now: claimable unless settled
    p.require(p.add(2, "b2", T), "add of a new update_id returned False")
    wrong = AttemptIdentity(1, a.attempt, other_claim_id(a.claim_id))
    settlements: Tuple[Tuple[AttemptIdentity, Settlement], ...] = (
        (wrong, Completed(at=T + 2)),
        (a, Completed(at=T + 2)),
    )
    calls = (
        OutboxCall("sendMessage", '{"text": "x"}', 7, 0, False),
        OutboxCall("sendMessage", '{"text": "y"}', 8, 1, False),
    )
    claim = CallClaim("sender-1", T + 4 + L, 1)
    effects = {a: AttemptEffects(calls=calls, claim=claim)} if features.outbox else None
    terms = ClaimTerms(T + 4, T + 4 + L, 5, False)
    batch = Batch(
        terms,
        records=((2, "b2", T + 4), (3, "b3", T + 4)),
        claimed_records=((4, "b4", T + 4), (1, "b1", T + 4)),
        settlements=settlements,
        effects=effects,
        claims=(1, 3, 3),
    )
    got = p.commit(batch)
    p.expect(
        list(got.recorded) == [False, True],
        f"commit recorded {list(got.recorded)}; add gives [False, True] (existing; new)",
    )
    p.expect(
        _shape(got.claimed_records) == [(4, 1), None],
        f"commit claimed records {_shape(got.claimed_records)} (as (update_id, attempt)); "
        "expected [(4, 1), None] (new; existing)",
    )
    p.expect(
        [bool(x) and not isinstance(x, StateConflict) for x in got.landed] == [False, True],
        f"commit landed {list(got.landed)}; expected [False, True] (a wrong claim id; the owner)",
    )
    p.expect(
        _shape(got.claims) == [None, (3, 1), None],
        f"commit claimed {_shape(got.claims)}; expected [None, (3, 1), None] (update 1 completed "
        "in the same commit; update 3 recorded pending in it; 3 repeated)",
    )
    p.expect(not p.owns(a, T + 2), "the completion in commit did not land")
    for identity in (*got.claimed_records, *got.claims):
        if identity is not None:
            p.expect(
                p.owns(identity, T + 4 + L),
                f"update {identity.update_id} claimed by commit is not owned by the identity "
                "it returned",
            )
    if features.outbox:
        ids = got.call_ids.get(a, ())
        p.expect(len(ids) == 2, f"commit returned call ids {ids} for two calls; expected two")
        if len(ids) == 2:
            entries = [p.call("get_call", call_id) for call_id in ids]
            p.expect(
                [None if e is None else (e.update_id, e.seq) for e in entries] == [(1, 0), (1, 1)],
                f"get_call of the ids commit returned gave {entries!r}: expected the two calls "
                "the completion wrote, in order",
            )
            p.expect(
                got.sending == frozenset(ids[:1]),
                f"commit says {sorted(got.sending)} were inserted claimed; the claim's limit of "
                f"1 claims the first call only ({ids[0]})",
            )
    p.expect(
        p.commit(Batch(terms)) == Committed(),
        "commit of an empty batch did not return an empty Committed",
    )


@rule(
    "batch-commit-atomic",
    "durable",
    "A commit that fails part way applies nothing of its batch.",
    applies="only for a store that declares ``features``",
)
def rule_batch_commit_atomic(p: Probe, fenced: bool, durable: bool) -> None:
    """A batch whose last part the store refuses raises.

    The refused part is an update id that is not a valid Telegram update id.
    The earlier parts of the batch leave no trace.
    The settlement did not land and the record was not made.
    """
    if _features(p) is None or not has_method(p.store, "commit"):
        return
    a = claimed_identity(p, 1, T + L)
    batch = Batch(
        ClaimTerms(T + 4, T + 4 + L, 5, False),
        records=((2, "b2", T + 4),),
        settlements=((a, Completed(at=T + 2)),),
        claims=(-1,),
    )
    try:
        p.store.commit(batch)
    except Exception:
        pass
    else:
        p.expect(False, "commit of a batch claiming update id -1 did not raise")
        return
    p.expect(p.owns(a, T + 3), "a failed commit still settled an attempt of its batch")
    p.expect(
        p.due(now=T + 5, pending_before=T + 5) == [],
        "a failed commit still recorded an update of its batch",
    )
