"""BlockConnection: the DB-API connection (or cursor) a fenced block receives, which refuses
to end the fenced transaction."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterator, NoReturn

from ptb_fence._errors import TransactionEnded

if TYPE_CHECKING:
    from ptb_fence._values import AttemptIdentity

__all__ = ["BlockConnection"]

# a statement that ends the transaction (ROLLBACK TO a savepoint does not)
_ENDS = re.compile(
    r"\s*(?:COMMIT|END|ABORT|ROLLBACK(?!\s+(?:TRANSACTION\s+|WORK\s+)?TO\b))\b", re.IGNORECASE
)

_REFUSED = (
    "refused {what} inside the block: nothing was committed or rolled back, and the block "
    "fails (rolled back, not retried). The fenced transaction commits when the block ends, "
    "together with the ownership check and complete=True: do not end it yourself (raise an "
    "exception to roll it back)"
)


# the first characters a statement that ends the transaction can start with (a cheap test
# before the pattern: most statements start with I, S, U, D or W)
_FIRST = frozenset("cCeEaArR \t\r\n")


def _ends_transaction(sql: Any) -> bool:
    if isinstance(sql, str):
        if sql[:1] not in _FIRST:
            return False
    elif isinstance(sql, (bytes, bytearray)):
        sql = bytes(sql[:64]).decode("latin-1")
    else:
        return False  # a composed query object: the driver renders it
    return _ENDS.match(sql) is not None


class BlockConnection:
    """What a fenced block receives for a DB-API connection or cursor: the object itself in
    all but ending the transaction.

    ``commit()``, ``rollback()``, ``close()``, ``with conn:`` (which commits), sqlite3's
    ``executescript()`` (which commits first), a ``COMMIT``/``ROLLBACK``/``END`` statement
    through ``execute()``, and switching ``autocommit`` or ``isolation_level`` raise
    :exc:`~ptb_fence.TransactionEnded` before anything reaches the database. The block
    fails with it even if the code catches it: its author thought something ended. Every
    other attribute is the connection's own. A cursor's ``connection`` is guarded the same
    way. A cursor from ``cursor()`` is the driver's own (its ``COMMIT`` is seen when the
    block ends).

    Args:
        target: The connection or cursor.
        identity: The attempt whose fenced transaction it is.
    """

    __slots__ = ("_target", "_identity", "_refused", "_cursor", "_owner")

    def __init__(
        self, target: Any, identity: "AttemptIdentity", owner: "BlockConnection | None" = None
    ) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_identity", identity)
        object.__setattr__(self, "_refused", None)
        object.__setattr__(self, "_cursor", not hasattr(target, "commit"))
        # the one the block received, which keeps the refusal (a cursor's connection is made
        # when asked for)
        object.__setattr__(self, "_owner", owner if owner is not None else self)

    @property
    def refused(self) -> "TransactionEnded | None":
        """The refusal raised in the block, if any (the block fails with it)."""
        return self._refused  # type: ignore[no-any-return]

    @property
    def target(self) -> Any:
        """The connection or cursor itself."""
        return self._target

    def _refuse(self, what: str) -> NoReturn:
        error = TransactionEnded(self._identity, "refused", _REFUSED.format(what=what))
        owner = self._owner
        if owner._refused is None:
            object.__setattr__(owner, "_refused", error)
        raise error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("autocommit", "isolation_level"):
            self._refuse(f"setting {name} (it may commit or end the transaction)")
        setattr(self._target, name, value)

    def __repr__(self) -> str:
        return f"<fenced block's {self._target!r}>"

    def __iter__(self) -> Iterator[Any]:
        return iter(self._target)

    def __enter__(self) -> Any:
        if not self._cursor:
            self._refuse("with conn: (it commits or closes the connection at its end)")
        self._target.__enter__()
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> Any:
        return self._target.__exit__(kind, error, traceback)

    @property
    def connection(self) -> Any:
        """A cursor's connection, guarded the same way."""
        return BlockConnection(self._target.connection, self._identity, self._owner)

    def commit(self) -> NoReturn:
        """Refused: the fenced transaction commits when the block ends."""
        self._refuse("commit()")

    def rollback(self) -> NoReturn:
        """Refused: raise an exception to roll the block back."""
        self._refuse("rollback()")

    def close(self) -> None:
        """Refused for the connection (a cursor closes)."""
        if not self._cursor:
            self._refuse("close()")
        self._target.close()

    def executescript(self, script: str) -> Any:
        """Refused: sqlite3 commits the open transaction before it runs a script."""
        self._refuse("executescript() (sqlite3 commits before the script)")

    def execute(self, sql: Any, *args: Any, **kwargs: Any) -> Any:
        """The driver's ``execute()``, unless ``sql`` ends the transaction (refused)."""
        if _ends_transaction(sql):
            self._refuse(f"{str(sql).strip()[:20]!r} through execute()")
        return self._target.execute(sql, *args, **kwargs)

    def executemany(self, sql: Any, *args: Any, **kwargs: Any) -> Any:
        """The driver's ``executemany()``, unless ``sql`` ends the transaction (refused)."""
        if _ends_transaction(sql):
            self._refuse(f"{str(sql).strip()[:20]!r} through executemany()")
        return self._target.executemany(sql, *args, **kwargs)
