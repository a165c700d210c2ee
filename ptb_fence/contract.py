"""The store contract: what a store does for the runtime.

The seed's three levels are :class:`UpdateStore`, :class:`FencedUpdateStore` and
:class:`DurableUpdateStore`. They are detected by duck typing. A :class:`BatchStore` adds one
``commit`` of a whole :class:`Batch` and declares its optional parts in :class:`StoreFeatures`.
:class:`OutboxStore` and :class:`StateStore` are two of those parts. Every method is blocking.
Each rule is one conditional statement on one row. Times are integer epoch milliseconds.
:func:`ptb_fence.conformance.check_update_store` checks the rules, boundaries included.
See the store contract page of the docs for the rules of each optional part.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    FrozenSet,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    runtime_checkable,
)

from ptb_fence._values import (
    AttemptEffects,
    AttemptIdentity,
    Exhaustion,
    Landing,
    OutboxEntry,
    PaceBucket,
    Recipient,
    RecipientOutcome,
    Settlement,
    StateConflict,
    StateEntry,
    StateKey,
    StateWrite,
    JobFire,
    JobWrite,
    StepRecord,
    StoreFigures,
    StoredBroadcast,
    StoredJob,
    StoredUpdate,
)

__all__ = [
    "BASE_METHODS",
    "Batch",
    "BatchStore",
    "Committed",
    "CAPABILITY_GROUPS",
    "CHAT_KEYING_METHODS",
    "CHAT_ORDER_METHODS",
    "ChatKey",
    "ChatRow",
    "CapabilityGroup",
    "ClaimTerms",
    "COMPLETING_METHODS",
    "DURABLE_METHODS",
    "DurableUpdateStore",
    "BATCH_STORE_METHODS",
    "FEATURE_GROUPS",
    "FEATURE_METHODS",
    "FENCED_METHODS",
    "FencedUpdateStore",
    "FIGURES_METHODS",
    "ISOLATING_METHODS",
    "LIVENESS_METHODS",
    "CLAIMED_INSERT_METHODS",
    "RECORD_AND_CLAIM_METHODS",
    "OutboxStore",
    "OUTBOX_METHODS",
    "STATE_METHODS",
    "STEP_METHODS",
    "JOB_METHODS",
    "PACE_METHODS",
    "BROADCAST_METHODS",
    "StateStore",
    "StoreCapabilities",
    "StoreFeatures",
    "UpdateStore",
    "is_durable",
    "is_fenced",
    "missing_methods",
]

BASE_METHODS = ("add", "claim", "renew", "settle", "due", "prune")
"""The six methods of the base contract, :class:`UpdateStore`. This contract never grows."""

FENCED_METHODS = BASE_METHODS + ("claim_owned", "renew_owned", "owns", "settle_owned")
"""The methods of :class:`FencedUpdateStore`: the base six plus four."""

DURABLE_METHODS = FENCED_METHODS + ("exhaust", "due_exhaustions", "acknowledge_exhaustion")
"""The methods of :class:`DurableUpdateStore`: the fenced ten plus three."""

LIVENESS_METHODS = ("hold_liveness", "release_liveness", "take_over_dead")
"""The methods of the declared part ``liveness``."""

ISOLATING_METHODS = ("claimed_suspect", "mark_isolated", "end_probation")
"""The methods of the declared part ``isolation``."""

CHAT_ORDER_METHODS = ("add_many_in_chats", "claim_in_chat_order", "due_in_chat_order")
"""The methods of the declared part ``chat_order`` that order the chats."""

CHAT_KEYING_METHODS = ("unkeyed_in_chats", "set_chat_keys")
"""The methods of the declared part ``chat_order`` that key rows recorded without a chat key."""

COMPLETING_METHODS = ("complete_owned", "reopen_completed")
"""The methods that complete an attempt at the start of a fenced transaction."""

FIGURES_METHODS = ("figures",)
"""The method of the declared part ``figures``."""

OUTBOX_METHODS = (
    "write_effects",
    "claim_calls",
    "record_sent",
    "retry_call",
    "fail_call",
    "release_calls",
    "due_send_failures",
    "acknowledge_send_failure",
    "get_call",
    "list_calls",
    "outbox_counts",
    "retry_failed_call",
    "drop_call",
)
"""The methods of :class:`OutboxStore`, the declared part ``outbox``."""

CLAIMED_INSERT_METHODS = ("claimed_calls",)
"""The method of :class:`OutboxStore` that reads the calls inserted claimed for a sender."""

RECORD_AND_CLAIM_METHODS = ("record_sent_and_claim",)
"""The method of :class:`OutboxStore` that records results and claims in one commit."""

STATE_METHODS = ("read_state", "write_state", "list_state")
"""The methods of :class:`StateStore`, the declared part ``state``."""

STEP_METHODS = ("read_step", "record_step", "steps_of")
"""The methods of the declared part ``steps``."""

JOB_METHODS = ("schedule_jobs", "cancel_jobs", "due_jobs", "fire_jobs", "list_jobs", "get_job",
               "run_job_now")
"""The methods of the declared part ``jobs``."""

PACE_METHODS = ("take_send_slots", "hold_sends")
"""The methods of the declared part ``pacing``."""

BROADCAST_METHODS = ("start_broadcast", "add_recipients", "claim_recipients",
                     "settle_recipients", "set_broadcast_state", "list_broadcasts")
"""The methods of the declared part ``broadcasts``."""

Row = Tuple[int, str, int]
"""An update to record: ``(update_id, body, received_at)``."""

ChatRow = Tuple[int, str, int, Optional[int]]
"""An update to record with its chat key: ``(update_id, body, received_at, chat_key)``.

