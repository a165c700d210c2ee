"""MemoryUpdateStore: the executable statement of the store rules, whole in one class.

Sections: lifecycle, helpers, the base, fenced and durable contracts, chat order, release
and liveness, figures, the outbox, persisted bot state."""

from __future__ import annotations

import itertools

import threading
import uuid
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from ptb_fence._errors import StateConflictError, TableBotMismatch
from ptb_fence._fingerprint import update_fingerprint
from ptb_fence.contract import ChatKey, ClaimTerms
from ptb_fence._values import (
    OUTBOX_STATES,
    Abandoned,
    AttemptEffects,
    AttemptIdentity,
    Completed,
    Exhaustion,
    Failed,
    OutboxEntry,
    Landing,
    Settlement,
    StateConflict,
    StateEntry,
    StateKey,
    StateWrite,
    StoreFigures,
    StoredUpdate,
)
from ptb_fence.stores._state_sql import check_kind, check_writes
from ptb_fence.stores._duplicates import warn_conflict
from ptb_fence.stores._names import validate_update_id
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

    It is the clearest statement of the rules and makes unit tests fast. Everything it holds is
    lost when the process ends: use it for tests and for bots that accept losing work on
    restart. :meth:`transaction` yields :obj:`None` and runs the caller's block under the store's
    lock, so an ownership check and a settle inside it are atomic.
    """

    __slots__ = (
        "_bot_id", "_calls", "_keyboards_at", "_liveness", "_lock", "_next_call", "_rows",
        "_staged", "_state", "_staged_state",
    )

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._rows: Dict[int, Row] = {}
        self._calls: Dict[int, CallRow] = {}
        self._next_call = 1
        # the calls write_effects wrote inside the open transaction() block (None: no block):
        # they land when the block ends normally and vanish when it raises, like a rollback
        self._staged: Optional[List[CallRow]] = None
        # persisted bot state (StateStore); the writes of the open transaction() block wait in
        # _staged_state like its calls
        self._state: Dict[StateKey, StateEntry] = {}
        self._staged_state: Optional[Dict[StateKey, StateEntry]] = None
        # when each callback-data keyboard was written (prune deletes the old ones)
        self._keyboards_at: Dict[StateKey, int] = {}
        self._bot_id: Optional[int] = None
        self._liveness = Liveness()

    def bind_bot(self, bot_id: int) -> None:
        """Record that this store belongs to bot ``bot_id``; the first binder wins.

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
        """Release resources: stops holding liveness (nothing else to release)."""
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

        A new id, or a different update where the stored row is settled (it is replaced), may
        be inserted; the same update again is a plain duplicate; a different update while the
        stored row is live keeps the first and logs a WARNING .
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
        """Insert a pending row; :obj:`False` if the id exists (see below).

        The same update again is a duplicate (:obj:`False`, nothing changes). A different
        update (another fingerprint) replaces a settled row (completed, or abandoned with
        ``settled_at`` set) as a fresh pending row (:obj:`True`); with a live row the first is
        kept (:obj:`False`) and a WARNING is logged on ``ptb_fence.store``.
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
        """Insert several ``(update_id, body, received_at)`` rows at once (optional capability)."""
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        with self._lock:
            return [self.add(update_id, body, at) for update_id, body, at in rows]

    def add_claimed_many(
        self, rows: Sequence[Tuple[int, str, int]], *, lease_until: int
    ) -> List[Optional[AttemptIdentity]]:
        """Record fresh updates already claimed for attempt 1 (optional capability).

        For each ``(update_id, body, received_at)``: if the id is new, insert it as
        ``processing`` with ``attempts = 1``, lease ``lease_until`` and a fresh claim id, and
        return its identity; if it exists, change nothing and return :obj:`None` — except
        that a different update replaces a settled row (see :meth:`add`). All rows land
        together (one commit in the SQL stores).
        """
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        with self._lock:
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
        """Take the row for a new attempt; see :class:`ptb_fence.UpdateStore`."""
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        with self._lock:
            row = self._take(update_id, terms)
            return None if row is None else row.attempts

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """Extend a live lease; see :class:`ptb_fence.UpdateStore`."""
        with self._lock:
            row = self._rows.get(update_id)
            if row is None or not self._live(row, attempt, now, None):
                return False
            row.due_at = lease_until if row.due_at is None else max(row.due_at, lease_until)
            return True

    def renew_many(
        self, leases: Sequence[Tuple[int, int]], lease_until: int, now: int
    ) -> List[bool]:
        """Renew several ``(update_id, attempt)`` leases at once (optional capability)."""
        with self._lock:
            return [self.renew(u, a, lease_until, now) for u, a in leases]

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Record an attempt's result if it still holds its lease at ``settlement.at``."""
        with self._lock:
            row = self._rows.get(update_id)
            if row is not None and self._live(row, attempt, settlement.at, None):
                self._apply(row, settlement)

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """Rows to hand over, by ``update_id``; see :class:`ptb_fence.UpdateStore`.

        A released row (pending with a claim id, see :meth:`release_many`) is listed at once,
        whatever ``pending_before``."""
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
        """Delete completed/abandoned rows settled before ``before``; return the count. The
        outbox's history and the callback-data keyboards of the same window go too."""
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
        """As :meth:`claim`, returning the attempt's identity."""
        terms = ClaimTerms(now, lease_until, max_attempts, durable_exhaustion)
        return self._claim_all([update_id], terms)[0]

    def claim_owned_many(
        self, update_ids: Sequence[int], terms: ClaimTerms
    ) -> List[Optional[AttemptIdentity]]:
        """:meth:`claim_owned` for each id, at once (optional capability, see
        :class:`ptb_fence.ClaimingUpdateStore`); an id repeated in ``update_ids`` is claimed at
        its first position only (:obj:`None` at the later ones)."""
        return self._claim_all(update_ids, terms)

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
        """As :meth:`renew`, and the claim id must match."""
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(row, identity.attempt, now, identity.claim_id):
                return False
            row.due_at = lease_until if row.due_at is None else max(row.due_at, lease_until)
            return True

    def renew_owned_many(
        self, identities: Sequence[AttemptIdentity], lease_until: int, now: int
    ) -> List[bool]:
        """Renew several fenced leases at once (optional capability)."""
        with self._lock:
            return [self.renew_owned(i, lease_until, now) for i in identities]

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """:obj:`True` while this exact claim holds a lease unexpired at ``at``.

        ``connection`` is accepted for interface compatibility and ignored: the check runs under
        the store's lock, which :meth:`transaction` holds for the whole block.
        """
        with self._lock:
            row = self._rows.get(identity.update_id)
            return row is not None and self._live(row, identity.attempt, at, identity.claim_id)

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        """As :meth:`settle`, and the claim id must match; returns whether it landed."""
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(
                row, identity.attempt, settlement.at, identity.claim_id
            ):
                return False
            self._apply(row, settlement)
            return True

    def settle_owned_many(
        self,
        items: Sequence[Tuple[AttemptIdentity, Settlement]],
        *,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    ) -> List[Landing]:
        """:meth:`settle_owned` for several attempts at once (optional capability; one commit
        in the SQL stores). Returns, per input position, whether that settlement landed.

        With ``effects``: the calls of each settlement that landed and is
        :class:`~ptb_fence.Completed` are queued with it (see
        :class:`ptb_fence.OutboxStore`); its state writes land with it, all or none, and a
        moved version makes the item a :class:`~ptb_fence.StateConflict` that does not settle
        (see :class:`ptb_fence.StateStore`)."""
        for queued in (effects or {}).values():
            check_writes(queued.state)  # refused before anything settles
        with self._lock:
            landed = [self._settle_with_state(identity, settlement, effects)
                      for identity, settlement in items]
            self._queue_landed(items, landed, effects)
            return landed

    def _settle_with_state(
        self,
        identity: AttemptIdentity,
        settlement: Settlement,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]],
    ) -> Landing:
        """One settle of :meth:`settle_owned_many` with the item's state writes."""
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

    def add_claimed_and_settle_many(
        self,
        rows: Sequence[Tuple[int, str, int]],
        *,
        lease_until: int,
        settlements: Sequence[Tuple[AttemptIdentity, Settlement]],
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    ) -> Tuple[List[Optional[AttemptIdentity]], List[Landing]]:
        """:meth:`add_claimed_many` and :meth:`settle_owned_many` (with its ``effects``) at
        once (optional capability; one commit in the SQL stores)."""
        with self._lock:
            added = self.add_claimed_many(rows, lease_until=lease_until)
            return added, self.settle_owned_many(settlements, effects=effects)

    def settle_and_claim_many(
        self,
        settlements: Sequence[Tuple[AttemptIdentity, Settlement]],
        update_ids: Sequence[int],
        terms: ClaimTerms,
        *,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    ) -> Tuple[List[Landing], List[Optional[AttemptIdentity]]]:
        """:meth:`settle_owned_many` (with its ``effects``), then :meth:`claim_owned_many`, at
        once (optional capability; one commit in the SQL stores): the slots that completions
        free are claimed in the commit that frees them."""
        ids = [validate_update_id(update_id) for update_id in update_ids]
        with self._lock:
            landed = self.settle_owned_many(settlements, effects=effects)
            return landed, self._claim_all(ids, terms)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Hold the store's lock for a block (optional capability used by ``Attempt``).

        Yields :obj:`None`: there is no database connection. Changes made in the block are not
        rolled back on error (the memory store has no undo), but no other thread can claim,
        renew or settle while the block runs. The one exception: the calls
        :meth:`write_effects` writes in the block (calls and state) land when it ends normally
        and are discarded when it raises, as a rollback would.
        """
        with self._lock:
            if self._staged is not None:  # a nested block belongs to the outer one
                yield None
                return
            self._staged = []
            self._staged_state = {}
            try:
                yield None
            except BaseException:
                self._staged = None
                self._staged_state = None
                raise
            staged, self._staged = self._staged, None
            state, self._staged_state = self._staged_state, None
            for call in staged:
                self._calls[call.call_id] = call
            self._state.update(state)

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
        """Acknowledge the exhaustion with exactly this identity; it becomes prunable. With
        ``effects``, their outbox calls are inserted as pending with it, only when it
        acknowledges (see :class:`ptb_fence.OutboxStore`)."""
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
        """Per chat key: its lowest unsettled ``update_id`` and the id of a row processing
        with a live lease (``-1`` if none)."""
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
        """Insert ``(update_id, body, received_at, chat_key)`` rows as pending, recording each
        chat key (see :class:`ptb_fence.ChatOrderedUpdateStore`); per row whether it was
        inserted (the rules of ``add``)."""
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
        """As ``due``, only rows in turn at ``now`` (with ``chat_key``: of that chat)."""
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
        """For ``(update_id, body, chat_key)``: record the chat key of the row if it has none,
        is unsettled and holds exactly ``body``. Returns how many were set."""
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
        """Give the exact claims back: pending, ``attempts - 1``, ``due_at = at``, error and
        claim id kept; claimable and listed by ``due`` at once (optional capability, see
        :class:`ptb_fence.ReleasingUpdateStore`).

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
        """Start holding this store's liveness (idempotent); returns the instance id. Claims
        made through the store from now on record it (optional capability, see
        :class:`ptb_fence.LivenessStore`)."""
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

        In memory every registered instance is alive until it is released, so there is never
        a dead one: returns ``0``.
        """
        int(now)
        return 0

    # -- figures ---------------------------------------------------------------------------
    def figures(self) -> StoreFigures:
        """What waits in the store, for operators (optional capability, see
        :class:`ptb_fence.FiguresStore`): the unsettled rows and the oldest ``received_at``
        among them, the unacknowledged exhaustions and the oldest ``due_at`` among them, and
        the chat held longest by one update (of the chats with two or more unsettled rows, the
        one whose oldest unsettled row is the oldest; ties: the smaller chat key)."""
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
        """Rows for the calls of ``effects`` (fresh, increasing call ids): pending, or
        sending under ``effects.claim`` for the first ``claim.limit`` whose chat has no call
        pending or sending (in the store or among the rows made before it here)."""
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
    ) -> None:
        """Insert the calls of every landed completion of ``items`` (called under the lock, in
        the same step as the settles)."""
        if not effects:
            return
        for (identity, settlement), ok in zip(items, landed):
            queued = effects.get(identity)
            if ok and queued is not None and isinstance(settlement, Completed):
                for call in self._new_calls(identity, queued, settlement.at):
                    self._calls[call.call_id] = call

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
        """Insert the calls of ``effects`` as pending at ``at`` (see
        :class:`ptb_fence.OutboxStore`). Inside a :meth:`transaction` block they land with the
        block and vanish when it raises; outside one they land at once. ``connection`` is
        accepted for the interface and ignored (the block yields :obj:`None`)."""
        with self._lock:
            writes = tuple(check_writes(effects.state))
            moved = self._moved(writes)
            if moved:
                raise StateConflictError(tuple(moved))
            rows = self._new_calls(identity, effects, at)
            if self._staged is not None and self._staged_state is not None:
                self._staged.extend(rows)
                self._put_state(self._staged_state, writes, at)
            else:
                for row in rows:
                    self._calls[row.call_id] = row
                self._put_state(self._state, writes, at)
            return [row.call_id for row in rows]

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
        """The committed rows of ``keys`` (absent keys are left out; see
        :class:`ptb_fence.StateStore`)."""
        with self._lock:
            return {key: self._state[key] for key in keys if key in self._state}

    def write_state(self, writes: Sequence[StateWrite], at: int) -> Optional[StateConflict]:
        """Apply ``writes`` at once, all or none (see :class:`ptb_fence.StateStore`)."""
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
        """The rows by ``(kind, name, key)`` after ``after`` (see
        :class:`ptb_fence.StateStore`)."""
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
        """No other call of the chat pending or sending below ``call``, and none sending under
        a live lease (a call without a chat key always is)."""
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
        """Claim the calls to send now, lowest ``call_id`` first (see
        :class:`ptb_fence.OutboxStore`): pending and due (``due_at <= now``) or sending with
        a lapsed lease (``due_at < now``), and in turn in the chat."""
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
        """The calls ``sending`` by ``sender`` (claimed at insert or by :meth:`claim_calls`),
        by ``call_id``, at most ``limit``; reads only."""
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
        """For ``(call_id, sender, result_json, at)``: sending by ``sender`` -> sent at
        ``at`` with the result; per item whether it landed."""
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
        """:meth:`record_sent` then :meth:`claim_calls`, under one hold of the lock (optional
        capability, see :class:`ptb_fence.RecordAndClaimOutboxStore`)."""
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
        """Calls per state (``failed``: not acknowledged; ``failed_acknowledged``)."""
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
        """Operators: failed -> pending at ``at`` (not acknowledged; error, tries kept)."""
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
