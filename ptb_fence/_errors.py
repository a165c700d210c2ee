"""Exceptions raised by ptb_fence."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ptb_fence._values import AttemptIdentity

__all__ = ["OwnershipLost", "RowLocked", "SchemaError", "StoreBusy"]


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


class RowLocked(RuntimeError):
    """A single lease renewal found its row locked by another open transaction.

    Raised by :meth:`ptb_fence.PostgresUpdateStore.renew` and
    :meth:`~ptb_fence.PostgresUpdateStore.renew_owned` after waiting a short bound (200 ms)
    instead of waiting for the lock. The lease was neither renewed nor refused: usually the
    attempt's own fenced transaction holds the row (``owns(..., connection=conn)`` takes it
    ``FOR UPDATE``). Not an ownership loss; renew again later.
    """
