"""Value types shared by the stores, the runtime and the framework adapters.

All of them are frozen dataclasses or named tuples.
So they are safe to share between threads and to use as dictionary keys.
Store-level times are integer milliseconds since the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple, Union

__all__ = [
    "BROADCAST_STATES",
    "BroadcastWrite",
    "RECIPIENT_STATES",
    "Recipient",
    "RecipientOutcome",
    "StoredBroadcast",
    "JOB_STATES",
    "JobFire",
    "JobWrite",
    "StoredJob",
    "Abandoned",
    "AttemptEffects",
    "CallClaim",
    "AttemptIdentity",
    "Completed",
    "Exhaustion",
    "Failed",
    "OutboxCall",
    "OutboxEntry",
    "PaceBucket",
    "Settlement",
    "StateConflict",
    "StateEntry",
    "StateKey",
    "StateWrite",
    "StepRecord",
    "StoreFigures",
    "StoredUpdate",
]


@dataclass(frozen=True)
class AttemptIdentity:
    """The capability of one attempt at handling one update.

    The full triple is the idempotency key of everything the attempt does.
    A later attempt gets a different ``claim_id``.
    So does the same ``update_id`` recorded again after pruning.

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
    """What a store counts for operators.

    The runtime's sweep reads it at most every few seconds, never per scrape of a metrics endpoint.
    A row is *unsettled* while its state is ``pending``, ``processing`` (leased or lapsed) or
    ``failed``.
    An *unacknowledged exhaustion* is an ``abandoned`` row whose ``settled_at`` is NULL.
    Completed rows and acknowledged (or ordinarily abandoned) rows count nowhere.
    :class:`ptb_fence.BatchStore` has the exact rules.
    Times are epoch milliseconds.

    Args:
        unsettled (:obj:`int`): How many rows are unsettled.
        oldest_unsettled_received_at (:obj:`int` | :obj:`None`): The smallest ``received_at`` of
            the unsettled rows. :obj:`None` when there are none.
        exhaustions_waiting (:obj:`int`): How many unacknowledged exhaustions wait for their
            acknowledgement.
        oldest_exhaustion_at (:obj:`int` | :obj:`None`): The smallest ``due_at`` of those, which is
            when the update was exhausted (:attr:`Exhaustion.exhausted_at`). :obj:`None` when
            there are none.
        held_chat (:obj:`int` | :obj:`None`, optional): The chat held longest, in a store that
            keeps chat order (:class:`ptb_fence.BatchStore`). Only chat keys with
            two or more unsettled rows count. In such a chat the later updates wait behind the
            oldest one. The held chat is the one whose oldest unsettled row (smallest
            ``received_at``) is the oldest. On a tie it is the smaller chat key. :obj:`None`
            when no chat has two unsettled rows, and always for a store without chat keys.
            Defaults to :obj:`None`.
        held_chat_since (:obj:`int` | :obj:`None`, optional): The ``received_at`` of that chat's
            oldest unsettled row. It is :obj:`None` exactly when ``held_chat`` is. Defaults to
            :obj:`None`.
    """

    unsettled: int
    oldest_unsettled_received_at: Optional[int]
    exhaustions_waiting: int
    oldest_exhaustion_at: Optional[int]
    held_chat: Optional[int] = None
    held_chat_since: Optional[int] = None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """The recorded result of one step of an update's handling.

    An attempt records it through :meth:`ptb_fence.BatchStore.record_step`.
    The store writes it only while that attempt owns the update.
    A later attempt of the same update reads it back instead of doing the step again.
    The record is kept until its update row is pruned.
    Times are epoch milliseconds.

    Args:
        key (:obj:`str`): The effect key. It is unique, at most 64 characters of ``[a-z0-9-]``.
        update_id (:obj:`int`): The update whose handling did the step.
        name (:obj:`str`): The step's name as the handler gave it.
        result (:obj:`str`): The step's result as JSON text.
        attempt (:obj:`int`): The attempt that recorded it.
        claim_id (:obj:`str`): The claim id of that attempt.
        recorded_at (:obj:`int`): When it was recorded.
    """

    key: str
    update_id: int
    name: str
    result: str
    attempt: int
    claim_id: str
    recorded_at: int


