"""The fast paths of every store's ``commit``: claimed records, settlements, and both with
claims, each in one transaction."""

from __future__ import annotations

import threading
from typing import Any, List

import pytest

from ptb_fence import Abandoned, AttemptIdentity, Batch, ClaimTerms, Completed, Failed
from store_support import settle_many

NOW = 1_700_000_000_000
LEASE = NOW + 60_000


def claimed_records(store: Any, rows: Any, lease_until: int = LEASE) -> List[Any]:
    """The identities of a ``commit`` of ``rows`` as claimed records with ``lease_until``."""
    terms = ClaimTerms(NOW, lease_until, 5)
    return list(store.commit(Batch(terms, claimed_records=tuple(rows))).claimed_records)


def test_claimed_records_record_and_claim_fresh_ids_only(shared_stores: Any) -> None:
    store = shared_stores()
    assert store.add(5, '{"update_id": 5}', NOW) is True
    result = claimed_records(
        store,
        [(1, '{"update_id": 1}', NOW), (2, '{"update_id": 2}', NOW), (1, "{}", NOW), (5, "{}", NOW)],
    )
    assert [r if r is None else (r.update_id, r.attempt) for r in result] == [
        (1, 1),
        (2, 1),
        None,
        None,
    ]
    first, second = result[0], result[1]
    assert isinstance(first.claim_id, str) and first.claim_id and first.claim_id != second.claim_id
    # the claim is live until the lease, inclusive, and the body is the first one given
    assert store.owns(first, LEASE) is True
    assert store.owns(first, LEASE + 1) is False
    assert store.claim_owned(1, now=LEASE, lease_until=LEASE + 10, max_attempts=5) is None
    taken = store.claim_owned(1, now=LEASE + 1, lease_until=LEASE + 100, max_attempts=5)
    assert taken is not None and taken.attempt == 2 and taken.claim_id != first.claim_id
    assert [u.body for u in store.due(now=LEASE + 200, pending_before=NOW, limit=10)] == [
        '{"update_id": 1}',
        '{"update_id": 2}',
        '{"update_id": 5}',
    ]
    # a pre-claimed row is not pending: it is not listed before its lease lapses
    assert [u.update_id for u in store.due(now=NOW, pending_before=NOW, limit=10)] == [5]
    assert claimed_records(store, []) == []


def test_claimed_records_race_across_connections(shared_stores: Any) -> None:
    stores = [shared_stores() for _ in range(4)]  # four connections (memory: one store)
    wins: List[AttemptIdentity] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(stores))

    def worker(store: Any) -> None:
        barrier.wait(timeout=10)
        got = claimed_records(store, [(i, "{}", NOW) for i in range(50)])
        with lock:
            wins.extend(r for r in got if r is not None)

    threads = [threading.Thread(target=worker, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(w.update_id for w in wins) == list(range(50))


def test_settlements_land_each_exact_live_claim_once(shared_stores: Any) -> None:
    store = shared_stores()
    a, b, c, d = claimed_records(store, [(i, f'{{"update_id": {i}}}', NOW) for i in (1, 2, 3, 4)])
    forged = AttemptIdentity(4, 1, "not-the-claim")
    landed = settle_many(
        store,
        [
            (a, Completed(NOW + 5)),
            (b, Failed(NOW + 5, NOW + 100, "boom")),
            (c, Abandoned(NOW + 5, "gave up")),
            (a, Completed(NOW + 6)),  # the same attempt again: already settled
            (forged, Completed(NOW + 5)),  # wrong claim id
            (d, Completed(LEASE + 1)),  # after the lease
        ]
    )
    assert landed == [True, True, True, False, False, False]
    assert all(type(x) is bool for x in landed)
    assert store.owns(d, LEASE) is True  # d untouched
    due = store.due(now=NOW + 100, pending_before=NOW, limit=10)
    assert [u.update_id for u in due] == [2]
    assert store.prune(NOW + 6) == 2  # completed 1 and abandoned 3
    assert settle_many(store, []) == []


@pytest.mark.parametrize("bad", [None, "5", 1.0, True, float("nan"), -1, 2**63, [1]])
def test_every_way_in_refuses_impossible_update_ids(shared_stores: Any, bad: Any) -> None:
    store = shared_stores()
    with pytest.raises((TypeError, ValueError)):
        store.add(bad, "{}", NOW)
    with pytest.raises((TypeError, ValueError)):
        store.add_many([(1, "{}", NOW), (bad, "{}", NOW)])
    with pytest.raises((TypeError, ValueError)):
        claimed_records(store, [(bad, "{}", NOW)])
    # nothing was written, not even the valid row of the refused batch
    assert store.due(now=NOW, pending_before=NOW, limit=10) == []
    assert store.add(1, "{}", NOW) is True


def test_claimed_records_and_settlements_are_one_transaction(shared_stores: Any) -> None:
    store = shared_stores()
    (old,) = claimed_records(store, [(1, '{"update_id": 1}', NOW)])
    got = store.commit(Batch(
        ClaimTerms(NOW, LEASE, 5),
        claimed_records=((2, '{"update_id": 2}', NOW), (1, "{}", NOW)),
        settlements=((old, Completed(NOW + 1)), (AttemptIdentity(1, 1, "forged"), Completed(NOW))),
    ))
    added, landed = list(got.claimed_records), list(got.landed)
    assert [a if a is None else (a.update_id, a.attempt) for a in added] == [(2, 1), None]
    assert landed == [True, False]
    assert store.owns(added[0], LEASE) is True
    assert store.prune(NOW + 2) == 1  # update 1 completed at NOW + 1
    empty = store.commit(Batch(ClaimTerms(NOW, LEASE, 5)))
    assert (empty.claimed_records, empty.landed) == ((), ())


def test_settlements_then_claims_in_one_transaction(shared_stores: Any) -> None:
    store = shared_stores()
    (done,) = claimed_records(store, [(1, '{"update_id": 1}', NOW)])
    assert store.add_many([(2, "{}", NOW), (3, "{}", NOW)]) == [True, True]
    terms = ClaimTerms(NOW + 1, LEASE + 1, 5, False)
    # the completion lands, its own row is no longer claimable; 2 and 3 are claimed once each
    got = store.commit(Batch(
        terms,
        settlements=((done, Completed(NOW + 1)), (AttemptIdentity(2, 1, "forged"), Completed(NOW + 1))),
        claims=(2, 1, 3, 2),
    ))
    landed, claimed = list(got.landed), list(got.claims)
    assert landed == [True, False]
    assert [c if c is None else (c.update_id, c.attempt) for c in claimed] == [
        (2, 1), None, (3, 1), None,
    ]
    assert store.owns(claimed[0], LEASE + 1) is True
    assert store.prune(NOW + 2) == 1  # update 1 completed at NOW + 1
    empty = store.commit(Batch(terms))
    assert (empty.landed, empty.claims) == ((), ())
    # a refused batch changes nothing: the settle of the same call is rolled back too
    with pytest.raises((TypeError, ValueError)):
        store.commit(Batch(terms, settlements=((claimed[0], Completed(NOW + 3)),), claims=(-1,)))
    assert store.owns(claimed[0], LEASE + 1) is True
