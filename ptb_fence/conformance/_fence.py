"""The fence.

Only the live claim writes, also inside the caller's transaction.
``fence`` runs for every fenced store.
``transaction()``, ``owns``/``settle_owned(connection=...)`` and
``complete_owned``/``reopen_completed`` are checked when the store has them.
"""

from __future__ import annotations

import threading
import time
from typing import Any, List

from ptb_fence._values import AttemptIdentity, Completed
from ptb_fence.contract import takes_connection
from ptb_fence.conformance._probe import (
    FAR,
    JOIN_TIMEOUT,
    L,
    T,
    Abort,
    Probe,
    StoreRaised,
    claimed_identity,
    has_method,
    other_claim_id,
    stamp,
)
from ptb_fence.conformance._rule import rule


class _Rollback(Exception):
    """Raised inside ``transaction()`` by the check to see the block roll back."""


def _takes_connection(store: Any, method: str) -> bool:
    """Whether ``store.method`` exists and accepts the ``connection=`` keyword (duck typing).

    A store with only the batch form of ``settle_owned`` has no such keyword.
    """
    return takes_connection(getattr(store, method, None))


@rule(
    "transaction",
    "fenced",
    "transaction() (when present) commits on normal exit and rolls back and re-raises "
    "on an exception.",
    applies="only for a store with ``transaction()``",
)
def rule_transaction(p: Probe, fenced: bool, durable: bool) -> None:
    """A block that ends normally commits.

    The block's exception is re-raised unchanged.
    ``settle_owned`` may take ``connection=``.
    A settle made with it in a block that raises is then rolled back.
    """
    if not has_method(p.store, "transaction"):
        return
    with_connection = _takes_connection(p.store, "settle_owned")
    a = claimed_identity(p, 1, T + L)
    error = _Rollback("raised inside the block by the check")
    try:
        with p.call("transaction") as conn:
            if with_connection and conn is not None:
                p.settle_owned(a, Completed(at=T + 5), connection=conn)
            raise error
    except _Rollback as exc:
        p.expect(exc is error, "transaction() replaced the exception raised inside its block")
    else:
        p.fail("transaction() swallowed the exception raised inside its block; it must roll "
               "back and re-raise it")
    if with_connection:
        p.expect(p.owns(a, T + 5), "a settle_owned(connection=conn) inside a transaction() "
                 "block that raised was not rolled back: the row is no longer owned")
    with p.call("transaction") as conn:
        landed = p.settle_owned(a, Completed(at=T + 5), connection=conn) if with_connection \
            else p.settle_owned(a, Completed(at=T + 5))
        p.expect(landed, "settle_owned inside transaction() returned False for the live claim")
    p.expect(not p.owns(a, T + 5), "the settle_owned of a transaction() block that ended "
             "normally was not committed: the row is still owned")
    taken = p.claim_owned(1, now=FAR, lease_until=FAR + L)
    p.expect(taken is None, f"the update completed in a transaction() block was claimed again "
             f"({taken!r})")


