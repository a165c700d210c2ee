"""ConflictRetries: attempts whose persisted state moved meanwhile, given back unspent.

A version conflict (:exc:`~ptb_fence.StateConflictError`) says nothing against the update.
Its handler succeeded on state that is now stale. So the attempt is not settled as a failure,
which would spend one of ``max_attempts``. Its claim is released (``release_many``) and the
update runs again on the state that won. Attempts that conflicted on a key wait here in the
order they first conflicted. They are handed back one at a time per key, so every round lets
one write land. A repeated conflict waits a jittered delay that grows with its conflicts in a
row. See :doc:`/explanation/guarantees` for the bounds this gives.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Set, Tuple

from ptb_fence._values import StateKey, StoredUpdate
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._outcome import ids

if TYPE_CHECKING:
    from ptb_fence.runtime._lease_keeper import LeaseKeeper, ReportStoreError
    from ptb_fence.runtime._options import RuntimeOptions
    from ptb_fence.runtime._port import StorePort
    from ptb_fence.runtime._stats import RuntimeStats

__all__ = [
    "CONFLICT_DELAY_CAP_SECONDS",
    "CONFLICT_DELAY_SECONDS",
    "ConflictRetries",
    "TURN_LAPSE_SECONDS",
]

_LOGGER = logging.getLogger("ptb_fence.runtime")

CONFLICT_DELAY_SECONDS = 0.02
"""The delay before the retry of an update's second conflict in a row (its first is retried
at once). It doubles with each further conflict, up to :data:`CONFLICT_DELAY_CAP_SECONDS`,
and is jittered (between half and all of it)."""

CONFLICT_DELAY_CAP_SECONDS = 1.0
"""The longest delay between two conflicts in a row of one update."""

TURN_LAPSE_SECONDS = 2.0
"""A retry handed back that no attempt here claimed within this (after its delay) loses its
turn: another process took the update, or this one is stopping. The next waiting for its keys
is handed back, and the sweep may take it again."""

_RELEASE_RETRY_SECONDS = 0.5
"""How long a release is tried again while another short transaction locks the row (a lease
renewal in flight) before the conflict is settled as a failure instead."""

Hand = Callable[[int, float, Optional[str]], None]
"""How an update is handed back to the front end: ``(update_id, delay_seconds, body)``."""


class _Waiting:
    """One update that conflicted and waits for its turn (or runs it)."""

    __slots__ = ("body", "conflicts", "delay", "handed_at", "keys", "seq", "settling")

    def __init__(self, seq: int, keys: Tuple[StateKey, ...], body: Optional[str]) -> None:
        self.seq = seq
        self.keys = keys
        self.body = body
        self.conflicts = 0
        self.delay = 0.0
        self.handed_at: Optional[float] = None  # monotonic: when it was handed back
        self.settling = True  # its attempt that conflicted has not ended yet


class ConflictRetries:
    """Gives conflicting attempts back without spending them and hands their updates back in
    turn.

    Thread-safe (store threads, the event loop, the front end's workers). A collaborator of
    :class:`~ptb_fence.runtime._runtime.Runtime` (``runtime.conflicts``).

    Args:
        port: The store port (its ``release_many``).
        options: The runtime's options (its clock).
        keeper: The lease keeper. An attempt given back is no longer renewed.
        report: How a store error is reported (the runtime's ``report_store_error``).
        stats: Where release durations are timed.
        hand: How an update is handed back to the front end (its ``retry_soon``).
            With :obj:`None` the sweep takes the released updates, in no order.
    """

    __slots__ = ("_hand", "_keeper", "_lock", "_options", "_port", "_random", "_report",
                 "_seq", "_stats", "_turns", "_given_back", "_waiting")

    def __init__(
        self,
        port: "StorePort",
        options: "RuntimeOptions",
        keeper: "LeaseKeeper",
        report: "ReportStoreError",
        stats: "RuntimeStats",
        hand: Optional[Hand],
    ) -> None:
        self._port = port
        self._options = options
        self._keeper = keeper
        self._report = report
        self._stats = stats
        self._hand = hand
        self._lock = threading.Lock()
        self._waiting: Dict[int, _Waiting] = {}
        self._turns: Dict[StateKey, int] = {}  # key -> the update whose retry holds it
        # attempts given back whose end is still to come (their update keeps waiting)
        self._given_back: Set[Tuple[int, int, Optional[str]]] = set()
        self._seq = 0
        self._random = random.Random()

    # -- the conflict -----------------------------------------------------------------------
    def give_back(self, attempt: Attempt, keys: Sequence[StateKey]) -> bool:
        """Release ``attempt``'s claim after a version conflict on ``keys``: the row is pending
        again with its attempt not spent, and the update waits here for its turn.

        A row another short transaction locks is tried again for up to half a second.

        Returns:
            :obj:`False` when the claim could not be released (a store without
            ``release_many``, a store error, the row locked throughout, the claim no longer
            its own): the caller settles the attempt as it would a failure.
        """
        if not attempt.fenced:
            return False
        self._keeper.unregister(attempt)  # a renewal after the release would be refused
        deadline = time.monotonic() + _RELEASE_RETRY_SECONDS
        while True:
            try:
                released = self._stats.timed(
                    "release", self._port.release_many, [attempt.identity],
                    self._options.now_ms(),
                )[0]
            except Exception as exc:
                self._report(exc, "settle", ids=ids(attempt))
                return False
            if released or attempt.result is not None or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if not released:
            return False
        attempt.mark_owner_lost()  # its claim id is refused from now on
        conflicts = self._wait(attempt, tuple(keys))
        _LOGGER.info(
            "update %s attempt %s conflicted on %s (%d in a row): given back unspent, it runs "
            "again on the fresh state",
            attempt.update_id,
            attempt.attempt,
            ", ".join(_key_text(key) for key in keys),
            conflicts,
            extra=ids(attempt),
        )
        return True

    def _wait(self, attempt: Attempt, keys: Tuple[StateKey, ...]) -> int:
        """Put the update in line (keeping its place if it waited already). Its conflicts in a
        row."""
        if self._hand is None:
            return 1  # no front end to hand it back: the sweep takes it
        with self._lock:
            waiting = self._waiting.get(attempt.update_id)
            if waiting is None:
                self._seq += 1
                waiting = self._waiting[attempt.update_id] = _Waiting(
                    self._seq, keys, attempt.body
                )
            else:
                waiting.keys = keys
                waiting.body = attempt.body or waiting.body
            waiting.conflicts += 1
            waiting.handed_at = None
            waiting.settling = True
            if waiting.conflicts > 1:
                grown = CONFLICT_DELAY_SECONDS * 2.0 ** min(waiting.conflicts - 2, 16)
                waiting.delay = min(CONFLICT_DELAY_CAP_SECONDS, grown) * self._random.uniform(
                    0.5, 1.0
                )
            self._given_back.add(_identity(attempt))
            return waiting.conflicts

    # -- turns ------------------------------------------------------------------------------
    def ended(self, attempt: Attempt) -> None:
        """``attempt`` ended (any outcome): if its update held turns, the next waiting updates
        get them. An update that ended otherwise than by a conflict leaves the line."""
        if not self._waiting:  # the usual case: nothing in line (read unlocked: an update
            return  # is put in line by its conflict's settle, which happens before its end)
        with self._lock:
            update_id = attempt.update_id
            identity = _identity(attempt)
            waiting = self._waiting.get(update_id)
            if identity in self._given_back:
                self._given_back.discard(identity)
                if waiting is not None:
                    waiting.settling = False
            elif waiting is not None:
                self._leave(update_id)  # completed, failed, lost: no longer this line's
            self._free_turns(update_id)
            handed = self._next()
        self._hand_over(handed)

    def unswept(self, rows: List[StoredUpdate]) -> List[StoredUpdate]:
        """The rows of a sweep page the sweep may hand over: not those of updates waiting
        here for their turn (handed back in order instead). Turns whose retry was never
        claimed here lapse first."""
        if not self._waiting:
            return rows
        with self._lock:
            handed = self._next()
            waiting = self._waiting
            kept = [row for row in rows if row.update_id not in waiting]
        self._hand_over(handed)
        return kept

    def waiting(self) -> int:
        """How many updates wait here after a conflict (or run their turn)."""
        with self._lock:
            return len(self._waiting)

    def _leave(self, update_id: int) -> None:
        self._free_turns(update_id)
        del self._waiting[update_id]

    def _free_turns(self, update_id: int) -> None:
        for key in [k for k, holder in self._turns.items() if holder == update_id]:
            del self._turns[key]

    def _lapse(self, now: float) -> None:
        """Turns handed back that no attempt here claimed in time pass on."""
        late = [
            update_id for update_id, w in self._waiting.items()
            if w.handed_at is not None and now - w.handed_at > w.delay + TURN_LAPSE_SECONDS
        ]
        if not late:
            return
        running = {a.update_id for a in self._keeper.active()}
        for update_id in late:
            if update_id not in running:
                self._leave(update_id)

    def _next(self) -> List[Tuple[int, float, Optional[str]]]:
        """Give turns to the waiting updates whose keys are free and that no earlier waiting
        update shares a key with (first come, first served per key). What to hand back."""
        now = time.monotonic()
        self._lapse(now)
        taken: Set[StateKey] = set(self._turns)
        out: List[Tuple[int, float, Optional[str]]] = []
        for update_id, waiting in sorted(self._waiting.items(), key=lambda item: item[1].seq):
            # still settling, running its turn, or behind an earlier one on a key: it waits,
            # and so do the later ones on its keys
            blocked = (waiting.settling or waiting.handed_at is not None
                       or not taken.isdisjoint(waiting.keys))
            taken.update(waiting.keys)
            if blocked:
                continue
            for key in waiting.keys:
                self._turns[key] = update_id
            waiting.handed_at = now
            out.append((update_id, waiting.delay, waiting.body))
        return out

    def _hand_over(self, handed: List[Tuple[int, float, Optional[str]]]) -> None:
        hand = self._hand
        if hand is None:
            return
        for update_id, delay, body in handed:
            try:
                hand(update_id, delay, body)
            except Exception:  # the turn lapses. The sweep then takes it
                _LOGGER.exception("could not hand update %s back after its conflict", update_id)


def _identity(attempt: Attempt) -> Tuple[int, int, Optional[str]]:
    # the claim id too: a released attempt's number is claimed again
    return (attempt.update_id, attempt.attempt, attempt.claim_id)


def _key_text(key: StateKey) -> str:
    return f"{key.kind} {key.name + ' ' if key.name else ''}{key.key}".strip()
