"""Value types shared by the stores, the runtime and the framework adapters.

All of them are frozen dataclasses: they are safe to share between threads and to use as
dictionary keys. Store-level times are integer milliseconds since the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple, Union

__all__ = [
    "Abandoned",
    "AttemptEffects",
    "CallClaim",
    "AttemptIdentity",
    "Completed",
    "Exhaustion",
    "Failed",
    "OutboxCall",
    "OutboxEntry",
    "Settlement",
    "StateConflict",
    "StateEntry",
    "StateKey",
    "StateWrite",
    "StoreFigures",
    "StoredUpdate",
]


@dataclass(frozen=True)
class AttemptIdentity:
    """The capability of one attempt at handling one update.

    The full triple is the idempotency key of everything the attempt does: a later attempt,
    or the same ``update_id`` recorded again after pruning, gets a different ``claim_id``.

    Args:
        update_id (:obj:`int`): The Telegram ``update_id``.
        attempt (:obj:`int`): The attempt number, counted from 1 per recorded row.
        claim_id (:obj:`str`): The opaque, globally unique token of this claim, as stored in the
            row. Never derive meaning from it.
    """

    update_id: int
    attempt: int
    claim_id: str


@dataclass(frozen=True)
class StoredUpdate:
    """An update as recorded in a store.

    Args:
        update_id (:obj:`int`): The Telegram ``update_id``.
        body (:obj:`str`): The update's JSON text, as received.
    """

    update_id: int
    body: str


@dataclass(frozen=True)
class Exhaustion:
    """The durable, unacknowledged terminal record of an update that will not be retried.

    Args:
        update_id (:obj:`int`): The Telegram ``update_id``.
        attempt (:obj:`int`): The number of the last attempt.
        claim_id (:obj:`str`): The claim id of the last attempt.
        body (:obj:`str`): The update's JSON text.
        exhausted_at (:obj:`int`): When the update was exhausted (epoch milliseconds).
        error (:obj:`str` | :obj:`None`): The last failure text.
    """

    update_id: int
    attempt: int
    claim_id: str
    body: str
    exhausted_at: int
    error: Optional[str]

    @property
    def identity(self) -> AttemptIdentity:
        """:class:`AttemptIdentity`: The exact identity that acknowledges this exhaustion."""
        return AttemptIdentity(self.update_id, self.attempt, self.claim_id)


@dataclass(frozen=True, slots=True)
class StoreFigures:
    """What a store counts for operators (read by the runtime's sweep, at most every few
    seconds, never per scrape of a metrics endpoint).

    A row is *unsettled* while its state is ``pending``, ``processing`` (leased or lapsed) or
    ``failed``; an *unacknowledged exhaustion* is an ``abandoned`` row whose ``settled_at`` is
    NULL. Completed rows and acknowledged (or ordinarily abandoned) rows count nowhere. See
    :class:`ptb_fence.FiguresStore` for the exact rules. Times are epoch milliseconds.

    Args:
        unsettled (:obj:`int`): How many rows are unsettled.
        oldest_unsettled_received_at (:obj:`int` | :obj:`None`): The smallest ``received_at`` of
            the unsettled rows; :obj:`None` when there are none.
        exhaustions_waiting (:obj:`int`): How many unacknowledged exhaustions wait for their
            acknowledgement.
        oldest_exhaustion_at (:obj:`int` | :obj:`None`): The smallest ``due_at`` (when the
            update was exhausted, :attr:`Exhaustion.exhausted_at`) of those; :obj:`None` when
            there are none.
        held_chat (:obj:`int` | :obj:`None`, optional): A store that keeps chat order
            (:class:`ptb_fence.ChatOrderedUpdateStore`): of the chat keys with two or more
            unsettled rows (a chat whose later updates wait behind its oldest one), the one
            whose oldest unsettled row (smallest ``received_at``) is the oldest; on a tie the
            smaller chat key. :obj:`None` when no chat has two unsettled rows, and always for
            a store without chat keys. Defaults to :obj:`None`.
        held_chat_since (:obj:`int` | :obj:`None`, optional): The ``received_at`` of that
            chat's oldest unsettled row; :obj:`None` exactly when ``held_chat`` is. Defaults to
            :obj:`None`.
    """

    unsettled: int
    oldest_unsettled_received_at: Optional[int]
    exhaustions_waiting: int
    oldest_exhaustion_at: Optional[int]
    held_chat: Optional[int] = None
    held_chat_since: Optional[int] = None


OUTBOX_STATES = ("pending", "sending", "sent", "failed")
"""The states of an outbox call, in the order a call goes through them."""


@dataclass(frozen=True, slots=True)
class OutboxCall:
    """A Bot API call queued by an attempt, sent only if that attempt's completion commits.

    Args:
        method (:obj:`str`): The Bot API method, e.g. ``"sendMessage"``.
        params_json (:obj:`str`): The call's parameters as the text of a JSON object (after
            the bot's defaults were applied).
        chat_key (:obj:`int` | :obj:`None`): The chat the call goes to (the chat id, else the
            user id: the key chat order uses); the store sends the calls of one chat one at a
            time, in order. :obj:`None`: no chat, never ordered.
        seq (:obj:`int`): The call's position among the calls of its attempt (0, 1, ...).
        at_most_once (:obj:`bool`, optional): An unknown outcome (a network error after the
            request left) ends the call ``failed`` instead of sending it again. Defaults to
            :obj:`False`.
    """

    method: str
    params_json: str
    chat_key: Optional[int]
    seq: int
    at_most_once: bool = False


STATE_KINDS = ("user", "chat", "bot", "conversation", "callback")
"""The kinds of persisted bot state: a user's ``user_data``, a chat's ``chat_data``, the
``bot_data``, one conversation's state and the callback-data cache."""


