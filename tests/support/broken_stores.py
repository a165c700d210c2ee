"""Deliberately broken stores: each breaks one requirement of the store contract.

They subclass (or wrap) :class:`ptb_fence.MemoryUpdateStore` and are used by
``tests/integration/test_conformance.py`` to show that
:func:`ptb_fence.conformance.check_update_store` bites. ``BROKEN`` maps every broken store to the
rule names that must report it.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from contextlib import contextmanager
from typing import (
    Any,
    Dict,
    FrozenSet,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Type,
)

from ptb_fence import (
    AttemptEffects,
    AttemptIdentity,
    Completed,
    Exhaustion,
    MemoryUpdateStore,
    OutboxEntry,
    Settlement,
    StateConflict,
    StateEntry,
    StateKey,
    StateWrite,
    JobFire,
    JobWrite,
    PaceBucket,
    StepRecord,
    StoreFigures,
    StoredJob,
    StoredUpdate,
)
from ptb_fence._errors import StateConflictError
from ptb_fence.contract import Batch, Committed
from ptb_fence.stores.memory._jobs import MemoryJobs
from ptb_fence.stores.memory._rows import CallRow


def _real_claim_id(store: MemoryUpdateStore, identity: AttemptIdentity) -> AttemptIdentity:
    """The identity with the claim id currently in the row (ignores the caller's claim id)."""
    row = store._rows.get(identity.update_id)  # noqa: SLF001 - deliberately breaking the store
    claim_id = row.claim_id if row is not None and row.claim_id else identity.claim_id
    return AttemptIdentity(identity.update_id, identity.attempt, claim_id)


# -- concurrency ---------------------------------------------------------------------------------
class ReadThenWriteClaimStore(MemoryUpdateStore):
    """claim/claim_owned check the row, sleep, then write without re-checking (no lock held)."""

    def _racey_take(
        self,
        update_id: int,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool,
    ) -> Optional[Tuple[int, str]]:
        with self._lock:
            row = self._rows.get(update_id)
            claimable = row is not None and self._claimable(row, now)
        if not claimable or row is None:
            return None
        time.sleep(0.003)  # the window in which every other claimer reads the same row
        with self._lock:
            if row.attempts >= max_attempts:
                row.state, row.due_at, row.error = "abandoned", now, "attempts spent"
                row.settled_at = None if durable_exhaustion else now
                return None
            row.state = "processing"
            row.attempts += 1
            row.due_at = lease_until
            row.error = None
            row.claim_id = uuid.uuid4().hex
            return row.attempts, row.claim_id

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[int]:
        taken = self._racey_take(update_id, now, lease_until, max_attempts, durable_exhaustion)
        return None if taken is None else taken[0]

    def claim_owned(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        taken = self._racey_take(update_id, now, lease_until, max_attempts, durable_exhaustion)
        return None if taken is None else AttemptIdentity(update_id, taken[0], taken[1])


# -- claim id ignored ----------------------------------------------------------------------------
class RenewOwnedIgnoresClaimIdStore(MemoryUpdateStore):
    """renew_owned checks only (update_id, attempt)."""

    def renew_owned(
        self, identity: AttemptIdentity, lease_until: int, now: Optional[int] = None
    ) -> bool:
        return self.renew(identity.update_id, identity.attempt, lease_until, now)


class SettleOwnedIgnoresClaimIdStore(MemoryUpdateStore):
    """settle_owned checks only (update_id, attempt)."""

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        with self._lock:
            return super().settle_owned(_real_claim_id(self, identity), settlement)


class ExhaustIgnoresClaimIdStore(MemoryUpdateStore):
    """exhaust checks only (update_id, attempt)."""

    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        with self._lock:
            return super().exhaust(_real_claim_id(self, identity), at=at, error=error)


class AcknowledgeIgnoresClaimIdStore(MemoryUpdateStore):
    """acknowledge_exhaustion checks only (update_id, attempt)."""

    def acknowledge_exhaustion(self, identity: AttemptIdentity, at: int) -> bool:
        with self._lock:
            return super().acknowledge_exhaustion(_real_claim_id(self, identity), at)


class OwnsIgnoresClaimIdStore(MemoryUpdateStore):
    """owns checks only (update_id, attempt)."""

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        with self._lock:
            return super().owns(_real_claim_id(self, identity), at)


class SettleOwnedAlwaysTrueStore(MemoryUpdateStore):
    """settle_owned says it landed even when it did not."""

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        super().settle_owned(identity, settlement)
        return True


class ReusedClaimIdStore(MemoryUpdateStore):
    """The claim id is derived from the update_id, so it repeats after prune and re-add."""

    def claim_owned(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        with self._lock:
            got = super().claim_owned(
                update_id,
                now=now,
                lease_until=lease_until,
                max_attempts=max_attempts,
                durable_exhaustion=durable_exhaustion,
            )
            if got is None:
                return None
            self._rows[update_id].claim_id = f"claim-{update_id}"
            return AttemptIdentity(update_id, got.attempt, f"claim-{update_id}")


# -- raising --------------------------------------------------------------------------------------
class DueRaisesStore(MemoryUpdateStore):
    """due raises RuntimeError."""

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        raise RuntimeError("due is broken")


class DueRaisesAndReadThenWriteClaimStore(ReadThenWriteClaimStore):
    """due raises, and claim is read-then-write (to see that later rules still run)."""

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        raise RuntimeError("due is broken")


# -- boundaries -----------------------------------------------------------------------------------
class TakeoverAtDueAtStore(MemoryUpdateStore):
    """A lease is taken over at now == due_at (should be due_at < now)."""

    @staticmethod
    def _claimable(row: Any, now: int) -> bool:
        if row.state == "processing":
            return row.due_at is not None and row.due_at <= now
        return MemoryUpdateStore._claimable(row, now)  # noqa: SLF001


class FailedDueLateStore(MemoryUpdateStore):
    """A failed row becomes due only after its retry time (should be due_at <= now)."""

    @staticmethod
    def _claimable(row: Any, now: int) -> bool:
        if row.state == "failed":
            return row.due_at is not None and row.due_at < now
        return MemoryUpdateStore._claimable(row, now)  # noqa: SLF001


class InclusivePruneStore(MemoryUpdateStore):
    """prune deletes settled_at <= before (should be settled_at < before)."""

    def prune(self, before: int) -> int:
        return super().prune(before + 1)


class PruneDeletesFailedStore(MemoryUpdateStore):
    """prune also deletes failed rows."""

    def prune(self, before: int) -> int:
        with self._lock:
            doomed = [u for u, r in self._rows.items() if r.state == "failed"]
            for update_id in doomed:
                del self._rows[update_id]
            return len(doomed) + super().prune(before)


class ShorteningRenewStore(MemoryUpdateStore):
    """renew/renew_owned set due_at = lease_until, even when that is earlier."""

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        with self._lock:
            row = self._rows.get(update_id)
            if row is None or not self._live(row, attempt, now, None):
                return False
            row.due_at = lease_until
            return True

    def renew_owned(
        self, identity: AttemptIdentity, lease_until: int, now: Optional[int] = None
    ) -> bool:
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(row, identity.attempt, now, identity.claim_id):
                return False
            row.due_at = lease_until
            return True


class RenewRevivesStore(MemoryUpdateStore):
    """renew ignores now, so it revives an expired lease."""

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        return super().renew(update_id, attempt, lease_until, None)


class SettleIgnoresExpiryStore(MemoryUpdateStore):
    """settle lands even after the lease expired."""

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        with self._lock:
            row = self._rows.get(update_id)
            if row is not None and self._live(row, attempt, None, None):
                self._apply(row, settlement)


class OwnsExclusiveStore(MemoryUpdateStore):
    """owns is False at at == due_at (should be inclusive)."""

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        return super().owns(identity, at + 1)


class ExhaustIgnoresExpiryStore(MemoryUpdateStore):
    """exhaust turns an expired attempt into an exhaustion."""

    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(row, identity.attempt, None, identity.claim_id):
                return False
            row.state, row.due_at, row.settled_at, row.error = "abandoned", at, None, error
            return True


class PendingBeforeStrictStore(MemoryUpdateStore):
    """due lists a pending row only when received_at < pending_before (should be <=)."""

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        return super().due(now=now, pending_before=pending_before - 1, limit=limit)


class DueByTextStore(MemoryUpdateStore):
    """due orders by the update_id's text ("100" before "7")."""

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        rows = super().due(now=now, pending_before=pending_before, limit=10**9)
        return sorted(rows, key=lambda r: str(r.update_id))[:limit]


class DueIgnoresLimitStore(MemoryUpdateStore):
    """due returns every row, whatever the limit."""

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        return super().due(now=now, pending_before=pending_before, limit=10**9)


class UpsertAddStore(MemoryUpdateStore):
    """add overwrites an existing row (resets it to pending) and returns True."""

    def add(self, update_id: int, body: str, received_at: int) -> bool:
        with self._lock:
            self._rows.pop(update_id, None)
            return super().add(update_id, body, received_at)


class IntBooleansStore(MemoryUpdateStore):
    """add returns 1/0 instead of True/False."""

    def add(self, update_id: int, body: str, received_at: int) -> bool:
        return int(super().add(update_id, body, received_at))  # type: ignore[return-value]


class EmptyClaimIdStore(MemoryUpdateStore):
    """claim_owned returns an empty claim id."""

    def claim_owned(self, update_id: int, **kwargs: Any) -> Optional[AttemptIdentity]:
        got = super().claim_owned(update_id, **kwargs)
        if got is None:
            return None
        with self._lock:
            self._rows[update_id].claim_id = ""
        return AttemptIdentity(got.update_id, got.attempt, "")


class SpendKeepsLiveLeaseClaimableStore(MemoryUpdateStore):
    """A claim with attempts spent abandons the row even while its lease is live."""

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[int]:
        with self._lock:
            row = self._rows.get(update_id)
            if row is not None and row.state == "processing" and row.attempts >= max_attempts:
                row.state, row.due_at, row.error = "abandoned", now, "attempts spent"
                row.settled_at = None if durable_exhaustion else now
                return None
            return super().claim(
                update_id,
                now=now,
                lease_until=lease_until,
                max_attempts=max_attempts,
                durable_exhaustion=durable_exhaustion,
            )


class SpendIgnoresDurableFlagStore(MemoryUpdateStore):
    """A spend always settles the row, so durable exhaustion is lost."""

    def _take(
        self,
        update_id: int,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool,
    ) -> Any:
        return super()._take(update_id, now, lease_until, max_attempts, False)


class AcknowledgeTwiceStore(MemoryUpdateStore):
    """acknowledge_exhaustion returns True for an already acknowledged row too."""

    def acknowledge_exhaustion(self, identity: AttemptIdentity, at: int) -> bool:
        with self._lock:
            row = self._rows.get(identity.update_id)
            if (
                row is not None
                and row.state == "abandoned"
                and row.attempts == identity.attempt
                and row.claim_id == identity.claim_id
            ):
                if row.settled_at is None:
                    row.settled_at = at
                return True
            return False


class InclusiveCursorStore(MemoryUpdateStore):
    """due_exhaustions includes the row at after_update_id (should be strictly after)."""

    def due_exhaustions(
        self, *, limit: int, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        after = None if after_update_id is None else after_update_id - 1
        return super().due_exhaustions(limit=limit, after_update_id=after)


class BaseSpendWithoutClaimIdStore(MemoryUpdateStore):
    """Base claim writes no claim id and a durable spend writes none either (legacy bug)."""

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[int]:
        with self._lock:
            row = self._rows.get(update_id)
            old = None if row is None else row.claim_id
            got = super().claim(
                update_id,
                now=now,
                lease_until=lease_until,
                max_attempts=max_attempts,
                durable_exhaustion=durable_exhaustion,
            )
            if row is not None:
                row.claim_id = old
            return got

    def due_exhaustions(
        self, *, limit: int, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        with self._lock:
            result = []
            for update_id in sorted(self._rows):
                row = self._rows[update_id]
                if after_update_id is not None and update_id <= after_update_id:
                    continue
                if row.state == "abandoned" and row.settled_at is None:
                    result.append(
                        Exhaustion(
                            update_id=update_id,
                            attempt=row.attempts,
                            claim_id=row.claim_id,  # type: ignore[arg-type]
                            body=row.body,
                            exhausted_at=row.due_at,  # type: ignore[arg-type]
                            error=row.error,
                        )
                    )
            return result[:limit]


class CloseRaisesStore(MemoryUpdateStore):
    """close raises."""

    def close(self) -> None:
        raise OSError("close is broken")


# -- capability levels ----------------------------------------------------------------------------
class BaseOnlyStore:
    """Only the six base methods (delegating to a memory store)."""

    def __init__(self, inner: Optional[MemoryUpdateStore] = None) -> None:
        self._inner = inner if inner is not None else MemoryUpdateStore()

    def add(self, update_id: int, body: str, received_at: int) -> bool:
        return self._inner.add(update_id, body, received_at)

    def claim(self, update_id: int, **kwargs: Any) -> Optional[int]:
        return self._inner.claim(update_id, **kwargs)

    def renew(self, update_id: int, attempt: int, lease_until: int, now: Any = None) -> bool:
        return self._inner.renew(update_id, attempt, lease_until, now)

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        self._inner.settle(update_id, attempt, settlement)

    def due(self, **kwargs: Any) -> List[StoredUpdate]:
        return self._inner.due(**kwargs)

    def prune(self, before: int) -> int:
        return self._inner.prune(before)


class FencedOnlyStore(BaseOnlyStore):
    """The ten fenced methods, no durable ones (delegating to a memory store)."""

    def claim_owned(self, update_id: int, **kwargs: Any) -> Optional[AttemptIdentity]:
        return self._inner.claim_owned(update_id, **kwargs)

    def renew_owned(self, identity: AttemptIdentity, lease_until: int, now: Any = None) -> bool:
        return self._inner.renew_owned(identity, lease_until, now)

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        return self._inner.owns(identity, at)

    def settle_owned(self, identity: AttemptIdentity, settlement: Settlement) -> bool:
        return self._inner.settle_owned(identity, settlement)


class BaseOnlyTakeoverAtDueAtStore(BaseOnlyStore):
    """Base-only wrapper around a store that takes a lease over at now == due_at."""

    def __init__(self) -> None:
        super().__init__(TakeoverAtDueAtStore())


class FencedOnlySettleOwnedIgnoresClaimIdStore(FencedOnlyStore):
    """Fenced-only wrapper whose settle_owned ignores the claim id."""

    def __init__(self) -> None:
        super().__init__(SettleOwnedIgnoresClaimIdStore())


class BatchRenewIgnoresClaimIdStore(MemoryUpdateStore):
    """renew_owned_many renews every processing row of the id, whatever the claim id."""

    def renew_owned_many(self, identities: Any, lease_until: int, now: int) -> Any:
        return [
            self.renew(i.update_id, i.attempt, lease_until, now) for i in identities
        ]


class BatchRenewNoneStore(MemoryUpdateStore):
    """renew_many answers None (\"locked\") for refused rows although nothing is locked."""

    def renew_many(self, leases: Any, lease_until: int, now: int) -> Any:
        return [True if ok else None for ok in super().renew_many(leases, lease_until, now)]


# -- optional capabilities -----------------------------------------------------------------------
class CommitRecordsOverwriteStore(MemoryUpdateStore):
    """The records of ``commit`` replace existing rows (an upsert) instead of refusing them."""

    def commit(self, batch: Batch) -> Committed:
        with self._lock:
            for update_id, _body, _at in batch.records:
                self._rows.pop(update_id, None)
            done = super().commit(batch)
            return dataclasses.replace(done, recorded=tuple(True for _ in done.recorded))


class CommitClaimedRecordsClaimExistingStore(MemoryUpdateStore):
    """The claimed records of ``commit`` also claim an id that already existed (attempt 1)."""

    def commit(self, batch: Batch) -> Committed:
        with self._lock:
            for update_id, _body, _at in batch.claimed_records:
                self._rows.pop(update_id, None)
            return super().commit(batch)


class CommitSettlesIgnoreClaimIdStore(MemoryUpdateStore):
    """The settlements of ``commit`` use the row's claim id, whatever the caller's claim id."""

    def commit(self, batch: Batch) -> Committed:
        with self._lock:
            settlements = tuple(
                (_real_claim_id(self, identity), settlement)
                for identity, settlement in batch.settlements
            )
            return super().commit(dataclasses.replace(batch, settlements=settlements))


class CommitWithClaimedRecordsDropsSettlementsStore(MemoryUpdateStore):
    """A ``commit`` with claimed records records them and forgets its settlements."""

    def commit(self, batch: Batch) -> Committed:
        if not batch.claimed_records:
            return super().commit(batch)
        done = super().commit(dataclasses.replace(batch, settlements=(), effects=None))
        return dataclasses.replace(done, landed=tuple(True for _ in batch.settlements))


class BindBotAcceptsAnyIdStore(MemoryUpdateStore):
    """bind_bot accepts every bot id (two bots would share one table)."""

    def bind_bot(self, bot_id: int) -> None:
        return None


class TransactionSwallowsErrorsStore(MemoryUpdateStore):
    """transaction() swallows the exception raised inside its block."""

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._lock:
            try:
                yield None
            except Exception:
                pass


class StagedConnection:
    """The "connection" of :class:`TransactionalMemoryStore`: settlements wait for the commit."""

    def __init__(self) -> None:
        self.settles: List[Tuple[AttemptIdentity, Settlement]] = []
        self.calls: List[CallRow] = []
        self.state: List[StateWrite] = []
        self.steps: List[StepRecord] = []
        self.jobs: List[Tuple[AttemptEffects, int]] = []


class TransactionalMemoryStore(MemoryUpdateStore):
    """A CORRECT memory store whose transaction() yields a connection and really rolls back:
    ``settle_owned(connection=conn)`` and ``write_effects(connection=conn)`` (its calls,
    state writes and jobs, versions checked when written) are staged on ``conn`` and applied
    only at the commit."""

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        with self._lock:
            conn = StagedConnection()
            yield conn  # an exception skips the commit below: the staged writes are dropped
            for identity, settlement in conn.settles:
                MemoryUpdateStore.settle_owned(self, identity, settlement)
            for call in conn.calls:
                self._calls[call.call_id] = call
            self._put_state(self._state, conn.state, 0)
            for step in conn.steps:
                self._steps.setdefault(step.key, step)
            for effects, at in conn.jobs:
                self._write_later(effects, at)

    def record_step(self, record: StepRecord, *, connection: Any = None) -> bool:
        if not isinstance(connection, StagedConnection):
            return super().record_step(record, connection=connection)
        with self._lock:
            live = self.owns(
                AttemptIdentity(record.update_id, record.attempt, record.claim_id),
                record.recorded_at,
            )
            if live:
                connection.steps.append(record)
            return live

    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        if not isinstance(connection, StagedConnection):
            return super().write_effects(identity, effects, at, connection=connection)
        with self._lock:
            staged = {write.key: write.version + 1 for write in connection.state}
            moved = tuple(
                write.key for write in effects.state
                if staged.get(write.key, getattr(self._state.get(write.key), "version", 0))
                != write.version
            )
            if moved:
                raise StateConflictError(moved)
            rows = self._new_calls(identity, effects, at)
            connection.calls.extend(rows)
            connection.state.extend(effects.state)
            connection.jobs.append((effects, at))
            return [row.call_id for row in rows]

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        if connection is None:
            return super().settle_owned(identity, settlement)
        with self._lock:
            live = self.owns(identity, settlement.at)
            if live:
                connection.settles.append((identity, settlement))
            return live

    def complete_owned(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        # staged on the connection: the memory store's own one cannot be undone by this
        # double's transaction
        return self.settle_owned(identity, Completed(at), connection=connection)


class CompletingMemoryStore(TransactionalMemoryStore):
    """A CORRECT double with complete_owned/reopen_completed (BatchStore): the
    completion is staged on the connection and lands at the commit."""

    def complete_owned(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        return self.settle_owned(identity, Completed(at), connection=connection)

    def reopen_completed(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        with self._lock:
            row = self._rows.get(identity.update_id)
            if (row is None or row.state != "completed" or row.settled_at != at
                    or row.attempts != identity.attempt or row.claim_id != identity.claim_id):
                return False
            row.state, row.settled_at = "processing", None
            return True


class CompleteOwnedCommitsAtOnceStore(CompletingMemoryStore):
    """complete_owned ignores the caller's connection and lands at once: the caller's rollback
    (a failing fn) leaves the update completed and its writes lost."""

    def complete_owned(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        return MemoryUpdateStore.settle_owned(self, identity, Completed(at))


class CompleteOwnedExclusiveAtLeaseEndStore(CompletingMemoryStore):
    """complete_owned refuses a lease that ends exactly at the check (due_at > at)."""

    def complete_owned(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        return self.owns(identity, at + 1) and super().complete_owned(
            identity, at, connection=connection)


class ReopenIgnoresTimeStore(CompletingMemoryStore):
    """reopen_completed turns back any completion of the claim, whatever its time."""

    def reopen_completed(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        row = self._rows.get(identity.update_id)
        settled = row.settled_at if row is not None else None
        return super().reopen_completed(identity, at if settled is None else settled,
                                        connection=connection)


class SettleOwnedCommitsOnItsOwnStore(TransactionalMemoryStore):
    """settle_owned(connection=conn) ignores the caller's connection and lands at once (as a
    SQL store committing on its own connection would): it survives the caller's rollback."""

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        return super().settle_owned(identity, settlement)


class TransactionWithoutLockStore(MemoryUpdateStore):
    """transaction() holds nothing: a competing claim takes the row inside the block."""

    @contextmanager
    def transaction(self) -> Iterator[None]:
        yield None


# -- recovery capabilities (release, liveness) -----------------------------------------------------
class ReleaseSpendsAttemptStore(MemoryUpdateStore):
    """release_many gives the row back but counts the attempt as spent (attempts kept)."""

    def release_many(self, identities: Sequence[AttemptIdentity], *, at: int) -> List[bool]:
        with self._lock:
            result = super().release_many(identities, at=at)
            for identity, ok in zip(identities, result):
                if ok:
                    self._rows[identity.update_id].attempts += 1
            return result


class ReleaseIgnoresClaimIdStore(MemoryUpdateStore):
    """release_many releases the row's current claim, whatever the caller's claim id."""

    def release_many(self, identities: Sequence[AttemptIdentity], *, at: int) -> List[bool]:
        with self._lock:
            return super().release_many(
                [_real_claim_id(self, identity) for identity in identities], at=at
            )


class ReleasedWaitsForPendingGraceStore(MemoryUpdateStore):
    """due lists a released row only once received_at <= pending_before (like a fresh one)."""

    @staticmethod
    def _released(row: Any) -> bool:
        return False


class TakeOverLiveStore(MemoryUpdateStore):
    """take_over_dead makes every processing row claimable, live instances' included."""

    def take_over_dead(self, *, now: int) -> int:
        with self._lock:
            rows = [r for r in self._rows.values() if r.state == "processing"]
            for row in rows:
                row.due_at = now - 1
            return len(rows)


# -- isolation of suspect rows (BatchStore) ---------------------------------------------
class IsolatingMemoryStore(MemoryUpdateStore):
    """A correct test double of BatchStore on the memory store (which has no dead
    instances, so only marked rows are suspect): the marks are kept beside the rows."""

    def __init__(self) -> None:
        super().__init__()
        self._marked: Dict[int, str] = {}
        self._suspect_claims: Dict[AttemptIdentity, int] = {}

    def claim_owned(self, update_id: int, **kwargs: Any) -> Optional[AttemptIdentity]:
        identity = super().claim_owned(update_id, **kwargs)
        if identity is not None and update_id in self._marked:
            self._suspect_claims[identity] = 1 if self._marked[update_id] == "~" else 2
        return identity

    def claimed_suspect(self, identity: AttemptIdentity) -> int:
        return self._suspect_claims.pop(identity, 0)

    def _may_mark(self, identity: AttemptIdentity, at: int) -> bool:
        row = self._rows.get(identity.update_id)
        return row is not None and self._live(row, identity.attempt, at, identity.claim_id)

    def mark_isolated(self, identity: AttemptIdentity, *, at: int) -> bool:
        with self._lock:
            if not self._may_mark(identity, at):
                return False
            self._marked[identity.update_id] = identity.claim_id
            return True

    def end_probation(self, identity: AttemptIdentity, *, at: int) -> bool:
        with self._lock:
            if not self._may_mark(identity, at):
                return False
            if self._marked.get(identity.update_id) != identity.claim_id:
                return False
            self._marked[identity.update_id] = "~"
            return True


class MarkIsolatedIgnoresLeaseStore(IsolatingMemoryStore):
    """mark_isolated lands for a claim whose lease ended (it must hold at ``at``)."""

    def _may_mark(self, identity: AttemptIdentity, at: int) -> bool:
        row = self._rows.get(identity.update_id)
        return row is not None and self._live(row, identity.attempt, None, identity.claim_id)


class SuspectForgottenStore(IsolatingMemoryStore):
    """claimed_suspect never says suspect: a marked row's next attempt would not run alone."""

    def claimed_suspect(self, identity: AttemptIdentity) -> int:
        return 0


class ProbationNeverEndsStore(IsolatingMemoryStore):
    """end_probation lands but keeps the mark: a crash after the probation would be charged
    to the attempt whose handler ran past it."""

    def end_probation(self, identity: AttemptIdentity, *, at: int) -> bool:
        with self._lock:
            return self._may_mark(identity, at) and (
                self._marked.get(identity.update_id) == identity.claim_id
            )


# -- claims of several rows (BatchStore) ------------------------------------------------
class CommitClaimsIgnoreSpendStore(MemoryUpdateStore):
    """The claims of ``commit`` take a claimable row even when its attempts are spent."""

    def commit(self, batch: Batch) -> Committed:
        if batch.terms is not None and batch.claims:
            terms = dataclasses.replace(batch.terms, max_attempts=batch.terms.max_attempts + 100)
            batch = dataclasses.replace(batch, terms=terms)
        return super().commit(batch)


class ChatClaimIgnoresOrderStore(MemoryUpdateStore):
    """``claim_in_chat_order`` claims like ``claim_owned``: a later update of a chat runs while
    an earlier one is unsettled."""

    __slots__ = ()

    def claim_in_chat_order(self, update_id: int, **kwargs: Any) -> Any:
        return self.claim_owned(update_id, **kwargs)


class ChatOrderIgnoresLiveLeaseStore(MemoryUpdateStore):
    """Only lower unsettled rows hold a chat: a higher update's live attempt does not."""

    __slots__ = ()

    def _in_turn(self, row: Any, now: int) -> bool:
        if row.chat_key is None:
            return True
        return not any(
            o.chat_key == row.chat_key and o.update_id < row.update_id
            and o.state in ("pending", "processing", "failed")
            for o in self._rows.values()
        )


class ChatKeysOverwriteStore(MemoryUpdateStore):
    """``set_chat_keys`` keys every row it names, whatever its body and key."""

    __slots__ = ()

    def set_chat_keys(self, keys: Any) -> int:
        with self._lock:
            for update_id, _, chat_key in keys:
                self._rows[update_id].chat_key = int(chat_key)
        return len(keys)


# -- figures -------------------------------------------------------------------------------------
class FiguresCountCompletedStore(MemoryUpdateStore):
    """``figures`` counts completed rows as unsettled (and their ``received_at``)."""

    __slots__ = ()

    def figures(self) -> StoreFigures:
        with self._lock:
            received = [r.received_at for r in self._rows.values()
                        if r.state in ("pending", "processing", "failed", "completed")]
            return dataclasses.replace(
                super().figures(), unsettled=len(received),
                oldest_unsettled_received_at=min(received, default=None),
            )


class FiguresIgnoreFailedStore(MemoryUpdateStore):
    """``figures`` counts only pending and processing rows: a failed row waiting for its retry
    is missed."""

    __slots__ = ()

    def figures(self) -> StoreFigures:
        with self._lock:
            received = [r.received_at for r in self._rows.values()
                        if r.state in ("pending", "processing")]
            return dataclasses.replace(
                super().figures(), unsettled=len(received),
                oldest_unsettled_received_at=min(received, default=None),
            )


class FiguresOldestByUpdateIdStore(MemoryUpdateStore):
    """``figures`` takes the oldest unsettled row to be the one with the lowest ``update_id``."""

    __slots__ = ()

    def figures(self) -> StoreFigures:
        with self._lock:
            waiting = sorted(u for u, r in self._rows.items()
                             if r.state in ("pending", "processing", "failed"))
            oldest = self._rows[waiting[0]].received_at if waiting else None
            return dataclasses.replace(super().figures(), oldest_unsettled_received_at=oldest)


class FiguresCountAcknowledgedStore(MemoryUpdateStore):
    """``figures`` counts every abandoned row as an exhaustion waiting, whatever its
    ``settled_at``: acknowledged exhaustions too."""

    __slots__ = ()

    def figures(self) -> StoreFigures:
        with self._lock:
            ended = [r.due_at for r in self._rows.values()
                     if r.state == "abandoned" and r.due_at is not None]
            return dataclasses.replace(
                super().figures(), exhaustions_waiting=len(ended),
                oldest_exhaustion_at=min(ended, default=None),
            )


class FiguresHeldSingleChatStore(MemoryUpdateStore):
    """``figures`` holds the chat with the oldest unsettled row even when that row is the
    chat's only one (nothing waits behind it)."""

    __slots__ = ()

    def figures(self) -> StoreFigures:
        with self._lock:
            keyed = [(r.received_at, r.chat_key) for r in self._rows.values()
                     if r.chat_key is not None and r.state in ("pending", "processing", "failed")]
            since, chat = min(keyed, default=(None, None))
            return dataclasses.replace(super().figures(), held_chat=chat, held_chat_since=since)



class FiguresHeldSmallestChatStore(MemoryUpdateStore):
    """``figures`` holds the smallest chat key with two or more unsettled rows, not the one
    whose oldest unsettled row is the oldest."""

    __slots__ = ()

    def figures(self) -> StoreFigures:
        with self._lock:
            chats: Dict[int, List[int]] = {}
            for r in self._rows.values():
                if r.chat_key is not None and r.state in ("pending", "processing", "failed"):
                    chats.setdefault(r.chat_key, []).append(r.received_at)
            held = min((key for key, times in chats.items() if len(times) >= 2), default=None)
            since = None if held is None else min(chats[held])
            return dataclasses.replace(super().figures(), held_chat=held, held_chat_since=since)


# -- outbox --------------------------------------------------------------------------------------
class OutboxIgnoresChatOrderStore(MemoryUpdateStore):
    """``claim_calls`` takes every due call, however many calls of its chat wait before it."""

    def _call_in_turn(self, call: CallRow, now: int) -> bool:
        return True


class OutboxClaimsLiveSendingStore(MemoryUpdateStore):
    """``claim_calls`` takes a sending call over at the last millisecond of its lease
    (``due_at <= now`` instead of ``due_at < now``)."""

    def claim_calls(
        self, *, now: int, lease_until: int, limit: int, sender: str
    ) -> List[OutboxEntry]:
        with self._lock:
            for call in self._calls.values():
                if call.state == "sending" and call.due_at == now:
                    call.due_at = now - 1
            return super().claim_calls(now=now, lease_until=lease_until, limit=limit,
                                       sender=sender)


class OutboxWritesUnlandedEffectsStore(MemoryUpdateStore):
    """The batch settles write the calls of every completion given, landed or not."""

    def _queue_landed(
        self,
        items: Sequence[Tuple[AttemptIdentity, Settlement]],
        landed: Sequence[bool],
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]],
    ) -> None:
        super()._queue_landed(items, [True] * len(items), effects)


class OutboxRecordSentIgnoresSenderStore(MemoryUpdateStore):
    """``record_sent`` (and retry, fail, release) accept any sender token for a sending
    call: a sender whose lease lapsed records over the one that took the call over."""

    def _sending(self, call_id: int, sender: str) -> Optional[CallRow]:
        call = self._calls.get(call_id)
        return call if call is not None and call.state == "sending" else None


class OutboxReadThenWriteClaimStore(MemoryUpdateStore):
    """``claim_calls`` picks the calls under the lock, lets go of it, then takes them."""

    def claim_calls(
        self, *, now: int, lease_until: int, limit: int, sender: str
    ) -> List[OutboxEntry]:
        with self._lock:
            chosen = [
                call for _, call in sorted(self._calls.items())
                if ((call.state == "pending" and call.due_at <= now)
                    or (call.state == "sending" and call.due_at < now))
                and self._call_in_turn(call, now)
            ][:limit]
        time.sleep(0.003)  # every other claimer picks the same calls meanwhile
        with self._lock:
            for call in chosen:
                call.state, call.due_at, call.sender = "sending", lease_until, sender
                call.tries += 1
            return [self._entry(call) for call in chosen]


class OutboxWriteEffectsCommitsAtOnceStore(MemoryUpdateStore):
    """``write_effects`` writes its calls at once, outside the caller's transaction: a
    rollback of the caller keeps them."""

    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        with self._lock:
            rows = self._new_calls(identity, effects, at)
            for row in rows:
                self._calls[row.call_id] = row
            return [row.call_id for row in rows]


class OutboxCountsAcknowledgedAsFailedStore(MemoryUpdateStore):
    """``outbox_counts`` counts acknowledged failures as waiting ones."""

    def outbox_counts(self) -> Dict[str, int]:
        counts = super().outbox_counts()
        counts["failed"] += counts["failed_acknowledged"]
        counts["failed_acknowledged"] = 0
        return counts


class OutboxClaimsBusyChatStore(MemoryUpdateStore):
    """A claimed insert ignores the chat: every call within the claim's limit is inserted
    sending, even behind an unsent call of its chat."""

    def _new_calls(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int
    ) -> List[CallRow]:
        rows = super()._new_calls(identity, dataclasses.replace(effects, claim=None), at)
        claim = effects.claim
        if claim is not None:
            for row in rows[: claim.limit]:
                row.state, row.tries, row.due_at = "sending", 1, claim.lease_until
                row.sender = claim.sender
        return rows


class OutboxClaimsPastLimitStore(MemoryUpdateStore):
    """A claimed insert claims every call in its chat's turn, past the claim's limit."""

    def _new_calls(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int
    ) -> List[CallRow]:
        claim = effects.claim
        if claim is not None:
            effects = dataclasses.replace(
                effects, claim=dataclasses.replace(claim, limit=len(effects.calls))
            )
        return super()._new_calls(identity, effects, at)


class OutboxClaimedInsertRacesStore(MemoryUpdateStore):
    """A claimed insert checks its chat, lets go of the lock, then inserts: concurrent
    completions of one chat each see it idle (as two PostgreSQL transactions without the
    chat lock would)."""

    def _queue_landed(
        self,
        items: Sequence[Tuple[AttemptIdentity, Settlement]],
        landed: Sequence[bool],
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]],
    ) -> None:
        if not effects:
            return
        made = []
        for (identity, settlement), ok in zip(items, landed):
            queued = effects.get(identity)
            if ok and queued is not None:
                made += self._new_calls(identity, queued, settlement.at)
        self._lock.release()
        try:
            time.sleep(0.003)  # the other completions check the chat meanwhile
        finally:
            self._lock.acquire()
        for call in made:
            self._calls[call.call_id] = call


class OutboxClaimsBeforeRecordStore(MemoryUpdateStore):
    """``record_sent_and_claim`` claims first, then records: a chat's next call is not in
    turn yet when the claim runs."""

    def record_sent_and_claim(
        self,
        items: Sequence[Tuple[int, str, str, int]],
        *,
        now: int,
        lease_until: int,
        limit: int,
        sender: str,
    ) -> Tuple[List[bool], List[OutboxEntry]]:
        with self._lock:
            claimed = self.claim_calls(now=now, lease_until=lease_until, limit=limit,
                                       sender=sender) if limit > 0 else []
            return self.record_sent(items), claimed


class OutboxRecordAndClaimDropsRecordStore(MemoryUpdateStore):
    """``record_sent_and_claim`` claims and says the records landed, writing none."""

    def record_sent_and_claim(
        self,
        items: Sequence[Tuple[int, str, str, int]],
        *,
        now: int,
        lease_until: int,
        limit: int,
        sender: str,
    ) -> Tuple[List[bool], List[OutboxEntry]]:
        with self._lock:
            claimed = self.claim_calls(now=now, lease_until=lease_until, limit=limit,
                                       sender=sender) if limit > 0 else []
            return [True] * len(items), claimed


# -- persisted bot state -------------------------------------------------------------------------
class StateIgnoresVersionStore(MemoryUpdateStore):
    """Every state write lands whatever version its writer read (last writer wins)."""

    def _moved(self, writes: Sequence[StateWrite]) -> Tuple[StateKey, ...]:
        return ()


class StateDeleteDropsRowStore(MemoryUpdateStore):
    """A deleted state loses its row (and with it its version): a writer that read the state
    before it was deleted is no longer refused."""

    @staticmethod
    def _put_state(
        target: Dict[StateKey, StateEntry], writes: Sequence[StateWrite], at: int
    ) -> None:
        for write in writes:
            if write.value is None:
                target.pop(write.key, None)
            else:
                target[write.key] = StateEntry(write.value, write.version + 1)


class StatePruneDeletesStore(MemoryUpdateStore):
    """``prune`` also deletes the persisted state."""

    def prune(self, before: int) -> int:
        with self._lock:
            self._state.clear()
            return super().prune(before)


class StatePruneKeepsKeyboardsStore(MemoryUpdateStore):
    """``prune`` keeps the callback-data keyboards (their rows grow without bound)."""

    def prune(self, before: int) -> int:
        with self._lock:
            self._keyboards_at.clear()
            return super().prune(before)


class StateConflictSettlesStore(MemoryUpdateStore):
    """A completion whose state conflicts is reported as a conflict but settled anyway (its
    update is completed without its writes: the state change is lost)."""

    def _settle_with_state(
        self,
        identity: AttemptIdentity,
        settlement: Settlement,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]],
    ) -> Any:
        landed = super()._settle_with_state(identity, settlement, effects)
        if isinstance(landed, StateConflict):
            self.settle_owned(identity, settlement)
        return landed


class StateConflictAsFalseStore(MemoryUpdateStore):
    """A completion whose state conflicts is reported as ``False``, like a lost claim (the
    runtime would wait for the lease instead of retrying at once)."""

    def _settle_with_state(
        self,
        identity: AttemptIdentity,
        settlement: Settlement,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]],
    ) -> Any:
        landed = super()._settle_with_state(identity, settlement, effects)
        return False if isinstance(landed, StateConflict) else landed


class StatePartialWritesStore(MemoryUpdateStore):
    """A conflicting completion still applies its writes whose versions did not move."""

    def _settle_with_state(
        self,
        identity: AttemptIdentity,
        settlement: Settlement,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]],
    ) -> Any:
        landed = super()._settle_with_state(identity, settlement, effects)
        if isinstance(landed, StateConflict) and effects is not None:
            fine = [w for w in effects[identity].state if w.key not in landed.keys]
            self._put_state(self._state, fine, settlement.at)
        return landed


class StateWritesUnownedStore(MemoryUpdateStore):
    """The state writes of a settle that did not land (a wrong claim, a failure) are applied
    anyway."""

    def _settle_with_state(
        self,
        identity: AttemptIdentity,
        settlement: Settlement,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]],
    ) -> Any:
        landed = super()._settle_with_state(identity, settlement, effects)
        if landed is False or not isinstance(settlement, Completed):
            writes = () if not effects or identity not in effects else effects[identity].state
            if writes and not self._moved(writes):
                self._put_state(self._state, writes, settlement.at)
        return landed


