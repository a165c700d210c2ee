"""StorePort: the user's store wrapped once, with every operation the runtime uses.

The one place that probes a store for its capabilities (:class:`~ptb_fence.StoreCapabilities`,
logged once at INFO; a store with part of a capability group is refused there with a
:exc:`TypeError` naming the methods). It decides once, at construction, which calls exist, and
always offers both the single-row and the batch form of each operation: the single-row claim,
renewal and settlement of a fenced store that has only the batch forms (``claim_owned_many``,
``renew_owned_many``, ``settle_owned_many``) are a batch of one, and a store that has only the
base, fenced and durable single-row methods (:class:`~ptb_fence.UpdateStore`,
:class:`~ptb_fence.FencedUpdateStore`, :class:`~ptb_fence.DurableUpdateStore`) gets these
fallbacks:

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
  ``claim_owned`` (an id repeated in the input is claimed at its first position only); a
  ``claim_owned_many`` of the earlier keyword form is called with keywords;
- ``hold_liveness``/``release_liveness``/``take_over_dead`` missing
  (:class:`~ptb_fence.LivenessStore`, all three needed) → no instance (:obj:`None`), nothing
  to release, nothing taken over (``0``): a dead process's claims wait for their lease
  (:attr:`StorePort.has_liveness` is :obj:`False`);
- ``add_many_in_chats``/``claim_in_chat_order``/``due_in_chat_order`` missing
  (:class:`~ptb_fence.ChatOrderedUpdateStore`, all three needed) → no fallback:
  ``strict_chat_order`` refuses the store (:exc:`TypeError` naming the methods);
- ``unkeyed_in_chats``/``set_chat_keys`` missing (both needed) → rows recorded without a chat
  key stay unordered (:attr:`StorePort.keys_chats` is :obj:`False`; a WARNING at start);
- ``claimed_suspect``/``mark_isolated``/``end_probation`` missing
  (:class:`~ptb_fence.IsolatingUpdateStore`, all three needed) → no claim is suspect, nothing to mark: every attempt runs with the others and
  a crash counts against every claim of the process that died
  (:attr:`StorePort.isolates` is :obj:`False`);
- ``complete_owned``/``reopen_completed`` missing (:class:`~ptb_fence.CompletingUpdateStore`,
  both needed) → a ``complete=True`` transaction checks with ``owns(connection=)`` first and
  settles with ``settle_owned(connection=)`` last (:attr:`StorePort.completes_first` is
  :obj:`False`);
- ``figures`` missing (:class:`~ptb_fence.FiguresStore`) → :meth:`StorePort.figures` is
  :obj:`None`: the store counts nothing for operators (:attr:`StorePort.has_figures` is
  :obj:`False`);
- the outbox group missing (:class:`~ptb_fence.OutboxStore`) → no outbox
  (:attr:`StorePort.has_outbox` is :obj:`False`): its readers return nothing (no calls,
  :obj:`None` counts), its sender writes land nowhere (:obj:`False`), and effects passed to
  a settle or to :meth:`StorePort.write_effects` are refused with a :exc:`TypeError` (never
  dropped). ``effects=`` reaches the store's batch settles only when the store has the group
  and there are effects: otherwise the store is called exactly as before.
- the state group missing (:class:`~ptb_fence.StateStore`) → no persisted bot state
  (:attr:`StorePort.has_state` is :obj:`False`): :meth:`StorePort.read_state` and
  :meth:`StorePort.list_state` find nothing, and state writes (in effects or
  :meth:`StorePort.write_state`) are refused with a :exc:`TypeError` (never dropped).

Sections of :class:`StorePort`: construction and the flags decided once, the base contract,
the fenced contract (single-row forms over the batch forms where needed), the durable contract,
batches, claims of several rows, chat order, recovery (release, liveness, isolation),
transactions and binding, figures, the outbox.
"""

from __future__ import annotations