class StateKey(NamedTuple):
    """Which piece of persisted bot state a row holds.

    Immutable, compared and hashed by its three fields (a named tuple: an update's state
    keys are looked up in several dicts per update, and a tuple hashes and compares in C).

    Args:
        kind (:obj:`str`): One of ``user``, ``chat``, ``bot``, ``conversation``, ``callback``.
        name (:obj:`str`): The conversation handler's name for ``conversation``; empty
            otherwise.
        key (:obj:`str`): The user id or chat id as decimal text (``user``, ``chat``), the
            conversation key's JSON text (``conversation``), the keyboard's uuid (``callback``:
            one row per keyboard of PTB's callback-data cache); empty for ``bot``.
    """

    kind: str
    name: str = ""
    key: str = ""


class StateEntry(NamedTuple):
    """A row of persisted bot state as stored (immutable: a named tuple, as
    :class:`StateKey`; several are made per update).

    Args:
        value (:obj:`str` | :obj:`None`): The state's encoded text (the store never reads
            it); :obj:`None` once the state was deleted (the row keeps its version).
        version (:obj:`int`): How many writes landed on the row (1 after the first).
    """

    value: Optional[str]
    version: int


@dataclass(frozen=True, slots=True)
class StateWrite:
    """A change to one piece of persisted bot state, conditional on its version.

    It lands only if the row's version is still ``version`` (the one the attempt read; ``0``:
    the row must not exist) and then leaves the row at ``version + 1``: two attempts that
    changed the same state from the same version never both land.

    Args:
        key (:class:`StateKey`): The state written.
        value (:obj:`str` | :obj:`None`): The new encoded text; :obj:`None` deletes the state
            (the row stays, with its version, so a stale writer is still refused).
        version (:obj:`int`): The version the attempt read (``0``: none).
    """

    key: StateKey
    value: Optional[str]
    version: int


@dataclass(frozen=True, slots=True)
class StateConflict:
    """A completion that did not land because state it wrote changed since it was read.

    Returned by a settle in place of :obj:`False` (it is falsy, so code that only asks
    whether a settle landed reads it as not landed). The attempt still holds its claim: fail
    it and retry from fresh state.

    Args:
        keys (Tuple[:class:`StateKey`, ...]): The state whose version had moved.
    """

    keys: Tuple[StateKey, ...]

    def __bool__(self) -> bool:
        return False


Landing = Union[bool, StateConflict]
"""Per settled item: whether it landed, or the :class:`StateConflict` that stopped it."""


@dataclass(frozen=True, slots=True)
class CallClaim:
    """Terms on which a completion's commit claims the calls it inserts for sending, so the
    sender of this process needs no claim commit of its own before it sends them (see
    :class:`ptb_fence.contract.ClaimedInsertOutboxStore`).

    Args:
        sender (:obj:`str`): The sender token the calls are claimed under.
        lease_until (:obj:`int`): The end of that sender's lease on them (epoch ms).
        limit (:obj:`int`): At most this many of the attempt's calls (the first ones, in
            order) are inserted claimed; the others are inserted ``pending``.
    """

    sender: str
    lease_until: int
    limit: int


