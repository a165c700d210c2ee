"""MemoryUpdateStore: the executable statement of the store rules, whole in one class.

Sections: lifecycle, helpers, the base, fenced and durable contracts, chat order, release
and liveness, figures, the outbox, persisted bot state, recorded steps."""

from __future__ import annotations

import itertools

import threading
import uuid
from contextlib import contextmanager
from typing import Any, Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from ptb_fence._errors import StateConflictError, TableBotMismatch
from ptb_fence._fingerprint import update_fingerprint
from ptb_fence.contract import Batch, ChatKey, ClaimTerms, Committed, StoreFeatures
from ptb_fence._values import (
    OUTBOX_STATES,
    Abandoned,
    AttemptEffects,
    AttemptIdentity,
    Completed,
    Exhaustion,
    Failed,
    JobFire,
    JobWrite,
    OutboxEntry,
    Landing,
    PaceBucket,
    Recipient,
    RecipientOutcome,
    StoredBroadcast,
    Settlement,
    StateConflict,
    StateEntry,
    StateKey,
    StateWrite,
    StepRecord,
    StoreFigures,
    StoredJob,
    StoredUpdate,
)
from ptb_fence.stores._state_sql import check_kind, check_writes
from ptb_fence.stores._steps_sql import check_step
from ptb_fence.stores._duplicates import warn_conflict
from ptb_fence.stores._names import validate_update_id
from ptb_fence.stores.memory._jobs import MemoryJobs
from ptb_fence.stores.memory._broadcasts import MemoryBroadcasts
from ptb_fence.stores.memory._pace import MemoryPace
from ptb_fence.stores.memory._rows import CallRow, Row, new_claim_id

__all__ = ["MemoryUpdateStore"]

UNSETTLED = ("pending", "processing", "failed")
"""The states of a row that holds its chat (completed and abandoned rows release it)."""


class Liveness:
    """The instance a memory store holds (:obj:`None`: not holding liveness)."""

    __slots__ = ("instance",)

    def __init__(self) -> None:
        self.instance: Optional[str] = None