@dataclass(frozen=True, slots=True)
class PaceBucket:
    """One limit a send is paced by, kept by the store for every process of the bot.

    A bucket is a generic cell rate: sends of one key go at most one per ``interval_ms``.
    Up to ``tolerance_ms`` of sends may come early, which is a burst. A send asks for slots in
    several buckets at once, such as the bot's and its chat's. It goes when all of them have
    room. See :meth:`ptb_fence.BatchStore.take_send_slots`.

    Args:
        key (:obj:`str`): The bucket's name, at most 64 characters. The runtime uses ``bot``,
            ``paid`` and ``chat:<id>``.
        interval_ms (:obj:`int`): The least time between two sends, in milliseconds.
        tolerance_ms (:obj:`int`, optional): How early a send may go, in milliseconds.
            ``0`` spaces every send by ``interval_ms``.
    """

    key: str
    interval_ms: int
    tolerance_ms: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not 0 < len(self.key) <= 64:
            raise ValueError(f"a pace bucket's key is 1 to 64 characters, got {self.key!r}")
        for name in ("interval_ms", "tolerance_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"PaceBucket.{name} is an int >= 0, got {value!r}")


OUTBOX_STATES = ("pending", "sending", "sent", "failed")
"""The states of an outbox call, in the order a call goes through them."""


@dataclass(frozen=True, slots=True)
class OutboxCall:
    """A Bot API call queued by an attempt, sent only if that attempt's completion commits.

    Args:
        method (:obj:`str`): The Bot API method, e.g. ``"sendMessage"``.
        params_json (:obj:`str`): The call's parameters as the text of a JSON object, after the
            bot's defaults were applied.
        chat_key (:obj:`int` | :obj:`None`): The chat the call goes to. It is the chat id, else the
            user id, the key chat order uses. The store sends the calls of one chat one at a time,
            in order. :obj:`None` means no chat and no order.
        seq (:obj:`int`): The call's position among the calls of its attempt (0, 1, ...).
        at_most_once (:obj:`bool`, optional): An unknown outcome ends the call ``failed``
            instead of sending it again. A network error after the request left is such an
            outcome. Defaults to :obj:`False`.
    """

    method: str
    params_json: str
    chat_key: Optional[int]
    seq: int
    at_most_once: bool = False


STATE_KINDS = ("user", "chat", "bot", "conversation", "callback")
"""The kinds of persisted bot state.

They are a user's ``user_data``, a chat's ``chat_data``, the ``bot_data``, one conversation's
state and the callback-data cache.
"""


class StateKey(NamedTuple):
    """Which piece of persisted bot state a row holds.

    It is immutable, and compared and hashed by its three fields.
    It is a named tuple because an update's state keys are looked up in several dicts per update.
    A tuple hashes and compares in C.

    Args:
        kind (:obj:`str`): One of ``user``, ``chat``, ``bot``, ``conversation``, ``callback``.
        name (:obj:`str`): The conversation handler's name for ``conversation``. Empty
            otherwise.
        key (:obj:`str`): The user id or chat id as decimal text for ``user`` and ``chat``.
            The conversation key's JSON text for ``conversation``.
            The keyboard's uuid for ``callback``, one row per keyboard of PTB's callback-data
            cache. Empty for ``bot``.
    """

    kind: str
    name: str = ""
    key: str = ""


class StateEntry(NamedTuple):
    """A row of persisted bot state as stored.

    It is an immutable named tuple, as :class:`StateKey` is, since several are made per update.

    Args:
        value (:obj:`str` | :obj:`None`): The state's encoded text, which the store never reads.
            :obj:`None` once the state was deleted. The row then keeps its version.
        version (:obj:`int`): How many writes landed on the row (1 after the first).
    """

    value: Optional[str]
    version: int


@dataclass(frozen=True, slots=True)
class StateWrite:
    """A change to one piece of persisted bot state, conditional on its version.

    It lands only if the row's version is still ``version``, the one the attempt read.
    ``0`` means the row must not exist.
    It then leaves the row at ``version + 1``.
    So two attempts that changed the same state from the same version never both land.

    Args:
        key (:class:`StateKey`): The state written.
        value (:obj:`str` | :obj:`None`): The new encoded text. :obj:`None` deletes the state.
            The row stays with its version, so a stale writer is still refused.
        version (:obj:`int`): The version the attempt read (``0``: none).
    """

    key: StateKey
    value: Optional[str]
    version: int


@dataclass(frozen=True, slots=True)
class StateConflict:
    """A completion that did not land because state it wrote changed since it was read.

    A settle returns it in place of :obj:`False`.
    It is falsy, so code that only asks whether a settle landed reads it as not landed.
    The attempt still holds its claim.
    Fail it and retry from fresh state.

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
    """Terms on which a completion's commit claims the calls it inserts for sending.

    The sender of this process then needs no claim commit of its own before it sends them.
    See :class:`ptb_fence.contract.OutboxStore`.

    Args:
        sender (:obj:`str`): The sender token the calls are claimed under.
        lease_until (:obj:`int`): The end of that sender's lease on them (epoch ms).
        limit (:obj:`int`): At most this many of the attempt's calls are inserted claimed.
            They are the first ones, in order. The others are inserted ``pending``.
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
            calls already claimed for sending. Only a call whose chat has no call ``pending`` or
            ``sending`` at that moment is. Only a store with ``claimed_calls`` is given a claim.
            Defaults to :obj:`None`, and every call is then inserted ``pending``.
        state (Tuple[:class:`StateWrite`, ...], optional): The persisted bot state the attempt
            changed. All of them land with the completion or none does. A moved version makes
            the completion a :class:`StateConflict`. Defaults to none.
        jobs (Tuple[:class:`JobWrite`, ...], optional): The durable jobs the attempt
            scheduled. Only a store that declares ``StoreFeatures(jobs=True)`` is given any.
            Defaults to none.
        cancelled_jobs (Tuple[:obj:`int`, ...], optional): The ids of the durable jobs the
            attempt removed. Defaults to none.
        broadcasts (Tuple[:class:`BroadcastWrite`, ...], optional): The broadcasts the attempt
            started. Only a store that declares ``StoreFeatures(broadcasts=True)`` is given
            any. Defaults to none.
    """

    calls: Tuple[OutboxCall, ...] = ()
    claim: Optional[CallClaim] = None
    state: Tuple[StateWrite, ...] = ()
    jobs: Tuple["JobWrite", ...] = ()
    cancelled_jobs: Tuple[int, ...] = ()
    broadcasts: Tuple["BroadcastWrite", ...] = ()


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """A call as stored in the outbox.

    A ``pending`` call waits until ``due_at``.
    A ``sending`` call is claimed by a sender whose lease ends at ``due_at``.
    The other states are ``sent`` and ``failed``.
    Times are epoch milliseconds.

    Args:
        call_id (:obj:`int`): The store's id of the call. Later calls get higher ids.
        update_id (:obj:`int`): The update whose attempt queued the call.
        attempt (:obj:`int`): That attempt's number.
        claim_id (:obj:`str`): That attempt's claim id.
        seq (:obj:`int`): The call's position among the calls of its attempt.
        chat_key (:obj:`int` | :obj:`None`): The call's chat (:obj:`None`: no chat).
        method (:obj:`str`): The Bot API method.
        params_json (:obj:`str`): The parameters, a JSON object's text.
        at_most_once (:obj:`bool`): An unknown outcome fails the call instead of resending it.
        state (:obj:`str`): ``pending``, ``sending``, ``sent`` or ``failed``.
        tries (:obj:`int`): How many times a sender claimed the call. A release does not
            count.
        due_at (:obj:`int`): For a pending call, when it may be sent. For a sending call, the
            sender's lease end. For a failed call, when it failed.
        created_at (:obj:`int`): When the completion that queued it committed.
        sent_at (:obj:`int` | :obj:`None`): When it was recorded sent.
        error (:obj:`str` | :obj:`None`): The last failure text.
        result_json (:obj:`str` | :obj:`None`): The Bot API result of a sent call.
        acknowledged (:obj:`bool`): For a failed call, whether its failure was delivered and
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


JOB_STATES = ("scheduled", "paused", "ended", "cancelled")
"""The states of a durable job: it runs when due, it waits, it has no more runs, it was
removed."""


@dataclass(frozen=True, slots=True)
class JobWrite:
    """A durable job to schedule.

    A keyed job is declared, not added. A store keeps one live keyed job per name. Declaring
    it again keeps the stored job and its next run. Only a changed schedule takes the new
    ``next_run_at``. Times are epoch milliseconds.

    Args:
        name (:obj:`str`): The job's name.
        callback (:obj:`str`): The callback's reference (an import path or a registered name).
        data (:obj:`str`): The job's ``data``, encoded as persisted bot state is.
        chat_id (:obj:`int` | :obj:`None`): The job's chat.
        user_id (:obj:`int` | :obj:`None`): The job's user.
        schedule (:obj:`str`): When it runs, as JSON text.
        next_run_at (:obj:`int` | :obj:`None`): Its first run. :obj:`None`: it never runs.
        keyed (:obj:`bool`, optional): One live job per name. Defaults to :obj:`False`.
        options (:obj:`str`, optional): Its run options as JSON text (e.g.
            ``misfire_grace_time``). Defaults to ``"{}"``.
    """

    name: str
    callback: str
    data: str
    chat_id: Optional[int]
    user_id: Optional[int]
    schedule: str
    next_run_at: Optional[int]
    keyed: bool = False
    options: str = "{}"


@dataclass(frozen=True, slots=True)
class StoredJob:
    """A durable job as a store keeps it.

    Args:
        job_id (:obj:`int`): The store's id of the job. Later jobs get higher ids.
        name (:obj:`str`): The job's name.
        callback (:obj:`str`): The callback's reference.
        data (:obj:`str`): The job's encoded ``data``.
        chat_id (:obj:`int` | :obj:`None`): The job's chat.
        user_id (:obj:`int` | :obj:`None`): The job's user.
        schedule (:obj:`str`): When it runs, as JSON text.
        next_run_at (:obj:`int` | :obj:`None`): Its next run. :obj:`None`: no more runs.
        runs (:obj:`int`): How many runs it fired so far.
        keyed (:obj:`bool`): One live job per name.
        state (:obj:`str`): One of :data:`JOB_STATES`.
        created_at (:obj:`int`): When it was first scheduled.
        options (:obj:`str`): Its run options as JSON text.
    """

    job_id: int
    name: str
    callback: str
    data: str
    chat_id: Optional[int]
    user_id: Optional[int]
    schedule: str
    next_run_at: Optional[int]
    runs: int
    keyed: bool
    state: str
    created_at: int
    options: str = "{}"


@dataclass(frozen=True, slots=True)
class JobFire:
    """One run of a due job, to record as an update row.

    The store fires it only if the job is still ``scheduled`` with ``runs`` runs and its next
    run at ``due_at``. It then records ``body`` as a pending update row ``update_id`` (unless
    ``skip``), and moves the job on to ``next_run_at`` (:obj:`None`: the job has ended).
    Both happen in one transaction. So two processes never fire one run twice.

    Args:
        job_id (:obj:`int`): The job.
        runs (:obj:`int`): The runs it had fired when it was read.
        due_at (:obj:`int`): The run's time, as read.
        next_run_at (:obj:`int` | :obj:`None`): The run after this one.
        update_id (:obj:`int`): The run's update id (above Telegram's range).
        body (:obj:`str`): The run's update body.
        chat_key (:obj:`int` | :obj:`None`): The run's chat, for ``strict_chat_order``.
        skip (:obj:`bool`, optional): Move on without recording the run (a run later than its
            ``misfire_grace_time``). Defaults to :obj:`False`.
    """

    job_id: int
    runs: int
    due_at: int
    next_run_at: Optional[int]
    update_id: int
    body: str
    chat_key: Optional[int]
    skip: bool = False


BROADCAST_STATES = ("active", "paused", "cancelled")
"""The states of a broadcast: its recipients are sent to, they wait, they are not sent to."""

RECIPIENT_STATES = ("pending", "sending", "sent", "failed", "blocked", "cancelled")
"""The states of a broadcast's recipient.

``pending`` waits for its turn, ``sending`` is held by a sender under a lease. ``sent``,
``failed`` (Telegram refused it), ``blocked`` (the user blocked the bot) and ``cancelled``
(the broadcast was cancelled first) are final.
"""


@dataclass(frozen=True, slots=True)
class StoredBroadcast:
    """A broadcast as a store keeps it, with its recipients counted per state.

    Args:
        broadcast_id (:obj:`int`): The store's id of the broadcast.
        name (:obj:`str`): Its name, unique per store.
        method (:obj:`str`): The Bot API method sent to each recipient.
        params_json (:obj:`str`): The call's parameters as a JSON object, without ``chat_id``.
        state (:obj:`str`): One of :data:`BROADCAST_STATES`.
        created_at (:obj:`int`): When it was started (epoch milliseconds).
        pending (:obj:`int`, optional): Recipients waiting for their turn.
        sending (:obj:`int`, optional): Recipients a sender holds.
        sent (:obj:`int`, optional): Recipients sent to.
        failed (:obj:`int`, optional): Recipients Telegram refused.
        blocked (:obj:`int`, optional): Recipients who blocked the bot.
        cancelled (:obj:`int`, optional): Recipients left out by a cancel.
    """

    broadcast_id: int
    name: str
    method: str
    params_json: str
    state: str
    created_at: int
    pending: int = 0
    sending: int = 0
    sent: int = 0
    failed: int = 0
    blocked: int = 0
    cancelled: int = 0

    @property
    def total(self) -> int:
        """:obj:`int`: The recipients recorded."""
        return (self.pending + self.sending + self.sent + self.failed + self.blocked
                + self.cancelled)

    @property
    def done(self) -> bool:
        """:obj:`bool`: No recipient is pending or being sent to."""
        return not (self.pending or self.sending)


@dataclass(frozen=True, slots=True)
class BroadcastWrite:
    """A broadcast an attempt starts, written by its completion.

    The store starts the broadcast ``name`` as ``start_broadcast`` does and adds the chats as
    ``add_recipients`` does, in the completion's transaction. When a broadcast of that name
    exists with another method or parameters, no recipient is added to it.

    Args:
        name (:obj:`str`): The broadcast's name.
        method (:obj:`str`): The Bot API method sent to each recipient.
        params_json (:obj:`str`): The call's parameters as a JSON object, without ``chat_id``.
        chat_ids (Tuple[:obj:`int`, ...]): The recipients' chats.
    """

    name: str
    method: str
    params_json: str
    chat_ids: Tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Recipient:
    """A recipient a sender claimed: send ``method(chat_id=chat_id, **params)``.

    Args:
        broadcast_id (:obj:`int`): The broadcast.
        chat_id (:obj:`int`): The recipient's chat.
        method (:obj:`str`): The broadcast's Bot API method.
        params_json (:obj:`str`): The broadcast's parameters (without ``chat_id``).
        tries (:obj:`int`): The claims of this recipient so far, this one included.
    """

    broadcast_id: int
    chat_id: int
    method: str
    params_json: str
    tries: int


@dataclass(frozen=True, slots=True)
class RecipientOutcome:
    """What a sender learnt of one recipient it held.

    Args:
        broadcast_id (:obj:`int`): The broadcast.
        chat_id (:obj:`int`): The recipient's chat.
        state (:obj:`str`): ``sent``, ``failed``, ``blocked``, or ``pending`` to send it again
            at ``due_at``.
        due_at (:obj:`int`, optional): When a ``pending`` recipient is due again.
        error (:obj:`str` | :obj:`None`, optional): Telegram's answer for a recipient not sent.
    """

    broadcast_id: int
    chat_id: int
    state: str
    due_at: int = 0
    error: Optional[str] = None

    def __post_init__(self) -> None:
        if self.state not in ("sent", "failed", "blocked", "pending"):
            raise ValueError(
                f"a recipient's outcome is sent, failed, blocked or pending, got {self.state!r}")