class StateWriteEffectsAtOnceStore(MemoryUpdateStore):
    """``write_effects`` applies its state writes at once, outside the caller's transaction:
    a rollback of the caller keeps them."""

    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        with self._lock:
            if not self._moved(effects.state):
                self._put_state(self._state, effects.state, at)
            return super().write_effects(
                identity, dataclasses.replace(effects, state=()), at, connection=connection
            )


class StateReadThenWriteStore(MemoryUpdateStore):
    """A completion checks its versions under the lock, lets go of it, then writes: two
    completions from one version both land."""

    def _settle_with_state(
        self,
        identity: AttemptIdentity,
        settlement: Settlement,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]],
    ) -> Any:
        writes = () if not effects or identity not in effects else effects[identity].state
        if not writes:
            return super()._settle_with_state(identity, settlement, effects)
        moved = self._moved(writes)
        self._lock.release()
        try:
            time.sleep(0.002)  # every other completer checks the same versions meanwhile
        finally:
            self._lock.acquire()
        if moved:
            return StateConflict(moved)
        if not self.settle_owned(identity, settlement):
            return False
        self._put_state(self._state, writes, settlement.at)
        return True


class CommitClaimsBeforeSettlingStore(MemoryUpdateStore):
    """``commit`` claims before it settles: a completed update is claimed again."""

    __slots__ = ()

    def commit(self, batch: Batch) -> Committed:
        with self._lock:
            taken = tuple(self._claim_all(batch.claims, batch.terms))
            done = super().commit(dataclasses.replace(batch, claims=()))
            return dataclasses.replace(done, claims=taken)