@rule(
    "connection-fence",
    "fenced",
    "owns/settle_owned(connection=) run inside the caller's transaction: the settle "
    "rolls back and commits with it, and the row stays held against a competing claim.",
    applies="only with ``transaction()`` and ``connection=`` on ``owns``/``settle_owned``",
)
def rule_connection_fence(p: Probe, fenced: bool, durable: bool) -> None:
    """``owns`` and ``settle_owned`` take part in the caller's transaction.

    The rule works inside ``with store.transaction() as conn``.
    ``owns(identity, at, connection=conn)`` confirms the live claim.
    ``settle_owned(..., connection=conn)`` rolls back when the block raises.
    It lands when the block commits.
    The block holds the row after ``owns(connection=conn)``.
    Meanwhile a ``claim_owned`` from another thread with the lease lapsed does not take the row.
    It waits and returns :obj:`None` after the commit.
    A ``transaction()`` may yield :obj:`None` (no connection).
    :class:`ptb_fence.MemoryUpdateStore`'s does, and it holds the store's lock.
    Such a store is checked for the competing claim only.
    """
    if not (
        has_method(p.store, "transaction")
        and _takes_connection(p.store, "owns")
        and _takes_connection(p.store, "settle_owned")
    ):
        return
    a = claimed_identity(p, 1, T + L)
    # 1. A settle on the caller's connection rolls back with the caller's transaction.
    # A transaction() that yields None has no connection to roll back. Only its lock is checked.
    yielded: List[Any] = []
    try:
        with p.call("transaction") as conn:
            yielded.append(conn)
            if conn is not None:
                p.expect(p.owns(a, T + 5, connection=conn), "owns(connection=conn) returned "
                         "False for the live claim inside transaction()")
                p.settle_owned(a, Completed(at=T + 5), connection=conn)
            raise _Rollback("raised inside the block by the check")
    except _Rollback:
        pass
    if yielded and yielded[0] is not None:
        p.require(
            p.owns(a, T + 5) and p.due_ids(now=T + L + 1, pending_before=T - 1) == [1],
            "settle_owned(connection=conn) landed although the caller's transaction rolled "
            "back (it must run on the caller's connection and never commit by itself)",
        )
    # 2. While the caller's transaction holds the row, a competing claim does not take it.
    started = threading.Event()
    result: List[Any] = []

    def compete() -> None:
        started.set()
        try:
            result.append(p.claim_owned(1, now=T + L + 1, lease_until=FAR))
        except BaseException as exc:  # reported below
            result.append(exc)

    thread = threading.Thread(target=compete, name="conformance-competing-claim", daemon=True)
    with p.call("transaction") as conn:
        p.require(p.owns(a, T + 5, connection=conn), "owns(connection=conn) returned False for "
                  "the live claim inside transaction()")
        thread.start()
        started.wait(JOIN_TIMEOUT)
        time.sleep(0.2)  # let the competing claim reach the store while the row is held
        landed = p.settle_owned(a, Completed(at=T + 5), connection=conn)
        p.expect(landed, "settle_owned(connection=conn) returned False for the claim that "
                 "owns(connection=conn) had just confirmed")
    thread.join(JOIN_TIMEOUT)
    p.require(not thread.is_alive(), f"a competing claim_owned did not return within "
              f"{JOIN_TIMEOUT:g} s after the transaction committed")
    competitor = result[0] if result else None
    if isinstance(competitor, Abort):
        raise competitor
    if isinstance(competitor, BaseException):
        raise StoreRaised("claim_owned", competitor)
    p.expect(
        competitor is None,
        f"a competing claim_owned (lease lapsed) from another thread took the update while the "
        f"caller's transaction held it after owns(connection=conn) (returned {competitor!r}); "
        "the ownership check must lock the row until the caller's transaction ends",
    )
    p.expect(not p.owns(a, T + 5), "the settle_owned(connection=conn) of a committed "
             "transaction did not land")