import inspect
import logging
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from ptb_fence._values import (
    AttemptEffects,
    AttemptIdentity,
    Exhaustion,
    Landing,
    OutboxEntry,
    Settlement,
    StateConflict,
    StateEntry,
    StateKey,
    StateWrite,
    StoreFigures,
    StoredUpdate,
)
from ptb_fence.contract import (
    BASE_METHODS,
    CAPABILITY_GROUPS,
    OUTBOX_METHODS,
    STATE_METHODS,
    ChatKey,
    ChatRow,
    ClaimTerms,
    StoreCapabilities,
    takes_connection,
    missing_methods,
    takes_claim_keywords,
)

__all__ = ["Recorded", "Row", "StorePort"]

_LOGGER = logging.getLogger("ptb_fence.runtime")

Row = Tuple[int, str, int]
"""An update to record: ``(update_id, body, received_at)``."""

Recorded = Union[AttemptIdentity, bool]
"""Per recorded row: the identity it was claimed with, :obj:`True` (recorded, not claimed
here) or :obj:`False` (the id exists: a duplicate)."""


def _landing(result: object) -> Landing:
    """A store's per-item settle result: a :class:`~ptb_fence.StateConflict` as it is, else
    whether it landed."""
    return result if isinstance(result, StateConflict) else bool(result)


def _optional(store: object, name: str) -> Optional[Callable[..., Any]]:
    method = getattr(store, name, None)
    return method if callable(method) else None


def _lacking(store: object, group: str) -> str:
    """The operations of ``group`` the store has in no form (``a (or b)`` per operation)."""
    (wanted,) = [g for g in CAPABILITY_GROUPS if g.name == group]
    names: List[str] = []
    for forms in wanted.needs:
        if len(missing_methods(store, forms)) == len(forms):
            names.append(forms[0] + "".join(f" (or {other})" for other in forms[1:]))
    return ", ".join(names)



def _keywords(terms: ClaimTerms) -> "dict[str, Any]":
    """``terms`` as the keywords of the single-row claims of the contract (``claim_owned``,
    ``claim_in_chat_order``, and a batch claim written before :class:`ClaimTerms`)."""
    return {
        "now": terms.now,
        "lease_until": terms.lease_until,
        "max_attempts": terms.max_attempts,
        "durable_exhaustion": terms.durable_exhaustion,
    }

