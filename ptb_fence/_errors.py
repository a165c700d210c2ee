"""Exceptions raised by ptb_fence."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Optional

if TYPE_CHECKING:
    from ptb_fence._values import AttemptIdentity, StateKey

__all__ = [
    "AttemptFinished",
    "OwnershipLost",
    "RowLocked",
    "SchemaError",
    "StateConflictError",
    "StoreBusy",
    "TableBotMismatch",
    "TransactionEnded",
    "UsageError",
    "is_misuse",
]


def is_misuse(error: BaseException) -> bool:
    """Whether ``error`` is ptb_fence refusing a misuse of its own API.

    Such an error comes back on every retry (the same code makes the same mistake), and a
    retry could repeat what escaped the fence. The runtime ends its attempt at once as a final
    failure, never retried. The marker is the class attribute ``ptb_fence_misuse``.
    """
    return getattr(error, "ptb_fence_misuse", False) is True


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


class StateConflictError(RuntimeError):
    """Persisted bot state the attempt changed was changed by another attempt since it was
    read: the attempt's writes must not land.

    Raised by a store's ``write_effects`` inside the caller's transaction. Roll it back: the
    domain writes were made from stale state too. The attempt still holds its claim. The
    runtime gives it back without spending it (a conflict never exhausts an update) and runs
    the update again on fresh state.

    Args:
        keys (Tuple[:class:`ptb_fence.StateKey`, ...]): The state whose version had moved.
    """

    __slots__ = ("keys",)

    def __init__(self, keys: "tuple[StateKey, ...]") -> None:
        self.keys = tuple(keys)
        named = ", ".join(f"{k.kind} {k.name + ' ' if k.name else ''}{k.key}".strip()
                          for k in self.keys)
        super().__init__(
            f"persisted state changed since this attempt read it ({named}): the attempt's "
            "writes were not applied; retry the update from fresh state"
        )


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


class UsageError(TypeError):
    """ptb_fence was called in a way that cannot work: a mistake in the handler's code.

    Examples: an ``async def`` given to :meth:`ptb_fence.Attempt.run_in_transaction`, an
    asyncio connection given as ``connection=``, a file to upload given to the outbox. The
    message names the fix. A handler that lets it out fails for good at once (see
    :func:`is_misuse`): never retried.
    """

    ptb_fence_misuse: ClassVar[bool] = True


class TransactionEnded(RuntimeError):
    """The code inside a fenced transaction committed, rolled back or closed it itself, or
    marked it for rollback.

    Raised inside the block by the connection it was given (``commit()``, ``rollback()``,
    ``close()``, a ``COMMIT`` statement: refused, nothing ended) and by a SQLAlchemy
    ``session.commit()``. Raised by :meth:`ptb_fence.Attempt.transaction` (and
    :meth:`~ptb_fence.Attempt.run_in_transaction`) when the block returns and the transaction
    was ended by a way no guard saw (e.g. a ``COMMIT`` through a cursor), or was marked for
    rollback (Django ``transaction.set_rollback(True)``, a SQLAlchemy session after a failed
    flush). ``complete=True`` then settled nothing. A misuse (see :func:`is_misuse`): the
    attempt fails for good at once, never retried.

    Args:
        identity (:class:`ptb_fence.AttemptIdentity`): The attempt's identity.
        how (:obj:`str`): What was found (e.g. ``"committed or rolled back"``, ``"closed"``).
        message (:obj:`str`, optional): What happened and what to do, instead of the text
            for a transaction ended by the block.
    """

    __slots__ = ("identity", "how")

    ptb_fence_misuse: ClassVar[bool] = True

    def __init__(
        self, identity: "AttemptIdentity", how: str, message: Optional[str] = None
    ) -> None:
        self.identity = identity
        self.how = how
        where = (
            f"the fenced transaction of update {identity.update_id} attempt {identity.attempt} "
            f"(claim {identity.claim_id})"
        )
        super().__init__(
            f"{where} {message}" if message is not None else
            f"{where} was {how} inside the block: writes made before that "
            "escaped the fence (do not commit or roll back or close the connection inside the "
            "block; it commits on exit); nothing was settled by complete=True"
        )


class RowLocked(RuntimeError):
    """A single lease renewal found its row locked by another open transaction.

    Raised by :meth:`ptb_fence.PostgresUpdateStore.renew` and
    :meth:`~ptb_fence.PostgresUpdateStore.renew_owned` after waiting a short bound (200 ms)
    instead of waiting for the lock. The lease was neither renewed nor refused. Usually the
    attempt's own fenced transaction holds the row (``owns(..., connection=conn)`` takes it
    ``FOR UPDATE``). It is not an ownership loss. Renew again later.
    """


class TableBotMismatch(RuntimeError):
    """The store's table belongs to another bot (one table per bot).

    Raised by ``bind_bot(bot_id)`` of every store when the table was bound to a different bot
    id first. Two bots sharing one table would drop each other's colliding update ids
    and handle each other's updates.

    Args:
        table (:obj:`str`): The table.
        where (:obj:`str`): The database (a path, or "PostgreSQL", or "memory").
        owner (:obj:`int`): The bot id the table belongs to.
        bot_id (:obj:`int`): The bot id that tried to use it.
    """

    __slots__ = ("table", "owner", "bot_id")

    def __init__(self, table: str, where: str, owner: int, bot_id: int) -> None:
        self.table = table
        self.owner = owner
        self.bot_id = bot_id
        suggestion = f"{table[: 62 - len(str(bot_id)) - 4]}_bot{bot_id}"
        super().__init__(
            f"table {table!r} in {where} belongs to bot {owner}, this is bot {bot_id}: use one "
            f"table per bot, e.g. table={suggestion!r}"
        )
