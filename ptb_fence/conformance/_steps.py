"""Recorded steps.

A step's record lands only while its attempt owns the update.
The first record of a key stands.
Prune deletes the records of the rows it deletes and keeps the others.
The rule runs only for a store that declares ``steps``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, cast

from ptb_fence._values import AttemptIdentity, Completed, Failed, StepRecord
from ptb_fence.contract import StoreFeatures
from ptb_fence.conformance._probe import (
    FAR,
    L,
    T,
    Abort,
    Probe,
    claimed_identity,
    has_method,
    other_claim_id,
    stamp,
)
from ptb_fence.conformance._rule import rule


def _declares_steps(store: Any) -> bool:
    features = getattr(store, "features", None)
    return isinstance(features, StoreFeatures) and features.steps


def _step(identity: AttemptIdentity, name: str, at: int, result: str = '{"ok": 1}') -> StepRecord:
    """A record of step ``name`` by ``identity`` at ``at``, keyed by the update and the name."""
    return StepRecord(
        key=f"s-{identity.update_id}-{name}",
        update_id=identity.update_id,
        name=name,
        result=result,
        attempt=identity.attempt,
        claim_id=identity.claim_id,
        recorded_at=at,
    )


def _valid(value: object) -> bool:
    return (
        isinstance(value, StepRecord)
        and isinstance(value.key, str)
        and type(value.update_id) is int
        and isinstance(value.name, str)
        and isinstance(value.result, str)
        and type(value.attempt) is int
        and isinstance(value.claim_id, str)
        and type(value.recorded_at) is int
    )


def _record(p: Probe, record: StepRecord, **connection: Any) -> bool:
    return p.real_bool("record_step", p.call("record_step", record, **connection))


def _read(p: Probe, key: str) -> Optional[StepRecord]:
    value = p.call("read_step", key)
    ok = value is None or _valid(value)
    if not p.check_type("read_step", ok, "a StepRecord (str and int fields as declared) or None",
                        value):
        raise Abort
    return cast(Optional[StepRecord], value)


def _steps_of(p: Probe, update_id: int) -> List[StepRecord]:
    value = p.call("steps_of", update_id)
    ok = isinstance(value, list) and all(_valid(item) for item in value)
    if not p.check_type("steps_of", ok, "a list of StepRecord", value):
        raise Abort
    return list(value)


def _keys(records: List[StepRecord]) -> List[str]:
    return [record.key for record in records]


def _refused(p: Probe, record: StepRecord, why: str) -> None:
    """``record`` is refused with :obj:`False` and writes nothing."""
    landed = _record(p, record)
    p.expect(not landed, f"record_step of {why} returned True; it must return False")
    found = _read(p, record.key)
    p.expect(found is None, f"record_step of {why} wrote {found!r}; it must write nothing")


@rule(
    "steps",
    "fenced",
    "record_step (when declared) writes a step's record only while its attempt owns the update "
    "at recorded_at, keeps the first record of a key, rolls back with a caller's transaction, "
    "and prune deletes the records of the rows it deletes and keeps the others.",
    applies="only for a store that declares ``steps``",
)
def rule_steps(p: Probe, fenced: bool, durable: bool) -> None:
    """An empty store has no record: ``read_step`` gives :obj:`None`, ``steps_of`` an empty list.

    A record by the owning attempt lands (:obj:`True`) and reads back equal.
    ``steps_of`` lists it.
    A second record of the same key by the owner returns :obj:`True` and keeps the first.
    ``steps_of`` orders by ``recorded_at`` and then by key.
    A lease ending exactly at ``recorded_at`` owns the update.
    A lease ending one millisecond before ``recorded_at`` does not.
    A wrong claim id, a wrong attempt, an unknown update and a settled row are refused.
    A refused record returns :obj:`False` and writes nothing.
    A refused record of a key already recorded leaves the first one unchanged.
    A record made with ``connection=`` inside ``transaction()`` is gone when the block raises.
    It stands when the block ends normally.
    ``prune`` deletes the records of the completed row it deletes.
    It keeps those of a later completed row, a failed row and an unacknowledged exhaustion.
    """
    if not _declares_steps(p.store) or not all(
        has_method(p.store, m) for m in ("read_step", "record_step", "steps_of")
    ):
        return
    p.expect(_read(p, "s-1-none") is None, "read_step of a key never recorded did not return None")
    p.expect(_steps_of(p, 1) == [], "steps_of of an empty store did not return []")

    one = claimed_identity(p, 1, T + L)
    first = _step(one, "charge", T + 10, '{"charge": "c-1"}')
    p.require(_record(p, first), f"record_step by the owning attempt at {stamp(T + 10)} returned "
              "False")
    found = _read(p, first.key)
    p.expect(found == first, f"read_step returned {found!r}; expected the record {first!r}")
    listed = _steps_of(p, 1)
    p.expect(listed == [first], f"steps_of(1) returned {listed!r}; expected [{first!r}]")

    again = dataclasses.replace(first, result='{"charge": "c-2"}', recorded_at=T + 20)
    p.expect(_record(p, again), "record_step of a key already recorded by the owning attempt "
             "returned False; it must return True (the earlier record stands)")
    found = _read(p, first.key)
    p.expect(found == first, f"a second record of the same key changed it to {found!r}; the "
             f"first one must stay {first!r}")

    # order: by recorded_at, then by key (b before c at the same time, a earlier than both)
    late = _step(one, "b", T + 30)
    tied = _step(one, "a", T + 30)
    early = _step(one, "z", T + 5)
    for record in (late, tied, early):
        p.require(_record(p, record), "record_step by the owning attempt returned False")
    want = [early.key, first.key, tied.key, late.key]
    got = _keys(_steps_of(p, 1))
    p.expect(got == want, f"steps_of(1) listed the keys {got}; expected {want} (by "
             "recorded_at, then by key)")

    # the lease edge: due_at == recorded_at owns, due_at == recorded_at - 1 does not
    p.expect(_record(p, _step(one, "edge", T + L)),
             f"record_step at {stamp(T + L)} with the lease ending at {stamp(T + L)} returned "
             "False; a lease ending exactly at recorded_at owns the update")
    _refused(p, _step(one, "lapsed", T + L + 1),
             f"an attempt whose lease ended at {stamp(T + L)}, at {stamp(T + L + 1)}")

    two = claimed_identity(p, 2, FAR)
    _refused(p, _step(dataclasses.replace(two, claim_id=other_claim_id(two.claim_id)), "x", T + 1),
             "a wrong claim id")
    _refused(p, _step(dataclasses.replace(two, attempt=two.attempt + 1), "x", T + 1),
             "a wrong attempt")
    _refused(p, _step(AttemptIdentity(99, 1, "no-such-claim"), "x", T + 1), "an unknown update")
    stale = dataclasses.replace(first, claim_id=other_claim_id(one.claim_id), result='"stale"')
    p.expect(not _record(p, stale), "record_step of a recorded key by a wrong claim id returned "
             "True; it must return False")
    found = _read(p, first.key)
    p.expect(found == first, f"a refused record of a recorded key changed it to {found!r}")

    # a settled row is refused: completed and failed
    three = claimed_identity(p, 3, FAR)
    p.require(p.settle_owned(three, Completed(at=T + 100)),
              "settle_owned(Completed) of a live claim returned False")
    _refused(p, _step(three, "x", T + 101), "an attempt whose update is completed")
    four = claimed_identity(p, 4, FAR)
    p.require(p.settle_owned(four, Failed(at=T + 100, retry_at=FAR, error="x")),
              "settle_owned(Failed) of a live claim returned False")
    _refused(p, _step(four, "x", T + 101), "an attempt whose update failed")

    _connection_rolls_back(p)
    _prune(p, durable)


def _connection_rolls_back(p: Probe) -> None:
    if not has_method(p.store, "transaction"):
        return
    five = claimed_identity(p, 5, FAR)
    rolled = _step(five, "rolled", T + 1)
    landed: List[bool] = []
    try:
        with p.call("transaction") as connection:
            landed.append(_record(p, rolled, connection=connection))
            raise _Rollback
    except _Rollback:
        pass
    p.expect(landed == [True], "record_step(connection=) by the owning attempt inside "
             "transaction() returned False")
    found = _read(p, rolled.key)
    p.expect(found is None, f"record_step(connection=) inside a transaction() block that raised "
             f"left {found!r}; it must roll back with the block")
    kept = _step(five, "kept", T + 2)
    with p.call("transaction") as connection:
        p.expect(_record(p, kept, connection=connection), "record_step(connection=) by the "
                 "owning attempt inside transaction() returned False")
    found = _read(p, kept.key)
    p.expect(found == kept, f"record_step(connection=) inside a transaction() block that ended "
             f"normally left {found!r}; expected {kept!r}")


class _Rollback(Exception):
    """Raised inside a ``transaction()`` block so it rolls back."""


def _prune(p: Probe, durable: bool) -> None:
    """Completed rows 10 (settled at T+100) and 11 (T+500), failed row 12, exhausted row 13."""
    records = {}
    for update_id in (10, 11, 12, 13):
        identity = claimed_identity(p, update_id, FAR)
        record = _step(identity, "charge", T + 1)
        p.require(_record(p, record), "record_step by the owning attempt returned False")
        records[update_id] = (identity, record)
    p.require(p.settle_owned(records[10][0], Completed(at=T + 100)),
              "settle_owned(Completed) of a live claim returned False")
    p.require(p.settle_owned(records[11][0], Completed(at=T + 500)),
              "settle_owned(Completed) of a live claim returned False")
    p.require(p.settle_owned(records[12][0], Failed(at=T + 100, retry_at=FAR, error="x")),
              "settle_owned(Failed) of a live claim returned False")
    if durable:
        p.require(p.exhaust(records[13][0], at=T + 100, error="x"),
                  "exhaust of a live claim returned False")
    pruned = p.prune(T + 200)
    p.expect(pruned >= 1, f"prune({stamp(T + 200)}) deleted {pruned} rows; the completed row 10 "
             f"settled at {stamp(T + 100)} is prunable")
    p.expect(_read(p, records[10][1].key) is None, "prune kept the record of the completed row "
             "10 it deleted")
    p.expect(_steps_of(p, 10) == [], "steps_of(10) lists records after prune deleted row 10")
    kept = {11: "a completed row settled after the cut", 12: "a failed row",
            13: "an unacknowledged exhaustion" if durable else "a processing row"}
    for update_id, what in kept.items():
        record = records[update_id][1]
        found = _read(p, record.key)
        p.expect(found == record, f"prune deleted the record of {what} ({update_id}), which it "
                 f"keeps; read_step returned {found!r}")