class CommitNotAtomicStore(MemoryUpdateStore):
    """``commit`` applies each part in turn, so a refused claim leaves the settles applied."""

    __slots__ = ()

    def commit(self, batch: Batch) -> Committed:
        with self._lock:
            parts = super().commit
            landed = parts(Batch(settlements=batch.settlements, effects=batch.effects)).landed
            recorded = parts(Batch(records=batch.records)).recorded
            taken = parts(Batch(batch.terms, claims=batch.claims)).claims
            return Committed(recorded, (), landed, taken)


class CommitDropsCallIdsStore(MemoryUpdateStore):
    """``commit`` writes the outbox calls but does not return their ids."""

    __slots__ = ()

    def commit(self, batch: Batch) -> Committed:
        return dataclasses.replace(super().commit(batch), call_ids={})


class DeclaresIsolationStore(MemoryUpdateStore):
    """``features`` declares isolation, which the memory store does not have."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__()
        self.features = dataclasses.replace(self.features, isolation=True)


# -- recorded steps ------------------------------------------------------------------------------
class RecordStepIgnoresOwnershipStore(MemoryUpdateStore):
    """``record_step`` writes every record, whoever recorded it and whatever the row's state."""

    __slots__ = ()

    def record_step(self, record: StepRecord, *, connection: Any = None) -> bool:
        with self._lock:
            self._steps.setdefault(record.key, record)
            return True


