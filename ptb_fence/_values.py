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