@dataclass(frozen=True, slots=True)
class AttemptEffects:
    """What an attempt's completion writes besides its settlement, in the same commit.

    Args:
        calls (Tuple[:class:`OutboxCall`, ...], optional): The Bot API calls the attempt
            queued, in order. Defaults to none.
        claim (:class:`CallClaim` | :obj:`None`, optional): Insert the first ``claim.limit``
            calls already claimed for sending, each one whose chat has no call ``pending``
            or ``sending`` at that moment (only a store with ``claimed_calls`` is given
            one). Defaults to :obj:`None`: every call is inserted ``pending``.
        state (Tuple[:class:`StateWrite`, ...], optional): The persisted bot state the attempt
            changed; all of them land with the completion or none does (a moved version makes
            the completion a :class:`StateConflict`). Defaults to none.
    """

    calls: Tuple[OutboxCall, ...] = ()
    claim: Optional[CallClaim] = None
    state: Tuple[StateWrite, ...] = ()


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """A call as stored in the outbox.

    ``state`` is ``pending`` (waits until ``due_at``), ``sending`` (claimed by a sender whose
    lease ends at ``due_at``), ``sent`` or ``failed``. Times are epoch milliseconds.

    Args:
        call_id (:obj:`int`): The store's id of the call; later calls get higher ids.
        update_id (:obj:`int`): The update whose attempt queued the call.
        attempt (:obj:`int`): That attempt's number.
        claim_id (:obj:`str`): That attempt's claim id.
        seq (:obj:`int`): The call's position among the calls of its attempt.
        chat_key (:obj:`int` | :obj:`None`): The call's chat (:obj:`None`: no chat).
        method (:obj:`str`): The Bot API method.
        params_json (:obj:`str`): The parameters, a JSON object's text.
        at_most_once (:obj:`bool`): An unknown outcome fails the call instead of resending it.
        state (:obj:`str`): ``pending``, ``sending``, ``sent`` or ``failed``.
        tries (:obj:`int`): How many times a sender claimed the call (a release does not
            count).
        due_at (:obj:`int`): Pending: when it may be sent; sending: the sender's lease end;
            failed: when it failed.
        created_at (:obj:`int`): When the completion that queued it committed.
        sent_at (:obj:`int` | :obj:`None`): When it was recorded sent.
        error (:obj:`str` | :obj:`None`): The last failure text.
        result_json (:obj:`str` | :obj:`None`): The Bot API result of a sent call.
        acknowledged (:obj:`bool`): For a failed call: whether its failure was delivered and
            acknowledged.
    """

    call_id: int
    update_id: int
    attempt: int
    claim_id: str
    seq: int
    chat_key: Optional[int]
    method: str
    params_json: str
    at_most_once: bool
    state: str
    tries: int
    due_at: int
    created_at: int
    sent_at: Optional[int]
    error: Optional[str]
    result_json: Optional[str]
    acknowledged: bool

    @property
    def identity(self) -> AttemptIdentity:
        """:class:`AttemptIdentity`: The attempt that queued the call."""
        return AttemptIdentity(self.update_id, self.attempt, self.claim_id)


@dataclass(frozen=True)
class Completed:
    """Settlement: the attempt handled the update.

    Args:
        at (:obj:`int`): When it completed (epoch milliseconds).
    """

    at: int


@dataclass(frozen=True)
class Failed:
    """Settlement: the attempt failed and the update is to be retried.

    Args:
        at (:obj:`int`): When it failed (epoch milliseconds).
        retry_at (:obj:`int`): When the update becomes due again (epoch milliseconds).
        error (:obj:`str`): The failure text.
    """

    at: int
    retry_at: int
    error: str


@dataclass(frozen=True)
class Abandoned:
    """Settlement: the attempt failed and the update will not be retried.

    Args:
        at (:obj:`int`): When it was abandoned (epoch milliseconds).
        error (:obj:`str`): The failure text.
    """

    at: int
    error: str


Settlement = Union[Completed, Failed, Abandoned]
"""The result of one attempt: :class:`Completed`, :class:`Failed` or :class:`Abandoned`."""
