"""Value types shared by the stores, the runtime and the framework adapters.

All of them are frozen dataclasses: they are safe to share between threads and to use as
dictionary keys. Store-level times are integer milliseconds since the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

__all__ = [
    "Abandoned",
    "AttemptIdentity",
    "Completed",
    "Exhaustion",
    "Failed",
    "Settlement",
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
