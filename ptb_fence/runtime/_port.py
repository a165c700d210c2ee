"""StorePort: the user's store wrapped once, with every operation the runtime uses.

A batch store (:class:`~ptb_fence.BatchStore`) declares its parts. The port reads the
declaration once and sends every batch to ``commit``. A store without ``commit`` is probed
once for its capability groups (:class:`~ptb_fence.StoreCapabilities`). A store with part of
a group is refused with a :exc:`TypeError` naming the methods. What the port does for a part a
store lacks is listed on :class:`StorePort`.
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
    PaceBucket,
    Settlement,
    StateConflict,
    StateEntry,
    StateKey,
    StateWrite,
    JobFire,
    JobWrite,
    StepRecord,
    StoreFigures,
    StoredJob,
    StoredUpdate,
)
from ptb_fence.stores.memory._pace import MemoryPace
from ptb_fence._errors import UsageError
from ptb_fence.contract import (
    BASE_METHODS,
    BATCH_STORE_METHODS,
    FEATURE_GROUPS,
    Batch,
    Committed,
    StoreFeatures,
    CAPABILITY_GROUPS,
    OUTBOX_METHODS,
    STATE_METHODS,
    ChatKey,
    ChatRow,
    ClaimTerms,
    StoreCapabilities,
    takes_connection,
    missing_methods,
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


_BATCH_GROUPS = ("base", "fenced", "durable", "renew_many", "renew_owned_many", "transaction",
                 "completing", "bind_bot", "release")
"""The capability groups every batch store has."""


def _declared(store: object, features: StoreFeatures) -> StoreCapabilities:
    """The capabilities of a batch store, read from its declaration (no probing).

    Raises:
        TypeError: The store lacks a method that a batch store or a declared part needs.
    """
    name = type(store).__name__
    missing = missing_methods(store, BATCH_STORE_METHODS + features.methods)
    if missing:
        raise TypeError(
            f"{name} declares {features} but lacks {', '.join(missing)}: a BatchStore has "
            f"{', '.join(BATCH_STORE_METHODS)}, and each declared part has its methods "
            "(ptb_fence.contract.FEATURE_METHODS)"
        )
    groups = set(_BATCH_GROUPS)
    for part in features.names:
        groups.update(FEATURE_GROUPS[part])
    connection = all(
        takes_connection(getattr(store, method, None)) for method in ("owns", "settle_owned")
    )
    return StoreCapabilities(name, frozenset(groups), connection)


def _seed_levels(found: StoreCapabilities) -> StoreCapabilities:
    """A store without ``commit`` is used at the seed's levels only (its other methods are
    never called)."""
    groups = found.groups & {"base", "fenced", "durable"}
    return StoreCapabilities(found.store, frozenset(groups), found.caller_transactions)


def _keywords(terms: ClaimTerms) -> "dict[str, Any]":
    """``terms`` as the keywords of the single-row claims of the contract (``claim_owned``,
    ``claim_in_chat_order``)."""
    return {
        "now": terms.now,
        "lease_until": terms.lease_until,
        "max_attempts": terms.max_attempts,
        "durable_exhaustion": terms.durable_exhaustion,
    }

class StorePort:
    """The user's store behind one typed interface (built once per runtime).

    What it does for a part a store lacks:

    - Batches become loops of single calls on a store of the seed's levels. Each row is still
      correct on its own, but a failure part way leaves the earlier rows written.
    - Without ``transaction()``, a fenced transaction needs ``connection=``.
    - Without ``connection=`` on ``owns`` and ``settle_owned``, completion is at least once.
      The port warns once at construction.
    - Without releases, liveness, isolation or figures, the port reports nothing released,
      taken over, suspect or counted. Claims then wait for their lease.
    - Without chat order, ``strict_chat_order`` refuses the store.
    - Without the outbox or persisted state, their readers find nothing. Writes for them
      are refused with a :exc:`TypeError`, never dropped.

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
        "_bind_bot",
        "_commit",
        "_claim_owned",
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
        "_steps",
        "_jobs",
        "_pace",
        "broadcast_store",
        "_owns_connection",
        "_release_liveness",
        "_release_many",
        "_renew_many",
        "_renew_owned",
        "_renew_owned_many",
        "_reopen_completed",
        "_settle_connection",
        "_settle_owned",
        "_take_over_dead",
        "_transaction",
        "bot_id",
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
        features = getattr(store, "features", None)
        try:
            if isinstance(features, StoreFeatures):
                capabilities = _declared(store, features)
            else:
                capabilities = _seed_levels(StoreCapabilities.of(store))
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
                f"(BatchStore); {name} lacks {lacks}"
            )
        self.store = store
        self.capabilities = capabilities
        has = capabilities.groups.__contains__

        def method(group: str, method_name: str) -> Optional[Callable[..., Any]]:
            # a method of a group the store does not have whole is never called
            return _optional(store, method_name) if has(group) else None

        # a batch store declares its features: then commit carries every batch
        self._commit = _optional(store, "commit") if isinstance(features, StoreFeatures) else None
        self._renew_many = method("renew_many", "renew_many")
        self._claim_owned = method("fenced", "claim_owned")
        self._renew_owned = method("fenced", "renew_owned")
        self._settle_owned = method("fenced", "settle_owned")
        self._renew_owned_many = method("renew_owned_many", "renew_owned_many")
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
        self._steps: Any = store if has("steps") else None
        self._jobs: Any = store if has("jobs") else None
        # the pace of every process (StoreFeatures.pacing), else this process's alone
        self._pace: Any = store if has("pacing") else MemoryPace()
        #: The store when it keeps broadcasts (``StoreFeatures.broadcasts``), else :obj:`None`.
        self.broadcast_store: Any = store if has("broadcasts") else None
        # the bot whose updates these are (its id from the token), once a front end knows it
        self.bot_id: Optional[int] = None
        self._owns_connection = takes_connection(_optional(store, "owns"))
        self._settle_connection = takes_connection(self._settle_owned)
        _LOGGER.info("%s: store capabilities: %s", component, capabilities)
        if fenced and not self.atomic_completion:
            _LOGGER.warning(
                "%s: %s.%s has no connection= keyword (BatchStore): "
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
        """:obj:`bool`: The store gives claims back at once (``release_many``). Otherwise a
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
        statement at its start (``complete_owned``, undone by ``reopen_completed``)."""
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
        (:class:`~ptb_fence.contract.OutboxStore`): ``AttemptEffects.claim`` is
        honoured and ``claimed_calls`` reads them back."""
        return self._claimed_inserts is not None

    @property
    def has_steps(self) -> bool:
        """:obj:`bool`: The store records the results of steps (``StoreFeatures.steps``)."""
        return self._steps is not None

    def take_send_slots(self, wants: Sequence[Sequence[PaceBucket]], now: int,
                        horizon_ms: int) -> List[int]:
        """``store.take_send_slots``, or this process's own pace without the part."""
        return list(self._pace.take_send_slots(wants, now=now, horizon_ms=horizon_ms))

    def hold_sends(self, holds: Sequence[Tuple[str, int]]) -> None:
        """``store.hold_sends``, or this process's own pace without the part."""
        self._pace.hold_sends(holds)

    @property
    def has_jobs(self) -> bool:
        """:obj:`bool`: The store keeps durable jobs (``StoreFeatures.jobs``)."""
        return self._jobs is not None

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

    # -- fenced contract ------------------------------------------------------------------------
    def claim_owned(self, update_id: int, terms: ClaimTerms) -> Optional[AttemptIdentity]:
        """``store.claim_owned``."""
        assert self._claim_owned is not None  # a fenced store has it
        identity: Optional[AttemptIdentity] = self._claim_owned(update_id, **_keywords(terms))
        return identity

    def renew_owned(self, identity: AttemptIdentity, lease_until: int, now: int) -> bool:
        """``store.renew_owned``."""
        assert self._renew_owned is not None  # a fenced store has it
        return bool(self._renew_owned(identity, lease_until, now))

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """``store.owns``. ``connection`` is passed only to a store that takes it (otherwise
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
        assert self._settle_owned is not None  # a fenced store has it
        if connection is None:
            return bool(self._settle_owned(identity, settlement))
        if not self._settle_connection:
            raise TypeError(
                f"{type(self.store).__name__}.settle_owned() takes no connection=, so it cannot "
                "settle inside the caller's transaction"
            )
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
        """``store.acknowledge_exhaustion``. With ``effects`` (an outbox store that takes
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

    # -- the group commit -------------------------------------------------------------------
    @property
    def commits_batches(self) -> bool:
        """:obj:`bool`: The store commits a whole :class:`~ptb_fence.contract.Batch` in one
        call (:class:`~ptb_fence.contract.BatchStore`)."""
        return self._commit is not None

    def commit(self, batch: Batch) -> Committed:
        """Commit ``batch``: one ``store.commit`` on a batch store.

        A store without ``commit`` (the seed's levels) gets its single calls, one after the
        other.
        """
        if batch.empty:
            return Committed()
        if self._commit is not None:
            committed: Committed = self._commit(batch)
            return committed
        return self._commit_in_parts(batch)

    def _commit_in_parts(self, batch: Batch) -> Committed:
        """A batch on a store of the seed's levels: its single calls, one after the other.

        The settlements come before the claims, so a claim never counts on a completion that
        did not land.
        """
        recorded = tuple(self.add(*row) for row in batch.records)
        claimed: List[Optional[AttemptIdentity]] = []
        for row in batch.claimed_records:
            assert batch.terms is not None  # a Batch with claimed records has terms
            claimed.append(self.claim_owned(row[0], batch.terms) if self.add(*row) else None)
        landed = self.settle_owned_many(batch.settlements, effects=batch.effects)
        taken: List[Optional[AttemptIdentity]] = []
        if batch.claims:
            assert batch.terms is not None
            taken = self.claim_owned_many(batch.claims, batch.terms)
        return Committed(recorded, tuple(claimed), tuple(landed), tuple(taken))

    # -- batches: one commit on a batch store, loops of single calls at the seed's levels ----
    def add_many(self, rows: Sequence[Row]) -> List[bool]:
        """Record ``rows`` pending: one commit, or the loop of ``add``."""
        if self._commit is not None:
            return list(self.commit(Batch(records=tuple(rows))).recorded)
        return [self.add(*row) for row in rows]

    def record_claimed(self, rows: Sequence[Row], terms: ClaimTerms) -> List[Recorded]:
        """Record fresh rows claimed for their first attempt (a batch store only).

        Per row it gives the identity, or :obj:`False` when the id exists.
        """
        got = self.commit(Batch(terms, claimed_records=tuple(rows))).claimed_records
        return [False if identity is None else identity for identity in got]

    def settle_owned_many(
        self,
        items: Sequence[Tuple[AttemptIdentity, Settlement]],
        *,
        effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None,
    ) -> List[Landing]:
        """Settle ``items``: one commit with ``effects``, or the loop of ``settle_owned``.

        Raises:
            TypeError: Effects for a store without the outbox (they would be lost).
        """
        if self._commit is not None:
            return list(self.commit(Batch(settlements=tuple(items), effects=effects)).landed)
        self._refuse_effects(effects)
        return [self.settle_owned(identity, settlement) for identity, settlement in items]

    def _refuse_effects(self, effects: Optional[Mapping[AttemptIdentity, AttemptEffects]]) -> None:
        """Refuse calls or state writes for a store that cannot keep them."""
        if effects and any(e.calls or e.state for e in effects.values()):
            self._require_outbox("effects=")
            if any(e.state for e in effects.values()):
                self._require_state("effects= with state writes")

    def _require_state(self, what: str) -> Any:
        if self._state is None:
            raise TypeError(
                f"{type(self.store).__name__} keeps no persisted bot state: {what} needs a "
                f"BatchStore that declares StoreFeatures(state=True) and has "
                f"{', '.join(STATE_METHODS)}"
            )
        return self._state

    def _require_outbox(self, what: str) -> Any:
        if self._outbox is None:
            raise TypeError(
                f"{type(self.store).__name__} has no outbox: {what} needs a BatchStore that "
                f"declares StoreFeatures(outbox=True) and has {', '.join(OUTBOX_METHODS)}"
            )
        return self._outbox

    def renew_owned_many(
        self, identities: Sequence[AttemptIdentity], lease_until: int, now: int
    ) -> List[Optional[bool]]:
        """``store.renew_owned_many``, or the loop of ``renew_owned``.

        Per position :obj:`True` or :obj:`False`, or :obj:`None` when the row is locked right
        now (undecided).
        """
        if self._renew_owned_many is not None:
            results = self._renew_owned_many(list(identities), lease_until, now)
            return [None if ok is None else bool(ok) for ok in results]
        return [self.renew_owned(identity, lease_until, now) for identity in identities]

    def renew_many(
        self, leases: Sequence[Tuple[int, int]], lease_until: int, now: int
    ) -> List[Optional[bool]]:
        """``store.renew_many``, or the loop of ``renew`` (as :meth:`renew_owned_many`)."""
        if self._renew_many is not None:
            results = self._renew_many(list(leases), lease_until, now)
            return [None if ok is None else bool(ok) for ok in results]
        return [self.renew(update_id, attempt, lease_until, now) for update_id, attempt in leases]

    def claim_owned_many(
        self, update_ids: Sequence[int], terms: ClaimTerms
    ) -> List[Optional[AttemptIdentity]]:
        """Claim ``update_ids``: one commit, or the loop of ``claim_owned``.

        Per position it gives the identity or :obj:`None`. An id repeated in the input is
        claimed at its first position only.
        """
        ids = list(update_ids)
        if self._commit is not None:
            return list(self.commit(Batch(terms, claims=tuple(ids))).claims)
        seen: Set[int] = set()
        result: List[Optional[AttemptIdentity]] = []
        for update_id in ids:
            identity = None
            if update_id not in seen:
                seen.add(update_id)
                identity = self.claim_owned(update_id, terms)
            result.append(identity)
        return result

    # -- chat order (BatchStore, no fallback: strict_chat_order refuses a store
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
        that claim was released. Without the capability every position is :obj:`False` (the
        update waits for its lease)."""
        identities = list(identities)
        if self._release_many is None or not identities:
            return [False] * len(identities)
        return [bool(ok) for ok in self._release_many(identities, at=at)]

    def claimed_suspect(self, identity: AttemptIdentity) -> int:
        """``store.claimed_suspect(identity)`` (no statement: the claim read it back): 0, 1
        or 2. 0 without the capability."""
        if self._claimed_suspect is None:
            return 0
        return min(max(int(self._claimed_suspect(identity)), 0), 2)

    def mark_isolated(self, identity: AttemptIdentity, at: int) -> bool:
        """``store.mark_isolated(identity, at=at)`` (one committed statement). :obj:`False`
        without the capability."""
        if self._mark_isolated is None:
            return False
        return bool(self._mark_isolated(identity, at=at))

    def end_probation(self, identity: AttemptIdentity, at: int) -> bool:
        """``store.end_probation(identity, at=at)`` (one committed statement). :obj:`False`
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
        """``store.release_liveness()``. Nothing without the capability."""
        self.held_instance = None
        if self._release_liveness is not None:
            self._release_liveness()

    def take_over_dead(self, now: int) -> int:
        """``store.take_over_dead(now=now)``: rows made claimable. ``0`` without the
        capability."""
        if self._take_over_dead is None:
            return 0
        return int(self._take_over_dead(now=now))

    # -- transactions and binding -----------------------------------------------------------
    def transaction(self) -> ContextManager[Any]:
        """``store.transaction()``.

        Raises:
            TypeError: The store has none. The message names the fix (``connection=``).
        """
        if self._transaction is None:
            raise TypeError(
                f"{type(self.store).__name__} has no transaction(); pass connection= (an open "
                "DB-API connection to the store's database)"
            )
        manager: ContextManager[Any] = self._transaction()
        return manager

    def bind_bot(self, bot_id: int) -> None:
        """Note the bot (:attr:`bot_id`) and call ``store.bind_bot`` where the store records
        its bot."""
        self.bot_id = bot_id
        if self._bind_bot is not None:
            self._bind_bot(bot_id)

    # -- figures (BatchStore) -------------------------------------------------------------
    def figures(self) -> Optional[StoreFigures]:
        """``store.figures()``: what waits in the store (one read-only look). :obj:`None`
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

    # -- recorded steps (StoreFeatures.steps) ------------------------------------------------
    def no_steps(self) -> str:
        """The :exc:`~ptb_fence.UsageError` text for a step on a store without steps."""
        return (
            f"{type(self.store).__name__} does not record steps: attempt.step needs a store "
            "that declares StoreFeatures(steps=True) (SQLiteUpdateStore, PostgresUpdateStore, "
            "MemoryUpdateStore). attempt.effect_key(name) works on every store"
        )

    def read_step(self, key: str) -> Optional[StepRecord]:
        """``store.read_step``: the record of an effect key, or :obj:`None`."""
        if self._steps is None:
            raise UsageError(self.no_steps())
        found = self._steps.read_step(key)
        if found is not None and not isinstance(found, StepRecord):
            raise TypeError(
                f"{type(self.store).__name__}.read_step() returned {type(found).__name__}; "
                "it must return a ptb_fence.StepRecord or None"
            )
        return found

    def record_step(self, record: StepRecord, *, connection: Any) -> bool:
        """``store.record_step`` in the caller's transaction: whether the attempt owns its
        update (the record stands) or not (nothing written)."""
        if self._steps is None:
            raise UsageError(self.no_steps())
        return bool(self._steps.record_step(record, connection=connection))

    def steps_of(self, update_id: int) -> List[StepRecord]:
        """``store.steps_of``: the recorded steps of an update id (none without steps)."""
        if self._steps is None:
            return []
        return list(self._steps.steps_of(update_id))

    # -- durable jobs (StoreFeatures.jobs) ------------------------------------------------
    def _jobs_store(self) -> Any:
        if self._jobs is None:
            raise TypeError(
                f"{type(self.store).__name__} keeps no jobs: durable jobs need a store that "
                "declares StoreFeatures(jobs=True)"
            )
        return self._jobs

    def schedule_jobs(self, jobs: Sequence[JobWrite], at: int) -> List[StoredJob]:
        """``store.schedule_jobs``: the jobs as stored."""
        return list(self._jobs_store().schedule_jobs(list(jobs), at))

    def cancel_jobs(self, job_ids: Sequence[int], at: int) -> List[bool]:
        """``store.cancel_jobs``: per id, whether the job was live."""
        return [bool(done) for done in self._jobs_store().cancel_jobs(list(job_ids), at)]

    def due_jobs(self, now: int, limit: int) -> List[StoredJob]:
        """``store.due_jobs``: the jobs due now, earliest first."""
        return list(self._jobs_store().due_jobs(now, limit))

    def fire_jobs(self, fires: Sequence[JobFire], at: int) -> List[bool]:
        """``store.fire_jobs``: per fire, whether it fired."""
        return [bool(done) for done in self._jobs_store().fire_jobs(list(fires), at)]

    def list_jobs(self, *, name: Optional[str] = None, include_ended: bool = False,
                  after_job_id: int = 0, limit: int = 1000) -> List[StoredJob]:
        """``store.list_jobs``."""
        return list(self._jobs_store().list_jobs(
            name=name, include_ended=include_ended, after_job_id=after_job_id, limit=limit))

    def get_job(self, job_id: int) -> Optional[StoredJob]:
        """``store.get_job``."""
        found = self._jobs_store().get_job(job_id)
        return found if isinstance(found, StoredJob) else None

    def run_job_now(self, job_id: int, at: int) -> bool:
        """``store.run_job_now``."""
        return bool(self._jobs_store().run_job_now(job_id, at))

    # -- the outbox (OutboxStore) -----------------------------------------------------------
    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        """``store.write_effects``: the calls inside the caller's transaction. Their ids.

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
        """``store.claim_calls``. None without an outbox."""
        if self._outbox is None:
            return []
        return list(
            self._outbox.claim_calls(now=now, lease_until=lease_until, limit=limit, sender=sender)
        )

    def claimed_calls(self, sender: str, *, limit: int) -> List[OutboxEntry]:
        """``store.claimed_calls``. None without claimed inserts."""
        if self._claimed_inserts is None:
            return []
        return list(self._claimed_inserts.claimed_calls(sender, limit=limit))

    def record_sent(self, items: Sequence[Tuple[int, str, str, int]]) -> List[bool]:
        """``store.record_sent``. Nothing lands without an outbox."""
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
        """``store.record_sent_and_claim`` (one commit). On a store without it
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
        """``store.retry_call``. :obj:`False` without an outbox."""
        if self._outbox is None:
            return False
        return bool(self._outbox.retry_call(call_id, sender, due_at=due_at, error=error))

    def fail_call(self, call_id: int, sender: str, *, at: int, error: str) -> bool:
        """``store.fail_call``. :obj:`False` without an outbox."""
        if self._outbox is None:
            return False
        return bool(self._outbox.fail_call(call_id, sender, at=at, error=error))

    def release_calls(self, call_ids: Sequence[int], sender: str, at: int) -> List[bool]:
        """``store.release_calls``. Nothing lands without an outbox."""
        if self._outbox is None:
            return [False] * len(call_ids)
        return [bool(ok) for ok in self._outbox.release_calls(list(call_ids), sender, at)]

    def due_send_failures(
        self, *, limit: int, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """``store.due_send_failures``. None without an outbox."""
        if self._outbox is None:
            return []
        return list(self._outbox.due_send_failures(limit=limit, after_call_id=after_call_id))

    def acknowledge_send_failure(self, call_id: int, at: int) -> bool:
        """``store.acknowledge_send_failure``. :obj:`False` without an outbox."""
        if self._outbox is None:
            return False
        return bool(self._outbox.acknowledge_send_failure(call_id, at))

    def get_call(self, call_id: int) -> Optional[OutboxEntry]:
        """``store.get_call``. :obj:`None` without an outbox."""
        if self._outbox is None:
            return None
        entry: Optional[OutboxEntry] = self._outbox.get_call(call_id)
        return entry

    def list_calls(
        self, *, state: Optional[str] = None, limit: int = 100, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """``store.list_calls``. None without an outbox."""
        if self._outbox is None:
            return []
        return list(self._outbox.list_calls(state=state, limit=limit, after_call_id=after_call_id))

    def outbox_counts(self) -> Optional[Dict[str, int]]:
        """``store.outbox_counts``. :obj:`None` without an outbox."""
        if self._outbox is None:
            return None
        return {str(k): int(v) for k, v in self._outbox.outbox_counts().items()}

    def retry_failed_call(self, call_id: int, at: int) -> bool:
        """``store.retry_failed_call``. :obj:`False` without an outbox."""
        if self._outbox is None:
            return False
        return bool(self._outbox.retry_failed_call(call_id, at))

    def drop_call(self, call_id: int) -> bool:
        """``store.drop_call``. :obj:`False` without an outbox."""
        if self._outbox is None:
            return False
        return bool(self._outbox.drop_call(call_id))

    # -- persisted bot state (StateStore) ---------------------------------------------------
    def read_state(self, keys: Sequence[StateKey]) -> Dict[StateKey, StateEntry]:
        """``store.read_state``: the committed rows of ``keys`` in one read. None without
        the capability."""
        if self._state is None or not keys:
            return {}
        found = self._state.read_state(list(keys))
        return {key: entry for key, entry in found.items()}

    def write_state(self, writes: Sequence[StateWrite], at: int) -> Optional[StateConflict]:
        """``store.write_state``: all or none. The conflict, else :obj:`None`.

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
        """``store.list_state``. None without the capability."""
        if self._state is None:
            return []
        return list(self._state.list_state(kind=kind, name=name, after=after, limit=limit))