A ``chat_key`` of :obj:`None` means the update belongs to no chat. It is never ordered.
"""

ChatKey = Tuple[int, str, int]
"""The chat key of a recorded row: ``(update_id, body, chat_key)``."""


@dataclass(frozen=True, slots=True)
class ClaimTerms:
    """The terms every claim of one call is made on.

    They are the keywords of :meth:`UpdateStore.claim`, as one value for the claims of a
    :class:`Batch` (:meth:`BatchStore.commit`). A store author reads the fields. The runtime
    builds the value once per claim call.

    Args:
        now (:obj:`int`): The claim time (epoch milliseconds). A row is claimable at ``now``
            when it is ``pending``, ``failed`` with ``due_at <= now`` or ``processing`` with
            ``due_at < now``.
        lease_until (:obj:`int`): The lease of a claim made (its ``due_at``). It is
            ``>= now``.
        max_attempts (:obj:`int`): A claimable row whose ``attempts`` reached this is spent:
            abandoned instead of claimed.
        durable_exhaustion (:obj:`bool`): A spent row becomes an unacknowledged exhaustion
            (``settled_at`` NULL) instead of ordinary settled history. Defaults to
            :obj:`False`.
    """

    now: int
    lease_until: int
    max_attempts: int
    durable_exhaustion: bool = False


@runtime_checkable
class UpdateStore(Protocol):
    """The base store contract: the original six methods.

    Times are integer milliseconds since the epoch.
    """

    def add(self, update_id: int, body: str, received_at: int) -> bool:
        """Insert a pending row.

        Returns:
            :obj:`bool`: :obj:`False` if ``update_id`` exists in any state.
        """

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[int]:
        """Take a claimable row for a new attempt and return the attempt number.

        If the row is claimable but its attempts are spent, abandon it and return :obj:`None`.
        With ``durable_exhaustion`` the abandoned row is an unacknowledged exhaustion. Return
        :obj:`None` as well for a live lease, a final row or an unknown id.
        """

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """Extend the lease of ``attempt`` to at least ``lease_until``.

        It never shortens the lease. With ``now``, it never revives an expired one.

        Returns:
            :obj:`bool`: :obj:`True` when the row matched.
        """

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Record the result of ``attempt`` if it still holds an unexpired lease at
        ``settlement.at``.

        Otherwise do nothing.
        """

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """Rows to hand over, by ``update_id``, at most ``limit``.

        The rows are pending with ``received_at <= pending_before``, failed with
        ``due_at <= now`` and processing with ``due_at < now``.

        A store with :meth:`BatchStore.release_many` also lists every *released* row at once,
        whatever ``pending_before``. Every :class:`BatchStore` has it. A released row is a
        pending row that carries a claim id. Only a release leaves one on a pending row.
        ``add`` never writes one.
        """

    def prune(self, before: int) -> int:
        """Delete completed and abandoned rows with ``settled_at < before``.

        Returns:
            :obj:`int`: The count of rows deleted.
        """