class RecordStepExclusiveAtLeaseEndStore(MemoryUpdateStore):
    """``record_step`` refuses a lease that ends exactly at ``recorded_at``."""

    __slots__ = ()

    def record_step(self, record: StepRecord, *, connection: Any = None) -> bool:
        with self._lock:
            row = self._rows.get(record.update_id)
            if row is not None and row.due_at == record.recorded_at:
                return False
            return super().record_step(record, connection=connection)


class RecordStepOverwritesStore(MemoryUpdateStore):
    """``record_step`` of a key already recorded replaces the earlier record."""

    __slots__ = ()

    def record_step(self, record: StepRecord, *, connection: Any = None) -> bool:
        with self._lock:
            held = self._steps.pop(record.key, None)
            landed = super().record_step(record, connection=connection)
            if not landed and held is not None:
                self._steps[record.key] = held
            return landed


class RecordStepCommitsAtOnceStore(TransactionalMemoryStore):
    """``record_step(connection=)`` commits at once: a rolled back block keeps the record."""

    def record_step(self, record: StepRecord, *, connection: Any = None) -> bool:
        return MemoryUpdateStore.record_step(self, record)


class PruneKeepsStepsStore(MemoryUpdateStore):
    """``prune`` deletes the rows but keeps their recorded steps."""

    __slots__ = ()

    def prune(self, before: int) -> int:
        with self._lock:
            steps = dict(self._steps)
            pruned = super().prune(before)
            self._steps.update(steps)
            return pruned