@rule(
    "completing",
    "fenced",
    "complete_owned/reopen_completed (when present): complete_owned is inclusive at "
    "due_at, refuses wrong claim ids and changes nothing then, rolls back with the "
    "caller's transaction and holds the row against a competing claim until its commit; "
    "reopen_completed undoes exactly that completion, once.",
    applies="only with ``transaction()``, ``complete_owned`` and ``reopen_completed``",
)
def rule_completing(p: Probe, fenced: bool, durable: bool) -> None:
    """``complete_owned`` and ``reopen_completed`` run inside the caller's transaction.

    The rule works inside ``with store.transaction() as conn``.
    ``complete_owned(identity, at, connection=conn)`` completes the live claim.
    It does so with ``at == due_at`` too.
    It is rolled back with the block, and the claim is owned again with the same lease.
    At ``due_at + 1`` or with a wrong claim id it returns :obj:`False` and changes nothing.
    The block holds the completed row.
    Meanwhile a ``claim_owned`` from another thread with the lease lapsed waits.
    It returns :obj:`None` after the commit.
    ``reopen_completed(identity, at, connection=conn)`` turns back exactly that completion.
    It needs the same claim id and ``at``.
    It works once and keeps the claim's lease.
    """
    if not (
        has_method(p.store, "transaction")
        and has_method(p.store, "complete_owned")
        and has_method(p.store, "reopen_completed")
    ):
        return

    def complete(identity: AttemptIdentity, at: int, conn: Any) -> bool:
        value = p.call("complete_owned", identity, at, connection=conn)
        return p.real_bool("complete_owned", value)

    def reopen(identity: AttemptIdentity, at: int, conn: Any) -> bool:
        value = p.call("reopen_completed", identity, at, connection=conn)
        return p.real_bool("reopen_completed", value)

    a = claimed_identity(p, 1, T + L)
    # 1. A lease ending exactly at the check holds. The caller's rollback restores the claim.
    try:
        with p.call("transaction") as conn:
            p.require(complete(a, T + L, conn), "complete_owned returned False for the live "
                      f"claim at {stamp(T + L)}, the end of its lease (due_at == at still holds)")
            raise _Rollback("raised inside the block by the check")
    except _Rollback:
        pass
    p.require(p.owns(a, T + L), "complete_owned landed although the caller's transaction "
              "rolled back: the rollback must restore the claim (owned, same lease)")
    # 2. Refusals change nothing. The lease ended 1 ms before the check, or the claim id is stale.
    stale = AttemptIdentity(1, a.attempt, other_claim_id(a.claim_id))
    with p.call("transaction") as conn:
        p.expect(not complete(a, T + L + 1, conn), f"complete_owned at {stamp(T + L + 1)} "
                 f"returned True for a lease that ended at {stamp(T + L)}")
        p.expect(not complete(stale, T + 5, conn), "complete_owned returned True for a wrong "
                 "claim id")
    p.require(p.owns(a, T + L), "a refused complete_owned changed the row: the claim is no "
              "longer owned")
    # 3. The row stays held against a competing claim until the caller's commit.
    result: List[Any] = []
    started = threading.Event()

    def compete() -> None:
        started.set()
        try:
            result.append(p.claim_owned(1, now=T + L + 1, lease_until=FAR))
        except BaseException as exc:  # reported below
            result.append(exc)

    thread = threading.Thread(target=compete, name="conformance-completing-claim", daemon=True)
    with p.call("transaction") as conn:
        p.require(complete(a, T + 5, conn), "complete_owned returned False for the live claim")
        thread.start()
        started.wait(JOIN_TIMEOUT)
        time.sleep(0.2)  # let the competing claim reach the store while the row is held
    thread.join(JOIN_TIMEOUT)
    p.require(not thread.is_alive(), "a competing claim_owned did not return within "
              f"{JOIN_TIMEOUT:g} s after the transaction committed")
    competitor = result[0] if result else None
    if isinstance(competitor, Abort):
        raise competitor
    if isinstance(competitor, BaseException):
        raise StoreRaised("claim_owned", competitor)
    p.expect(competitor is None, f"a competing claim_owned (lease lapsed) took the update "
             f"completed by complete_owned in the caller's transaction ({competitor!r}): the "
             "row must stay held until the caller's transaction ends")
    p.require(not p.owns(a, T + 5), "the complete_owned of a committed transaction did not land")
    # 4. reopen_completed undoes exactly that completion, once.
    with p.call("transaction") as conn:
        p.expect(not reopen(a, T + 6, conn), "reopen_completed undid a completion made at "
                 f"another time ({stamp(T + 6)}, completed at {stamp(T + 5)})")
        p.expect(not reopen(stale, T + 5, conn), "reopen_completed undid the completion of "
                 "another claim id")
    with p.call("transaction") as conn:
        p.expect(reopen(a, T + 5, conn), "reopen_completed returned False for the completion "
                 "complete_owned made")
    p.expect(p.owns(a, T + L), "after reopen_completed the claim is not owned with its lease")
    with p.call("transaction") as conn:
        p.expect(not reopen(a, T + 5, conn), "reopen_completed undid the same completion twice")