class StorePort:
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
        "_claim_keywords",
        "_claim_owned",
        "_claim_owned_many",
        "_claimed_suspect",
        "_complete_owned",
        "_figures",
        "_hold_liveness",
        "_mark_isolated",
        "_end_probation",
        "held_instance",
        "_outbox",
        "_note_sent",
        "_claimed_inserts",
        "_record_and_claim",
        "_state",
        "_owns_connection",
        "_release_liveness",
        "_release_many",
        "_renew_many",
        "_renew_owned",
        "_renew_owned_many",
        "_reopen_completed",
        "_settle_connection",
        "_settle_owned",
        "_settle_and_claim_many",
        "_settle_owned_many",
        "_take_over_dead",
        "_transaction",
        "capabilities",
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
        name = type(store).__name__
        missing = missing_methods(store, BASE_METHODS)
        if missing:
            raise TypeError(
                f"{component} needs an update store; {name} lacks {', '.join(missing)}"
            )
        try:
            capabilities = StoreCapabilities.of(store)
        except TypeError as exc:
            raise TypeError(f"{component}: {exc}") from None
        for wanted, group, need, kind in (
            (fenced, "fenced", "attempt-aware handling", "fenced store (FencedUpdateStore)"),
            (durable, "durable", "handle_exhaustion", "durable store (DurableUpdateStore)"),
        ):
            if wanted and group not in capabilities:
                lacks = ", ".join(
                    lacking for lacking in (_lacking(store, "fenced"), _lacking(store, group))
                    if lacking
                )
                raise TypeError(f"{component}: {need} needs a {kind}; {name} lacks {lacks}")
        if chat_order and "chat_order" not in capabilities:
            lacks = ", ".join(
                lacking for lacking in (_lacking(store, "fenced"), _lacking(store, "chat_order"))
                if lacking
            )
            raise TypeError(
                f"{component}: strict_chat_order needs a store that keeps chat order "
                f"(ChatOrderedUpdateStore); {name} lacks {lacks}"
            )
        self.store = store
        self.capabilities = capabilities
        has = capabilities.groups.__contains__

        def method(group: str, method_name: str) -> Optional[Callable[..., Any]]:
            # a method of a group the store does not have whole is never called
            return _optional(store, method_name) if has(group) else None

        self._add_many = method("add_many", "add_many")
        self._add_claimed_many = method("add_claimed_many", "add_claimed_many")
        self._add_claimed_and_settle_many = method(
            "add_claimed_and_settle_many", "add_claimed_and_settle_many"
        )
        self._renew_many = method("renew_many", "renew_many")
        self._claim_owned = method("fenced", "claim_owned")
        self._renew_owned = method("fenced", "renew_owned")
        self._settle_owned = method("fenced", "settle_owned")
        self._claim_owned_many = method("claim_owned_many", "claim_owned_many")
        self._renew_owned_many = method("renew_owned_many", "renew_owned_many")
        self._settle_owned_many = method("settle_owned_many", "settle_owned_many")
        self._settle_and_claim_many = method("settle_and_claim_many", "settle_and_claim_many")
        self._claim_keywords = self._claim_owned_many is not None and takes_claim_keywords(
            self._claim_owned_many
        )
        self._transaction = method("transaction", "transaction")
        self._bind_bot = method("bind_bot", "bind_bot")
        self._release_many = method("release", "release_many")
        self._hold_liveness = method("liveness", "hold_liveness")
        self._release_liveness = method("liveness", "release_liveness")
        self._take_over_dead = method("liveness", "take_over_dead")
        self._claimed_suspect = method("isolation", "claimed_suspect")
        self._mark_isolated = method("isolation", "mark_isolated")
        self._end_probation = method("isolation", "end_probation")
        # the instance this process holds liveness under (hold_liveness), or None
        self.held_instance: Optional[str] = None
        self._complete_owned = method("completing", "complete_owned")
        self._reopen_completed = method("completing", "reopen_completed")
        self._figures = method("figures", "figures")
        # the outbox group is all or nothing: the store itself, or None without it
        self._outbox: Any = store if has("outbox") else None
        self._claimed_inserts: Any = store if has("outbox_claimed_inserts") else None
        self._record_and_claim = method("outbox_record_and_claim", "record_sent_and_claim")
        # SQLite's sent journal: a sent call recorded at once, outside the write lock
        self._note_sent = _optional(store, "note_sent") if self._outbox is not None else None
        self._state: Any = store if has("state") else None
        self._owns_connection = takes_connection(_optional(store, "owns"))
        self._settle_connection = takes_connection(self._settle_owned)
        _LOGGER.info("%s: store capabilities: %s", component, capabilities)
        if fenced and not self.atomic_completion:
            _LOGGER.warning(
                "%s: %s.%s has no connection= keyword (TransactionalUpdateStore): "
                "attempt.transaction(complete=True) settles right after the caller's commit "
                "instead of in it, so completion is at-least-once, not exactly-once (a crash "
                "between the two runs the handler again); add connection= to owns and "
                "settle_owned for exactly-once",
                component,
                name,
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
        attempt's handler starts on probation or alone (``claimed_suspect``,
        ``mark_isolated``, ``end_probation``)."""
        return self._claimed_suspect is not None

    @property
    def atomic_completion(self) -> bool:
        """:obj:`bool`: ``owns`` and ``settle_owned`` take ``connection=``, so
        ``transaction(complete=True)`` settles inside the caller's commit (exactly-once)."""
        return self._owns_connection and self._settle_connection

    @property
    def claims_many_at_once(self) -> bool:
        """:obj:`bool`: ``claim_owned_many`` is one statement (one commit) in the store."""
        return self._claim_owned_many is not None

    @property
    def settles_and_claims_together(self) -> bool:
        """:obj:`bool`: The store settles finished attempts and claims the updates that take
        their slots in one commit (``settle_and_claim_many``)."""
        return self._settle_and_claim_many is not None

    @property
    def orders_chats(self) -> bool:
        """:obj:`bool`: The store keeps chat order (``add_many_in_chats``,
        ``claim_in_chat_order``, ``due_in_chat_order``)."""
        return "chat_order" in self.capabilities

    @property
    def keys_chats(self) -> bool:
        """:obj:`bool`: The store can key rows recorded without a chat key
        (``unkeyed_in_chats``, ``set_chat_keys``)."""
        return "chat_keys" in self.capabilities

    @property
    def completes_first(self) -> bool:
        """:obj:`bool`: A ``complete=True`` transaction checks ownership and settles in one
        statement at its start (``complete_owned``; ``reopen_completed`` undoes it)."""
        return self._complete_owned is not None

    @property
    def has_figures(self) -> bool:
        """:obj:`bool`: The store counts what waits in it for operators (``figures``)."""
        return self._figures is not None

    @property
    def has_outbox(self) -> bool:
        """:obj:`bool`: The store keeps an outbox of Bot API calls sent iff their attempt
        committed (:class:`~ptb_fence.OutboxStore`)."""
        return self._outbox is not None

    @property
    def has_claimed_inserts(self) -> bool:
        """:obj:`bool`: The outbox store claims calls at insert for a sender
        (:class:`~ptb_fence.contract.ClaimedInsertOutboxStore`): ``AttemptEffects.claim`` is
        honoured and ``claimed_calls`` reads them back."""
        return self._claimed_inserts is not None

    @property
    def has_state(self) -> bool:
        """:obj:`bool`: The store keeps persisted bot state that commits with the update
        (:class:`~ptb_fence.StateStore`)."""
        return self._state is not None

    # -- base contract ----------------------------------------------------------------------
    def add(self, update_id: int, body: str, received_at: int) -> bool:
        """``store.add``."""
        return bool(self.store.add(update_id, body, received_at))

    def claim(self, update_id: int, terms: ClaimTerms) -> Optional[int]:
        """``store.claim`` (a base store: ``durable_exhaustion`` is not its to take)."""
        number = self.store.claim(
            update_id,
            now=terms.now,
            lease_until=terms.lease_until,
            max_attempts=terms.max_attempts,
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

    # -- fenced contract (a single-row form over the batch form where the store has only that)
    def claim_owned(self, update_id: int, terms: ClaimTerms) -> Optional[AttemptIdentity]:
        """``store.claim_owned``, or ``store.claim_owned_many`` of one id."""
        if self._claim_owned is None:
            return self._claim_batch([update_id], terms)[0]
        identity: Optional[AttemptIdentity] = self._claim_owned(update_id, **_keywords(terms))
        return identity

    def renew_owned(self, identity: AttemptIdentity, lease_until: int, now: int) -> bool:
        """``store.renew_owned``, or ``store.renew_owned_many`` of one identity (a row locked
        right now, undecided there, is reported not renewed)."""
        if self._renew_owned is None:
            return bool(self.renew_owned_many([identity], lease_until, now)[0])
        return bool(self._renew_owned(identity, lease_until, now))

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
            if self._settle_owned is None:  # the store settles in batches only
                return bool(self.settle_owned_many([(identity, settlement)])[0])
            return bool(self._settle_owned(identity, settlement))
        if not self._settle_connection:
            raise TypeError(
                f"{type(self.store).__name__}.settle_owned() takes no connection=; it cannot "
                "settle inside the caller's transaction"
            )
        assert self._settle_owned is not None  # _settle_connection: the store has it
        return bool(self._settle_owned(identity, settlement, connection=connection))

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

    def acknowledge_exhaustion(
        self, identity: AttemptIdentity, at: int, effects: Optional[AttemptEffects] = None
    ) -> bool:
        """``store.acknowledge_exhaustion``; with ``effects`` (an outbox store that takes
        them, see :attr:`acknowledges_with_calls`) their calls are inserted in its commit."""
        if effects is None or not effects.calls:
            return bool(self.store.acknowledge_exhaustion(identity, at))
        return bool(self.store.acknowledge_exhaustion(identity, at, effects=effects))

    @property
    def acknowledges_with_calls(self) -> bool:
        """:obj:`bool`: The store's ``acknowledge_exhaustion`` takes ``effects=`` (outbox
        calls inserted in the acknowledgement's commit): the stores ptb_fence ships do."""
        if not self.has_outbox:
            return False
        try:
            parameters = inspect.signature(self.store.acknowledge_exhaustion).parameters
        except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
            return False
        return "effects" in parameters

    # -- batches (with per-row fallbacks) ---------------------------------------------------
    def add_many(self, rows: Sequence[Row]) -> List[bool]:
        """``store.add_many`` (one commit) or the loop of ``add``."""
        if self._add_many is not None and len(rows) > 1:
            return [bool(added) for added in self._add_many(list(rows))]
        return [self.add(*row) for row in rows]

    def record_claimed(self, rows: Sequence[Row], terms: ClaimTerms) -> List[Recorded]:
        """Record fresh rows claimed for their first attempt.

        Per row: the identity (recorded and claimed here), :obj:`True` (recorded but not
        claimed here: only in the fallback, when another process took it in between) or
        :obj:`False` (the id exists). ``add_claimed_many`` does it in one commit; the fallback
        is ``add`` then ``claim_owned`` with ``max_attempts``/``durable_exhaustion`` per row.
        """
        if self._add_claimed_many is not None:
            identities = self._add_claimed_many(list(rows), lease_until=terms.lease_until)
            return [False if identity is None else identity for identity in identities]
        return [self._add_then_claim(row, terms) for row in rows]

    def _add_then_claim(self, row: Row, terms: ClaimTerms) -> Recorded:
        if not self.add(*row):
            return False
        identity = self.claim_owned(row[0], terms)
        return True if identity is None else identity

    def record_claimed_and_settle(
        self,
        rows: Sequence[Row],
        settlements: Sequence[Tuple[AttemptIdentity, Settlement]],
        terms: ClaimTerms,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    ) -> Tuple[List[Recorded], List[Landing]]:
        """:meth:`record_claimed` and :meth:`settle_owned_many` (with ``effects``): one
        commit with ``add_claimed_and_settle_many``, else the two calls one after the other."""
        if self._add_claimed_and_settle_many is not None:
            extra = self._effects_keyword(effects)
            identities, landed = self._add_claimed_and_settle_many(
                list(rows), lease_until=terms.lease_until, settlements=list(settlements),
                **extra,
            )
            return (
                [False if identity is None else identity for identity in identities],
                [_landing(ok) for ok in landed],
            )
        return (
            self.record_claimed(rows, terms),
            self.settle_owned_many(settlements, effects=effects),
        )

    def settle_owned_many(
        self,
        items: Sequence[Tuple[AttemptIdentity, Settlement]],
        *,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    ) -> List[Landing]:
        """``store.settle_owned_many`` (one commit) or the loop of ``settle_owned``. With
        ``effects`` (an outbox store: it has ``settle_owned_many``), the calls of the landed
        completions ride in the same commit."""
        extra = self._effects_keyword(effects)
        if self._settle_owned_many is not None:
            return [_landing(ok) for ok in self._settle_owned_many(list(items), **extra)]
        return [self.settle_owned(identity, settlement) for identity, settlement in items]

    def _effects_keyword(
        self, effects: Optional[Mapping[AttemptIdentity, AttemptEffects]]
    ) -> Dict[str, Any]:
        """``{"effects": ...}`` for an outbox store given calls; ``{}`` when there are none
        (the store is called as before).

        Raises:
            TypeError: Calls for a store without the outbox (they would be lost).
        """
        if not effects or not any(e.calls or e.state for e in effects.values()):
            return {}
        self._require_outbox("effects=")
        if any(e.state for e in effects.values()):
            self._require_state("effects= with state writes")
        return {"effects": dict(effects)}

    def _require_state(self, what: str) -> Any:
        if self._state is None:
            raise TypeError(
                f"{type(self.store).__name__} keeps no persisted bot state (StateStore: "
                f"{', '.join(STATE_METHODS)}): {what} needs it"
            )
        return self._state

    def _require_outbox(self, what: str) -> Any:
        if self._outbox is None:
            raise TypeError(
                f"{type(self.store).__name__} has no outbox (OutboxStore: "
                f"{', '.join(OUTBOX_METHODS)}): {what} needs one"
            )
        return self._outbox

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

    # -- claims of several rows (ClaimingUpdateStore) ------------------------------------------
    def claim_owned_many(
        self, update_ids: Sequence[int], terms: ClaimTerms
    ) -> List[Optional[AttemptIdentity]]:
        """``store.claim_owned_many`` (one commit) or the loop of ``claim_owned``: per
        position the identity or :obj:`None` (an id repeated in the input is claimed at its
        first position only)."""
        ids = list(update_ids)
        if self._claim_owned_many is not None and (len(ids) > 1 or self._claim_owned is None):
            return self._claim_batch(ids, terms)
        seen: Set[int] = set()
        result: List[Optional[AttemptIdentity]] = []
        for update_id in ids:
            identity = None
            if update_id not in seen:
                seen.add(update_id)
                identity = self.claim_owned(update_id, terms)
            result.append(identity)
        return result

    def settle_and_claim(
        self,
        settlements: Sequence[Tuple[AttemptIdentity, Settlement]],
        update_ids: Sequence[int],
        terms: ClaimTerms,
        *,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    ) -> Tuple[List[Landing], List[Optional[AttemptIdentity]]]:
        """:meth:`settle_owned_many` (with ``effects``) and :meth:`claim_owned_many`: one
        commit with ``settle_and_claim_many``, else the two calls one after the other (the
        settles first, so a claim never counts on a completion that did not land)."""
        if self._settle_and_claim_many is None:
            landed = self.settle_owned_many(settlements, effects=effects) if settlements else []
            return landed, self.claim_owned_many(update_ids, terms) if update_ids else []
        extra = self._effects_keyword(effects)
        landed, identities = self._settle_and_claim_many(
            list(settlements), list(update_ids), terms, **extra
        )
        return [_landing(ok) for ok in landed], list(identities)

    def _claim_batch(
        self, update_ids: List[int], terms: ClaimTerms
    ) -> List[Optional[AttemptIdentity]]:
        """``store.claim_owned_many`` in the form the store has (terms, or the earlier
        keywords)."""
        assert self._claim_owned_many is not None
        if self._claim_keywords:
            got = self._claim_owned_many(update_ids, **_keywords(terms))
        else:
            got = self._claim_owned_many(update_ids, terms)
        return list(got)

    # -- chat order (ChatOrderedUpdateStore; no fallback: strict_chat_order refuses a store
    #    without it at construction) ------------------------------------------------------------
    def unkeyed_in_chats(self, *, after_update_id: Optional[int], limit: int) -> List[StoredUpdate]:
        """``store.unkeyed_in_chats``: unsettled rows without a chat key, by ``update_id``."""
        return list(self.store.unkeyed_in_chats(after_update_id=after_update_id, limit=limit))

    def set_chat_keys(self, keys: Sequence[ChatKey]) -> int:
        """``store.set_chat_keys``: key the rows that still have none (one commit)."""
        return int(self.store.set_chat_keys(list(keys)))

    def add_many_in_chats(self, rows: Sequence[ChatRow]) -> List[bool]:
        """``store.add_many_in_chats``: record rows with their chat keys (one commit)."""
        return [bool(added) for added in self.store.add_many_in_chats(list(rows))]

    def claim_in_chat_order(
        self, update_id: int, terms: ClaimTerms
    ) -> Optional[AttemptIdentity]:
        """``store.claim_in_chat_order``: claim only when the row is its chat's turn."""
        identity: Optional[AttemptIdentity] = self.store.claim_in_chat_order(
            update_id, **_keywords(terms)
        )
        return identity

    def due_in_chat_order(
        self, *, now: int, pending_before: int, limit: int, chat_key: Optional[int] = None
    ) -> List[StoredUpdate]:
        """``store.due_in_chat_order``: due rows that are their chat's turn (with
        ``chat_key``: of that chat only)."""
        rows = self.store.due_in_chat_order(
            now=now, pending_before=pending_before, limit=limit, chat_key=chat_key
        )
        return list(rows)

    # -- recovery (release, liveness) -------------------------------------------------------
    def release_many(self, identities: Sequence[AttemptIdentity], at: int) -> List[bool]:
        """``store.release_many(identities, at=at)`` (one statement): per position whether
        that claim was released; without the capability every position is :obj:`False` (the
        update waits for its lease)."""
        identities = list(identities)
        if self._release_many is None or not identities:
            return [False] * len(identities)
        return [bool(ok) for ok in self._release_many(identities, at=at)]

    def claimed_suspect(self, identity: AttemptIdentity) -> int:
        """``store.claimed_suspect(identity)`` (no statement: the claim read it back): 0, 1
        or 2; 0 without the capability."""
        if self._claimed_suspect is None:
            return 0
        return min(max(int(self._claimed_suspect(identity)), 0), 2)

    def mark_isolated(self, identity: AttemptIdentity, at: int) -> bool:
        """``store.mark_isolated(identity, at=at)`` (one committed statement); :obj:`False`
        without the capability."""
        if self._mark_isolated is None:
            return False
        return bool(self._mark_isolated(identity, at=at))

    def end_probation(self, identity: AttemptIdentity, at: int) -> bool:
        """``store.end_probation(identity, at=at)`` (one committed statement); :obj:`False`
        without the capability."""
        if self._end_probation is None:
            return False
        return bool(self._end_probation(identity, at=at))

    def hold_liveness(self) -> Optional[str]:
        """``store.hold_liveness()``: the instance id, or :obj:`None` without the
        capability. Kept as :attr:`held_instance`."""
        if self._hold_liveness is None:
            return None
        self.held_instance = str(self._hold_liveness())
        return self.held_instance

    def release_liveness(self) -> None:
        """``store.release_liveness()``; nothing without the capability."""
        self.held_instance = None
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

    # -- figures (FiguresStore) -------------------------------------------------------------
    def figures(self) -> Optional[StoreFigures]:
        """``store.figures()``: what waits in the store (one read-only look); :obj:`None`
        without the capability.

        Raises:
            TypeError: The store returned something else than a
                :class:`~ptb_fence.StoreFigures` (the message names the store).
        """
        if self._figures is None:
            return None
        figures = self._figures()
        if not isinstance(figures, StoreFigures):
            raise TypeError(
                f"{type(self.store).__name__}.figures() returned {type(figures).__name__} "
                f"{figures!r}; it must return a ptb_fence.StoreFigures"
            )
        return figures

    # -- the outbox (OutboxStore) -----------------------------------------------------------
    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        """``store.write_effects``: the calls inside the caller's transaction; their ids.

        Raises:
            TypeError: The store has no outbox.
        """
        outbox = self._require_outbox("write_effects")
        if effects.state:
            self._require_state("write_effects with state writes")
        return [int(i) for i in outbox.write_effects(identity, effects, at, connection=connection)]

    def claim_calls(
        self, *, now: int, lease_until: int, limit: int, sender: str
    ) -> List[OutboxEntry]:
        """``store.claim_calls``; none without an outbox."""
        if self._outbox is None:
            return []
        return list(
            self._outbox.claim_calls(now=now, lease_until=lease_until, limit=limit, sender=sender)
        )

    def claimed_calls(self, sender: str, *, limit: int) -> List[OutboxEntry]:
        """``store.claimed_calls``; none without claimed inserts."""
        if self._claimed_inserts is None:
            return []
        return list(self._claimed_inserts.claimed_calls(sender, limit=limit))

    def record_sent(self, items: Sequence[Tuple[int, str, str, int]]) -> List[bool]:
        """``store.record_sent``; nothing lands without an outbox."""
        if self._outbox is None:
            return [False] * len(items)
        return [bool(ok) for ok in self._outbox.record_sent(list(items))]

    def note_sent(self, items: Sequence[Tuple[int, str, str, int]]) -> bool:
        """``store.note_sent(items)`` (SQLite: the sent journal, no write lock). Returns
        whether the store has it (:obj:`False`: nothing done, ``record_sent`` is the record)."""
        if self._note_sent is None:
            return False
        self._note_sent(list(items))
        return True

    def record_sent_and_claim(
        self,
        items: Sequence[Tuple[int, str, str, int]],
        *,
        now: int,
        lease_until: int,
        limit: int,
        sender: str,
    ) -> Tuple[List[bool], List[OutboxEntry]]:
        """``store.record_sent_and_claim`` (one commit); on a store without it
        :meth:`record_sent` then, when ``limit`` > 0, :meth:`claim_calls` (two)."""
        if self._outbox is None:
            return [False] * len(items), []
        if self._record_and_claim is None:
            landed = self.record_sent(items) if items else []
            claimed = self.claim_calls(now=now, lease_until=lease_until, limit=limit,
                                       sender=sender) if limit > 0 else []
            return landed, claimed
        landed, claimed = self._record_and_claim(
            list(items), now=now, lease_until=lease_until, limit=limit, sender=sender
        )
        return [bool(ok) for ok in landed], list(claimed)

    def retry_call(self, call_id: int, sender: str, *, due_at: int, error: str) -> bool:
        """``store.retry_call``; :obj:`False` without an outbox."""
        if self._outbox is None:
            return False
        return bool(self._outbox.retry_call(call_id, sender, due_at=due_at, error=error))

    def fail_call(self, call_id: int, sender: str, *, at: int, error: str) -> bool:
        """``store.fail_call``; :obj:`False` without an outbox."""
        if self._outbox is None:
            return False
        return bool(self._outbox.fail_call(call_id, sender, at=at, error=error))

    def release_calls(self, call_ids: Sequence[int], sender: str, at: int) -> List[bool]:
        """``store.release_calls``; nothing lands without an outbox."""
        if self._outbox is None:
            return [False] * len(call_ids)
        return [bool(ok) for ok in self._outbox.release_calls(list(call_ids), sender, at)]

    def due_send_failures(
        self, *, limit: int, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """``store.due_send_failures``; none without an outbox."""
        if self._outbox is None:
            return []
        return list(self._outbox.due_send_failures(limit=limit, after_call_id=after_call_id))

    def acknowledge_send_failure(self, call_id: int, at: int) -> bool:
        """``store.acknowledge_send_failure``; :obj:`False` without an outbox."""
        if self._outbox is None:
            return False
        return bool(self._outbox.acknowledge_send_failure(call_id, at))

    def get_call(self, call_id: int) -> Optional[OutboxEntry]:
        """``store.get_call``; :obj:`None` without an outbox."""
        if self._outbox is None:
            return None
        entry: Optional[OutboxEntry] = self._outbox.get_call(call_id)
        return entry

    def list_calls(
        self, *, state: Optional[str] = None, limit: int = 100, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """``store.list_calls``; none without an outbox."""
        if self._outbox is None:
            return []
        return list(self._outbox.list_calls(state=state, limit=limit, after_call_id=after_call_id))

    def outbox_counts(self) -> Optional[Dict[str, int]]:
        """``store.outbox_counts``; :obj:`None` without an outbox."""
        if self._outbox is None:
            return None
        return {str(k): int(v) for k, v in self._outbox.outbox_counts().items()}

    def retry_failed_call(self, call_id: int, at: int) -> bool:
        """``store.retry_failed_call``; :obj:`False` without an outbox."""
        if self._outbox is None:
            return False
        return bool(self._outbox.retry_failed_call(call_id, at))

    def drop_call(self, call_id: int) -> bool:
        """``store.drop_call``; :obj:`False` without an outbox."""
        if self._outbox is None:
            return False
        return bool(self._outbox.drop_call(call_id))

    # -- persisted bot state (StateStore) ---------------------------------------------------
    def read_state(self, keys: Sequence[StateKey]) -> Dict[StateKey, StateEntry]:
        """``store.read_state``: the committed rows of ``keys`` in one read; none without
        the capability."""
        if self._state is None or not keys:
            return {}
        found = self._state.read_state(list(keys))
        return {key: entry for key, entry in found.items()}

    def write_state(self, writes: Sequence[StateWrite], at: int) -> Optional[StateConflict]:
        """``store.write_state``: all or none; the conflict, else :obj:`None`.

        Raises:
            TypeError: The store keeps no state.
        """
        state = self._require_state("write_state")
        conflict: Optional[StateConflict] = state.write_state(list(writes), at)
        return conflict

    def list_state(
        self,
        *,
        kind: Optional[str] = None,
        name: Optional[str] = None,
        after: Optional[StateKey] = None,
        limit: int = 100,
    ) -> List[Tuple[StateKey, StateEntry]]:
        """``store.list_state``; none without the capability."""
        if self._state is None:
            return []
        return list(self._state.list_state(kind=kind, name=name, after=after, limit=limit))