class PruneDeletesEveryStepStore(MemoryUpdateStore):
    """``prune`` deletes every recorded step, also those of the rows it keeps."""

    __slots__ = ()

    def prune(self, before: int) -> int:
        with self._lock:
            self._steps.clear()
            return super().prune(before)


class StepsOfUnorderedStore(MemoryUpdateStore):
    """``steps_of`` lists the records by key only."""

    __slots__ = ()

    def steps_of(self, update_id: int) -> List[StepRecord]:
        return sorted(super().steps_of(update_id), key=lambda step: step.key)


# -- durable jobs --------------------------------------------------------------------------------
class _JobsStore(MemoryUpdateStore):
    """A memory store whose jobs are kept by the ``MemoryJobs`` subclass ``JOBS``."""

    __slots__ = ()
    JOBS: Type[MemoryJobs] = MemoryJobs

    def __init__(self) -> None:
        super().__init__()
        self._jobs = self.JOBS()


class _FireIgnoresStateJobs(MemoryJobs):
    __slots__ = ()

    def advance(self, fire: JobFire) -> bool:
        job = self._jobs.get(fire.job_id)
        if job is None:
            return False
        self._jobs[job.job_id] = dataclasses.replace(
            job, runs=job.runs + 1, next_run_at=fire.next_run_at,
            state="scheduled" if fire.next_run_at is not None else "ended",
        )
        return True


