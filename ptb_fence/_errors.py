"""Exceptions raised by ptb_fence."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ptb_fence._values import AttemptIdentity

__all__ = [
    "AttemptFinished",
    "OwnershipLost",
    "SchemaError",
    "StoreBusy",
    "TransactionEnded",
]


class OwnershipLost(Exception):
    """The attempt no longer owns its update: its lease lapsed or another claim took it over.

    Raised by :meth:`ptb_fence.Attempt.transaction` (after rolling back) and by
    :meth:`ptb_fence.Attempt.raise_if_lost`.

    Args:
        identity (:class:`ptb_fence.AttemptIdentity`): The identity that lost its update.
    """

    __slots__ = ("identity",)

    def __init__(self, identity: "AttemptIdentity", message: str | None = None) -> None:
        self.identity = identity
        super().__init__(
            message
            or (
                f"attempt {identity.attempt} of update {identity.update_id} "
                f"(claim {identity.claim_id}) no longer owns the update"
            )
        )


class SchemaError(RuntimeError):
    """The store's table lacks what an operation needs (for example the ``claim_id`` column).

    The message names the fix, e.g. applying :func:`ptb_fence.postgres_update_store_schema`.
    """


class StoreBusy(RuntimeError):
    """A store could not get a database connection within its wait bound."""


class AttemptFinished(RuntimeError):
    """The attempt is over for writing: a handler mistake, not a lost lease.

    Raised (before touching the database) by :meth:`ptb_fence.Attempt.transaction`,
    :meth:`ptb_fence.Attempt.run_in_transaction` and :meth:`ptb_fence.Attempt.exhaust` when a
    ``transaction(complete=True)`` already completed the attempt, when it was exhausted, or when
    its handler already returned. Nobody took the update over: nothing is logged as a takeover
    and ``owner_lost`` is not fired.

    Args:
        identity (:class:`ptb_fence.AttemptIdentity`): The attempt's identity.
        message (:obj:`str`): What happened and what to do instead.
    """

    __slots__ = ("identity",)

    def __init__(self, identity: "AttemptIdentity", message: str) -> None:
        self.identity = identity
        super().__init__(
            f"update {identity.update_id} attempt {identity.attempt} "
            f"(claim {identity.claim_id}): {message}"
        )


class TransactionEnded(RuntimeError):
    """The code inside a fenced transaction committed, rolled back or closed it itself.

    Raised by :meth:`ptb_fence.Attempt.transaction` (and
    :meth:`~ptb_fence.Attempt.run_in_transaction`) when the block returns: writes made before
    such a commit landed *outside the fence*, and ``complete=True`` settled nothing. Do not
    commit, roll back or close the yielded connection; the transaction commits on exit.

    Args:
        identity (:class:`ptb_fence.AttemptIdentity`): The attempt's identity.
        how (:obj:`str`): What was found (e.g. ``"committed or rolled back"``, ``"closed"``).
    """

    __slots__ = ("identity",)

    def __init__(self, identity: "AttemptIdentity", how: str) -> None:
        self.identity = identity
        super().__init__(
            f"the fenced transaction of update {identity.update_id} attempt {identity.attempt} "
            f"(claim {identity.claim_id}) was {how} inside the block: writes made before that "
            "escaped the fence (do not commit or roll back or close the connection inside the "
            "block; it commits on exit); nothing was settled by complete=True"
        )
