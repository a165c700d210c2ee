"""StorePort: the user's store wrapped once, with every operation the runtime uses.

The one place that probes a store for its optional capabilities (:mod:`ptb_fence.contract`:
:class:`~ptb_fence.BatchUpdateStore`, :class:`~ptb_fence.TransactionalUpdateStore`,
:class:`~ptb_fence.BotBoundStore`). It decides once, at construction, which calls exist, and
always offers the batch and transaction operations, falling back to the loop of single calls
for a store that has only the base, fenced and durable methods (:class:`~ptb_fence.UpdateStore`,
:class:`~ptb_fence.FencedUpdateStore`, :class:`~ptb_fence.DurableUpdateStore`):

- batch calls → the loop of single calls (not one commit: a failure part way leaves the
  earlier rows written; each row is still correct on its own);
- ``add_claimed_many`` → per row ``add`` then ``claim_owned`` with the runtime's own
  ``max_attempts`` and ``durable_exhaustion`` (a row another process claimed in between is
  then claimed exactly as a later sweep would: never spent or abandoned early); a row added
  but not claimed here is :obj:`True` (see :meth:`StorePort.record_claimed`);
- ``transaction()`` missing → :exc:`TypeError` naming the fix (pass ``connection=``);
- ``owns``/``settle_owned`` without a ``connection=`` keyword → ownership is checked on the
  store (advisory, before the caller's writes) and ``complete=True`` settles right *after* the
  caller's commit: at-least-once completion, not exactly-once (one WARNING at construction);
- ``bind_bot`` missing → nothing to do;
- ``release_many`` missing (:class:`~ptb_fence.ReleasingUpdateStore`) → every claim is
  reported not released (:obj:`False`): the update waits for its lease to lapse
  (:attr:`StorePort.releases` is :obj:`False`);
- ``claim_owned_many`` missing (:class:`~ptb_fence.ClaimingUpdateStore`) → the loop of
  ``claim_owned`` (see :class:`~ptb_fence.runtime._port_claims.ClaimsPort`);
- ``hold_liveness``/``release_liveness``/``take_over_dead`` missing
  (:class:`~ptb_fence.LivenessStore`, all three needed) → no instance (:obj:`None`), nothing
  to release, nothing taken over (``0``): a dead process's claims wait for their lease
  (:attr:`StorePort.has_liveness` is :obj:`False`);
- ``add_many_in_chats``/``claim_in_chat_order``/``due_in_chat_order`` missing
  (:class:`~ptb_fence.ChatOrderedUpdateStore`, all three needed) → no fallback:
  ``strict_chat_order`` refuses the store (:exc:`TypeError` naming the methods);
- ``unkeyed_in_chats``/``set_chat_keys`` missing (both needed) → rows recorded without a chat
  key stay unordered (:attr:`StorePort.keys_chats` is :obj:`False`; a WARNING at start);
- ``claimed_suspect``/``mark_isolated`` missing (:class:`~ptb_fence.IsolatingUpdateStore`,
  both needed) → no claim is suspect, nothing to mark: every attempt runs with the others and
  a crash counts against every claim of the process that died
  (:attr:`StorePort.isolates` is :obj:`False`);
- ``complete_owned``/``reopen_completed`` missing (:class:`~ptb_fence.CompletingUpdateStore`,
  both needed) → a ``complete=True`` transaction checks with ``owns(connection=)`` first and
  settles with ``settle_owned(connection=)`` last (:attr:`StorePort.completes_first` is
  :obj:`False`).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, ContextManager, List, Optional, Sequence, Tuple, Union

from ptb_fence.contract import (
    BASE_METHODS,
    CHAT_KEYING_METHODS,
    CHAT_ORDER_METHODS,
    COMPLETING_METHODS,
    DURABLE_METHODS,
    FENCED_METHODS,
    ISOLATING_METHODS,
    LIVENESS_METHODS,
    missing_methods,
)
from ptb_fence._values import AttemptIdentity, Exhaustion, Settlement, StoredUpdate
from ptb_fence.runtime._port_chats import ChatOrderPort
from ptb_fence.runtime._port_claims import ClaimsPort

__all__ = ["Recorded", "Row", "StorePort"]

_LOGGER = logging.getLogger("ptb_fence.runtime")

Row = Tuple[int, str, int]
"""An update to record: ``(update_id, body, received_at)``."""

Recorded = Union[AttemptIdentity, bool]
"""Per recorded row: the identity it was claimed with, :obj:`True` (recorded, not claimed
here) or :obj:`False` (the id exists: a duplicate)."""


def _optional(store: object, name: str) -> Optional[Callable[..., Any]]:
    method = getattr(store, name, None)
    return method if callable(method) else None


def _takes_connection(method: Optional[Callable[..., Any]]) -> bool:
    if method is None:
        return False
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return False
    return any(
        p.name == "connection" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
    )


class StorePort(ClaimsPort, ChatOrderPort):
    """The user's store behind one typed interface (built once per runtime).

    Args:
        store: The user's update store.
        component: Name used in error messages.
        fenced: The configuration needs a fenced store.
        durable: The configuration needs a durable store.
        chat_order: The configuration needs a chat-ordered store (``strict_chat_order``).

    Raises:
        TypeError: The store lacks a method the configuration needs (the message names them).
    """

    __slots__ = (
        "_add_claimed_and_settle_many",
        "_add_claimed_many",
        "_add_many",
        "_bind_bot",
        "_chat_keying",
        "_chat_order",
        "_claim_owned_many",
        "_claimed_suspect",
        "_complete_owned",
        "_hold_liveness",
        "_mark_isolated",
        "_owns_connection",
        "_release_liveness",
        "_release_many",
        "_renew_many",
        "_reopen_completed",
        "_renew_owned_many",
        "_settle_connection",
        "_settle_owned_many",
        "_take_over_dead",
        "_transaction",
        "store",
    )

    def __init__(
        self,
        store: Any,
        *,
        component: str,
        fenced: bool = False,
        durable: bool = False,
        chat_order: bool = False,
    ) -> None:
        missing = missing_methods(store, BASE_METHODS)
        if missing:
            raise TypeError(
                f"{component} needs an update store; {type(store).__name__} lacks "
                f"{', '.join(missing)}"
            )
        name = type(store).__name__
        for wanted, methods, need, kind in (
            (fenced, FENCED_METHODS, "attempt-aware handling", "fenced store (FencedUpdateStore)"),
            (durable, DURABLE_METHODS, "handle_exhaustion", "durable store (DurableUpdateStore)"),
        ):
            missing = missing_methods(store, methods) if wanted else []
            if missing:
                lacks = ", ".join(missing)
                raise TypeError(f"{component}: {need} needs a {kind}; {name} lacks {lacks}")
        missing = missing_methods(store, FENCED_METHODS + CHAT_ORDER_METHODS)
        if chat_order and missing:
            raise TypeError(
                f"{component}: strict_chat_order needs a store that keeps chat order "
                f"(ChatOrderedUpdateStore); {type(store).__name__} lacks {', '.join(missing)}"
            )
        self._chat_order = not missing
        self._chat_keying = not missing and not missing_methods(store, CHAT_KEYING_METHODS)
        self.store = store
        self._add_many = _optional(store, "add_many")
        self._add_claimed_many = _optional(store, "add_claimed_many")
        self._add_claimed_and_settle_many = _optional(store, "add_claimed_and_settle_many")
        self._renew_many = _optional(store, "renew_many")
        self._renew_owned_many = _optional(store, "renew_owned_many")
        self._settle_owned_many = _optional(store, "settle_owned_many")
        self._transaction = _optional(store, "transaction")
        self._bind_bot = _optional(store, "bind_bot")
        self._release_many = _optional(store, "release_many")
        self._claim_owned_many = _optional(store, "claim_owned_many")
        liveness = not missing_methods(store, LIVENESS_METHODS)
        self._hold_liveness = _optional(store, "hold_liveness") if liveness else None
        self._release_liveness = _optional(store, "release_liveness") if liveness else None
        self._take_over_dead = _optional(store, "take_over_dead") if liveness else None
        isolating = not missing_methods(store, ISOLATING_METHODS)
        self._claimed_suspect = _optional(store, "claimed_suspect") if isolating else None
        self._mark_isolated = _optional(store, "mark_isolated") if isolating else None
        completing = not missing_methods(store, COMPLETING_METHODS)
        self._complete_owned = _optional(store, "complete_owned") if completing else None
        self._reopen_completed = _optional(store, "reopen_completed") if completing else None
        self._owns_connection = _takes_connection(_optional(store, "owns"))
        self._settle_connection = _takes_connection(_optional(store, "settle_owned"))
        if fenced and not self.atomic_completion:
            _LOGGER.warning(
                "%s: %s.%s has no connection= keyword (TransactionalUpdateStore): "
                "attempt.transaction(complete=True) settles right after the caller's commit "
                "instead of in it, so completion is at-least-once, not exactly-once (a crash "
                "between the two runs the handler again); add connection= to owns and "
                "settle_owned for exactly-once",
                component,
                type(store).__name__,
                "settle_owned" if self._owns_connection else "owns/settle_owned",
            )

    def __repr__(self) -> str:
        return f"StorePort({self.store!r})"

    # -- decided once -----------------------------------------------------------------------
    @property
    def claims_at_ingest(self) -> bool:
        """:obj:`bool`: The store records and claims fresh updates in one commit
        (``add_claimed_many``)."""
        return self._add_claimed_many is not None

    @property
    def records_and_settles_together(self) -> bool:
        """:obj:`bool`: The store records, claims and settles in one commit
        (``add_claimed_and_settle_many``)."""
        return self._add_claimed_and_settle_many is not None

    @property
    def settles_in_batches(self) -> bool:
        """:obj:`bool`: ``settle_owned_many`` is one call (one commit) in the store."""
        return self._settle_owned_many is not None

    @property
    def renews_owned_in_batches(self) -> bool:
        """:obj:`bool`: ``renew_owned_many`` is one call in the store."""
        return self._renew_owned_many is not None

    @property
    def renews_in_batches(self) -> bool:
        """:obj:`bool`: ``renew_many`` is one call in the store."""
        return self._renew_many is not None

    @property
    def has_transaction(self) -> bool:
        """:obj:`bool`: The store opens transactions itself (``transaction()``)."""
        return self._transaction is not None

    @property
    def releases(self) -> bool:
        """:obj:`bool`: The store gives claims back at once (``release_many``); otherwise a
        claim that is not finished waits for its lease."""
        return self._release_many is not None

    @property
    def has_liveness(self) -> bool:
        """:obj:`bool`: The store holds a liveness signal per instance and takes over the
        claims of dead instances (``hold_liveness``, ``release_liveness``,
        ``take_over_dead``)."""
        return self._hold_liveness is not None

    @property
    def isolates(self) -> bool:
        """:obj:`bool`: The store tells which claims took a suspect row and records that an
        attempt's handler starts alone (``claimed_suspect``, ``mark_isolated``)."""
        return self._claimed_suspect is not None

    @property
    def atomic_completion(self) -> bool:
        """:obj:`bool`: ``owns`` and ``settle_owned`` take ``connection=``, so
        ``transaction(complete=True)`` settles inside the caller's commit (exactly-once)."""
        return self._owns_connection and self._settle_connection

    @property
    def completes_first(self) -> bool:
        """:obj:`bool`: A ``complete=True`` transaction checks ownership and settles in one
        statement at its start (``complete_owned``; ``reopen_completed`` undoes it)."""
        return self._complete_owned is not None

    # -- base contract ----------------------------------------------------------------------
    def add(self, update_id: int, body: str, received_at: int) -> bool:
        """``store.add``."""
        return bool(self.store.add(update_id, body, received_at))

    def claim(
        self, update_id: int, *, now: int, lease_until: int, max_attempts: int
    ) -> Optional[int]:
        """``store.claim``."""
        number = self.store.claim(
            update_id, now=now, lease_until=lease_until, max_attempts=max_attempts
        )
        return None if number is None else int(number)

    def renew(self, update_id: int, attempt: int, lease_until: int, now: int) -> bool:
        """``store.renew``."""
        return bool(self.store.renew(update_id, attempt, lease_until, now))

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """``store.settle``."""
        self.store.settle(update_id, attempt, settlement)

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """``store.due``."""
        return list(self.store.due(now=now, pending_before=pending_before, limit=limit))

    def prune(self, before: int) -> int:
        """``store.prune``."""
        return int(self.store.prune(before))

    # -- fenced contract --------------------------------------------------------------------
    def claim_owned(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """``store.claim_owned``."""
        identity: Optional[AttemptIdentity] = self.store.claim_owned(
            update_id,
            now=now,
            lease_until=lease_until,
            max_attempts=max_attempts,
            durable_exhaustion=durable_exhaustion,
        )
        return identity

    def renew_owned(self, identity: AttemptIdentity, lease_until: int, now: int) -> bool:
        """``store.renew_owned``."""
        return bool(self.store.renew_owned(identity, lease_until, now))

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """``store.owns``; ``connection`` is passed only to a store that takes it (otherwise
        the answer is advisory)."""
        if connection is not None and self._owns_connection:
            return bool(self.store.owns(identity, at, connection=connection))
        return bool(self.store.owns(identity, at))

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        """``store.settle_owned``.

        Raises:
            TypeError: ``connection`` given to a store whose ``settle_owned`` does not take it
                (check :attr:`atomic_completion` first).
        """
        if connection is None:
            return bool(self.store.settle_owned(identity, settlement))
        if not self._settle_connection:
            raise TypeError(
                f"{type(self.store).__name__}.settle_owned() takes no connection=; it cannot "
                "settle inside the caller's transaction"
            )
        return bool(self.store.settle_owned(identity, settlement, connection=connection))

    def complete_owned(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """``store.complete_owned`` (check :attr:`completes_first` first)."""
        assert self._complete_owned is not None
        return bool(self._complete_owned(identity, at, connection=connection))

    def reopen_completed(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """``store.reopen_completed`` (check :attr:`completes_first` first)."""
        assert self._reopen_completed is not None
        return bool(self._reopen_completed(identity, at, connection=connection))

    # -- durable contract -------------------------------------------------------------------
    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        """``store.exhaust``."""
        return bool(self.store.exhaust(identity, at=at, error=error))

    def due_exhaustions(
        self, *, limit: int, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        """``store.due_exhaustions``."""
        return list(self.store.due_exhaustions(limit=limit, after_update_id=after_update_id))

    def acknowledge_exhaustion(self, identity: AttemptIdentity, at: int) -> bool:
        """``store.acknowledge_exhaustion``."""
        return bool(self.store.acknowledge_exhaustion(identity, at))

    # -- batches (with per-row fallbacks) ---------------------------------------------------
    def add_many(self, rows: Sequence[Row]) -> List[bool]:
        """``store.add_many`` (one commit) or the loop of ``add``."""
        if self._add_many is not None and len(rows) > 1:
            return [bool(added) for added in self._add_many(list(rows))]
        return [self.add(*row) for row in rows]

    def record_claimed(
        self,
        rows: Sequence[Row],
        *,
        lease_until: int,
        now: int,
        max_attempts: int,
        durable_exhaustion: bool,
    ) -> List[Recorded]:
        """Record fresh rows claimed for their first attempt.

        Per row: the identity (recorded and claimed here), :obj:`True` (recorded but not
        claimed here: only in the fallback, when another process took it in between) or
        :obj:`False` (the id exists). ``add_claimed_many`` does it in one commit; the fallback
        is ``add`` then ``claim_owned`` with ``max_attempts``/``durable_exhaustion`` per row.
        """
        if self._add_claimed_many is not None:
            identities = self._add_claimed_many(list(rows), lease_until=lease_until)
            return [False if identity is None else identity for identity in identities]
        return [
            self._add_then_claim(row, lease_until, now, max_attempts, durable_exhaustion)
            for row in rows
        ]

    def _add_then_claim(
        self, row: Row, lease_until: int, now: int, max_attempts: int, durable: bool
    ) -> Recorded:
        if not self.add(*row):
            return False
        identity = self.claim_owned(
            row[0],
            now=now,
            lease_until=lease_until,
            max_attempts=max_attempts,
            durable_exhaustion=durable,
        )
        return True if identity is None else identity

    def record_claimed_and_settle(
        self,
        rows: Sequence[Row],
        settlements: Sequence[Tuple[AttemptIdentity, Settlement]],
        *,
        lease_until: int,
        now: int,
        max_attempts: int,
        durable_exhaustion: bool,
    ) -> Tuple[List[Recorded], List[bool]]:
        """:meth:`record_claimed` and :meth:`settle_owned_many`: one commit with
        ``add_claimed_and_settle_many``, else the two calls one after the other."""
        if self._add_claimed_and_settle_many is not None:
            identities, landed = self._add_claimed_and_settle_many(
                list(rows), lease_until=lease_until, settlements=list(settlements)
            )
            return (
                [False if identity is None else identity for identity in identities],
                [bool(ok) for ok in landed],
            )
        recorded = self.record_claimed(
            rows,
            lease_until=lease_until,
            now=now,
            max_attempts=max_attempts,
            durable_exhaustion=durable_exhaustion,
        )
        return recorded, self.settle_owned_many(settlements)

    def settle_owned_many(
        self, items: Sequence[Tuple[AttemptIdentity, Settlement]]
    ) -> List[bool]:
        """``store.settle_owned_many`` (one commit) or the loop of ``settle_owned``."""
        if self._settle_owned_many is not None:
            return [bool(ok) for ok in self._settle_owned_many(list(items))]
        return [self.settle_owned(identity, settlement) for identity, settlement in items]

    def renew_owned_many(
        self, identities: Sequence[AttemptIdentity], lease_until: int, now: int
    ) -> List[Optional[bool]]:
        """``store.renew_owned_many`` or the loop of ``renew_owned``. Per position
        :obj:`True`/:obj:`False`, or :obj:`None`: locked right now (undecided)."""
        if self._renew_owned_many is not None:
            results = self._renew_owned_many(list(identities), lease_until, now)
            return [None if ok is None else bool(ok) for ok in results]
        return [self.renew_owned(identity, lease_until, now) for identity in identities]

    def renew_many(
        self, leases: Sequence[Tuple[int, int]], lease_until: int, now: int
    ) -> List[Optional[bool]]:
        """``store.renew_many`` or the loop of ``renew`` (as :meth:`renew_owned_many`)."""
        if self._renew_many is not None:
            results = self._renew_many(list(leases), lease_until, now)
            return [None if ok is None else bool(ok) for ok in results]
        return [self.renew(update_id, attempt, lease_until, now) for update_id, attempt in leases]

    # -- recovery (release, liveness) -------------------------------------------------------
    def release_many(self, identities: Sequence[AttemptIdentity], at: int) -> List[bool]:
        """``store.release_many(identities, at=at)`` (one statement): per position whether
        that claim was released; without the capability every position is :obj:`False` (the
        update waits for its lease)."""
        identities = list(identities)
        if self._release_many is None or not identities:
            return [False] * len(identities)
        return [bool(ok) for ok in self._release_many(identities, at=at)]

    def claimed_suspect(self, identity: AttemptIdentity) -> bool:
        """``store.claimed_suspect(identity)`` (no statement: the claim read it back);
        :obj:`False` without the capability."""
        if self._claimed_suspect is None:
            return False
        return bool(self._claimed_suspect(identity))

    def mark_isolated(self, identity: AttemptIdentity, at: int) -> bool:
        """``store.mark_isolated(identity, at=at)`` (one committed statement); :obj:`False`
        without the capability."""
        if self._mark_isolated is None:
            return False
        return bool(self._mark_isolated(identity, at=at))

    def hold_liveness(self) -> Optional[str]:
        """``store.hold_liveness()``: the instance id, or :obj:`None` without the
        capability."""
        if self._hold_liveness is None:
            return None
        return str(self._hold_liveness())

    def release_liveness(self) -> None:
        """``store.release_liveness()``; nothing without the capability."""
        if self._release_liveness is not None:
            self._release_liveness()

    def take_over_dead(self, now: int) -> int:
        """``store.take_over_dead(now=now)``: rows made claimable; ``0`` without the
        capability."""
        if self._take_over_dead is None:
            return 0
        return int(self._take_over_dead(now=now))

    # -- transactions and binding -----------------------------------------------------------
    def transaction(self) -> ContextManager[Any]:
        """``store.transaction()``.

        Raises:
            TypeError: The store has none; the message names the fix (``connection=``).
        """
        if self._transaction is None:
            raise TypeError(
                f"{type(self.store).__name__} has no transaction(); pass connection= (an open "
                "DB-API connection to the store's database)"
            )
        manager: ContextManager[Any] = self._transaction()
        return manager

    def bind_bot(self, bot_id: int) -> None:
        """``store.bind_bot`` where the store records its bot; otherwise nothing."""
        if self._bind_bot is not None:
            self._bind_bot(bot_id)