class FireIgnoresStateStore(_JobsStore):
    """``fire_jobs`` fires whatever the job's state, runs and next run: a run fires twice."""

    __slots__ = ()
    JOBS = _FireIgnoresStateJobs


class _KeyedAddsJobs(MemoryJobs):
    __slots__ = ()

    def schedule(self, writes: Sequence[JobWrite], at: int) -> List[StoredJob]:
        return super().schedule([dataclasses.replace(w, keyed=False) for w in writes], at)


class KeyedDeclarationAddsStore(_JobsStore):
    """A keyed job declared again is added as a second job."""

    __slots__ = ()
    JOBS = _KeyedAddsJobs


class _KeyedMovesJobs(MemoryJobs):
    __slots__ = ()

    def schedule(self, writes: Sequence[JobWrite], at: int) -> List[StoredJob]:
        stored = super().schedule(writes, at)
        for index, (write, job) in enumerate(zip(writes, stored)):
            if job.next_run_at != write.next_run_at:
                stored[index] = dataclasses.replace(job, next_run_at=write.next_run_at)
                self._jobs[job.job_id] = stored[index]
        return stored


class KeyedDeclarationMovesStore(_JobsStore):
    """A keyed job declared again takes the new next run, though its schedule is the same."""

    __slots__ = ()
    JOBS = _KeyedMovesJobs