class MemoryUpdateStore:
    """A thread-safe, in-process store implementing the durable contract.

    It is the clearest statement of the rules and makes unit tests fast.
    Everything it holds is lost when the process ends.
    Use it for tests and for bots that accept losing work on restart.
    :meth:`transaction` yields :obj:`None` and runs the caller's block under the store's lock.
    So an ownership check and a settle inside it are atomic.
    """

    __slots__ = (
        "features", "_bot_id", "_calls", "_keyboards_at", "_liveness", "_lock", "_next_call", "_rows",
        "_staged", "_state", "_staged_state", "_staged_steps", "_steps", "_undo",
        "_jobs", "_staged_jobs", "_pace", "_broadcasts",
    )

    def __init__(self) -> None:
        #: Every optional part but isolation: a process that dies takes the store with it.
        self.features = StoreFeatures(
            outbox=True, state=True, liveness=True, chat_order=True, figures=True, steps=True,
            jobs=True, pacing=True, broadcasts=True,
        )
        self._lock = threading.RLock()
        self._rows: Dict[int, Row] = {}
        self._calls: Dict[int, CallRow] = {}
        self._next_call = 1
        # the calls write_effects wrote inside the open transaction() block (None: no block):
        # they land when the block ends normally and vanish when it raises, like a rollback
        self._staged: Optional[List[CallRow]] = None
        # the completions complete_owned made inside the open transaction() block, undone
        # when it raises
        self._undo: List[Row] = []
        # Persisted bot state (StateStore). The writes of the open transaction() block wait in
        # _staged_state like its calls.
        self._state: Dict[StateKey, StateEntry] = {}
        self._staged_state: Optional[Dict[StateKey, StateEntry]] = None
        # when each callback-data keyboard was written (prune deletes the old ones)
        self._keyboards_at: Dict[StateKey, int] = {}
        # Recorded steps by effect key. The records of the open transaction() block wait in
        # _staged_steps like its calls.
        self._steps: Dict[str, StepRecord] = {}
        self._staged_steps: Optional[Dict[str, StepRecord]] = None
        # Durable jobs. The jobs and broadcasts write_effects writes in the open transaction()
        # block wait in _staged_jobs like its calls.
        self._jobs = MemoryJobs()
        self._staged_jobs: Optional[List[Tuple[AttemptEffects, int]]] = None
        self._bot_id: Optional[int] = None
        self._liveness = Liveness()
        self._pace = MemoryPace()
        self._broadcasts = MemoryBroadcasts()

    def bind_bot(self, bot_id: int) -> None:
        """Record that this store belongs to bot ``bot_id``. The first binder wins.

        See :meth:`ptb_fence.BatchStore.bind_bot`.

        Raises:
            ptb_fence.TableBotMismatch: The store was bound to another bot id before.
        """
        bot_id = int(bot_id)
        with self._lock:
            if self._bot_id is None:
                self._bot_id = bot_id
            elif self._bot_id != bot_id:
                raise TableBotMismatch("telegram_updates", "a MemoryUpdateStore",
                                       self._bot_id, bot_id)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Release resources. It stops holding liveness, and there is nothing else to release."""
        self.release_liveness()

    def __enter__(self) -> "MemoryUpdateStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _claimable(row: Row, now: int) -> bool:
        if row.state == "pending":
            return True
        if row.state == "failed":
            return row.due_at is not None and row.due_at <= now
        if row.state == "processing":
            return row.due_at is not None and row.due_at < now
        return False

    @staticmethod
    def _live(row: Row, attempt: int, at: Optional[int], claim_id: Optional[str]) -> bool:
        if row.state != "processing" or row.attempts != attempt:
            return False
        if claim_id is not None and row.claim_id != claim_id:
            return False
        return at is None or (row.due_at is not None and row.due_at >= at)

    def _take(self, update_id: int, terms: ClaimTerms) -> Optional[Row]:
        now = terms.now
        row = self._rows.get(update_id)
        if row is None or not self._claimable(row, now):
            return None
        if row.attempts < terms.max_attempts:
            row.state = "processing"
            row.attempts += 1
            row.due_at = terms.lease_until
            row.error = None
            row.claim_id = new_claim_id()
            row.instance = self._liveness.instance
            return row
        row.state = "abandoned"
        row.due_at = now
        row.error = "attempts spent"
        if terms.durable_exhaustion:
            row.settled_at = None
            if row.claim_id is None:
                row.claim_id = new_claim_id()
        else:
            row.settled_at = now
        return None

    @staticmethod
    def _apply(row: Row, settlement: Settlement) -> None:
        if isinstance(settlement, Completed):
            row.state = "completed"
            row.settled_at = settlement.at
            row.error = None
        elif isinstance(settlement, Failed):
            row.state = "failed"
            row.due_at = settlement.retry_at
            row.settled_at = None
            row.error = settlement.error
        elif isinstance(settlement, Abandoned):
            row.state = "abandoned"
            row.settled_at = settlement.at
            row.error = settlement.error
        else:
            raise TypeError(f"not a settlement: {settlement!r}")

    def _admit(self, update_id: int, body: str) -> Tuple[bool, Optional[str]]:
        """Whether ``body`` may be inserted now, and the new row's fingerprint.

        It follows :mod:`ptb_fence.stores._duplicates`.
        A new id may be inserted. So may a different update where the stored row is
        settled, which it replaces. The same update again is a plain duplicate. A different
        update while the stored row is live keeps the first and logs a WARNING.
        """
        fingerprint = update_fingerprint(body)
        row = self._rows.get(update_id)
        if row is None:
            return True, fingerprint
        if fingerprint is None or row.fingerprint is None or row.fingerprint == fingerprint:
            return False, fingerprint
        if row.state == "completed" or (row.state == "abandoned" and row.settled_at is not None):
            return True, fingerprint
        warn_conflict(update_id, row.fingerprint, fingerprint, row.state, row.settled_at)
        return False, fingerprint

    # -- base contract ---------------------------------------------------------------------
    def add(self, update_id: int, body: str, received_at: int) -> bool:
        """Insert a pending row.

        See :meth:`ptb_fence.UpdateStore.add` and :mod:`ptb_fence.stores._duplicates`.
        """
        validate_update_id(update_id)
        with self._lock:
            admitted, fingerprint = self._admit(update_id, body)
            if not admitted:
                return False
            self._rows[update_id] = Row(
                update_id, body, "pending", 0, received_at, received_at, fingerprint=fingerprint
            )
            return True

    def add_many(self, rows: Sequence[Tuple[int, str, int]]) -> List[bool]:
        """Record ``rows`` pending in one commit.

        It is a convenience over :meth:`commit` for seeding and imports. It is no part of the
        contract.

        Returns:
            List[:obj:`bool`]: Per row, whether it is new (``Committed.recorded``).
        """
        return list(self.commit(Batch(records=tuple(rows))).recorded)

    def _add_claimed(
        self, rows: Sequence[Tuple[int, str, int]], lease_until: int
    ) -> List[Optional[AttemptIdentity]]:
        """Record fresh rows claimed for attempt 1, under the lock.

        These are the claimed records of :meth:`commit`.
        """
        result: List[Optional[AttemptIdentity]] = []
        for update_id, body, received_at in rows:
            admitted, fingerprint = self._admit(update_id, body)
            if not admitted:
                result.append(None)
                continue
            claim_id = new_claim_id()
            self._rows[update_id] = Row(
                update_id, body, "processing", 1, lease_until, received_at,
                claim_id=claim_id, fingerprint=fingerprint, instance=self._liveness.instance,
            )
            result.append(AttemptIdentity(update_id, 1, claim_id))
        return result

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[int]:
        """Take the row for a new attempt. See :meth:`ptb_fence.UpdateStore.claim`."""
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        with self._lock:
            row = self._take(update_id, terms)
            return None if row is None else row.attempts

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """Extend a live lease. See :meth:`ptb_fence.UpdateStore.renew`."""
        with self._lock:
            row = self._rows.get(update_id)
            if row is None or not self._live(row, attempt, now, None):
                return False
            row.due_at = lease_until if row.due_at is None else max(row.due_at, lease_until)
            return True

    def renew_many(
        self, leases: Sequence[Tuple[int, int]], lease_until: int, now: int
    ) -> List[bool]:
        """Renew several leases at once. See :meth:`ptb_fence.BatchStore.renew_many`."""
        with self._lock:
            return [self.renew(u, a, lease_until, now) for u, a in leases]

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Record an attempt's result. See :meth:`ptb_fence.UpdateStore.settle`."""
        with self._lock:
            row = self._rows.get(update_id)
            if row is not None and self._live(row, attempt, settlement.at, None):
                self._apply(row, settlement)

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """Rows to hand over. See :meth:`ptb_fence.UpdateStore.due`."""
        with self._lock:
            result: List[StoredUpdate] = []
            if limit <= 0:
                return result
            for update_id in sorted(self._rows):
                row = self._rows[update_id]
                if self._listed_due(row, now, pending_before):
                    result.append(StoredUpdate(update_id, row.body))
                    if len(result) >= limit:
                        break
            return result

    def _listed_due(self, row: Row, now: int, pending_before: int) -> bool:
        """Whether :meth:`due` lists ``row`` (also the rows ``due_in_chat_order`` considers)."""
        if row.state == "pending":
            return row.received_at <= pending_before or self._released(row)
        return self._claimable(row, now)

    def prune(self, before: int) -> int:
        """Delete settled rows. See :meth:`ptb_fence.UpdateStore.prune`.

        The outbox's history and the callback-data keyboards of the same window go too.
        """
        with self._lock:
            doomed = [
                u
                for u, r in self._rows.items()
                if r.state in ("completed", "abandoned")
                and r.settled_at is not None
                and r.settled_at < before
            ]
            for u in doomed:
                del self._rows[u]
            # the recorded steps of the deleted rows (the rows that stay keep theirs)
            gone = set(doomed)
            for step_key in [k for k, step in self._steps.items() if step.update_id in gone]:
                del self._steps[step_key]
            # the callback-data keyboards of the same window (the only state pruned)
            for key in [k for k, at in self._keyboards_at.items() if at < before]:
                del self._keyboards_at[key]
                self._state.pop(key, None)
            # the outbox's history of the same window (not counted: the count is of updates)
            for call_id in [
                c.call_id for c in self._calls.values()
                if (c.state == "sent" and c.sent_at is not None and c.sent_at < before)
                or (c.state == "failed" and c.acknowledged and c.due_at < before)
            ]:
                del self._calls[call_id]
            self._pace.prune(before)
            self._broadcasts.prune(before)
            return len(doomed)

    # -- fenced contract -------------------------------------------------------------------
    def claim_owned(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """Claim with a fresh claim id. See :meth:`ptb_fence.FencedUpdateStore.claim_owned`."""
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        return self._claim_all([update_id], terms)[0]

    def _claim_all(
        self, update_ids: Sequence[int], terms: ClaimTerms
    ) -> List[Optional[AttemptIdentity]]:
        with self._lock:
            seen: Set[int] = set()
            result: List[Optional[AttemptIdentity]] = []
            for update_id in update_ids:
                row = None if update_id in seen else self._take(update_id, terms)
                seen.add(update_id)
                if row is not None:
                    assert row.claim_id is not None
                    result.append(AttemptIdentity(row.update_id, row.attempts, row.claim_id))
                else:
                    result.append(None)
            return result

    def renew_owned(
        self, identity: AttemptIdentity, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """Extend a fenced lease. See :meth:`ptb_fence.FencedUpdateStore.renew_owned`."""
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(row, identity.attempt, now, identity.claim_id):
                return False
            row.due_at = lease_until if row.due_at is None else max(row.due_at, lease_until)
            return True

    def renew_owned_many(
        self, identities: Sequence[AttemptIdentity], lease_until: int, now: int
    ) -> List[bool]:
        """Renew several fenced leases at once.

        See :meth:`ptb_fence.BatchStore.renew_owned_many`.
        """
        with self._lock:
            return [self.renew_owned(i, lease_until, now) for i in identities]

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """Whether this exact claim holds a live lease.

        See :meth:`ptb_fence.FencedUpdateStore.owns`.

        ``connection`` is ignored. The check runs under the store's lock, which
        :meth:`transaction` holds for the whole block.
        """
        with self._lock:
            row = self._rows.get(identity.update_id)
            return row is not None and self._live(row, identity.attempt, at, identity.claim_id)

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        """Settle a fenced attempt. See :meth:`ptb_fence.FencedUpdateStore.settle_owned`."""
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(
                row, identity.attempt, settlement.at, identity.claim_id
            ):
                return False
            self._apply(row, settlement)
            return True

    def _settle_with_state(
        self,
        identity: AttemptIdentity,
        settlement: Settlement,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]],
    ) -> Landing:
        """One settle of :meth:`commit` with the item's state writes."""
        writes = () if not effects or identity not in effects else effects[identity].state
        if not writes or not isinstance(settlement, Completed):
            return self.settle_owned(identity, settlement)
        row = self._rows.get(identity.update_id)
        if row is None or not self._live(row, identity.attempt, settlement.at, identity.claim_id):
            return False
        moved = self._moved(writes)
        if moved:
            return StateConflict(moved)
        self._apply(row, settlement)
        self._put_state(self._state, writes, settlement.at)
        return True

    def commit(self, batch: Batch) -> Committed:
        """Apply ``batch`` at once under the store's lock. See :meth:`ptb_fence.BatchStore.commit`."""
        for row in (*batch.records, *batch.claimed_records):
            validate_update_id(row[0])
        claims = [validate_update_id(update_id) for update_id in batch.claims]
        for queued in (batch.effects or {}).values():
            check_writes(queued.state)  # refused before anything lands
        settlements = list(batch.settlements)
        with self._lock:
            recorded = tuple(self.add(*row) for row in batch.records)
            claimed: Tuple[Optional[AttemptIdentity], ...] = ()
            taken: Tuple[Optional[AttemptIdentity], ...] = ()
            if batch.claimed_records:
                assert batch.terms is not None  # a Batch checks it
                lease_until = batch.terms.lease_until
                claimed = tuple(self._add_claimed(batch.claimed_records, lease_until))
            landed = [
                self._settle_with_state(identity, settlement, batch.effects)
                for identity, settlement in settlements
            ]
            call_ids, sending = self._queue_landed(settlements, landed, batch.effects)
            if claims:
                assert batch.terms is not None
                taken = tuple(self._claim_all(claims, batch.terms))
        return Committed(recorded, claimed, tuple(landed), taken, call_ids, sending)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Hold the store's lock for a block.

        See :meth:`ptb_fence.BatchStore.transaction`.

        It yields :obj:`None`, since there is no database connection.
        Changes made in the block are not rolled back on error, since the memory store has no undo.
        But no other thread can claim, renew or settle while the block runs.
        There is one exception. The calls and state :meth:`write_effects` writes in the block land
        when it ends normally. They are discarded when it raises, as a rollback would.
        """
        with self._lock:
            if self._staged is not None:  # a nested block belongs to the outer one
                yield None
                return
            self._staged = []
            self._staged_state = {}
            self._staged_steps = {}
            self._staged_jobs = []
            self._undo = []
            try:
                yield None
            except BaseException:
                self._staged = None
                self._staged_state = None
                self._staged_steps = None
                self._staged_jobs = None
                for row in self._undo:
                    row.state, row.settled_at = "processing", None
                self._undo = []
                raise
            self._undo = []
            staged, self._staged = self._staged, None
            state, self._staged_state = self._staged_state, None
            steps, self._staged_steps = self._staged_steps, None
            jobs, self._staged_jobs = self._staged_jobs, None
            for effects, at in jobs:
                self._write_later(effects, at)
            for call in staged:
                self._calls[call.call_id] = call
            self._state.update(state)
            for key, step in steps.items():
                self._steps.setdefault(key, step)

    def complete_owned(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Complete this claim at the start of a :meth:`transaction` block.

        See :meth:`ptb_fence.BatchStore.complete_owned`. The completion is undone
        when the block raises. ``connection`` is ignored.
        """
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(row, identity.attempt, at, identity.claim_id):
                return False
            row.state, row.settled_at = "completed", at
            if self._staged is not None:
                self._undo.append(row)
            return True

    def reopen_completed(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Undo a :meth:`complete_owned` of this claim at ``at``.

        See :meth:`ptb_fence.BatchStore.reopen_completed`. ``connection`` is
        ignored.
        """
        with self._lock:
            row = self._rows.get(identity.update_id)
            if (
                row is None
                or row.state != "completed"
                or row.settled_at != at
                or row.attempts != identity.attempt
                or row.claim_id != identity.claim_id
            ):
                return False
            row.state, row.settled_at = "processing", None
            return True

    # -- durable contract ------------------------------------------------------------------
    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        """Turn the exact live claim into an unacknowledged exhaustion."""
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(row, identity.attempt, at, identity.claim_id):
                return False
            row.state = "abandoned"
            row.due_at = at
            row.settled_at = None
            row.error = error
            return True

    def due_exhaustions(
        self, *, limit: int, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        """Unacknowledged exhaustions after ``after_update_id``, by ``update_id``."""
        with self._lock:
            result: List[Exhaustion] = []
            if limit <= 0:
                return result
            for update_id in sorted(self._rows):
                if after_update_id is not None and update_id <= after_update_id:
                    continue
                row = self._rows[update_id]
                if row.state == "abandoned" and row.settled_at is None:
                    assert row.claim_id is not None and row.due_at is not None
                    result.append(
                        Exhaustion(
                            update_id=update_id,
                            attempt=row.attempts,
                            claim_id=row.claim_id,
                            body=row.body,
                            exhausted_at=row.due_at,
                            error=row.error,
                        )
                    )
                    if len(result) >= limit:
                        break
            return result

    def acknowledge_exhaustion(
        self, identity: AttemptIdentity, at: int, *, effects: Optional[AttemptEffects] = None
    ) -> bool:
        """Acknowledge an exhaustion.

        See :meth:`ptb_fence.DurableUpdateStore.acknowledge_exhaustion`.

        With ``effects``, their outbox calls are inserted as pending with it, only when it
        acknowledges (see :class:`ptb_fence.OutboxStore`).
        """
        with self._lock:
            row = self._rows.get(identity.update_id)
            if (
                row is None
                or row.state != "abandoned"
                or row.settled_at is not None
                or row.attempts != identity.attempt
                or row.claim_id != identity.claim_id
            ):
                return False
            row.settled_at = at
            if effects is not None and effects.calls:
                for call in self._new_calls(identity, effects, at):
                    self._calls[call.call_id] = call
            return True

    # -- chat order ------------------------------------------------------------------------
    def _blockers(self, now: int) -> Dict[int, Tuple[int, int]]:
        """Per chat key: its lowest unsettled ``update_id`` and the id of a leased processing row.

        The id is ``-1`` if there is no such row.
        """
        chats: Dict[int, Tuple[int, int]] = {}
        for row in self._rows.values():
            if row.chat_key is None or row.state not in UNSETTLED:
                continue
            low, live = chats.get(row.chat_key, (row.update_id, -1))
            low = min(low, row.update_id)
            if row.state == "processing" and row.due_at is not None and row.due_at >= now:
                live = row.update_id
            chats[row.chat_key] = (low, live)
        return chats

    def _in_turn(self, row: Row, now: int) -> bool:
        """No other row of the chat unsettled below ``row``, none with a live lease."""
        if row.chat_key is None:
            return True
        for other in self._rows.values():
            if (
                other.chat_key != row.chat_key
                or other.update_id == row.update_id
                or other.state not in UNSETTLED
            ):
                continue
            if other.update_id < row.update_id:
                return False
            if other.state == "processing" and other.due_at is not None and other.due_at >= now:
                return False
        return True

    def add_many_in_chats(
        self, rows: Sequence[Tuple[int, str, int, Optional[int]]]
    ) -> List[bool]:
        """Insert rows with their chat keys.

        See :meth:`ptb_fence.BatchStore.add_many_in_chats`.
        """
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        with self._lock:
            result: List[bool] = []
            for update_id, body, received_at, chat_key in rows:
                admitted, fingerprint = self._admit(update_id, body)
                if admitted:
                    self._rows[update_id] = Row(
                        update_id, body, "pending", 0, received_at, received_at,
                        fingerprint=fingerprint,
                        chat_key=None if chat_key is None else int(chat_key),
                    )
                result.append(admitted)
            return result

    def claim_in_chat_order(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """As ``claim_owned``, only when the row is in turn at ``now``."""
        with self._lock:
            row = self._rows.get(update_id)
            if row is None or not self._in_turn(row, now):
                return None
            taken = self._take(
                update_id, ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
            )
            if taken is None or taken.claim_id is None:
                return None
            return AttemptIdentity(update_id, taken.attempts, taken.claim_id)

    def due_in_chat_order(
        self, *, now: int, pending_before: int, limit: int, chat_key: Optional[int] = None
    ) -> List[StoredUpdate]:
        """As ``due``, only rows in turn at ``now``, of ``chat_key``'s chat when given."""
        with self._lock:
            result: List[StoredUpdate] = []
            if limit <= 0:
                return result
            blockers = self._blockers(now)
            for update_id in sorted(self._rows):
                row = self._rows[update_id]
                if chat_key is not None and row.chat_key != chat_key:
                    continue
                if not self._listed_due(row, now, pending_before):
                    continue
                if row.chat_key is not None:
                    low, live = blockers[row.chat_key]
                    if low != update_id or live not in (-1, update_id):
                        continue
                result.append(StoredUpdate(update_id, row.body))
                if len(result) >= limit:
                    break
            return result

    def unkeyed_in_chats(
        self, *, after_update_id: Optional[int] = None, limit: int
    ) -> List[StoredUpdate]:
        """Unsettled rows without a chat key, by ``update_id``, after ``after_update_id``."""
        with self._lock:
            after = -1 if after_update_id is None else after_update_id
            rows = sorted(
                update_id
                for update_id, row in self._rows.items()
                if row.chat_key is None and row.state in UNSETTLED and update_id > after
            )[: max(int(limit), 0)]
            return [StoredUpdate(update_id, self._rows[update_id].body) for update_id in rows]

    def set_chat_keys(self, keys: Sequence[ChatKey]) -> int:
        """Record chat keys of rows that have none.

        For each ``(update_id, body, chat_key)`` the chat key is set if the row has none, is
        unsettled and holds exactly ``body``. Returns how many were set.
        """
        done = 0
        with self._lock:
            for update_id, body, chat_key in keys:
                row = self._rows.get(update_id)
                if (
                    row is not None
                    and row.chat_key is None
                    and row.state in UNSETTLED
                    and row.body == body
                ):
                    row.chat_key = int(chat_key)
                    done += 1
        return done

    # -- release and liveness --------------------------------------------------------------
    @staticmethod
    def _released(row: Row) -> bool:
        """A pending row with a claim id was released (``add`` never writes one)."""
        return row.state == "pending" and row.claim_id is not None

    def release_many(self, identities: Sequence[AttemptIdentity], *, at: int) -> List[bool]:
        """Give the exact claims back. See :meth:`ptb_fence.BatchStore.release_many`.

        Returns:
            List[:obj:`bool`]: Per input position, whether that claim was released.
        """
        at = int(at)
        result: List[bool] = []
        with self._lock:
            for identity in identities:
                row = self._rows.get(identity.update_id)
                ok = (
                    row is not None
                    and row.state == "processing"
                    and row.attempts == identity.attempt
                    and row.claim_id == identity.claim_id
                )
                if ok and row is not None:
                    row.state = "pending"
                    row.attempts -= 1
                    row.due_at = at
                    row.instance = None
                result.append(ok)
        return result

    def hold_liveness(self) -> str:
        """Start holding liveness. See :meth:`ptb_fence.BatchStore.hold_liveness`."""
        with self._lock:
            if self._liveness.instance is None:
                self._liveness.instance = uuid.uuid4().hex
            return self._liveness.instance

    def release_liveness(self) -> None:
        """Stop holding liveness and forget the instance (idempotent)."""
        with self._lock:
            self._liveness.instance = None

    def take_over_dead(self, *, now: int) -> int:
        """Make the processing rows of dead instances claimable at ``now``.

        See :meth:`ptb_fence.BatchStore.take_over_dead`.
        In memory every registered instance is alive until it is released. So there is never a
        dead one, and it returns ``0``.
        """
        int(now)
        return 0

    # -- figures ---------------------------------------------------------------------------
    def figures(self) -> StoreFigures:
        """What waits in the store, for operators. See :meth:`ptb_fence.BatchStore.figures`."""
        received: List[int] = []  # of the unsettled rows
        exhausted: List[int] = []  # due_at of the unacknowledged exhaustions
        chats: Dict[int, Tuple[int, int]] = {}  # chat key: (unsettled rows, oldest received_at)
        with self._lock:  # one consistent view, as one statement of the SQL stores
            for row in self._rows.values():
                if row.state in UNSETTLED:
                    received.append(row.received_at)
                    if row.chat_key is not None:
                        count, since = chats.get(row.chat_key, (0, row.received_at))
                        chats[row.chat_key] = (count + 1, min(since, row.received_at))
                elif row.state == "abandoned" and row.settled_at is None:
                    assert row.due_at is not None  # an abandoned row records when it ended
                    exhausted.append(row.due_at)
        held = min(
            ((since, key) for key, (count, since) in chats.items() if count >= 2), default=None
        )
        return StoreFigures(
            unsettled=len(received),
            oldest_unsettled_received_at=min(received, default=None),
            exhaustions_waiting=len(exhausted),
            oldest_exhaustion_at=min(exhausted, default=None),
            held_chat=None if held is None else held[1],
            held_chat_since=None if held is None else held[0],
        )

    # -- outbox ----------------------------------------------------------------------------
    def _new_calls(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int
    ) -> List[CallRow]:
        """Rows for the calls of ``effects``, with fresh, increasing call ids.

        A call is pending, or sending under ``effects.claim``. It is sending for the first
        ``claim.limit`` calls whose chat has no call pending or sending. That counts the store and
        the rows made before it here.
        """
        rows: List[CallRow] = []
        claim = effects.claim
        limit = 0 if claim is None else max(int(claim.limit), 0)
        for i, call in enumerate(effects.calls):
            chat = None if call.chat_key is None else int(call.chat_key)
            go = claim is not None and i < limit and (chat is None or not any(
                other.chat_key == chat and other.state in ("pending", "sending")
                for other in itertools.chain(self._calls.values(), self._staged or (), rows)
            ))
            row = CallRow(
                self._next_call, identity.update_id, identity.attempt, identity.claim_id,
                int(call.seq), chat, call.method, call.params_json, bool(call.at_most_once),
                "pending", 0, int(at), int(at),
            )
            if go:
                assert claim is not None
                row.state, row.tries, row.due_at = "sending", 1, int(claim.lease_until)
                row.sender = claim.sender
            rows.append(row)
            self._next_call += 1
        return rows

    def _queue_landed(
        self,
        items: Sequence[Tuple[AttemptIdentity, Settlement]],
        landed: Sequence[Landing],
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]],
    ) -> Tuple[Dict[AttemptIdentity, Tuple[int, ...]], FrozenSet[int]]:
        """Insert the calls of every landed completion of ``items``.

        It runs under the lock, in the same step as the settles. It returns the call ids per
        completion and the ids inserted claimed for a sender.
        """
        call_ids: Dict[AttemptIdentity, Tuple[int, ...]] = {}
        sending: Set[int] = set()
        if not effects:
            return call_ids, frozenset()
        for (identity, settlement), ok in zip(items, landed):
            queued = effects.get(identity)
            if ok and queued is not None and isinstance(settlement, Completed):
                self._write_later(queued, settlement.at)
                rows = self._new_calls(identity, queued, settlement.at)
                for call in rows:
                    self._calls[call.call_id] = call
                    if call.state == "sending":
                        sending.add(call.call_id)
                call_ids[identity] = tuple(call.call_id for call in rows)
        return call_ids, frozenset(sending)

    @staticmethod
    def _entry(row: CallRow) -> OutboxEntry:
        return OutboxEntry(
            row.call_id, row.update_id, row.attempt, row.claim_id, row.seq, row.chat_key,
            row.method, row.params_json, row.at_most_once, row.state, row.tries, row.due_at,
            row.created_at, row.sent_at, row.error, row.result_json, row.acknowledged,
        )

    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        """Insert the calls of ``effects`` as pending at ``at``.

        See :meth:`ptb_fence.OutboxStore.write_effects`.

        Inside a :meth:`transaction` block they land with the block and vanish when it raises.
        Outside one they land at once.
        ``connection`` is ignored, since the block yields :obj:`None`.
        """
        with self._lock:
            writes = tuple(check_writes(effects.state))
            moved = self._moved(writes)
            if moved:
                raise StateConflictError(tuple(moved))
            rows = self._new_calls(identity, effects, at)
            if self._staged is not None and self._staged_state is not None:
                self._staged.extend(rows)
                self._put_state(self._staged_state, writes, at)
                if self._staged_jobs is not None:
                    self._staged_jobs.append((effects, at))
            else:
                for row in rows:
                    self._calls[row.call_id] = row
                self._put_state(self._state, writes, at)
                self._write_later(effects, at)
            return [row.call_id for row in rows]

    # -- durable jobs ---------------------------------------------------------------------
    def _write_later(self, effects: AttemptEffects, at: int) -> None:
        """The jobs a landed completion scheduled and removed, and the broadcasts it started
        (under the lock)."""
        if effects.jobs:
            self._jobs.schedule(effects.jobs, at)
        if effects.cancelled_jobs:
            self._jobs.cancel(effects.cancelled_jobs)
        if effects.broadcasts:
            self._broadcasts.write(effects.broadcasts, at)

    def schedule_jobs(self, jobs: Sequence[JobWrite], at: int, *,
                      connection: Any = None) -> List[StoredJob]:
        """Write jobs. See :meth:`ptb_fence.BatchStore.schedule_jobs`."""
        with self._lock:
            return self._jobs.schedule(jobs, at)

    def cancel_jobs(self, job_ids: Sequence[int], at: int, *,
                    connection: Any = None) -> List[bool]:
        """Cancel jobs. See :meth:`ptb_fence.BatchStore.cancel_jobs`."""
        with self._lock:
            return self._jobs.cancel(job_ids)

    def due_jobs(self, now: int, limit: int) -> List[StoredJob]:
        """The jobs due now. See :meth:`ptb_fence.BatchStore.due_jobs`."""
        with self._lock:
            return self._jobs.due(now, limit)

    def fire_jobs(self, fires: Sequence[JobFire], at: int) -> List[bool]:
        """Fire runs as update rows. See :meth:`ptb_fence.BatchStore.fire_jobs`."""
        for fire in fires:
            validate_update_id(fire.update_id)
        with self._lock:
            fired: List[bool] = []
            for fire in fires:
                if not self._jobs.advance(fire):
                    fired.append(False)
                    continue
                if not fire.skip and fire.update_id not in self._rows:
                    self._rows[fire.update_id] = Row(
                        fire.update_id, fire.body, "pending", 0, at, at,
                        fingerprint=update_fingerprint(fire.body), chat_key=fire.chat_key,
                    )
                fired.append(True)
            return fired

    def list_jobs(self, *, name: Optional[str] = None, include_ended: bool = False,
                  after_job_id: int = 0, limit: int = 1000) -> List[StoredJob]:
        """The jobs by id. See :meth:`ptb_fence.BatchStore.list_jobs`."""
        with self._lock:
            return self._jobs.listed(name, include_ended, after_job_id, limit)

    def get_job(self, job_id: int) -> Optional[StoredJob]:
        """One job. See :meth:`ptb_fence.BatchStore.get_job`."""
        with self._lock:
            return self._jobs.get(job_id)

    def run_job_now(self, job_id: int, at: int) -> bool:
        """Make a job due now. See :meth:`ptb_fence.BatchStore.run_job_now`."""
        with self._lock:
            return self._jobs.run_now(job_id, at)

    # -- pacing ----------------------------------------------------------------------------
    def take_send_slots(
        self, wants: Sequence[Sequence[PaceBucket]], *, now: int, horizon_ms: int
    ) -> List[int]:
        """Take send slots. See :meth:`ptb_fence.BatchStore.take_send_slots`."""
        return self._pace.take_send_slots(wants, now=now, horizon_ms=horizon_ms)

    def hold_sends(self, holds: Sequence[Tuple[str, int]]) -> None:
        """Hold buckets. See :meth:`ptb_fence.BatchStore.hold_sends`."""
        self._pace.hold_sends(holds)

    # -- broadcasts ------------------------------------------------------------------------
    def start_broadcast(self, name: str, method: str, params_json: str,
                        at: int) -> StoredBroadcast:
        """Start a broadcast. See :meth:`ptb_fence.BatchStore.start_broadcast`."""
        return self._broadcasts.start_broadcast(name, method, params_json, at)

    def add_recipients(self, broadcast_id: int, chat_ids: Sequence[int], at: int) -> int:
        """Add recipients. See :meth:`ptb_fence.BatchStore.add_recipients`."""
        return self._broadcasts.add_recipients(broadcast_id, chat_ids, at)

    def claim_recipients(self, sender: str, *, now: int, lease_until: int,
                         limit: int) -> List[Recipient]:
        """Claim recipients. See :meth:`ptb_fence.BatchStore.claim_recipients`."""
        return self._broadcasts.claim_recipients(sender, now=now, lease_until=lease_until,
                                                 limit=limit)

    def settle_recipients(self, sender: str, outcomes: Sequence[RecipientOutcome],
                          at: int) -> List[bool]:
        """Record outcomes. See :meth:`ptb_fence.BatchStore.settle_recipients`."""
        return self._broadcasts.settle_recipients(sender, outcomes, at)

    def set_broadcast_state(self, name: str, state: str,
                            at: int) -> Optional[StoredBroadcast]:
        """Pause, resume or cancel. See :meth:`ptb_fence.BatchStore.set_broadcast_state`."""
        return self._broadcasts.set_broadcast_state(name, state, at)

    def list_broadcasts(self, name: Optional[str] = None) -> List[StoredBroadcast]:
        """The broadcasts. See :meth:`ptb_fence.BatchStore.list_broadcasts`."""
        return self._broadcasts.list_broadcasts(name)

    # -- persisted bot state -----------------------------------------------------------------
    def _current(self, key: StateKey) -> Optional[StateEntry]:
        """The state as this thread would read it: the open block's write, else committed."""
        if self._staged_state is not None and key in self._staged_state:
            return self._staged_state[key]
        return self._state.get(key)

    def _moved(self, writes: Sequence[StateWrite]) -> Tuple[StateKey, ...]:
        """The keys of ``writes`` whose version is not the one the writer read."""
        moved = []
        for write in writes:
            entry = self._current(write.key)
            if (0 if entry is None else entry.version) != write.version:
                moved.append(write.key)
        return tuple(moved)

    def _put_state(
        self, target: Dict[StateKey, StateEntry], writes: Sequence[StateWrite], at: int
    ) -> None:
        for write in writes:
            target[write.key] = StateEntry(write.value, write.version + 1)
            if write.key.kind == "callback":
                self._keyboards_at[write.key] = at

    def read_state(self, keys: Sequence[StateKey]) -> Dict[StateKey, StateEntry]:
        """The committed rows of ``keys``. See :meth:`ptb_fence.StateStore.read_state`."""
        with self._lock:
            return {key: self._state[key] for key in keys if key in self._state}

    def write_state(self, writes: Sequence[StateWrite], at: int) -> Optional[StateConflict]:
        """Apply ``writes`` at once, all or none. See :meth:`ptb_fence.StateStore.write_state`."""
        with self._lock:
            checked = check_writes(writes)
            moved = self._moved(checked)
            if moved:
                return StateConflict(moved)
            self._put_state(self._state, checked, at)
            return None

    def list_state(
        self,
        *,
        kind: Optional[str] = None,
        name: Optional[str] = None,
        after: Optional[StateKey] = None,
        limit: int = 100,
    ) -> List[Tuple[StateKey, StateEntry]]:
        """The rows after ``after``. See :meth:`ptb_fence.StateStore.list_state`."""
        check_kind(kind)
        with self._lock:
            keys = sorted(
                (k for k in self._state
                 if (kind is None or k.kind == kind) and (name is None or k.name == name)
                 and (after is None or (k.kind, k.name, k.key) > (after.kind, after.name,
                                                                  after.key))),
                key=lambda k: (k.kind, k.name, k.key),
            )
            return [(k, self._state[k]) for k in keys[: max(0, int(limit))]]

    def _call_in_turn(self, call: CallRow, now: int) -> bool:
        """Whether ``call`` is in turn in its chat.

        No other call of the chat is pending or sending below it, and none is sending under a live
        lease.

        A call without a chat key always is in turn.
        """
        if call.chat_key is None:
            return True
        for other in self._calls.values():
            if (
                other.chat_key != call.chat_key
                or other.call_id == call.call_id
                or other.state not in ("pending", "sending")
            ):
                continue
            if other.call_id < call.call_id:
                return False
            if other.state == "sending" and other.due_at >= now:
                return False
        return True

    def claim_calls(
        self, *, now: int, lease_until: int, limit: int, sender: str
    ) -> List[OutboxEntry]:
        """Claim the calls to send now. See :meth:`ptb_fence.OutboxStore.claim_calls`."""
        with self._lock:
            # decide on the calls as they are before this claim (one statement in SQL)
            chosen = [
                call for _, call in sorted(self._calls.items())
                if ((call.state == "pending" and call.due_at <= now)
                    or (call.state == "sending" and call.due_at < now))
                and self._call_in_turn(call, now)
            ][: max(int(limit), 0)]
            for call in chosen:
                call.state = "sending"
                call.due_at = int(lease_until)
                call.tries += 1
                call.sender = sender
            return [self._entry(call) for call in chosen]

    def claimed_calls(self, sender: str, *, limit: int) -> List[OutboxEntry]:
        """The calls ``sending`` by ``sender``.

        See :meth:`ptb_fence.OutboxStore.claimed_calls`.
        """
        with self._lock:
            mine = [call for _, call in sorted(self._calls.items())
                    if call.state == "sending" and call.sender == sender]
            return [self._entry(call) for call in mine[: max(int(limit), 0)]]

    def _sending(self, call_id: int, sender: str) -> Optional[CallRow]:
        call = self._calls.get(call_id)
        if call is None or call.state != "sending" or call.sender != sender:
            return None
        return call

    def record_sent(self, items: Sequence[Tuple[int, str, str, int]]) -> List[bool]:
        """Record sent calls. See :meth:`ptb_fence.OutboxStore.record_sent`."""
        with self._lock:
            result = []
            for call_id, sender, result_json, at in items:
                call = self._sending(call_id, sender)
                if call is not None:
                    call.state = "sent"
                    call.sent_at = int(at)
                    call.result_json = result_json
                result.append(call is not None)
            return result

    def record_sent_and_claim(
        self,
        items: Sequence[Tuple[int, str, str, int]],
        *,
        now: int,
        lease_until: int,
        limit: int,
        sender: str,
    ) -> Tuple[List[bool], List[OutboxEntry]]:
        """Record, then claim, under one hold of the lock.

        See :meth:`ptb_fence.OutboxStore.record_sent_and_claim`.
        """
        with self._lock:  # re-entrant: both steps as one
            landed = self.record_sent(items)
            claimed = self.claim_calls(now=now, lease_until=lease_until, limit=limit,
                                       sender=sender) if limit > 0 else []
            return landed, claimed

    def retry_call(self, call_id: int, sender: str, *, due_at: int, error: str) -> bool:
        """Sending by ``sender`` -> pending at ``due_at`` with ``error``."""
        with self._lock:
            call = self._sending(call_id, sender)
            if call is None:
                return False
            call.state = "pending"
            call.due_at = int(due_at)
            call.error = error
            return True

    def fail_call(self, call_id: int, sender: str, *, at: int, error: str) -> bool:
        """Sending by ``sender`` -> failed at ``at`` (not acknowledged) with ``error``."""
        with self._lock:
            call = self._sending(call_id, sender)
            if call is None:
                return False
            call.state = "failed"
            call.due_at = int(at)
            call.error = error
            call.acknowledged = False
            return True

    def release_calls(self, call_ids: Sequence[int], sender: str, at: int) -> List[bool]:
        """Each call sending by ``sender`` -> pending at ``at``, ``tries - 1``."""
        with self._lock:
            result = []
            for call_id in call_ids:
                call = self._sending(call_id, sender)
                if call is not None:
                    call.state = "pending"
                    call.due_at = int(at)
                    call.tries -= 1
                result.append(call is not None)
            return result

    def due_send_failures(
        self, *, limit: int, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """Failed calls not acknowledged, after ``after_call_id``, by ``call_id``."""
        return self._listed(
            lambda c: c.state == "failed" and not c.acknowledged, limit, after_call_id
        )

    def acknowledge_send_failure(self, call_id: int, at: int) -> bool:
        """A failed call not acknowledged -> acknowledged at ``at`` (``due_at = at``)."""
        with self._lock:
            call = self._calls.get(call_id)
            if call is None or call.state != "failed" or call.acknowledged:
                return False
            call.acknowledged = True
            call.due_at = int(at)
            return True

    def get_call(self, call_id: int) -> Optional[OutboxEntry]:
        """The call, or :obj:`None`."""
        with self._lock:
            call = self._calls.get(call_id)
            return None if call is None else self._entry(call)

    def list_calls(
        self, *, state: Optional[str] = None, limit: int = 100, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """The calls (of ``state``), after ``after_call_id``, by ``call_id``."""
        return self._listed(lambda c: state is None or c.state == state, limit, after_call_id)

    def _listed(
        self, keep: Any, limit: int, after_call_id: Optional[int]
    ) -> List[OutboxEntry]:
        after = -1 if after_call_id is None else int(after_call_id)
        with self._lock:
            rows = [
                self._entry(call) for call_id, call in sorted(self._calls.items())
                if call_id > after and keep(call)
            ]
        return rows[: max(int(limit), 0)]

    def outbox_counts(self) -> Dict[str, int]:
        """Calls per state. See :meth:`ptb_fence.OutboxStore.outbox_counts`."""
        counts = {state: 0 for state in OUTBOX_STATES}
        counts["failed_acknowledged"] = 0
        with self._lock:
            for call in self._calls.values():
                key = "failed_acknowledged" if (
                    call.state == "failed" and call.acknowledged
                ) else call.state
                counts[key] += 1
        return counts

    def retry_failed_call(self, call_id: int, at: int) -> bool:
        """Operators: retry a failed call. See :meth:`ptb_fence.OutboxStore.retry_failed_call`."""
        with self._lock:
            call = self._calls.get(call_id)
            if call is None or call.state != "failed":
                return False
            call.state = "pending"
            call.due_at = int(at)
            call.acknowledged = False
            call.sender = None
            return True

    def drop_call(self, call_id: int) -> bool:
        """Operators: delete a pending or failed call."""
        with self._lock:
            call = self._calls.get(call_id)
            if call is None or call.state not in ("pending", "failed"):
                return False
            del self._calls[call_id]
            return True

    # -- recorded steps --------------------------------------------------------------------
    def read_step(self, key: str) -> Optional[StepRecord]:
        """The committed record of ``key``, or :obj:`None`.

        See :meth:`ptb_fence.BatchStore.read_step`.
        """
        with self._lock:
            return self._steps.get(key)

    def record_step(self, record: StepRecord, *, connection: Any = None) -> bool:
        """Record a step while its attempt owns the update.

        See :meth:`ptb_fence.BatchStore.record_step`.

        Inside a :meth:`transaction` block the record lands with the block and vanishes when
        it raises. Outside one it lands at once. ``connection`` is ignored, since the block
        yields :obj:`None`.
        """
        check_step(record)
        with self._lock:
            row = self._rows.get(record.update_id)
            if row is None or not self._live(
                row, record.attempt, record.recorded_at, record.claim_id
            ):
                return False
            if record.key in self._steps:
                return True  # the earlier record stands
            target = self._steps if self._staged_steps is None else self._staged_steps
            target.setdefault(record.key, record)
            return True

    def steps_of(self, update_id: int) -> List[StepRecord]:
        """The committed records of ``update_id``, by ``recorded_at`` and then by key.

        See :meth:`ptb_fence.BatchStore.steps_of`.
        """
        with self._lock:
            found = [step for step in self._steps.values() if step.update_id == update_id]
        return sorted(found, key=lambda step: (step.recorded_at, step.key))
