"""The claim of several rows in one statement
(the claims of ``commit``) on the three stores, equal row by row to the loop of ``claim_owned``;
the port's per-row fallback; PostgreSQL row locks under two concurrent claimers."""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Set, Tuple

import pytest

from broken_stores import FencedOnlyStore
from ptb_fence import (
    AttemptIdentity,
    Batch,
    ClaimTerms,
    Completed,
    Failed,
    MemoryUpdateStore,
    SQLiteUpdateStore,
)
from ptb_fence.runtime._port import StorePort

T = 1_700_000_000_000
L = 60_000
NOW = T + 10


def scene(store: Any) -> None:
    """At NOW with max_attempts=2: 1 pending, 2 live lease, 3 lease held exactly at NOW,
    4 lapsed lease, 5 failed due at NOW, 6 failed due at NOW + 1, 7 lapsed with its attempts
    spent, 8 completed, 9 pending received after T + 20, 10 and 11 pending."""
    for update_id in range(1, 12):
        received = T + 30 if update_id == 9 else T
        assert store.add(update_id, f"body-{update_id}", received)
    for update_id, lease_until in ((2, T + L), (3, NOW), (4, NOW - 1), (5, NOW), (6, NOW),
                                   (7, T + 1), (8, NOW)):
        identity = store.claim_owned(update_id, now=T, lease_until=lease_until, max_attempts=2)
        assert identity is not None
        if update_id in (5, 6):
            failed = Failed(at=T + 1, retry_at=NOW + update_id - 5, error="e")
            assert store.settle_owned(identity, failed)
        elif update_id == 8:
            assert store.settle_owned(identity, Completed(at=T + 1))
    assert store.claim_owned(7, now=T + 2, lease_until=NOW - 1, max_attempts=2) is not None


def claims(store: Any, ids: List[int], terms: ClaimTerms) -> List[Optional[AttemptIdentity]]:
    """The identities a ``commit`` of the claims of ``ids`` returns, one per id."""
    return list(store.commit(Batch(terms, claims=tuple(ids))).claims)


def shape(identities: List[Optional[AttemptIdentity]]) -> List[Optional[Tuple[int, int]]]:
    return [None if i is None else (i.update_id, i.attempt) for i in identities]


def state(store: Any) -> List[Tuple[int, str]]:
    """What is observable through the contract: due rows far ahead, exhaustions."""
    due = [(u.update_id, u.body) for u in store.due(now=T + 10**9, pending_before=T + 10**9,
                                                      limit=100)]
    return due + [(e.update_id, "exhausted") for e in store.due_exhaustions(limit=100)]


@pytest.mark.parametrize("durable", [False, True])
def test_the_claims_of_a_commit_equal_the_loop_of_claim_owned(
    fresh_stores: Callable[[], Any], durable: bool
) -> None:
    batch, loop = fresh_stores(), fresh_stores()
    scene(batch)
    scene(loop)
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 99, 1, 10]
    kwargs = dict(now=NOW, lease_until=NOW + L, max_attempts=2, durable_exhaustion=durable)
    got = claims(batch, ids, ClaimTerms(**kwargs))
    seen: Set[int] = set()
    want: List[Optional[AttemptIdentity]] = []
    for update_id in ids:
        want.append(None if update_id in seen else loop.claim_owned(update_id, **kwargs))
        seen.add(update_id)
    assert shape(got) == shape(want) == [
        (1, 1), None, None, (4, 2), (5, 2), None, None, None, None, None, (10, 1)
    ]
    taken = [i for i in got if i is not None]
    assert len({i.claim_id for i in taken}) == len(taken)
    for identity in taken:
        assert batch.owns(identity, NOW + L) and not batch.owns(identity, NOW + L + 1)
    assert state(batch) == state(loop)
    # 7 was spent: abandoned (an exhaustion only with durable_exhaustion), never claimable
    assert (7, "exhausted") in state(batch) if durable else 7 not in dict(state(batch))
    assert batch.claim_owned(7, now=T + 10**9, lease_until=T + 10**9, max_attempts=9) is None
    assert claims(batch, [], ClaimTerms(NOW, NOW + L, 2)) == []


def test_the_port_falls_back_to_claim_owned_row_by_row() -> None:
    native, bare = MemoryUpdateStore(), FencedOnlyStore()
    results = []
    for store in (native, bare):
        port = StorePort(store, component="test", fenced=True)
        assert port.commits_batches is (store is native)
        for update_id in (1, 2, 3, 4):
            assert port.add(update_id, f"b{update_id}", T)
        many = port.claim_owned_many([2, 2, 9, 4], ClaimTerms(T, T + L, 3))
        assert many[0] is not None and port.owns(many[0], T + L)
        results.append(shape(many))
    assert results[0] == results[1] == [(2, 1), None, None, (4, 1)]


# -- PostgreSQL: row locks -----------------------------------------------------------------------
@pytest.mark.parametrize("store_kind", ["postgres"])
def test_pg_two_processes_claiming_the_same_ids_at_once_never_share_a_row(
    shared_stores: Callable[[], Any],
) -> None:
    one, two = shared_stores(), shared_stores()  # two connections to one table
    ids = list(range(1, 201))
    assert all(one.add_many([(u, f"b{u}", T) for u in ids]))
    got: List[List[Optional[AttemptIdentity]]] = [[], []]
    start = threading.Barrier(2)

    def claim(index: int, store: Any, order: List[int]) -> None:
        start.wait()
        for offset in range(0, len(order), 20):  # overlapping batches, opposite orders
            got[index] += claims(store, order[offset : offset + 20], ClaimTerms(NOW, NOW + L, 3))

    threads = [
        threading.Thread(target=claim, args=(0, one, ids)),
        threading.Thread(target=claim, args=(1, two, ids[::-1])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    won = [i.update_id for i in got[0] + got[1] if i is not None]
    assert sorted(won) == ids  # each row claimed exactly once, no deadlock


def test_the_capability_is_declared_documented_and_shipped() -> None:
    import inspect

    import ptb_fence
    from ptb_fence import BatchStore, PostgresUpdateStore
    assert "BatchStore" in ptb_fence.__all__
    for name in ("commit",):
        declared = inspect.signature(getattr(BatchStore, name))
        assert inspect.getdoc(getattr(BatchStore, name)), name
        for cls in (MemoryUpdateStore, SQLiteUpdateStore, PostgresUpdateStore):
            shipped = inspect.signature(getattr(cls, name))
            assert list(shipped.parameters) == list(declared.parameters), (cls, name)
            assert inspect.getdoc(getattr(cls, name)), (cls, name)