class _DueCancelledJobs(MemoryJobs):
    __slots__ = ()

    def cancel(self, job_ids: Sequence[int]) -> List[bool]:
        done = []
        for job_id in job_ids:
            job = self._jobs.get(int(job_id))
            live = job is not None and job.state in ("scheduled", "paused")
            if job is not None and live:
                self._jobs[job.job_id] = dataclasses.replace(job, state="cancelled")
            done.append(live)
        return done

    def due(self, now: int, limit: int) -> List[StoredJob]:
        due = [job for job in self._jobs.values()
               if job.state in ("scheduled", "cancelled") and job.next_run_at is not None
               and job.next_run_at <= now]
        due.sort(key=lambda job: (job.next_run_at, job.job_id))
        return due[:limit]


class DueJobsIncludeCancelledStore(_JobsStore):
    """``cancel_jobs`` keeps the next run, and ``due_jobs`` lists cancelled jobs."""

    __slots__ = ()
    JOBS = _DueCancelledJobs


class _DueStrictJobs(MemoryJobs):
    __slots__ = ()

    def due(self, now: int, limit: int) -> List[StoredJob]:
        return super().due(now - 1, limit)


class DueJobsStrictStore(_JobsStore):
    """``due_jobs`` lists the jobs with ``next_run_at < now``: a job due at now waits."""

    __slots__ = ()
    JOBS = _DueStrictJobs


class _DueByIdJobs(MemoryJobs):
    __slots__ = ()

    def due(self, now: int, limit: int) -> List[StoredJob]:
        return sorted(super().due(now, 10**6), key=lambda job: job.job_id)[:limit]


class DueJobsByIdStore(_JobsStore):
    """``due_jobs`` orders the due jobs by id, not by next run."""

    __slots__ = ()
    JOBS = _DueByIdJobs


class SkipFireRecordsStore(MemoryUpdateStore):
    """A ``skip`` fire records its run as an update row too."""

    __slots__ = ()

    def fire_jobs(self, fires: Sequence[JobFire], at: int) -> List[bool]:
        return super().fire_jobs([dataclasses.replace(f, skip=False) for f in fires], at)


class RefusedCompletionWritesJobsStore(MemoryUpdateStore):
    """A commit writes the jobs of every completion given, landed or refused."""

    __slots__ = ()

    def _queue_landed(
        self,
        items: Sequence[Tuple[AttemptIdentity, Settlement]],
        landed: Sequence[Any],
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]],
    ) -> Tuple[Dict[AttemptIdentity, Tuple[int, ...]], FrozenSet[int]]:
        for (identity, settlement), ok in zip(items, landed):
            queued = (effects or {}).get(identity)
            if not ok and queued is not None and isinstance(settlement, Completed):
                self._write_later(queued, settlement.at)
        return super()._queue_landed(items, landed, effects)


class WriteEffectsJobsAtOnceStore(MemoryUpdateStore):
    """``write_effects`` inside ``transaction()`` writes its jobs at once: a rollback keeps
    them."""

    __slots__ = ()

    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        with self._lock:
            if self._staged is not None:
                self._write_later(effects, at)
                effects = dataclasses.replace(effects, jobs=(), cancelled_jobs=())
            return super().write_effects(identity, effects, at, connection=connection)


class RefusedCompletionStartsBroadcastStore(MemoryUpdateStore):
    """A commit starts the broadcasts of every completion given, landed or refused."""

    __slots__ = ()

    def _queue_landed(
        self,
        items: Sequence[Tuple[AttemptIdentity, Settlement]],
        landed: Sequence[Any],
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]],
    ) -> Tuple[Dict[AttemptIdentity, Tuple[int, ...]], FrozenSet[int]]:
        for (identity, settlement), ok in zip(items, landed):
            queued = (effects or {}).get(identity)
            if not ok and queued is not None and isinstance(settlement, Completed):
                self._broadcasts.write(queued.broadcasts, settlement.at)
        return super()._queue_landed(items, landed, effects)


class BroadcastEffectJoinsAnyCallStore(MemoryUpdateStore):
    """A completion's broadcast adds its chats to the broadcast of its name, whatever that
    broadcast's call."""

    __slots__ = ()

    def _write_later(self, effects: AttemptEffects, at: int) -> None:
        for write in effects.broadcasts:
            started = self._broadcasts.start_broadcast(write.name, write.method,
                                                       write.params_json, at)
            self._broadcasts.add_recipients(started.broadcast_id, write.chat_ids, at)
        super()._write_later(dataclasses.replace(effects, broadcasts=()), at)


