"""The store contract: three capability levels, detected by duck typing, plus the optional
capabilities the runtime uses when a store offers them (:class:`BatchUpdateStore`,
:class:`TransactionalUpdateStore`, :class:`BotBoundStore`, :class:`ReleasingUpdateStore`,
:class:`LivenessStore`, :class:`IsolatingUpdateStore`, :class:`ChatOrderedUpdateStore`,
:class:`CompletingUpdateStore`, :class:`ClaimingUpdateStore`, :class:`FiguresStore`,
:class:`OutboxStore`).

The contract is batch-first: where an operation has a batch form (``claim_owned_many``,
``renew_owned_many``, ``settle_owned_many``) a store may offer that form alone and the runtime
derives the single-row call from it. :data:`CAPABILITY_GROUPS` lists which methods each
capability needs; a group is all or nothing (:class:`StoreCapabilities` refuses a store that
has part of one). The six base methods are the one group every store has, unchanged.

Every method is blocking and each rule is one conditional statement on one row. The methods'
docstrings below state the rules; :func:`ptb_fence.conformance.check_update_store` checks them,
boundaries included (a lease is held while ``due_at >= now``; a failed row is due when
``due_at <= now``; ``prune`` deletes only when ``settled_at < before``). Times are integer
milliseconds since the epoch.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    FrozenSet,
    List,
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
    OutboxEntry,
    Settlement,
    StateConflict,
    StateEntry,
    StateKey,
    StateWrite,
    StoreFigures,
    StoredUpdate,
)

__all__ = [
    "BASE_METHODS",
    "BATCH_METHODS",
    "BatchUpdateStore",
    "BotBoundStore",
    "CAPABILITY_GROUPS",
    "CHAT_KEYING_METHODS",
    "CHAT_ORDER_METHODS",
    "ChatKey",
    "ChatOrderedUpdateStore",
    "ChatRow",
    "CapabilityGroup",
    "ClaimTerms",
    "ClaimingUpdateStore",
    "COMPLETING_METHODS",
    "CompletingUpdateStore",
    "TransactionalUpdateStore",
    "DURABLE_METHODS",
    "DurableUpdateStore",
    "FENCED_METHODS",
    "FencedUpdateStore",
    "FIGURES_METHODS",
    "FiguresStore",
    "ISOLATING_METHODS",
    "IsolatingUpdateStore",
    "LIVENESS_METHODS",
    "LivenessStore",
    "CLAIMED_INSERT_METHODS",
    "RECORD_AND_CLAIM_METHODS",
    "ClaimedInsertOutboxStore",
    "RecordAndClaimOutboxStore",
    "OUTBOX_METHODS",
    "OutboxStore",
    "ReleasingUpdateStore",
    "STATE_METHODS",
    "StateStore",
    "StoreCapabilities",
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

BATCH_METHODS = (
    "add_many",
    "add_claimed_many",
    "add_claimed_and_settle_many",
    "renew_many",
    "renew_owned_many",
    "settle_owned_many",
    "settle_and_claim_many",
)
"""The optional methods of :class:`BatchUpdateStore`; each is independently optional."""

LIVENESS_METHODS = ("hold_liveness", "release_liveness", "take_over_dead")
"""The methods of :class:`LivenessStore` (all three or none)."""

ISOLATING_METHODS = ("claimed_suspect", "mark_isolated", "end_probation")
"""The methods of :class:`IsolatingUpdateStore` (all or none)."""

CHAT_ORDER_METHODS = ("add_many_in_chats", "claim_in_chat_order", "due_in_chat_order")
"""The methods of :class:`ChatOrderedUpdateStore` (all three or none)."""

CHAT_KEYING_METHODS = ("unkeyed_in_chats", "set_chat_keys")
"""The optional pair of a :class:`ChatOrderedUpdateStore` that keys rows recorded without a
chat key (both or none)."""

COMPLETING_METHODS = ("complete_owned", "reopen_completed")
"""The methods of :class:`CompletingUpdateStore` (both or none)."""

FIGURES_METHODS = ("figures",)
"""The method of :class:`FiguresStore`."""

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
"""The methods of :class:`OutboxStore` (all or none; the store's ``settle_owned_many`` and
``add_claimed_and_settle_many`` then also take ``effects=``)."""

CLAIMED_INSERT_METHODS = ("claimed_calls",)
"""The method of :class:`ClaimedInsertOutboxStore` (an outbox store whose effect inserts honour
:attr:`AttemptEffects.claim <ptb_fence.AttemptEffects.claim>`)."""
RECORD_AND_CLAIM_METHODS = ("record_sent_and_claim",)
"""The method of :class:`RecordAndClaimOutboxStore` (an outbox store that records results and
claims the next calls in one commit)."""
STATE_METHODS = ("read_state", "write_state", "list_state")
"""The methods of :class:`StateStore` (all or none; the store's ``settle_owned_many``,
``add_claimed_and_settle_many`` and ``write_effects`` then also write
:attr:`AttemptEffects.state`)."""

Row = Tuple[int, str, int]
"""An update to record: ``(update_id, body, received_at)``."""

ChatRow = Tuple[int, str, int, Optional[int]]
"""An update to record with its chat key: ``(update_id, body, received_at, chat_key)``;
``chat_key`` :obj:`None` means the update belongs to no chat (it is never ordered)."""

ChatKey = Tuple[int, str, int]
"""The chat key of a recorded row: ``(update_id, body, chat_key)``."""


@dataclass(frozen=True, slots=True)
class ClaimTerms:
    """The terms every claim of one call is made on: what :meth:`UpdateStore.claim` takes as
    keywords, as one value for the batch claims (:meth:`ClaimingUpdateStore.claim_owned_many`).

    A store author reads the fields; the runtime builds the value once per claim call.

    Args:
        now (:obj:`int`): The claim time (epoch milliseconds): a row is claimable at ``now``
            (``pending``; ``failed`` with ``due_at <= now``; ``processing`` with
            ``due_at < now``).
        lease_until (:obj:`int`): The lease of a claim made (``due_at``); ``>= now``.
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
        """Insert a pending row; :obj:`False` if ``update_id`` exists in any state."""

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

        If the row is claimable but its attempts are spent, abandon it (an unacknowledged
        exhaustion when ``durable_exhaustion``) and return :obj:`None`. Return :obj:`None` as well
        for a live lease, a final row or an unknown id.
        """

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """Extend the lease of ``attempt`` to at least ``lease_until``; never shortens it and,
        with ``now``, never revives an expired one. :obj:`True` when the row matched."""

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Record the result of ``attempt`` if it still holds an unexpired lease at
        ``settlement.at``; otherwise do nothing."""

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """Rows to hand over: pending with ``received_at <= pending_before``, failed with
        ``due_at <= now``, processing with ``due_at < now``; by ``update_id``; at most
        ``limit``.

        A store with :meth:`ReleasingUpdateStore.release_many` also lists every *released*
        row at once, whatever ``pending_before``: a pending row that carries a claim id (only
        a release leaves one on a pending row; ``add`` never writes one)."""

    def prune(self, before: int) -> int:
        """Delete completed and abandoned rows with ``settled_at < before``; return the count."""


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

        With ``connection`` (the caller's DB-API connection or cursor), the check runs on it,
        inside the caller's transaction (PostgreSQL: ``SELECT … FOR UPDATE``); see
        :class:`TransactionalUpdateStore` for what the runtime relies on.
        """

    def settle_owned(self, identity: AttemptIdentity, settlement: Settlement) -> bool:
        """As :meth:`settle`, and the claim id must match; returns whether it landed.

        The ``connection=`` keyword is an optional capability: see
        :class:`TransactionalUpdateStore`.
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
        """Acknowledge the exhaustion with exactly this identity; it becomes prunable."""


class BatchUpdateStore(Protocol):
    """Optional: several rows per call (one statement and one commit in the SQL stores).

    Each method is independently optional; the runtime uses the ones a store has and falls back
    to the loop of single calls for the others. Each must equal that loop row by row,
    refusals included, and land all or nothing (one commit). :meth:`renew_owned_many` and
    :meth:`settle_owned_many` are also the batch forms of
    :meth:`FencedUpdateStore.renew_owned` and :meth:`FencedUpdateStore.settle_owned`: a store
    with the batch form needs no single one (see :data:`CAPABILITY_GROUPS`).
    """

    def add_many(self, rows: Sequence[Row]) -> List[bool]:
        """``[add(*row) for row in rows]`` in one commit, all or nothing."""

    def add_claimed_many(
        self, rows: Sequence[Row], *, lease_until: int
    ) -> List[Optional[AttemptIdentity]]:
        """Record fresh updates already claimed for attempt 1, in one commit.

        Per row: a new ``update_id`` is inserted as ``processing`` with ``attempts = 1``,
        ``due_at = lease_until`` and a fresh claim id, and its identity is returned; an existing
        one returns :obj:`None` and changes nothing — except where :meth:`UpdateStore.add`
        documents that a *different* update replaces a settled row: then the row is replaced
        by the claimed one and its identity is returned.
        """

    def add_claimed_and_settle_many(
        self,
        rows: Sequence[Row],
        *,
        lease_until: int,
        settlements: Sequence[Tuple[AttemptIdentity, Settlement]],
    ) -> Tuple[List[Optional[AttemptIdentity]], List[bool]]:
        """:meth:`add_claimed_many` and :meth:`settle_owned_many` in one commit."""

    def renew_many(
        self, leases: Sequence[Tuple[int, int]], lease_until: int, now: int
    ) -> List[Optional[bool]]:
        """Renew ``(update_id, attempt)`` leases as :meth:`UpdateStore.renew` with ``now``.

        Per position: :obj:`True` renewed, :obj:`False` refused, :obj:`None` the row is locked
        by another open transaction right now (undecided; PostgreSQL ``FOR UPDATE SKIP
        LOCKED``): neither renewed nor refused.
        """

    def renew_owned_many(
        self, identities: Sequence[AttemptIdentity], lease_until: int, now: int
    ) -> List[Optional[bool]]:
        """As :meth:`renew_many` for :meth:`FencedUpdateStore.renew_owned` (claim ids must
        match); :obj:`None` means locked right now, undecided."""

    def settle_owned_many(
        self, items: Sequence[Tuple[AttemptIdentity, Settlement]]
    ) -> List[bool]:
        """``[settle_owned(i, s) for i, s in items]`` in one commit; per position whether that
        settlement landed."""

    def settle_and_claim_many(
        self,
        settlements: Sequence[Tuple[AttemptIdentity, Settlement]],
        update_ids: Sequence[int],
        terms: ClaimTerms,
    ) -> Tuple[List[bool], List[Optional[AttemptIdentity]]]:
        """:meth:`settle_owned_many` then :meth:`ClaimingUpdateStore.claim_owned_many`
        (``update_ids`` on ``terms``) in one commit, all or nothing; returns both results.

        The runtime claims the updates that take the slots of finished attempts in the commit
        that settles those attempts, so the claims a process holds stay bounded with one commit
        per group instead of two. An outbox store also takes ``effects=`` here, as in
        :meth:`settle_owned_many`.
        """


class ClaimingUpdateStore(Protocol):
    """Optional: claim several rows for their next attempt in one statement (one commit in
    the SQL stores). It is also the batch form of :meth:`FencedUpdateStore.claim_owned`: a
    store with it needs no ``claim_owned`` (the runtime claims one row as a batch of one);
    without it the runtime claims row by row with ``claim_owned``.

    :meth:`claim_owned_many` applies exactly the rule of ``claim_owned`` to each row, on the
    same :class:`ClaimTerms`: a claimable row (``pending``; ``failed`` with ``due_at <= now``;
    ``processing`` with ``due_at < now`` — a lease is held while ``due_at >= now``) whose
    ``attempts < max_attempts`` is taken for attempt ``attempts + 1`` with lease
    ``lease_until`` and a fresh claim id; a claimable row whose attempts are spent is abandoned
    exactly as ``claim_owned`` abandons it (an unacknowledged exhaustion with
    ``durable_exhaustion``) and gives no identity. Everything lands in one commit, all or
    nothing. ``lease_until >= now`` is assumed (a claim made by the call is then live for the
    rest of it).

    A store written for the earlier form, ``claim_owned_many(update_ids, *, now, lease_until,
    max_attempts, durable_exhaustion=False)`` (keywords, told apart by its ``now`` parameter),
    keeps working: the runtime calls it that way.

    The runtime uses it for the updates that start together (the slots freed by one grouped
    completion, a backlog handed over by a sweep): one commit for all their claims.
    """

    def claim_owned_many(
        self, update_ids: Sequence[int], terms: ClaimTerms
    ) -> List[Optional[AttemptIdentity]]:
        """``[claim_owned(u, **terms) for u in update_ids]`` in one statement.

        Returns:
            Per input position the identity (read back from the row) or :obj:`None`: not
            claimable at ``terms.now`` (a live lease, a ``failed`` row before its retry time, a
            completed or abandoned row), attempts spent (the row is abandoned), an unknown id,
            or an id repeated in ``update_ids`` (claimed at its first position only). A store
            may lock the rows in ``update_id`` order; a row held by an open transaction is
            waited for, as ``claim_owned`` waits.
        """


@runtime_checkable
class TransactionalUpdateStore(Protocol):
    """Optional: fenced writes inside a transaction, for ``Attempt.transaction``.

    Without :meth:`transaction`, ``Attempt.transaction()`` needs ``connection=``. Without the
    ``connection=`` keyword on :meth:`owns`/:meth:`settle_owned`, a caller's transaction is not
    fenced by the database: ownership is checked on the store before the block (advisory) and
    ``complete=True`` settles right *after* the caller's commit — at-least-once completion, not
    exactly-once (the runtime logs one WARNING naming this at start).
    """

    def transaction(self) -> ContextManager[Any]:
        """Open a transaction on a connection of the store's driver and yield the connection
        (:obj:`None` where there is none, e.g. the memory store); commit on normal exit, roll
        back on an exception."""

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """As :meth:`FencedUpdateStore.owns`. With ``connection`` (the caller's DB-API
        connection or cursor) the check runs on it, inside the caller's transaction, and holds
        the row until that transaction ends (PostgreSQL ``SELECT … FOR UPDATE``; SQLite the
        database's write lock)."""

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, *, connection: Any = None
    ) -> bool:
        """As :meth:`FencedUpdateStore.settle_owned`. With ``connection`` the statement runs on
        the caller's connection inside its transaction, so it commits or rolls back with it."""