@runtime_checkable
class FencedUpdateStore(UpdateStore, Protocol):
    """The fenced contract: the base six plus claims with a persisted, unique claim id."""

    def claim_owned(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """As :meth:`claim`, returning the identity with the claim id read back from the row."""

    def renew_owned(
        self, identity: AttemptIdentity, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """As :meth:`renew`, and the claim id must match."""

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """:obj:`True` only while this exact claim holds a lease unexpired at ``at``.

        With ``connection`` (the caller's DB-API connection or cursor), the check runs on it.
        It then runs inside the caller's transaction (PostgreSQL: ``SELECT … FOR UPDATE``).
        :meth:`BatchStore.owns` says what the runtime relies on.
        """

    def settle_owned(self, identity: AttemptIdentity, settlement: Settlement) -> bool:
        """As :meth:`settle`, and the claim id must match.

        The ``connection=`` keyword is optional. :meth:`BatchStore.settle_owned` says what it
        does.

        Returns:
            :obj:`bool`: Whether it landed.
        """


@runtime_checkable
class DurableUpdateStore(FencedUpdateStore, Protocol):
    """The durable contract: fenced, plus terminal failures kept until acknowledged."""

    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        """Turn the exact live claim into an unacknowledged exhaustion."""

    def due_exhaustions(
        self, *, limit: int, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        """Unacknowledged exhaustions with ``update_id > after_update_id``, by ``update_id``."""

    def acknowledge_exhaustion(self, identity: AttemptIdentity, at: int) -> bool:
        """Acknowledge the exhaustion with exactly this identity.

        It becomes prunable.
        """


class OutboxStore(Protocol):
    """The outbox of Bot API calls, sent iff the attempt that queued them committed.

    A store declares this part as ``outbox`` in :class:`StoreFeatures`. It then has all these
    methods. The runtime never calls them on a store that does not declare the part.

    An attempt's calls (:class:`AttemptEffects`) are written in the commit that completes it.
    :meth:`BatchStore.commit` takes them as ``Batch.effects``, a mapping from identity to
    effects. It inserts the calls of every settlement that *landed* and is
    :class:`~ptb_fence.Completed`, in the same transaction as the settlements. Each call is
    ``pending``, with ``due_at`` and ``created_at`` set to the settlement's ``at`` and ``tries``
    0. A settlement that did not land writes none of its calls. Effects of identities not
    settled in the batch are ignored. A batch whose effects are :obj:`None` or empty is exactly
    a batch without them. Or :meth:`write_effects` writes the calls inside the attempt's own
    fenced transaction.

    A durable outbox store's ``acknowledge_exhaustion(identity, at, *, effects=...)`` inserts
    the calls of ``effects`` in the acknowledgement's transaction. It inserts them only when it
    acknowledges. ``handle_exhaustion`` queues them on ``exhaustion.outbox``. With a store whose
    ``acknowledge_exhaustion`` takes no ``effects``, ``exhaustion.outbox`` is refused.

    A call is ``pending``, ``sending``, ``sent`` or ``failed``. A ``pending`` call is due at
    ``due_at``. A ``sending`` call is claimed by a sender token. Its lease ends at ``due_at``
    and is held while ``due_at >= now``. A ``failed`` call is acknowledged or not.

    Calls with a chat key are sent one at a time per chat, in ``call_id`` order. A call with
    chat key ``k`` is claimable only when no other call of ``k`` that is ``pending`` or
    ``sending`` has a smaller ``call_id``. No other call of ``k`` may be ``sending`` under a
    live lease either. So a held earlier call, due later or being sent, holds the chat.
    ``sent`` and ``failed`` calls release it. Calls without a chat key are not ordered.

    Each method is one transaction. :meth:`write_effects` is the exception, since it runs in
    the caller's. Times are epoch milliseconds.

    ``prune(before)`` of such a store also deletes the ``sent`` calls with
    ``sent_at < before``. It deletes the acknowledged ``failed`` calls with ``due_at < before``
    as well. An acknowledgement sets ``due_at`` to its time. ``prune`` still returns the count
    of update rows deleted.
    """

    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        """Insert the calls of ``effects`` for ``identity`` inside the caller's open transaction.

        The transaction is the one on ``connection``, as :meth:`BatchStore.complete_owned`
        takes it. Each call is ``pending``, with ``due_at`` and ``created_at`` set to ``at``.
        Nothing is committed. The caller's commit lands the calls. Its rollback discards them.
        It does not check ownership, since the caller's fenced transaction does.

        Returns:
            List[:obj:`int`]: The call ids, in the order of ``effects.calls``.
        """

    def claim_calls(
        self, *, now: int, lease_until: int, limit: int, sender: str
    ) -> List[OutboxEntry]:
        """Claim the calls to send now, lowest ``call_id`` first, at most ``limit``.

        A call is claimable when it is ``pending`` with ``due_at <= now``. It is claimable as
        well when it is ``sending`` with ``due_at < now``, since the sender's lease lapsed. It
        must also be in turn in its chat (see the class). Each claimed call becomes ``sending``
        with ``due_at = lease_until``, ``tries + 1`` and ``sender``. Concurrent claimers never
        get the same call.

        Returns:
            List[:class:`~ptb_fence.OutboxEntry`]: The claimed calls as they are now.
        """

    def record_sent(self, items: Sequence[Tuple[int, str, str, int]]) -> List[bool]:
        """Record the results of sent calls, in one transaction.

        Each item is ``(call_id, sender, result_json, at)``. A call ``sending`` by exactly
        ``sender`` becomes ``sent`` with ``sent_at = at`` and the result.

        Returns:
            List[:obj:`bool`]: Per item, whether it landed.
        """

    def retry_call(self, call_id: int, sender: str, *, due_at: int, error: str) -> bool:
        """A call ``sending`` by ``sender`` goes back to ``pending`` at ``due_at`` with
        ``error``.

        Returns:
            :obj:`bool`: Whether it landed.
        """

    def fail_call(self, call_id: int, sender: str, *, at: int, error: str) -> bool:
        """A call ``sending`` by ``sender`` becomes ``failed`` with ``error``.

        It is not acknowledged, with ``due_at = at`` and ``sent_at`` NULL. It releases its chat.

        Returns:
            :obj:`bool`: Whether it landed.
        """

    def release_calls(self, call_ids: Sequence[int], sender: str, at: int) -> List[bool]:
        """Give calls back (a graceful stop).

        Each call ``sending`` by ``sender`` becomes ``pending`` with ``due_at = at`` and
        ``tries - 1``.

        Returns:
            List[:obj:`bool`]: Per call id, whether it landed.
        """

    def due_send_failures(
        self, *, limit: int, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """The ``failed`` calls not acknowledged, with ``call_id > after_call_id``, by
        ``call_id``, at most ``limit``."""

    def acknowledge_send_failure(self, call_id: int, at: int) -> bool:
        """A ``failed`` call not acknowledged becomes acknowledged with ``due_at = at``.

        It is prunable from then.

        Returns:
            :obj:`bool`: Whether it landed.
        """

    def get_call(self, call_id: int) -> Optional[OutboxEntry]:
        """The call, or :obj:`None`."""

    def list_calls(
        self, *, state: Optional[str] = None, limit: int = 100, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """The calls (of ``state``, when given) with ``call_id > after_call_id``, by
        ``call_id``, at most ``limit``."""

    def outbox_counts(self) -> Dict[str, int]:
        """How many calls per state.

        The keys are ``pending``, ``sending``, ``sent``, ``failed`` (not acknowledged) and
        ``failed_acknowledged``. Each key is present.
        """

    def retry_failed_call(self, call_id: int, at: int) -> bool:
        """Operators: a ``failed`` call goes back to ``pending`` at ``at``.

        It is not acknowledged. Its error and tries are kept.

        Returns:
            :obj:`bool`: Whether it landed.
        """

    def drop_call(self, call_id: int) -> bool:
        """Operators: delete a ``pending`` or ``failed`` call.

        Returns:
            :obj:`bool`: Whether one was deleted.
        """

    def claimed_calls(self, sender: str, *, limit: int) -> List[OutboxEntry]:
        """The calls ``sending`` by ``sender`` (whatever their lease), by ``call_id``, at most
        ``limit``.

        It only reads.
        """

    def record_sent_and_claim(
        self,
        items: Sequence[Tuple[int, str, str, int]],
        *,
        now: int,
        lease_until: int,
        limit: int,
        sender: str,
    ) -> Tuple[List[bool], List[OutboxEntry]]:
        """Record results and claim the next calls, in one transaction.

        It runs :meth:`OutboxStore.record_sent` of ``items``. Then it runs
        :meth:`OutboxStore.claim_calls` with the other arguments. So the claim sees the calls
        just recorded as sent. A failure lands neither.

        Returns:
            Tuple[List[:obj:`bool`], List[:class:`~ptb_fence.OutboxEntry`]]: Both results. Per
            item whether it landed, and the calls claimed, by ``call_id``.
        """


class StateStore(Protocol):
    """Persisted bot state that commits with the update.

    The state is ``user_data``, ``chat_data``, ``bot_data``, conversation states and the
    callback-data cache. A store declares this part as ``state`` in :class:`StoreFeatures`. It
    then has all these methods. The part needs ``outbox``, since
    :meth:`OutboxStore.write_effects` carries the writes.

    Each piece of state is one row, named by a :class:`StateKey`. The row holds opaque text,
    which the store never reads, and a version. The version is the number of writes that landed
    on the row. A :class:`StateWrite` lands only if the row's version is still the one the
    writer read. Version ``0`` means no row. A write that lands leaves the version one higher. A
    write of :obj:`None` keeps the row as a tombstone with its version.

    An attempt's state writes (:attr:`AttemptEffects.state`) ride in the commit that completes
    it, all or none. :meth:`BatchStore.commit` applies the writes of each settlement that is
    :class:`~ptb_fence.Completed` and owned, together with the settle. Suppose one of them finds
    another version. Then none of that item's writes is applied. The item does not settle and
    stays claimed by the attempt. Its result is a :class:`StateConflict` naming the keys. It is
    falsy, so it reads as not landed. The other items of the batch still land. The outbox calls
    of a conflicting item are not written either. A settle that does not land for another reason
    applies none of its writes (:obj:`False`).

    :meth:`OutboxStore.write_effects` applies the writes inside the caller's open transaction.
    On a moved version it applies none and raises :exc:`~ptb_fence.StateConflictError`. The
    caller then rolls back.

    The state table is ``<table>_persistence`` (SQLite, PostgreSQL). It is created with the
    store, and by ``ptb-fence migrate`` or ``postgres_update_store_schema``. ``prune(before)``
    deletes no state but the callback-data cache's keyboards last written before ``before``.
    Those are the rows of kind ``callback``, each written once. Each method is one transaction.
    """

    def read_state(self, keys: Sequence[StateKey]) -> Dict[StateKey, StateEntry]:
        """The rows of ``keys`` as committed, in one read (one snapshot).

        A key without a row is absent from the result (version ``0``). Tombstones are returned
        (value :obj:`None`) with their versions.
        """

    def write_state(self, writes: Sequence[StateWrite], at: int) -> Optional[StateConflict]:
        """Apply ``writes`` in one transaction, all or none (operators: an import).

        Each write is conditional on its version, as in a completion. ``at`` is the rows' change
        time.

        Returns:
            :obj:`None` when every write landed, else the :class:`StateConflict` naming the
            keys whose version had moved (then none landed).
        """

    def list_state(
        self,
        *,
        kind: Optional[str] = None,
        name: Optional[str] = None,
        after: Optional[StateKey] = None,
        limit: int = 100,
    ) -> List[Tuple[StateKey, StateEntry]]:
        """The rows whose key sorts after ``after``, in key order, at most ``limit``.

        Keys sort by ``(kind, name, key)``. With ``kind`` or ``name``, only the rows of those
        are listed. Tombstones are included.
        """


# -- the batch contract -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StoreFeatures:
    """The optional parts of the contract a store offers, declared as data.

    A store says what it offers in its ``features`` attribute. The runtime reads the declaration
    once at start and never probes for methods. The conformance kit checks that every declared
    part works. PTB's :class:`telegram.ext.PersistenceInput` declares a persistence's parts the
    same way.

    Args:
        outbox (:obj:`bool`): Fenced replies: :class:`OutboxStore`.
        state (:obj:`bool`): Persisted bot state that commits with the update:
            :class:`StateStore`. Needs the outbox.
        liveness (:obj:`bool`): The claims of a dead process are taken over before their lease
            ends: :meth:`BatchStore.take_over_dead`.
        chat_order (:obj:`bool`): ``strict_chat_order``: :meth:`BatchStore.claim_in_chat_order`.
        isolation (:obj:`bool`): A crash is charged to the attempt that most likely caused it:
            :meth:`BatchStore.mark_isolated`.
        figures (:obj:`bool`): Operators' figures: :meth:`BatchStore.figures`.
        steps (:obj:`bool`): Recorded steps, fenced per attempt and kept until their update is
            pruned: :meth:`BatchStore.record_step`.
        jobs (:obj:`bool`): Durable jobs whose runs are recorded as update rows:
            :meth:`BatchStore.fire_jobs`. A store that declares it also writes the jobs of
            :attr:`AttemptEffects.jobs` with a completion.
        pacing (:obj:`bool`): Sends paced for every process of the bot, holds included:
            :meth:`BatchStore.take_send_slots`.
        broadcasts (:obj:`bool`): Durable broadcasts, one row per recipient:
            :meth:`BatchStore.claim_recipients`.
    """

    outbox: bool = False
    state: bool = False
    liveness: bool = False
    chat_order: bool = False
    isolation: bool = False
    figures: bool = False
    steps: bool = False
    jobs: bool = False
    pacing: bool = False
    broadcasts: bool = False

    def __post_init__(self) -> None:
        if self.state and not self.outbox:
            raise ValueError(
                "StoreFeatures(state=True) needs outbox=True: state writes ride in the commit "
                "that writes the outbox calls"
            )

    @property
    def names(self) -> Tuple[str, ...]:
        """Tuple[:obj:`str`, ...]: The names of the declared parts, in field order."""
        return tuple(name for name in FEATURE_METHODS if getattr(self, name))

    @property
    def methods(self) -> Tuple[str, ...]:
        """Tuple[:obj:`str`, ...]: The methods the declared parts need."""
        return tuple(method for name in self.names for method in FEATURE_METHODS[name])


FEATURE_METHODS: Dict[str, Tuple[str, ...]] = {
    "outbox": OUTBOX_METHODS + CLAIMED_INSERT_METHODS + RECORD_AND_CLAIM_METHODS,
    "state": STATE_METHODS,
    "liveness": LIVENESS_METHODS,
    "chat_order": CHAT_ORDER_METHODS + CHAT_KEYING_METHODS,
    "isolation": ISOLATING_METHODS,
    "figures": FIGURES_METHODS,
    "steps": STEP_METHODS,
    "jobs": JOB_METHODS,
    "pacing": PACE_METHODS,
    "broadcasts": BROADCAST_METHODS,
}
"""Dict[:obj:`str`, Tuple[:obj:`str`, ...]]: Per optional part of :class:`StoreFeatures`, the
methods a store that declares it must have."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Everything one commit of the runtime writes, for :meth:`BatchStore.commit`.

    The parts apply in field order, in one transaction, all or nothing. Settlements come before
    claims, so a claim never counts on a completion that did not land.

    Args:
        terms (:class:`ClaimTerms` | :obj:`None`): The terms of its claims and claimed records.
            A batch without either needs none.
        records (Tuple[Row, ...]): Fresh updates to record ``pending``.
        claimed_records (Tuple[Row, ...]): Fresh updates to record already claimed for attempt
            1 with lease ``terms.lease_until``.
        settlements (Tuple[Tuple[:class:`AttemptIdentity`, :class:`Settlement`], ...]):
            Attempts to settle, each only while its attempt owns the update.
        effects (Mapping[:class:`AttemptIdentity`, :class:`AttemptEffects`] | :obj:`None`):
            The outbox calls and state writes of settlements that complete. They land with
            their completion or not at all.
        claims (Tuple[:obj:`int`, ...]): Updates to claim for their next attempt on ``terms``.
    """

    terms: Optional[ClaimTerms] = None
    records: Tuple[Row, ...] = ()
    claimed_records: Tuple[Row, ...] = ()
    settlements: Tuple[Tuple[AttemptIdentity, Settlement], ...] = ()
    effects: Optional[Mapping[AttemptIdentity, AttemptEffects]] = None
    claims: Tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.terms is None and (self.claims or self.claimed_records):
            raise ValueError("a Batch with claims or claimed records needs terms")

    @property
    def empty(self) -> bool:
        """:obj:`bool`: The batch writes nothing."""
        return not (self.records or self.claimed_records or self.settlements or self.claims)


@dataclass(frozen=True, slots=True)
class Committed:
    """What a :class:`Batch` commit learnt, position by position.

    Args:
        recorded (Tuple[:obj:`bool`, ...]): Per record: new (:obj:`True`) or a duplicate.
        claimed_records (Tuple[:class:`AttemptIdentity` | :obj:`None`, ...]): Per claimed
            record: its identity, or :obj:`None` for a duplicate.
        landed (Tuple[Landing, ...]): Per settlement: whether it landed, or the
            :class:`StateConflict` that kept it from landing.
        claims (Tuple[:class:`AttemptIdentity` | :obj:`None`, ...]): Per claim: the identity,
            or :obj:`None` when the update was not taken.
        call_ids (Mapping[:class:`AttemptIdentity`, Tuple[:obj:`int`, ...]]): The outbox ids of
            the calls each landed completion wrote, in call order.
        sending (FrozenSet[:obj:`int`]): The ids among them inserted already claimed for
            the sender of their :class:`~ptb_fence.CallClaim`.
    """

    recorded: Tuple[bool, ...] = ()
    claimed_records: Tuple[Optional[AttemptIdentity], ...] = ()
    landed: Tuple[Landing, ...] = ()
    claims: Tuple[Optional[AttemptIdentity], ...] = ()
    call_ids: Mapping[AttemptIdentity, Tuple[int, ...]] = field(default_factory=dict)
    sending: FrozenSet[int] = frozenset()


BATCH_STORE_METHODS = DURABLE_METHODS + (
    "commit",
    "renew_many",
    "renew_owned_many",
    "release_many",
    "transaction",
    "complete_owned",
    "reopen_completed",
    "bind_bot",
)
"""The methods every :class:`BatchStore` has, whatever it declares."""

FEATURE_GROUPS: Dict[str, Tuple[str, ...]] = {
    "outbox": ("outbox", "outbox_claimed_inserts", "outbox_record_and_claim"),
    "state": ("state",),
    "liveness": ("liveness",),
    "chat_order": ("chat_order", "chat_keys"),
    "isolation": ("isolation",),
    "figures": ("figures",),
    "steps": ("steps",),
    "jobs": ("jobs",),
    "pacing": ("pacing",),
    "broadcasts": ("broadcasts",),
}
"""Per optional part of :class:`StoreFeatures`, the :data:`CAPABILITY_GROUPS` it stands for."""


class BatchStore(DurableUpdateStore, Protocol):
    """The store ptb_fence's runtime works best with: durable, batch-first, parts declared.

    ``commit``, the renewals, the fenced transactions, ``bind_bot`` and ``release_many`` are
    required. ``commit`` is the one batch method: it records, claims and settles in one
    transaction. The optional parts are declared in :attr:`features`. A store need not have the methods of a part it does not declare. The
    runtime never calls them. The rules of each part are on the store contract page of the docs.
    """

    features: StoreFeatures
    """:class:`StoreFeatures`: The optional parts this store offers."""

    def commit(self, batch: Batch) -> Committed:
        """Apply ``batch`` in one transaction and return what it learnt.

        Each part follows the rule of its single-row method. ``records`` are added as by
        :meth:`UpdateStore.add`. ``claimed_records`` are added already claimed for attempt 1,
        with a fresh claim id each. ``settlements`` land as by
        :meth:`FencedUpdateStore.settle_owned`, with their ``effects`` (see
        :class:`StateStore`). ``claims`` are taken as by :meth:`FencedUpdateStore.claim_owned`.
        An id repeated in ``claims`` is taken only at its first position. A failure rolls the
        whole batch back and raises.
        """

    # -- renewal -----------------------------------------------------------------------
    def renew_many(
        self, leases: Sequence[Tuple[int, int]], lease_until: int, now: int
    ) -> List[Optional[bool]]:
        """Renew ``(update_id, attempt)`` leases as :meth:`UpdateStore.renew` with ``now``.

        Returns:
            List[:obj:`bool` | :obj:`None`]: Per position, :obj:`True` (renewed), :obj:`False`
            (refused) or :obj:`None`. :obj:`None` means another open transaction locks the row
            right now (PostgreSQL ``FOR UPDATE SKIP LOCKED``). The lease is then undecided,
            neither renewed nor refused.
        """

    def renew_owned_many(
        self, identities: Sequence[AttemptIdentity], lease_until: int, now: int
    ) -> List[Optional[bool]]:
        """As :meth:`renew_many` for :meth:`FencedUpdateStore.renew_owned`.

        The claim ids must match. :obj:`None` means locked right now, undecided.
        """

    # -- fenced transactions -----------------------------------------------------------
    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """As :meth:`FencedUpdateStore.owns`. With ``connection`` the check runs on it.

        ``connection`` is the caller's DB-API connection or cursor. The check runs inside the
        caller's transaction and holds the row until that transaction ends (PostgreSQL
        ``SELECT … FOR UPDATE``, SQLite the database's write lock).
        """

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        """As :meth:`FencedUpdateStore.settle_owned`. With ``connection`` it runs on it.

        The statement then commits or rolls back with the caller's transaction.
        """

    def transaction(self) -> ContextManager[Any]:
        """Open a transaction on a connection of the store's driver and yield the connection.

        It yields :obj:`None` where there is no connection, e.g. in the memory store. It commits
        on normal exit. It rolls back on an exception.
        """

    def complete_owned(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Complete this exact claim inside the caller's open transaction.

        The claim is its update id, attempt and claim id. If it is ``processing`` with
        ``due_at >= at``, it becomes ``completed`` with ``settled_at = at``. A lease ending
        exactly at ``at`` still holds. The lease and attempts are kept. The row stays held
        until that transaction ends (PostgreSQL: the row lock of the ``UPDATE``, SQLite: the
        database's write lock). So a competing claim waits and then sees the completed row. It
        is one statement. Nothing is committed here.

        The caller's commit lands the completion with the caller's writes. The caller's
        rollback restores the claim exactly as it was, still owned with the same lease. The
        attempt can then write again, fail or be retried normally.

        Returns:
            :obj:`bool`: Whether this claim was owned at ``at`` and is now completed in the
            caller's transaction (:obj:`False`: nothing changed).
        """

    def reopen_completed(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Undo a :meth:`complete_owned` that a caller committed by mistake.

        That happens when the caller's block committed its own transaction. Only the row of this
        exact claim that is ``completed`` with ``settled_at = at`` goes back to ``processing``.
        Its ``settled_at`` becomes NULL. Its lease, attempts and claim id are kept. It runs on
        ``connection``, whose transaction ended, and commits at once.

        Returns:
            :obj:`bool`: Whether that completion was undone (:obj:`False`: the caller's block
            rolled back, or the row is not that completion).
        """

    # -- the table's bot and releases --------------------------------------------------
    def bind_bot(self, bot_id: int) -> None:
        """Record that the table belongs to bot ``bot_id`` (the first binder wins).

        Raises:
            ptb_fence.TableBotMismatch: The table belongs to another bot.
        """

    def release_many(self, identities: Sequence[AttemptIdentity], *, at: int) -> List[bool]:
        """Release the exact claims in ``identities``, in one statement (one commit).

        A claim is released when its row is ``processing`` with that attempt and claim id. The
        lease need not be live. The row gets ``state = 'pending'``,
        ``attempts = attempts - 1`` and ``due_at = at``. So the attempt is not counted as spent.
        ``error`` and ``claim_id`` are kept. The row is then claimable at once by any process.
        ``due`` lists it whatever ``pending_before``. The next claim returns the same attempt
        number with a fresh claim id. So ``owns``, ``renew_owned`` and ``settle_owned`` refuse
        the released identity from the release on.

        Returns:
            List[:obj:`bool`]: Per input position, whether that claim was released. It is
            :obj:`False` for another claim, a row not processing or an id repeated in the
            input. On PostgreSQL it is also :obj:`False` while an open transaction locks the
            row.
        """

    # -- liveness (declared: ``liveness``) ---------------------------------------------
    def hold_liveness(self) -> str:
        """Start holding this store object's liveness signal and return the instance id.

        It is idempotent. The instance id is opaque, non-empty text. Claims made through this
        object from now on record it.
        """

    def release_liveness(self) -> None:
        """Stop holding the signal and forget the instance.

        A graceful stop calls it. ``close()`` does it too. It is idempotent. Rows it claimed
        keep their lease, so release them first.
        """

    def take_over_dead(self, *, now: int) -> int:
        """Make the ``processing`` rows of every provably dead instance claimable at ``now``.

        It then forgets those instances. It never touches the caller's own instance or a live
        one, even a frozen one. It never waits for a row that another transaction still locks.
        Such a transaction is a database session that outlived its process. The row is left for
        a later call, and its instance is kept.

        Without the ``isolation`` part, every such row keeps its attempts and claim id, with
        ``due_at = min(due_at, now - 1)``. A crashed attempt then counts as spent, as after a
        lapsed lease. With ``isolation``, only a row whose current claim was marked isolated is
        handled so. :meth:`mark_isolated` marks a claim whose handler ran on probation or alone
        in the dead process. Every other row is given back as :meth:`release_many` gives it:
        ``pending``, ``attempts - 1``, ``due_at = now`` and the claim id kept. The row becomes
        *suspect*. It becomes *suspect again* when its handler had started there as a suspect
        (see :meth:`claimed_suspect`).

        A store that declares ``outbox`` also lets the lease of every ``sending`` call of a dead
        instance's sender lapse now (``due_at = now - 1``). The runtime's sender token ends with
        ``@<instance>``, the instance its process holds. So those calls are claimable at once,
        as the instance's updates are.

        Returns:
            :obj:`int`: The number of rows made claimable (updates and outbox calls).
        """

    # -- isolation (declared: ``isolation``) -------------------------------------------
    def claimed_suspect(self, identity: AttemptIdentity) -> int:
        """The suspicion of the row that ``identity`` took.

        ``identity`` is a claim made through this store object in this process. The answer
        comes from what the claim statement read back, with no statement of its own. Each claim
        is answered once, then forgotten. An identity this object did not claim, or already
        answered, gives 0. A fresh row claimed as it is recorded (``Batch.claimed_records``) is
        never suspect.

        Returns:
            :obj:`int`: 0 (not suspect), 1 (suspect: its handler starts on probation) or 2
            (suspect again: its handler runs alone).
        """

    def mark_isolated(self, identity: AttemptIdentity, *, at: int) -> bool:
        """Record that the handler of this exact claim starts now on probation or alone.

        It is one statement, committed before returning. It marks the row that is
        ``processing`` with that update id, attempt and claim id and a lease live at ``at``
        (``due_at >= at``). Nothing else changes.

        Returns:
            :obj:`bool`: Whether it landed (:obj:`False`: not this claim, not processing, or
            its lease ended before ``at``).
        """

    def end_probation(self, identity: AttemptIdentity, *, at: int) -> bool:
        """Record that the handler of this exact claim ran past its probation.

        :meth:`mark_isolated` marked the claim. It is one statement, committed before returning.
        The mark ends. From now on a crash of its process gives the row back as suspect again.
        The crash no longer charges its attempt. It lands under the same conditions as
        :meth:`mark_isolated`, and only while the claim is marked.

        Returns:
            :obj:`bool`: Whether it landed.
        """

    # -- chat order (declared: ``chat_order``) -----------------------------------------
    def add_many_in_chats(self, rows: Sequence[ChatRow]) -> List[bool]:
        """Record ``(update_id, body, received_at, chat_key)`` rows with their chat keys.

        It records them in one commit, as the ``records`` of a :meth:`commit`. A chat key of
        :obj:`None` means no chat. A row that is not inserted, since the id exists, keeps the
        chat key it has. A settled row replaced by a different update (see
        :meth:`UpdateStore.add`) takes the new one.

        Returns:
            List[:obj:`bool`]: Per row, as for ``records``: new (:obj:`True`) or a duplicate.
        """

    def claim_in_chat_order(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """As :meth:`FencedUpdateStore.claim_owned`, and the row must also be in turn at ``now``.

        Otherwise return :obj:`None` and change nothing. A row whose attempts are spent is
        abandoned only when it is in turn.
        """

    def due_in_chat_order(
        self, *, now: int, pending_before: int, limit: int, chat_key: Optional[int] = None
    ) -> List[StoredUpdate]:
        """As :meth:`UpdateStore.due`, listing only rows in turn at ``now``.

        So it lists at most one row per chat key. A chat whose lowest unsettled row is not due
        lists nothing. With ``chat_key``, it lists only rows of that chat.
        """

    def unkeyed_in_chats(
        self, *, after_update_id: Optional[int] = None, limit: int
    ) -> List[StoredUpdate]:
        """The unsettled rows without a chat key, by ``update_id``, after ``after_update_id``."""

    def set_chat_keys(self, keys: Sequence[ChatKey]) -> int:
        """Key the rows of ``(update_id, body, chat_key)`` that have no key yet.

        A row is keyed only while it is unsettled and holds exactly ``body``. One commit.
        Returns how many rows were keyed.
        """

    # -- figures (declared: ``figures``) -----------------------------------------------
    def figures(self) -> StoreFigures:
        """Count the waiting rows.

        It is blocking and read-only, with no arguments. The SQL stores read in one read
        transaction, or one statement, so the figures are one consistent view.

        - ``unsettled``: the rows whose state is ``pending``, ``processing`` or ``failed``. A
          ``processing`` row counts leased or lapsed, since there is no ``now``.
          ``oldest_unsettled_received_at`` is the smallest ``received_at`` of those
          (:obj:`None` when there are none). ``completed`` and ``abandoned`` rows never count
          here, an unacknowledged exhaustion included.
        - ``exhaustions_waiting``: the ``abandoned`` rows whose ``settled_at`` is NULL, as
          :meth:`DurableUpdateStore.due_exhaustions` lists them. An acknowledged exhaustion
          does not count. Nor does a row abandoned with ``settled_at`` set.
          ``oldest_exhaustion_at`` is the smallest ``due_at`` of those, the time it was
          exhausted (:obj:`None` when there are none).
        - ``held_chat``: only for a store with a chat key per row (declared ``chat_order``).
          Rows without a chat key are ignored. Take the chat keys that two or more unsettled
          rows carry (a chat whose later updates wait behind its oldest one). It is the one
          whose smallest ``received_at`` among its unsettled rows is the smallest. On a tie it
          is the smaller chat key. ``held_chat_since`` is that smallest ``received_at``. Both
          are :obj:`None` when no chat key is carried by two unsettled rows. They are always
          :obj:`None` for a store without chat keys.

        Times are epoch milliseconds. The counts and times are :obj:`int`.

        Returns:
            :class:`StoreFigures`: The figures.
        """

    # -- steps (declared: ``steps``) ---------------------------------------------------
    def read_step(self, key: str) -> Optional[StepRecord]:
        """The record of the effect key ``key``, or :obj:`None`.

        It is a plain read of committed records.
        """

    def record_step(self, record: StepRecord, *, connection: Any = None) -> bool:
        """Record a step's result while its attempt owns the update.

        The attempt is ``(record.update_id, record.attempt, record.claim_id)``. It owns the
        update at ``record.recorded_at`` as :meth:`owns` decides. The row is ``processing``
        with that attempt and claim id and ``due_at >= record.recorded_at``. A lease ending
        exactly at ``recorded_at`` still holds. When the key is recorded already, the earlier
        record is kept unchanged. It is one statement on PostgreSQL, so the database decides.

        With ``connection`` it runs inside the caller's open transaction, as
        :meth:`complete_owned` takes it. Nothing is committed then. The caller's rollback
        discards the record. Without ``connection`` it is one transaction of its own, committed
        before returning.

        ``prune(before)`` deletes the records of the update rows it deletes. A record whose
        update row stays is kept, whatever the row's state.

        Returns:
            :obj:`bool`: Whether the attempt owns the update. :obj:`True` means the key's record
            stands, this one or an earlier one. :obj:`False` means nothing was written.
        """

    def steps_of(self, update_id: int) -> List[StepRecord]:
        """The records of ``update_id``, by ``recorded_at`` and then by key."""

    # -- jobs (declared: ``jobs``) -----------------------------------------------------
    def schedule_jobs(self, jobs: Sequence[JobWrite], at: int, *,
                      connection: Any = None) -> List[StoredJob]:
        """Write ``jobs`` and return them as stored, in order.

        A job that is not keyed is added. A keyed job is declared: while a live job
        (``scheduled`` or ``paused``) is keyed by the same name, that job is kept with its id
        and its runs. Its callback, data, chat, user and options become the new ones. Its next
        run stays, unless the schedule text changed: then it takes the new ``next_run_at``.
        Concurrent declarations of one name leave one job. A job without a next run is stored
        ``ended``. With ``connection`` it runs in the caller's transaction, uncommitted.
        """

    def cancel_jobs(self, job_ids: Sequence[int], at: int, *,
                    connection: Any = None) -> List[bool]:
        """Cancel jobs: they run no more. Per id, whether the job was live."""

    def due_jobs(self, now: int, limit: int) -> List[StoredJob]:
        """The ``scheduled`` jobs whose ``next_run_at <= now``, earliest first, at most
        ``limit``. A plain read."""

    def fire_jobs(self, fires: Sequence[JobFire], at: int) -> List[bool]:
        """Fire runs: per fire, whether it fired.

        A fire applies only while its job is ``scheduled`` with ``runs`` runs and its next run
        at ``due_at``. It then counts the run, moves the job on to ``next_run_at`` (``ended``
        when that is :obj:`None`) and, unless ``skip``, records ``body`` as a ``pending`` row
        ``update_id`` received at ``at`` with ``chat_key``. Both in one transaction. So a run
        fires once however many processes fire it.
        """

    def list_jobs(self, *, name: Optional[str] = None, include_ended: bool = False,
                  after_job_id: int = 0, limit: int = 1000) -> List[StoredJob]:
        """The jobs after ``after_job_id``, by id: the live ones (all with ``include_ended``),
        named ``name`` when given."""

    def get_job(self, job_id: int) -> Optional[StoredJob]:
        """One job by id, or :obj:`None`."""

    def run_job_now(self, job_id: int, at: int) -> bool:
        """Make a live job due at ``at`` (and ``scheduled``). Whether it was live."""

    # -- pacing (declared: ``pacing``) -------------------------------------------------
    def take_send_slots(
        self, wants: Sequence[Sequence[PaceBucket]], *, now: int, horizon_ms: int
    ) -> List[int]:
        """Take a send slot for each want, in order, in one transaction.

        A want is the buckets one send is paced by. It may go at the latest of ``now``, each
        bucket's next time less its tolerance, and each bucket's hold. When that is at most
        ``horizon_ms`` after ``now``, the slot is taken. Each of its buckets then moves on by
        its interval from that time. Otherwise nothing changes for that want. A bucket never
        seen is free. Concurrent callers never get overlapping slots of one bucket. A negative
        ``horizon_ms`` takes nothing: it reads when each want could go.

        Returns:
            List[:obj:`int`]: Per want, its time. A time at most ``now + horizon_ms`` is a slot
            taken. A later one is when to ask again.
        """

    def hold_sends(self, holds: Sequence[Tuple[str, int]]) -> None:
        """Hold buckets, in one transaction: each ``(key, until)`` grants no slot before ``until``.

        A hold never shortens an earlier one. ``prune(before)`` deletes the buckets whose next
        time and hold are both before ``before``.
        """

    # -- broadcasts (declared: ``broadcasts``) -----------------------------------------
    def start_broadcast(self, name: str, method: str, params_json: str,
                        at: int) -> StoredBroadcast:
        """Start the broadcast ``name`` (``active``, no recipients yet) and return it.

        A broadcast of that name that exists already is returned as it is, whatever its
        method and parameters. So starting one again after a crash goes on with it.
        """

    def add_recipients(self, broadcast_id: int, chat_ids: Sequence[int], at: int) -> int:
        """Add recipients ``pending``, due at ``at``, in one transaction. A chat the broadcast
        has already is left as it is. Returns how many were new."""

    def claim_recipients(self, sender: str, *, now: int, lease_until: int,
                         limit: int) -> List[Recipient]:
        """Claim at most ``limit`` recipients of ``active`` broadcasts for ``sender`` until
        ``lease_until``, by broadcast and chat id.

        A recipient is claimable when it is ``pending`` and due at ``now``, or ``sending``
        under a lease that ended before ``now`` (its sender died). The claim makes it
        ``sending`` and counts a try. Concurrent claims never return one recipient twice.
        """

    def settle_recipients(self, sender: str, outcomes: Sequence[RecipientOutcome],
                          at: int) -> List[bool]:
        """Record outcomes, in one transaction. Per outcome, whether it landed: only a
        recipient ``sending`` under ``sender`` takes it. ``pending`` puts the recipient back,
        due at its ``due_at``."""

    def set_broadcast_state(self, name: str, state: str,
                            at: int) -> Optional[StoredBroadcast]:
        """Set a broadcast ``active``, ``paused`` or ``cancelled`` and return it, or
        :obj:`None` when there is none of that name.

        Cancelling makes its ``pending`` recipients ``cancelled``. A cancelled broadcast stays
        cancelled. ``prune(before)`` deletes the broadcasts started before ``before`` that have
        no recipient pending or sending, with their recipients.
        """

    def list_broadcasts(self, name: Optional[str] = None) -> List[StoredBroadcast]:
        """The broadcasts by id (the one called ``name`` when given), counted."""


def missing_methods(store: object, names: "tuple[str, ...]") -> List[str]:
    """Return the names in ``names`` that ``store`` lacks or that are not callable."""
    return [name for name in names if not callable(getattr(store, name, None))]


def is_fenced(store: object) -> bool:
    """Return :obj:`True` if ``store`` has every method of :class:`FencedUpdateStore`."""
    return not missing_methods(store, FENCED_METHODS)


def is_durable(store: object) -> bool:
    """Return :obj:`True` if ``store`` has every method of :class:`DurableUpdateStore`."""
    return not missing_methods(store, DURABLE_METHODS)


# -- capabilities ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CapabilityGroup:
    """One capability of the store contract and the methods it needs, all or nothing.

    A store without ``commit`` is probed group by group. A :class:`BatchStore` declares its
    parts instead (:data:`FEATURE_GROUPS`).

    Args:
        name (:obj:`str`): The capability's name, as :class:`StoreCapabilities` lists it.
        needs (Tuple[Tuple[:obj:`str`, ...], ...]): Per operation, the methods that provide it:
            any one of them is enough.
        feature (:obj:`str`): What the runtime does with the capability.
        requires (Tuple[:obj:`str`, ...]): The groups a store with this one must have too.
    """

    name: str
    needs: Tuple[Tuple[str, ...], ...]
    feature: str
    requires: Tuple[str, ...] = ()

    @property
    def methods(self) -> Tuple[str, ...]:
        """Tuple[:obj:`str`, ...]: Every method name the group mentions, in order."""
        return tuple(name for forms in self.needs for name in forms)


def _group(name: str, needs: str, feature: str, requires: Tuple[str, ...] = ()) -> CapabilityGroup:
    """``needs``: operations separated by spaces, the forms of one operation by ``|``."""
    operations = tuple(tuple(forms.split("|")) for forms in needs.split())
    return CapabilityGroup(name, operations, feature, requires)


CAPABILITY_GROUPS: Tuple[CapabilityGroup, ...] = (
    _group("base", "add claim renew settle due prune",
           "every store: record, claim, renew, settle, hand over and prune (the unary handler)"),
    _group("fenced", "claim_owned renew_owned owns settle_owned",
           "attempt-aware handling and exhaustion handling: claims with a persisted claim id"),
    _group("durable", "exhaust due_exhaustions acknowledge_exhaustion",
           "handle_exhaustion: terminal failures kept until acknowledged", ("fenced",)),
    _group("renew_many", "renew_many", "one statement per renewal round (unary attempts)"),
    _group("renew_owned_many", "renew_owned_many",
           "one statement per renewal round (fenced attempts)", ("fenced",)),
    _group("transaction", "transaction", "attempt.transaction() without connection="),
    _group("completing", "complete_owned reopen_completed",
           "a complete=True transaction owns and settles in one statement at its start",
           ("fenced",)),
    _group("bind_bot", "bind_bot", "one table, one bot: the table records its bot"),
    _group("release", "release_many",
           "a graceful stop gives unfinished claims back at once", ("fenced",)),
    _group("liveness", "hold_liveness release_liveness take_over_dead",
           "the claims of a dead process are taken over before their lease ends"),
    _group("isolation", "claimed_suspect mark_isolated end_probation",
           "a crash is charged only to the attempt that most likely caused it"),
    _group("chat_order", "add_many_in_chats claim_in_chat_order due_in_chat_order",
           "strict_chat_order", ("fenced",)),
    _group("chat_keys", "unkeyed_in_chats set_chat_keys",
           "strict_chat_order keys rows recorded without a chat key", ("chat_order",)),
    _group("figures", "figures",
           "operators' figures: the oldest unsettled update, the exhaustions waiting, the "
           "chat held longest"),
    _group("steps", " ".join(STEP_METHODS),
           "attempt.step: a step's result is recorded while its attempt owns the update and "
           "read back by later attempts", ("fenced",)),
    _group("jobs", " ".join(JOB_METHODS),
           "durable jobs: a due run is recorded as an update row once across processes, a job "
           "scheduled by an attempt is written by its completion", ("fenced",)),
    _group("pacing", " ".join(PACE_METHODS),
           "store-wide pacing: the sends of every process share one pace and one hold"),
    _group("broadcasts", " ".join(BROADCAST_METHODS),
           "durable broadcasts: one row per recipient, each sent once by one process"),
    _group("outbox", " ".join(OUTBOX_METHODS),
           "fenced replies: the Bot API calls an attempt queued are sent iff its completion "
           "committed", ("fenced",)),
    _group("outbox_claimed_inserts", " ".join(CLAIMED_INSERT_METHODS),
           "the commit that completes an update claims its calls for this process's sender: "
           "no claim commit before sending them", ("outbox",)),
    _group("outbox_record_and_claim", " ".join(RECORD_AND_CLAIM_METHODS),
           "a sender records its results and claims the next calls (a chat's next one "
           "among them) in one commit", ("outbox",)),
    _group("state", " ".join(STATE_METHODS),
           "FencedPersistence: user_data, chat_data, bot_data and conversation states commit "
           "with the update, versioned per key", ("fenced", "outbox")),
)
"""Tuple[:class:`CapabilityGroup`, ...]: Every capability of the store contract with the
methods it needs.

It is the capability table of the store contract's reference page. A store without ``commit``
is probed for each group. A batch store's groups follow from its declaration.
"""


def takes_connection(method: Optional[Callable[..., Any]]) -> bool:
    """Whether ``method`` accepts ``connection=`` (by name or through ``**kwargs``)."""
    if method is None:
        return False
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return False
    return any(
        p.name == "connection" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
    )


@dataclass(frozen=True, slots=True)
class StoreCapabilities:
    """What a store offers, decided once from its methods (:meth:`of`).

    The runtime logs it at start.

    Args:
        store (:obj:`str`): The store's type name.
        groups (FrozenSet[:obj:`str`]): The names of the :data:`CAPABILITY_GROUPS` the store has
            whole.
        caller_transactions (:obj:`bool`): ``owns`` and ``settle_owned`` take ``connection=``.
            A ``complete=True`` transaction then settles inside the caller's commit, exactly
            once (see :meth:`BatchStore.settle_owned`).
    """

    store: str
    groups: FrozenSet[str]
    caller_transactions: bool = False

    @classmethod
    def of(cls, store: object) -> "StoreCapabilities":
        """Probe ``store`` for every capability group.

        Raises:
            TypeError: The store has part of a group but not all of it, or a group without a
                group it requires. The message names the methods it has and the ones it lacks.
        """
        name = type(store).__name__
        groups = set()
        for group in CAPABILITY_GROUPS:
            # an operation is there when any of its forms is
            have = [forms for forms in group.needs
                    if len(missing_methods(store, forms)) < len(forms)]
            if len(have) == len(group.needs):
                groups.add(group.name)
            elif have:
                lacking = [forms for forms in group.needs if forms not in have]
                raise TypeError(
                    f"{name} has {_forms(have, store)} but not {_forms(lacking, store)}: the "
                    f"{group.name} capability ({group.feature}) needs all of "
                    f"{_forms(group.needs, store)}, or none"
                )
        for group in CAPABILITY_GROUPS:
            absent = [required for required in group.requires if required not in groups]
            if group.name in groups and absent:
                wanted = [g for g in CAPABILITY_GROUPS if g.name in absent]
                raise TypeError(
                    f"{name} has the {group.name} capability ({', '.join(group.methods)}) "
                    f"without {', '.join(absent)}: it needs "
                    + "; ".join(f"{g.name}: {_forms(g.needs, store)}" for g in wanted)
                )
        connection = all(
            takes_connection(getattr(store, method, None)) for method in ("owns", "settle_owned")
        )
        return cls(name, frozenset(groups), "fenced" in groups and connection)

    def __contains__(self, group: object) -> bool:
        return group in self.groups

    def __str__(self) -> str:
        names = [group.name for group in CAPABILITY_GROUPS if group.name in self.groups]
        extra = "; owns/settle_owned take connection=" if self.caller_transactions else ""
        return f"{self.store}: {', '.join(names) or 'none'}{extra}"


def _forms(operations: Sequence[Tuple[str, ...]], store: object) -> str:
    """Name operations for a message: the form the store has, else every form (``a or b``)."""
    names = []
    for forms in operations:
        present = [name for name in forms if not missing_methods(store, (name,))]
        names.append(present[0] if present else " or ".join(forms))
    return ", ".join(names)