BROKEN: Dict[Type[Any], Sequence[str]] = {
    FireIgnoresStateStore: ("jobs", "jobs-concurrent-fire"),
    KeyedDeclarationAddsStore: ("jobs",),
    KeyedDeclarationMovesStore: ("jobs",),
    DueJobsIncludeCancelledStore: ("jobs",),
    DueJobsStrictStore: ("jobs",),
    DueJobsByIdStore: ("jobs",),
    SkipFireRecordsStore: ("jobs",),
    RefusedCompletionWritesJobsStore: ("jobs-effects",),
    WriteEffectsJobsAtOnceStore: ("jobs-effects",),
    RecordStepIgnoresOwnershipStore: ("steps",),
    RecordStepExclusiveAtLeaseEndStore: ("steps",),
    RecordStepOverwritesStore: ("steps",),
    RecordStepCommitsAtOnceStore: ("steps",),
    PruneKeepsStepsStore: ("steps",),
    PruneDeletesEveryStepStore: ("steps",),
    StepsOfUnorderedStore: ("steps",),
    CommitClaimsBeforeSettlingStore: ("batch-commit", "settle-and-claim"),
    CommitNotAtomicStore: ("batch-commit-atomic",),
    CommitDropsCallIdsStore: ("batch-commit",),
    DeclaresIsolationStore: ("features",),
    OutboxClaimsBusyChatStore: ("outbox-claimed-inserts", "outbox-concurrent-claimed-inserts"),
    OutboxClaimsPastLimitStore: ("outbox-claimed-inserts",),
    OutboxClaimedInsertRacesStore: ("outbox-concurrent-claimed-inserts",),
    OutboxClaimsBeforeRecordStore: ("outbox-record-and-claim",),
    OutboxRecordAndClaimDropsRecordStore: ("outbox-record-and-claim",),
    StateIgnoresVersionStore: ("state-versions", "state-effects", "state-concurrent"),
    StateDeleteDropsRowStore: ("state-versions",),
    StatePruneDeletesStore: ("state-versions",),
    StatePruneKeepsKeyboardsStore: ("state-versions",),
    StateConflictSettlesStore: ("state-effects",),
    StateConflictAsFalseStore: ("state-effects",),
    StatePartialWritesStore: ("state-effects",),
    StateWritesUnownedStore: ("state-effects",),
    StateWriteEffectsAtOnceStore: ("state-effects",),
    StateReadThenWriteStore: ("state-concurrent",),
    OutboxIgnoresChatOrderStore: ("outbox-claim",),
    OutboxClaimsLiveSendingStore: ("outbox-claim",),
    OutboxWritesUnlandedEffectsStore: ("outbox-effects",),
    OutboxRecordSentIgnoresSenderStore: ("outbox-claim",),
    OutboxReadThenWriteClaimStore: ("outbox-concurrent-claim",),
    OutboxWriteEffectsCommitsAtOnceStore: ("outbox-effects",),
    OutboxCountsAcknowledgedAsFailedStore: ("outbox-operators",),
    FiguresHeldSmallestChatStore: ("figures",),
    FiguresCountCompletedStore: ("figures",),
    FiguresIgnoreFailedStore: ("figures",),
    FiguresOldestByUpdateIdStore: ("figures",),
    FiguresCountAcknowledgedStore: ("figures",),
    FiguresHeldSingleChatStore: ("figures",),
    ChatKeysOverwriteStore: ("chat-keys",),
    CommitClaimsIgnoreSpendStore: ("batch-claim",),
    ChatClaimIgnoresOrderStore: ("chat-order",),
    ChatOrderIgnoresLiveLeaseStore: ("chat-order",),
    ReleaseSpendsAttemptStore: ("release",),
    ReleaseIgnoresClaimIdStore: ("release",),
    ReleasedWaitsForPendingGraceStore: ("release",),
    TakeOverLiveStore: ("liveness",),
    MarkIsolatedIgnoresLeaseStore: ("isolation",),
    SuspectForgottenStore: ("isolation",),
    ProbationNeverEndsStore: ("isolation",),
    CommitRecordsOverwriteStore: ("batch-add",),
    CommitClaimedRecordsClaimExistingStore: ("batch-claim-at-ingest",),
    CommitSettlesIgnoreClaimIdStore: ("batch-settle",),
    CommitWithClaimedRecordsDropsSettlementsStore: ("combined-write",),
    BindBotAcceptsAnyIdStore: ("bind-bot",),
    TransactionSwallowsErrorsStore: ("transaction",),
    SettleOwnedCommitsOnItsOwnStore: ("transaction", "connection-fence"),
    TransactionWithoutLockStore: ("connection-fence",),
    CompleteOwnedCommitsAtOnceStore: ("completing",),
    CompleteOwnedExclusiveAtLeaseEndStore: ("completing",),
    ReopenIgnoresTimeStore: ("completing",),
    BatchRenewIgnoresClaimIdStore: ("batch-renewal",),
    BatchRenewNoneStore: ("batch-renewal",),
    ReadThenWriteClaimStore: ("concurrent-claim", "concurrent-claim-owned"),
    RenewOwnedIgnoresClaimIdStore: ("fence",),
    SettleOwnedIgnoresClaimIdStore: ("attempt-ownership", "fence"),
    ExhaustIgnoresClaimIdStore: ("durable-exhaustion",),
    AcknowledgeIgnoresClaimIdStore: ("durable-exhaustion",),
    OwnsIgnoresClaimIdStore: ("attempt-ownership", "fence"),
    SettleOwnedAlwaysTrueStore: ("attempt-ownership", "fence"),
    ReusedClaimIdStore: ("fence",),
    TakeoverAtDueAtStore: ("lease", "renewal-never-shortens"),
    FailedDueLateStore: ("retry-and-spend",),
    InclusivePruneStore: ("prune", "retry-and-spend", "durable-exhaustion"),
    PruneDeletesFailedStore: ("prune",),
    ShorteningRenewStore: ("renewal-never-shortens",),
    RenewRevivesStore: ("lease",),
    SettleIgnoresExpiryStore: ("attempt-ownership",),
    OwnsExclusiveStore: ("fence",),
    ExhaustIgnoresExpiryStore: ("durable-exhaustion",),
    PendingBeforeStrictStore: ("due-listing",),
    DueByTextStore: ("due-listing",),
    DueIgnoresLimitStore: ("due-listing",),
    UpsertAddStore: ("one-record-per-update",),
    IntBooleansStore: ("one-record-per-update",),
    EmptyClaimIdStore: ("fence",),
    SpendKeepsLiveLeaseClaimableStore: ("retry-and-spend",),
    SpendIgnoresDurableFlagStore: ("durable-exhaustion",),
    AcknowledgeTwiceStore: ("durable-exhaustion",),
    InclusiveCursorStore: ("durable-exhaustion",),
    BaseSpendWithoutClaimIdStore: ("durable-exhaustion",),
}
"""Every broken store and the rules that must report it."""


class HoldIgnoredStore(MemoryUpdateStore):
    """``hold_sends`` does nothing: a held bot is granted slots."""

    __slots__ = ()

    def hold_sends(self, holds: Sequence[Tuple[str, int]]) -> None:
        return None


class HoldShortenedStore(MemoryUpdateStore):
    """``hold_sends`` replaces an earlier hold, so a shorter one shortens it."""

    __slots__ = ()

    def hold_sends(self, holds: Sequence[Tuple[str, int]]) -> None:
        rows = self._pace._rows
        for key, until in holds:
            rows[key] = (rows.get(key, (0, 0))[0], int(until))


class SlotBeyondHorizonStore(MemoryUpdateStore):
    """``take_send_slots`` takes every slot, however far beyond the horizon."""

    __slots__ = ()

    def take_send_slots(self, wants: Sequence[Sequence[PaceBucket]], *, now: int,
                        horizon_ms: int) -> List[int]:
        return super().take_send_slots(wants, now=now, horizon_ms=10**12)


class PaceRacesStore(MemoryUpdateStore):
    """``take_send_slots`` reads the buckets, yields, then writes: concurrent takers overlap."""

    __slots__ = ()

    def take_send_slots(self, wants: Sequence[Sequence[PaceBucket]], *, now: int,
                        horizon_ms: int) -> List[int]:
        from ptb_fence.stores._pace import grant

        rows = dict(self._pace._rows)
        time.sleep(0.01)
        times, changed = grant(rows, [tuple(w) for w in wants], now=now, horizon_ms=horizon_ms)
        self._pace._rows.update(changed)
        return times


class PausedClaimedStore(MemoryUpdateStore):
    """``set_broadcast_state`` records nothing but a cancel: a paused broadcast is claimed."""

    __slots__ = ()

    def set_broadcast_state(self, name: str, state: str, at: int) -> Any:
        if state == "paused":
            found = self.list_broadcasts(name)
            return dataclasses.replace(found[0], state="paused") if found else None
        return super().set_broadcast_state(name, state, at)


class AnySenderSettlesStore(MemoryUpdateStore):
    """``settle_recipients`` takes the outcome of any sender."""

    __slots__ = ()

    def settle_recipients(self, sender: str, outcomes: Sequence[Any], at: int) -> List[bool]:
        rows = self._broadcasts._recipients
        out = []
        for outcome in outcomes:
            row = rows.get(outcome.broadcast_id, {}).get(outcome.chat_id)
            if row is not None:
                row.sender = sender
            out.extend(super().settle_recipients(sender, [outcome], at))
        return out


class RecipientRacesStore(MemoryUpdateStore):
    """``claim_recipients`` reads the claimable recipients, yields, then takes them: concurrent
    senders take one recipient twice."""

    __slots__ = ()

    def claim_recipients(self, sender: str, *, now: int, lease_until: int,
                         limit: int) -> List[Any]:
        from ptb_fence import Recipient

        seen = []
        for broadcast_id, rows in sorted(self._broadcasts._recipients.items()):
            broadcast = self._broadcasts._broadcasts[broadcast_id]
            for chat, row in sorted(rows.items()):
                if row.state == "pending" and row.due_at <= now and len(seen) < limit:
                    seen.append((broadcast, chat, row))
        time.sleep(0.01)
        out = []
        for broadcast, chat, row in seen:
            row.state, row.sender, row.due_at = "sending", sender, lease_until
            row.tries += 1
            out.append(Recipient(broadcast.broadcast_id, chat, broadcast.method,
                                 broadcast.params_json, row.tries))
        return out
