"""A Django connection as ``connection=`` of a fenced transaction.

The fenced transaction is a Django ``transaction.atomic()`` block on that connection: the
store's ownership check (PostgreSQL ``FOR UPDATE``) and ``complete=True``'s settle run on
its DB-API connection, next to the block's ORM writes, and Django commits them together when
the block ends, or rolls them back on an exception or a lost update.

Django gives every thread its own connection and closes them only at the end of a request:
a handler thread of :class:`~ptb_fence.UpdateIntake` (or an ``asyncio.to_thread`` thread of
a PTB bot) should call ``django.db.close_old_connections()`` when its handler is done.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Optional

from ptb_fence._errors import TransactionEnded, UsageError
from ptb_fence._dbapi import ROLLBACK_MARK, GivenConnection, transaction_ended

if TYPE_CHECKING:
    from ptb_fence._values import AttemptIdentity

__all__ = ["DjangoTransaction", "dbapi_of"]

# the text of Django's TransactionManagementError for commit(), rollback() and
# set_autocommit() inside atomic()
_FORBIDDEN = "forbidden when an 'atomic' block is active"

_REFUSED = (
    "refused a commit, rollback or autocommit switch inside the block (Django forbids it "
    "inside atomic()): nothing was committed, and the block fails (rolled back, not "
    "retried). Django commits the block when it ends, together with the ownership check and "
    "complete=True: raise an exception to roll it back, or use atomic() inside it for "
    "savepoints"
)

_MARKED = (
    f"{ROLLBACK_MARK} (transaction.set_rollback(True), or a database error caught inside the "
    "atomic() block)"
)


def _wrapper(given: Any) -> Any:
    """``django.db.connection`` (a proxy) or ``django.db.connections[alias]``.

    Raises TypeError for other Django objects."""
    if not (hasattr(given, "in_atomic_block") and hasattr(given, "ensure_connection")):
        raise UsageError(
            "connection= takes a Django connection (django.db.connection or "
            f"django.db.connections[alias]), got {type(given).__module__}."
            f"{type(given).__qualname__}"
        )
    return given


def dbapi_of(given: Any) -> Any:
    """The DB-API connection under a Django connection (connecting if needed)."""
    wrapper = _wrapper(given)
    wrapper.ensure_connection()
    return wrapper.connection


class DjangoTransaction:
    """One fenced transaction as a Django ``transaction.atomic()`` block.

    Entering opens the atomic block and returns its DB-API connection for the store. Leaving
    ends it (Django commits, or rolls back on an exception). Inside another ``atomic()``
    block it is refused: Django would commit later, after the attempt counted as done.

    Args:
        given: ``django.db.connection`` or ``django.db.connections[alias]``.

    Raises:
        TypeError: ``given`` is another Django object.
    """

    __slots__ = ("_given", "_atomic", "_raw", "_identity")

    def __init__(self, given: Any, identity: "Optional[AttemptIdentity]" = None) -> None:
        self._given = _wrapper(given)
        self._identity = identity
        self._atomic: Any = None
        self._raw: Any = None

    @property
    def yielded(self) -> Any:
        """The Django connection the caller passed."""
        return self._given

    def __enter__(self) -> Any:
        # imported by name: type-checking ptb_fence needs neither Django nor its types
        transaction = importlib.import_module("django.db.transaction")
        if self._given.in_atomic_block:
            raise ValueError(
                "attempt.transaction(connection=django.db.connection) is itself a "
                "transaction.atomic() block that Django commits when it ends, so that the "
                "ownership check, your writes and complete=True land in one commit that it "
                "sees; it was called inside another atomic() block, which would commit later: "
                "call it outside atomic() (use atomic() inside it for savepoints)"
            )
        atomic = transaction.atomic(using=self._given.alias)
        atomic.__enter__()
        self._atomic = atomic
        self._raw = self._given.connection
        return self._raw

    @property
    def refused(self) -> None:
        """Nothing to record: Django itself refuses a commit inside ``atomic()``."""
        return None

    def prepare(self) -> None:
        """Before the ownership check: open the DB-API transaction of a connection in
        autocommit mode, which the check's own statement would not."""
        GivenConnection(self._raw).prepare()

    def begin(self) -> None:
        """Open the DB-API transaction now (drivers begin lazily), so a block that writes
        nothing is not taken for one that committed."""
        GivenConnection(self._raw).begin()

    def ended(self) -> Optional[str]:
        """Whether the block committed, rolled back or closed the DB-API connection itself,
        or marked the atomic block for rollback."""
        if self._given.connection is not self._raw:
            return "closed"
        if self._given.needs_rollback:
            # Django rolls the block back when it ends, the completion with it
            return _MARKED
        return transaction_ended(self._raw)

    def store_connection(self) -> Any:
        """The DB-API connection of the block."""
        return self._raw

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        self._atomic.__exit__(kind, error, traceback)
        if (kind is not None and self._identity is not None and kind.__name__ ==
                "TransactionManagementError" and _FORBIDDEN in str(error)):
            # Django refused a commit, a rollback or autocommit in the block: the same
            # mistake as a refused commit() anywhere else (final, never retried)
            raise TransactionEnded(self._identity, "refused", _REFUSED) from error