@rule(
    "fence",
    "fenced",
    "owns is inclusive at due_at; wrong claim ids, expired and reclaimed attempts and "
    "identities from before a prune and re-add are refused.",
)
def rule_fence(p: Probe, fenced: bool, durable: bool) -> None:
    """``owns`` is inclusive at ``due_at`` and :obj:`False` at ``due_at + 1``.

    ``owns``, ``renew_owned`` and ``settle_owned`` refuse a wrong claim id or attempt.
    A refused call changes nothing.
    There is no resurrection after expiry.
    A reclaim gets attempt + 1 and a different claim id.
    The old identity is then refused.
    ``prune`` and a new ``add`` of the same ``update_id`` restart the attempt at 1.
    The old identity ``(update_id, 1, old claim id)`` is then refused.
    """
    p.require(p.add(1, "b", T), "add of a new update_id returned False")
    first = p.claim_owned(1, now=T, lease_until=T + L)
    p.require(
        first is not None and first.update_id == 1 and first.attempt == 1,
        f"claim_owned of a pending update returned {first!r}; expected update 1, attempt 1",
    )
    assert first is not None
    lease = T + L
    p.expect(p.owns(first, T), "owns right after claim_owned returned False")
    p.expect(
        p.owns(first, lease),
        f"owns at exactly due_at ({stamp(lease)}) returned False; the fence is inclusive",
    )
    p.expect(
        not p.owns(first, lease + 1), f"owns at due_at + 1 ({stamp(lease + 1)}) returned True"
    )

    wrong_claim = AttemptIdentity(1, 1, other_claim_id(first.claim_id))
    wrong_attempt = AttemptIdentity(1, 2, first.claim_id)
    for label, wrong in (("a wrong claim id", wrong_claim), ("a wrong attempt", wrong_attempt)):
        p.expect(not p.owns(wrong, T), f"owns with {label} returned True")
        p.expect(
            not p.renew_owned(wrong, lease + 5 * L, now=T),
            f"renew_owned with {label} returned True",
        )
        p.expect(
            not p.renew_owned(wrong, lease + 5 * L),
            f"renew_owned (without now) with {label} returned True",
        )
        p.expect(
            not p.settle_owned(wrong, Completed(at=T + 1)),
            f"settle_owned with {label} returned True",
        )
    p.expect(
        p.owns(first, lease) and not p.owns(first, lease + 1),
        "refused calls with a wrong identity changed the owner's lease or settled the update",
    )
    p.expect(
        p.renew_owned(first, lease, now=lease),
        f"renew_owned at now == due_at ({stamp(lease)}) returned False; the lease is live then",
    )
    p.expect(
        not p.renew_owned(first, lease + 5 * L, now=lease + 1),
        "renew_owned with now after expiry returned True: an expired fence was resurrected",
    )
    p.expect(
        not p.owns(first, lease + 1) and not p.owns(first, lease + 5 * L),
        "owns returned True after the lease expired (resurrected by a late renew_owned?)",
    )
    p.expect(
        not p.settle_owned(first, Completed(at=lease + 1)),
        "settle_owned after the lease expired returned True",
    )

    second = p.claim_owned(1, now=lease + 1, lease_until=lease + 1 + L)
    p.require(
        second is not None and second.update_id == 1 and second.attempt == 2,
        f"reclaim of the lapsed update returned {second!r}; expected attempt 2",
    )
    assert second is not None
    lease2 = lease + 1 + L
    p.expect(
        second.claim_id != first.claim_id,
        "a reclaim returned the same claim id as the previous attempt; every claim needs a "
        "fresh one",
    )
    old_with_new_attempt = AttemptIdentity(1, 2, first.claim_id)
    olds = (("old identity", first), ("old claim id with the new attempt", old_with_new_attempt))
    for label, old in olds:
        p.expect(not p.owns(old, lease + 1), f"after a reclaim, owns with the {label} was True")
        p.expect(
            not p.renew_owned(old, lease2 + L, now=lease + 1),
            f"after a reclaim, renew_owned with the {label} returned True",
        )
        p.expect(
            not p.renew_owned(old, lease2 + L),
            f"after a reclaim, renew_owned (without now) with the {label} returned True",
        )
        p.expect(
            not p.settle_owned(old, Completed(at=lease + 2)),
            f"after a reclaim, settle_owned with the {label} returned True",
        )
    p.expect(
        p.owns(second, lease2) and not p.owns(second, lease2 + 1),
        "the new owner's lease changed after refused calls by the old attempt",
    )
    p.expect(
        p.settle_owned(second, Completed(at=lease2)),
        "settle_owned(Completed) at exactly due_at returned False",
    )
    p.expect(not p.owns(second, lease2), "owns returned True for a completed attempt")
    p.expect(
        not p.settle_owned(second, Completed(at=lease2)),
        "a second settle_owned of the completed attempt returned True",
    )

    pruned = p.prune(lease2 + 1)
    p.require(pruned == 1, f"prune after the completion returned {pruned}; expected 1")
    p.require(p.add(1, "again", lease2 + 2), "the pruned update_id could not be added again")
    now = lease2 + 2
    third = p.claim_owned(1, now=now, lease_until=now + L)
    p.require(
        third is not None and third.update_id == 1,
        f"claim_owned of the re-added update returned {third!r}",
    )
    assert third is not None
    lease3 = now + L
    p.expect(
        third.attempt == 1,
        f"claim_owned of a re-added update returned attempt {third.attempt}; it restarts at 1",
    )
    p.expect(
        third.claim_id not in (first.claim_id, second.claim_id),
        "claim_owned of a re-added update returned a claim id used before",
    )
    stale = AttemptIdentity(1, 1, first.claim_id)
    p.expect(
        not p.owns(stale, now),
        "after prune and re-add, owns accepted the old identity (same update_id, attempt 1, "
        "old claim id)",
    )
    p.expect(
        not p.renew_owned(stale, lease3 + 5 * L, now=now),
        "after prune and re-add, renew_owned accepted the old identity",
    )
    p.expect(
        not p.settle_owned(stale, Completed(at=now)),
        "after prune and re-add, settle_owned accepted the old identity",
    )
    p.expect(
        p.owns(third, lease3) and not p.owns(third, lease3 + 1),
        "after refused calls by the old identity, the new attempt's lease changed or was lost",
    )
    p.expect(
        p.settle_owned(third, Completed(at=now + 1)),
        "settle_owned of the new attempt after the refused old identity returned False",
    )