class CompletingUpdateStore(Protocol):
    """Optional (with :class:`TransactionalUpdateStore`): a fenced ``complete=True``
    transaction checks ownership and settles in ONE conditional statement at its start.

    Without it the runtime checks with ``owns(connection=)`` first and settles with
    ``settle_owned(connection=)`` last: the same result, one statement more. Both methods run
    on the caller's connection (or cursor) and never end the caller's transaction.
    """

    def complete_owned(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Inside the caller's open transaction: if this exact claim (update id, attempt and
        claim id) is ``processing`` with ``due_at >= at`` (a lease ending exactly at ``at``
        still holds), set it ``completed`` with ``settled_at = at`` (lease and attempts kept)
        and keep its row held until that transaction ends (PostgreSQL: the row lock of the
        ``UPDATE``; SQLite: the database's write lock), so a competing claim waits and then
        sees the completed row. One statement; nothing is committed here.

        The caller's commit lands the completion with the caller's writes; the caller's
        rollback restores the claim exactly as it was (still owned, same lease), so the
        attempt can write again, fail or be retried normally.

        Returns:
            :obj:`bool`: Whether this claim was owned at ``at`` and is now completed in the
            caller's transaction (:obj:`False`: nothing changed).
        """

    def reopen_completed(self, identity: AttemptIdentity, at: int, *, connection: Any) -> bool:
        """Undo a :meth:`complete_owned` that a caller committed by mistake (the caller's
        block committed its own transaction): only the row of this exact claim that is
        ``completed`` with ``settled_at = at`` goes back to ``processing`` (``settled_at``
        NULL, lease, attempts and claim id kept). Runs on ``connection`` (its transaction
        ended) and commits at once.

        Returns:
            :obj:`bool`: Whether that completion was undone (:obj:`False`: the caller's block
            rolled back, or the row is not that completion).
        """


@runtime_checkable
class BotBoundStore(Protocol):
    """Optional: a store that records which bot owns its table."""

    def bind_bot(self, bot_id: int) -> None:
        """Record that the table belongs to bot ``bot_id`` (the first binder wins).

        Raises:
            ptb_fence.TableBotMismatch: The table belongs to another bot.
        """


class ReleasingUpdateStore(Protocol):
    """Optional: give claimed updates back at once, without spending their attempt."""

    def release_many(self, identities: Sequence[AttemptIdentity], *, at: int) -> List[bool]:
        """Release the exact claims in ``identities``, in one statement (one commit).

        Per identity whose row is ``processing`` with that attempt and claim id (the lease need
        not be live): ``state = 'pending'``, ``attempts = attempts - 1`` (the attempt is not
        counted as spent), ``due_at = at``, ``error`` and ``claim_id`` kept. The row is then
        claimable at once by any process and listed by ``due`` whatever ``pending_before``;
        the next claim returns the same attempt number with a fresh claim id, so the released
        identity is refused by ``owns``/``renew_owned``/``settle_owned`` from the release on.

        Returns:
            Per input position, whether that claim was released (:obj:`False`: not this claim,
            not processing, an id repeated in the input, or — PostgreSQL — the row is locked by
            an open transaction right now).
        """


class LivenessStore(Protocol):
    """Optional: a store object holds a liveness signal for the process using it, claims
    made through it record that *instance*, and another process can take over the claims of
    a provably dead instance before their lease ends.

    "Provably dead" means the signal is gone in a way only the end of the process explains
    (PostgreSQL: a session advisory lock of the instance's connection that is free while the
    instance has stopped refreshing its row; SQLite: an OS file lock on a file that names the
    instance). A live process that lost its signal (a terminated backend, a deleted lock file)
    holds it again and is never taken for dead meanwhile; a frozen process (SIGSTOP, a long GC
    pause) still holds it: the claims of both wait for their lease as before. A child made by
    ``os.fork()`` does not keep its parent's signal.
    """

    def hold_liveness(self) -> str:
        """Start holding this store object's liveness signal (idempotent); return the
        instance id (opaque, non-empty text). Claims made through this object from now on
        record it."""

    def release_liveness(self) -> None:
        """Stop holding the signal (graceful stop; also done by ``close()``) and forget the
        instance. Idempotent. Rows it claimed keep their lease (release them first)."""

    def take_over_dead(self, *, now: int) -> int:
        """Make the ``processing`` rows of every provably dead instance claimable at ``now``
        and forget those instances. Never touches the caller's own instance or a live (even
        frozen) one. Never waits for a row that another transaction still locks (a database
        session that outlived its process): such a row is left, and its instance kept, for a
        later call.

        Without :class:`IsolatingUpdateStore` every such row keeps its attempts and claim id
        (``due_at = min(due_at, now - 1)``): a crashed attempt counts as spent, as after a
        lapsed lease. With it, only a row whose current claim was marked isolated
        (:meth:`IsolatingUpdateStore.mark_isolated`: its handler ran on probation or alone
        in the dead process) is handled so. Every other row is given back as
        :meth:`ReleasingUpdateStore.release_many` gives it (``pending``, ``attempts - 1``,
        ``due_at = now``, claim id kept). It becomes *suspect*, or *suspect again* when its
        handler had started there as a suspect (see there).

        A store with the outbox (:class:`OutboxStore`) also lets the lease of every
        ``sending`` call of a dead instance's sender lapse now (``due_at = now - 1``): the
        runtime's sender token ends with ``@<instance>`` (the instance its process holds), so
        those calls are claimable at once, as the instance's updates are.

        Returns:
            The number of rows made claimable (updates and outbox calls).
        """


class IsolatingUpdateStore(Protocol):
    """Optional (all three methods or none; used with :class:`LivenessStore`): a crash is
    charged only to the attempt that most likely caused it.

    Several handlers start together in one process, so when it dies nobody knows which one
    killed it. With this capability ``take_over_dead`` counts a dead instance's attempt as
    spent only when that exact claim was *marked* (:meth:`mark_isolated`). The attempts of
    the other rows are given back and those rows become *suspect*. The runtime starts the
    handler of a suspect row *on probation*: it marks the claim, starts the handler, and no
    other handler of the process starts until the probation ends (a fraction of a second, or
    the attempt's end). Then it ends the mark (:meth:`end_probation`) and the next suspect
    may start. A handler that kills its process as it starts is charged alone, and the
    updates of an ordinary crash run together again after a short stagger. A suspect row
    whose handler had started as a suspect in the process that died, and was not charged,
    is *suspect again*: its next attempt runs alone, marked for its whole run. So a handler
    that keeps killing its process spends its own attempts only.

    Suspect rows are rare (only a dead instance makes them): a claim of a row that is not
    suspect costs no statement more.
    """

    def claimed_suspect(self, identity: AttemptIdentity) -> int:
        """The suspicion of the row that ``identity``, a claim made through this store object
        in this process, took.

        Answered from what the claim statement read back (no statement): each claim is
        answered once, then forgotten; an identity this object did not claim (or already
        answered) is 0. A claim of a fresh row (``add_claimed_many``) is never suspect.

        Returns:
            :obj:`int`: 0 (not suspect), 1 (suspect: its handler starts on probation) or 2
            (suspect again: its handler runs alone).
        """

    def mark_isolated(self, identity: AttemptIdentity, *, at: int) -> bool:
        """Record, in one statement committed before returning, that the handler of this exact
        claim starts now on probation or alone: the row that is ``processing`` with that
        update id, attempt and claim id and a lease live at ``at`` (``due_at >= at``) is
        marked; nothing else changes.

        Returns:
            :obj:`bool`: Whether it landed (:obj:`False`: not this claim, not processing, or
            its lease ended before ``at``).
        """

    def end_probation(self, identity: AttemptIdentity, *, at: int) -> bool:
        """Record, in one statement committed before returning, that the handler of this exact
        claim, marked by :meth:`mark_isolated`, ran past its probation: the mark ends, and a
        crash of its process from now on gives the row back as suspect again instead of
        charging its attempt. Lands under the same conditions as :meth:`mark_isolated`, and
        only while the claim is marked.

        Returns:
            :obj:`bool`: Whether it landed.
        """


class ChatOrderedUpdateStore(Protocol):
    """Optional (all three methods or none): the store keeps the order of each chat, for
    ``strict_chat_order``.

    A row may carry a *chat key* (an integer), written once when the row is recorded by
    :meth:`add_many_in_chats`; rows recorded otherwise have none. At time ``now``:

    - a row is *unsettled* while its state is ``pending``, ``processing`` (leased or lapsed)
      or ``failed`` (waiting for its retry or due); ``completed`` and ``abandoned`` rows are
      settled, an unacknowledged exhaustion included: an exhausted update releases its chat;
    - a row with chat key ``k`` is *in turn* at ``now`` when no *other* row with chat key ``k``
      is unsettled with a smaller ``update_id``, and no other row with chat key ``k`` is
      ``processing`` with a lease live at ``now`` (``due_at >= now``; a lapsed lease blocks
      only rows above it). A row without a chat key is always in turn.

    So of each chat at most one row is in turn (its lowest unsettled one, while no attempt of
    the chat runs). Each check is part of the one conditional statement that claims or lists,
    so it holds across processes sharing the store (within each claim statement's view: an
    update recorded *after* a higher one of its chat was claimed is not ordered before it).

    Rows recorded without a chat key by a process without ``strict_chat_order`` (or before it
    was turned on) would never be ordered. A store that also has the optional pair
    ``unkeyed_in_chats(*, after_update_id=None, limit)`` (the unsettled rows without a chat key,
    by ``update_id``, after ``after_update_id``, as :class:`~ptb_fence.StoredUpdate`) and
    ``set_chat_keys(keys)`` (for ``(update_id, body, chat_key)``: set the key of a row that has
    none, is unsettled and holds exactly ``body``, in one commit; return how many were set)
    has them keyed from their stored bodies when a ``strict_chat_order`` runtime starts, before
    its first claim; without the pair it logs a WARNING instead.
    """

    def add_many_in_chats(self, rows: Sequence[ChatRow]) -> List[bool]:
        """As :meth:`BatchUpdateStore.add_many` for ``(update_id, body, received_at,
        chat_key)`` rows, recording each row's chat key (:obj:`None`: no chat). A row that
        is not inserted (the id exists) keeps the chat key it has; a settled row replaced by a
        different update (see :meth:`UpdateStore.add`) takes the new one."""

    def claim_in_chat_order(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """As :meth:`FencedUpdateStore.claim_owned`, and the row must also be in turn at
        ``now``; otherwise return :obj:`None` and change nothing (a row whose attempts are
        spent is abandoned only when it is in turn)."""

    def due_in_chat_order(
        self, *, now: int, pending_before: int, limit: int, chat_key: Optional[int] = None
    ) -> List[StoredUpdate]:
        """As :meth:`UpdateStore.due`, listing only rows in turn at ``now`` (so at most one
        row per chat key; a chat whose lowest unsettled row is not due lists nothing). With
        ``chat_key``, only rows of that chat."""


class FiguresStore(Protocol):
    """Optional: the store counts, for operators, what waits in it (:class:`StoreFigures`).

    The runtime's sweep reads the figures at most every few seconds (never per scrape of a
    metrics endpoint): the age of the oldest unsettled update, the exhaustions waiting for
    their acknowledgement, and under ``strict_chat_order`` the chat held longest by one update.
    """

    def figures(self) -> StoreFigures:
        """Count the waiting rows; blocking, read-only (one read transaction, or one
        statement, in the SQL stores: the figures are one consistent view), no arguments.

        - ``unsettled``: the rows whose state is ``pending``, ``processing`` (leased or lapsed:
          there is no ``now``) or ``failed``; ``oldest_unsettled_received_at`` is the smallest
          ``received_at`` of those (:obj:`None` when there are none). ``completed`` and
          ``abandoned`` rows never count here, an unacknowledged exhaustion included.
        - ``exhaustions_waiting``: the ``abandoned`` rows whose ``settled_at`` is NULL (what
          :meth:`DurableUpdateStore.due_exhaustions` lists); an acknowledged exhaustion, or a
          row abandoned with ``settled_at`` set, does not count. ``oldest_exhaustion_at`` is the
          smallest ``due_at`` of those (when it was exhausted; :obj:`None` when there are none).
        - ``held_chat``: only a store with a chat key per row (:class:`ChatOrderedUpdateStore`);
          rows without a chat key are ignored. Of the chat keys that two or more unsettled rows
          carry (a chat whose later updates wait behind its oldest one), the one whose
          smallest ``received_at`` among its unsettled rows is the smallest; on a tie, the
          smaller chat key. ``held_chat_since`` is that smallest ``received_at``. Both are
          :obj:`None` when no chat key is carried by two unsettled rows, and always for a store
          without chat keys.

        Times are epoch milliseconds; the counts and times are :obj:`int`.

        Returns:
            :class:`StoreFigures`: The figures.
        """


class OutboxStore(Protocol):
    """Optional (all methods or none): the outbox of Bot API calls, sent iff the attempt that
    queued them committed.

    An attempt's calls (:class:`AttemptEffects`) are written in the commit that completes it:
    ``settle_owned_many(items, *, effects=...)`` and ``add_claimed_and_settle_many(..., *,
    effects=...)`` take a mapping from identity to effects and, in the same transaction as
    the settles, insert the calls of every settlement that *landed* and is
    :class:`~ptb_fence.Completed` (``pending``, ``due_at`` and ``created_at`` = the
    settlement's ``at``, ``tries`` 0); a settle that did not land writes none of its calls,
    effects of identities not settled in the call are ignored, and ``effects=None`` (or empty)
    is exactly the call without the keyword. Or :meth:`write_effects` writes them inside the
    attempt's own fenced transaction. A durable outbox store's ``acknowledge_exhaustion(identity,
    at, *, effects=...)`` inserts the calls of ``effects`` (queued by ``handle_exhaustion`` on
    ``exhaustion.outbox``) in the acknowledgement's transaction, only when it acknowledges; a
    store whose ``acknowledge_exhaustion`` takes no ``effects`` refuses ``exhaustion.outbox``.

    A call is ``pending`` (due at ``due_at``), ``sending`` (claimed by a sender token; its lease
    ends at ``due_at``, held while ``due_at >= now``), ``sent`` or ``failed`` (acknowledged or
    not). Calls with a chat key are sent one at a time per chat, in ``call_id`` order: a call
    with chat key ``k`` is claimable only when no other call of ``k`` that is ``pending`` or
    ``sending`` has a smaller ``call_id``, and none is ``sending`` under a live lease (so a held
    earlier call, due later or being sent, holds the chat; ``sent`` and ``failed`` calls release
    it). Calls without a chat key are not ordered. Each method is one transaction, except
    :meth:`write_effects`, which runs in the caller's. Times are epoch milliseconds.

    ``prune(before)`` of such a store also deletes the ``sent`` calls with ``sent_at <
    before`` and the acknowledged ``failed`` calls with ``due_at < before`` (an acknowledgement
    sets ``due_at`` to its time); it still returns the count of update rows deleted.

    The group needs the fenced group and ``settle_owned_many`` (the effects ride in its
    commit).
    """

    def write_effects(
        self, identity: AttemptIdentity, effects: AttemptEffects, at: int, *, connection: Any
    ) -> List[int]:
        """Inside the caller's open transaction on ``connection`` (as
        :meth:`CompletingUpdateStore.complete_owned` takes it): insert the calls of
        ``effects`` for ``identity`` (``pending``, ``due_at`` and ``created_at`` = ``at``).
        Nothing is committed: the caller's commit lands them, its rollback discards them. It
        does not check ownership (the caller's fenced transaction does).

        Returns:
            List[:obj:`int`]: The call ids, in the order of ``effects.calls``.
        """

    def claim_calls(
        self, *, now: int, lease_until: int, limit: int, sender: str
    ) -> List[OutboxEntry]:
        """Claim the calls to send now, lowest ``call_id`` first, at most ``limit``: a call
        is claimable when ``pending`` with ``due_at <= now``, or ``sending`` with ``due_at <
        now`` (the sender's lease lapsed), and in turn in its chat (see the class). Each
        becomes ``sending`` with ``due_at = lease_until``, ``tries + 1`` and ``sender``.
        Concurrent claimers never get the same call.

        Returns:
            List[:class:`~ptb_fence.OutboxEntry`]: The claimed calls as they are now.
        """

    def record_sent(self, items: Sequence[Tuple[int, str, str, int]]) -> List[bool]:
        """For ``(call_id, sender, result_json, at)``: a call ``sending`` by exactly
        ``sender`` becomes ``sent`` with ``sent_at = at`` and the result. One transaction.

        Returns:
            List[:obj:`bool`]: Per item, whether it landed.
        """

    def retry_call(self, call_id: int, sender: str, *, due_at: int, error: str) -> bool:
        """A call ``sending`` by ``sender`` goes back to ``pending`` at ``due_at`` with
        ``error``; whether it landed."""

    def fail_call(self, call_id: int, sender: str, *, at: int, error: str) -> bool:
        """A call ``sending`` by ``sender`` becomes ``failed`` (not acknowledged, ``due_at =
        at``, ``sent_at`` NULL) with ``error``; it releases its chat. Whether it landed."""

    def release_calls(self, call_ids: Sequence[int], sender: str, at: int) -> List[bool]:
        """Give calls back (a graceful stop): each ``sending`` by ``sender`` becomes
        ``pending`` with ``due_at = at`` and ``tries - 1``. Per call id, whether it landed."""

    def due_send_failures(
        self, *, limit: int, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """The ``failed`` calls not acknowledged, with ``call_id > after_call_id``, by
        ``call_id``, at most ``limit``."""

    def acknowledge_send_failure(self, call_id: int, at: int) -> bool:
        """A ``failed`` call not acknowledged becomes acknowledged with ``due_at = at``
        (prunable from then); whether it landed."""

    def get_call(self, call_id: int) -> Optional[OutboxEntry]:
        """The call, or :obj:`None`."""

    def list_calls(
        self, *, state: Optional[str] = None, limit: int = 100, after_call_id: Optional[int] = None
    ) -> List[OutboxEntry]:
        """The calls (of ``state``, when given) with ``call_id > after_call_id``, by
        ``call_id``, at most ``limit``."""

    def outbox_counts(self) -> Dict[str, int]:
        """How many calls per state: the keys ``pending``, ``sending``, ``sent``, ``failed``
        (not acknowledged) and ``failed_acknowledged``, each present."""

    def retry_failed_call(self, call_id: int, at: int) -> bool:
        """Operators: a ``failed`` call goes back to ``pending`` at ``at`` (not acknowledged;
        error and tries kept); whether it landed."""

    def drop_call(self, call_id: int) -> bool:
        """Operators: delete a ``pending`` or ``failed`` call; whether one was deleted."""


class ClaimedInsertOutboxStore(Protocol):
    """Optional, on an :class:`OutboxStore`: a completion's commit claims the calls it inserts
    for this process's sender, so the sender needs no claim commit before sending them.

    Having :meth:`claimed_calls` declares that every insert of :class:`AttemptEffects` (the
    ``effects=`` of the settles, and :meth:`OutboxStore.write_effects`) honours
    ``effects.claim``: of ``effects.calls`` in order, each of the first ``claim.limit`` is
    inserted ``sending`` with ``sender = claim.sender``, ``due_at = claim.lease_until`` and
    ``tries`` 1 exactly when it has no chat key or no call of its chat is ``pending`` or
    ``sending`` at that moment (the calls inserted before it in the same transaction
    included); every other call is inserted ``pending`` as without a claim. Concurrent
    transactions never both insert a claimed call of one chat: the later one sees the
    earlier one's call (SQLite: the write lock; PostgreSQL: a per-chat transaction lock taken
    after the settles). So the chat rule of :class:`OutboxStore` holds as if the claim had
    been made by :meth:`OutboxStore.claim_calls` right after the commit; a claimed call whose
    sender dies is claimable by others once its lease lapses, and ``release_calls`` gives it
    back like any other.

    A store without it gets no ``claim`` from the runtime, whose sender then claims every call
    with :meth:`OutboxStore.claim_calls`.
    """

    def claimed_calls(self, sender: str, *, limit: int) -> List[OutboxEntry]:
        """The calls ``sending`` by ``sender`` (whatever their lease), by ``call_id``, at most
        ``limit``. Reads only."""
class RecordAndClaimOutboxStore(Protocol):
    """Optional, on an :class:`OutboxStore`: a sender records the results of its calls and
    claims the next calls in one commit (a chat's next call is in turn the moment its earlier
    one is recorded, so without it every such call costs a record commit and a claim commit).
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
        """In one transaction: :meth:`OutboxStore.record_sent` of ``items``, then
        :meth:`OutboxStore.claim_calls` with the other arguments (so it sees the calls just
        recorded as sent). Returns both results: per item whether it landed, and the calls
        claimed by ``call_id``. A failure lands neither."""


class StateStore(Protocol):
    """Optional (all methods or none): persisted bot state (``user_data``, ``chat_data``,
    ``bot_data``, conversation states, the callback-data cache) that commits with the update.

    Each piece of state is one row, named by a :class:`StateKey`, holding opaque text (the
    store never reads it) and a version: the number of writes that landed on it. A
    :class:`StateWrite` lands only if the row's version is still the one the writer read (``0``:
    no row) and leaves it one higher; a write of :obj:`None` keeps the row as a tombstone with
    its version.

    An attempt's state writes (:attr:`AttemptEffects.state`) ride in the commit that completes
    it, all or none: ``settle_owned_many(items, *, effects=...)``,
    ``add_claimed_and_settle_many(..., *, effects=...)`` and ``settle_and_claim_many(..., *,
    effects=...)`` apply, for each settlement that is
    :class:`~ptb_fence.Completed` and owned, its writes together with the settle; if any of
    them finds another version, none of that item's writes is applied, the item does not
    settle (it stays claimed by the attempt) and its result is a :class:`StateConflict` naming
    the keys (falsy, so it reads as not landed) — the other items of the call still land. A
    settle that does not land for another reason applies none of its writes (:obj:`False`).
    :meth:`OutboxStore.write_effects` applies them inside the caller's open transaction and
    raises :exc:`~ptb_fence.StateConflictError` (applying none) on a moved version: the
    caller rolls back. The outbox calls of a conflicting item are not written either.

    The state table is ``<table>_persistence`` (SQLite, PostgreSQL), created with the store
    and by ``ptb-fence migrate`` / ``postgres_update_store_schema``. ``prune(before)`` deletes
    no state but the callback-data cache's keyboards (kind ``callback``, written once each)
    last written before ``before``. Each method is one transaction. The group needs the fenced group,
    ``settle_owned_many`` and the outbox (its ``write_effects`` carries the writes).
    """

    def read_state(self, keys: Sequence[StateKey]) -> Dict[StateKey, StateEntry]:
        """The rows of ``keys`` as committed, in one read (one snapshot); a key without a row
        is absent from the result (version ``0``). Tombstones are returned (value
        :obj:`None`) with their versions."""

    def write_state(self, writes: Sequence[StateWrite], at: int) -> Optional[StateConflict]:
        """Apply ``writes`` in one transaction, all or none (operators: an import). Each is
        conditional on its version as in a completion; ``at`` is the rows' change time.

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
        """The rows (of ``kind`` and ``name`` when given) whose key sorts after ``after``
        (by ``(kind, name, key)``), in that order, at most ``limit``; tombstones included."""


def missing_methods(store: object, names: "tuple[str, ...]") -> List[str]:
    """Return the names in ``names`` that ``store`` lacks or that are not callable."""
    return [name for name in names if not callable(getattr(store, name, None))]


def is_fenced(store: object) -> bool:
    """Return :obj:`True` if ``store`` has every method of :class:`FencedUpdateStore`.

    A store with batch forms instead of some single-row ones (``claim_owned_many`` for
    ``claim_owned``, ...) is fenced for the runtime (``"fenced" in StoreCapabilities.of(store)``)
    but not a :class:`FencedUpdateStore`: this answers the Protocol's question only."""
    return not missing_methods(store, FENCED_METHODS)


def is_durable(store: object) -> bool:
    """Return :obj:`True` if ``store`` has every method of :class:`DurableUpdateStore`."""
    return not missing_methods(store, DURABLE_METHODS)


# -- capabilities ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CapabilityGroup:
    """One capability of the store contract and the methods it needs, all or nothing.

    Args:
        name (:obj:`str`): The capability's name, as :class:`StoreCapabilities` lists it.
        needs (Tuple[Tuple[:obj:`str`, ...], ...]): Per operation, the methods that provide it:
            any one of them is enough (the single-row form first, then its batch forms).
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
    _group("fenced",
           "claim_owned|claim_owned_many renew_owned|renew_owned_many owns "
           "settle_owned|settle_owned_many",
           "attempt-aware handling and exhaustion handling: claims with a persisted claim id"),
    _group("durable", "exhaust due_exhaustions acknowledge_exhaustion",
           "handle_exhaustion: terminal failures kept until acknowledged", ("fenced",)),
    _group("add_many", "add_many", "one commit for the updates recorded together"),
    _group("renew_many", "renew_many", "one statement per renewal round (unary attempts)"),
    _group("claim_owned_many", "claim_owned_many",
           "one commit for the claims of updates that start together", ("fenced",)),
    _group("renew_owned_many", "renew_owned_many",
           "one statement per renewal round (fenced attempts)", ("fenced",)),
    _group("settle_owned_many", "settle_owned_many",
           "one commit for the completions that end together", ("fenced",)),
    _group("add_claimed_many", "add_claimed_many",
           "claim at ingest: record and claim fresh updates in one commit", ("fenced",)),
    _group("add_claimed_and_settle_many", "add_claimed_and_settle_many",
           "record, claim and settle in one commit", ("fenced",)),
    _group("settle_and_claim_many", "settle_and_claim_many",
           "settle finished attempts and claim the updates that take their slots in one "
           "commit", ("fenced",)),
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
    _group("outbox", " ".join(OUTBOX_METHODS),
           "fenced replies: the Bot API calls an attempt queued are sent iff its completion "
           "committed", ("fenced", "settle_owned_many")),
    _group("outbox_claimed_inserts", " ".join(CLAIMED_INSERT_METHODS),
           "the commit that completes an update claims its calls for this process's sender: "
           "no claim commit before sending them", ("outbox",)),
    _group("outbox_record_and_claim", " ".join(RECORD_AND_CLAIM_METHODS),
           "a sender records its results and claims the next calls (a chat's next one "
           "among them) in one commit", ("outbox",)),
    _group("state", " ".join(STATE_METHODS),
           "FencedPersistence: user_data, chat_data, bot_data and conversation states commit "
           "with the update, versioned per key", ("fenced", "settle_owned_many", "outbox")),
)
"""Tuple[:class:`CapabilityGroup`, ...]: Every capability of the store contract with the
methods it needs (the capability table of the store contract's reference page)."""


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


def takes_claim_keywords(method: Callable[..., Any]) -> bool:
    """Whether a batch claim is the earlier keyword form (it has a parameter ``now``) rather
    than the :class:`ClaimTerms` form; a method whose signature cannot be read takes terms."""
    try:
        return "now" in inspect.signature(method).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return False


@dataclass(frozen=True, slots=True)
class StoreCapabilities:
    """What a store offers, decided once from its methods (:meth:`of`); the runtime logs it at
    start.

    Args:
        store (:obj:`str`): The store's type name.
        groups (FrozenSet[:obj:`str`]): The names of the :data:`CAPABILITY_GROUPS` the store has
            whole.
        caller_transactions (:obj:`bool`): ``owns`` and ``settle_owned`` take ``connection=``, so
            a ``complete=True`` transaction settles inside the caller's commit (exactly-once;
            :class:`TransactionalUpdateStore`).
    """

    store: str
    groups: FrozenSet[str]
    caller_transactions: bool = False

    @classmethod
    def of(cls, store: object) -> "StoreCapabilities":
        """Probe ``store`` for every capability group.

        Raises:
            TypeError: The store has part of a group but not all of it, or a group without a
                group it requires; the message names the methods it has and the ones it lacks.
        """
        name = type(store).__name__
        groups = set()
        for group in CAPABILITY_GROUPS:
            # an operation is there when any of its forms is (single row or batch)
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
