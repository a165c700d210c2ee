"""SQLiteBaseStore: the unary (base) contract of the SQLite store, batch recording and
batch renewal, and its lifecycle. :class:`~ptb_fence.SQLiteUpdateStore` adds the fenced and
durable contracts."""

from __future__ import annotations

import os
import sqlite3
from typing import Any, List, Optional, Sequence, Set, Tuple, TypeVar, Union

from ptb_fence._errors import TableBotMismatch
from ptb_fence._values import Settlement, StoredUpdate
from ptb_fence.stores._names import validate_table_name, validate_update_id
from ptb_fence.stores._sqlite_connections import SQLiteConnections
from ptb_fence.stores._sqlite_recovery import FileLiveness
from ptb_fence.stores._sqlite_schema import ensure_schema
from ptb_fence.stores._sqlite_sql import SQLiteStatements
from ptb_fence.stores._suspects import SuspectClaims
from ptb_fence.stores._sqlite_writes import (
    add_in,
    max_variables,
    settle_params,
    settle_statement,
    take,
)

__all__ = ["SQLiteBaseStore"]

_MIN_SQLITE = (3, 35, 0)  # UPDATE … RETURNING (3.35), UPDATE … FROM (3.33)
_SYNCHRONOUS = ("NORMAL", "FULL")

_S = TypeVar("_S", bound="SQLiteBaseStore")


class SQLiteBaseStore:
    """The base and batch operations of :class:`ptb_fence.SQLiteUpdateStore` (see there for
    the constructor's arguments and the connection rules)."""

    __slots__ = ("__weakref__", "_conns", "_liveness", "_sql", "_suspects", "_table")

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        table: str = "telegram_updates",
        *,
        synchronous: str = "NORMAL",
        busy_timeout: float = 30.0,
    ) -> None:
        self._table = validate_table_name(table)
        if not isinstance(synchronous, str) or synchronous.upper() not in _SYNCHRONOUS:
            raise ValueError(
                f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}"
            )
        if (
            isinstance(busy_timeout, bool)
            or not isinstance(busy_timeout, (int, float))
            or not busy_timeout > 0
            or busy_timeout == float("inf")
        ):
            raise ValueError(
                f"busy_timeout must be a positive number of seconds, got {busy_timeout!r}"
            )
        if not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"path must be a file path (str or os.PathLike), got {path!r}")
        raw = os.fspath(path)
        if not isinstance(raw, str) or raw in ("", ":memory:"):
            raise ValueError(
                f"path must name a database file, got {path!r}; SQLiteUpdateStore gives every "
                "thread its own connection, so an in-memory or temporary database would not be "
                "shared (use MemoryUpdateStore for an in-process store)"
            )
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise RuntimeError(
                "SQLiteUpdateStore needs SQLite 3.35 or newer (for UPDATE … RETURNING); this "
                f"Python uses SQLite {sqlite3.sqlite_version}. Use a Python build with a newer "
                "SQLite, or use PostgresUpdateStore."
            )
        path = os.path.abspath(raw)
        self._liveness = FileLiveness()
        self._suspects = SuspectClaims()
        self._sql = SQLiteStatements(self._table)
        self._conns = SQLiteConnections(
            path,
            f"SQLiteUpdateStore({path!r}, table={self._table!r})",
            synchronous.upper(),
            float(busy_timeout),
        )
        try:
            ensure_schema(self._conns, self._sql, self._table)
        except BaseException:
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """:obj:`str`: The absolute path of the database file."""
        return self._conns.path

    @property
    def table(self) -> str:
        """:obj:`str`: The table name."""
        return self._table

    def close(self) -> None:
        """Close every connection the store opened (from all threads). Idempotent.

        A connection another thread is using right now (a statement, or an open
        :meth:`transaction` block) is never closed under it: that call finishes normally and
        its thread closes the connection when the call ends. ``close()`` waits up to 5 seconds
        for such calls, then returns. Calls that start after ``close()`` raise
        :exc:`RuntimeError`.
        """
        self._conns.close()

    def __enter__(self: _S) -> _S:
        """Return the store itself."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close the store (see :meth:`close`)."""
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._conns.path!r}, table={self._table!r})"

    # -- base contract ---------------------------------------------------------------------
    def bind_bot(self, bot_id: int) -> None:
        """Record that the table belongs to bot ``bot_id``; the first binder wins.

        The owner is kept in the table ``ptb_fence_meta`` of the same file (created when
        missing). Binding the same id again is a no-op; several processes binding a new table
        at once are safe (``BEGIN IMMEDIATE``).

        Raises:
            ptb_fence.TableBotMismatch: The table was bound to another bot id first.
        """
        bot_id = int(bot_id)
        params = {"table": self._table, "bot_id": bot_id}
        with self._conns.immediate() as conn:
            conn.execute(self._sql.create_meta)
            conn.execute(self._sql.bind_bot, params)
            row = conn.execute(self._sql.bot_of, params).fetchone()
        owner = int(row[0])
        if owner != bot_id:
            raise TableBotMismatch(self._table, repr(self._conns.path), owner, bot_id)

    def add(self, update_id: int, body: str, received_at: int) -> bool:
        """Insert a pending row.

        Args:
            update_id (:obj:`int`): The Telegram ``update_id``.
            body (:obj:`str`): The update's JSON text.
            received_at (:obj:`int`): When it was received (epoch milliseconds).

        Returns:
            :obj:`bool`: :obj:`True` if inserted, :obj:`False` if the id exists. The same
            update again never changes anything; a different update (another
            :func:`~ptb_fence._fingerprint.update_fingerprint`) replaces a settled row
            (completed, or abandoned with ``settled_at`` set) like a fresh insert and returns
            :obj:`True`; with a live row the first is kept and a WARNING is logged on
            ``ptb_fence.store`` (SPEC §12).
        """
        validate_update_id(update_id)
        with self._conns.immediate() as conn:
            return add_in(self._sql, conn, update_id, body, received_at)

    def add_many(self, rows: Sequence[Tuple[int, str, int]]) -> List[bool]:
        """Insert several ``(update_id, body, received_at)`` rows in one transaction.

        Args:
            rows: The rows to insert.

        Returns:
            List[:obj:`bool`]: Per row, :obj:`True` if inserted, :obj:`False` if the id existed
            (including an earlier row of the same batch).
        """
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        if not rows:
            return []
        with self._conns.immediate() as conn:
            return [
                add_in(self._sql, conn, update_id, body, received_at)
                for update_id, body, received_at in rows
            ]

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[int]:
        """Take a claimable row for a new attempt (one conditional ``UPDATE``).

        If the row is claimable and ``attempts < max_attempts``, it becomes ``processing`` with
        a fresh claim id and lease ``lease_until``. If it is claimable but its attempts are
        spent, it is abandoned (an unacknowledged exhaustion when ``durable_exhaustion``).

        Args:
            update_id (:obj:`int`): The update to claim.
            now (:obj:`int`): The current time (epoch milliseconds).
            lease_until (:obj:`int`): The lease expiry of the new attempt.
            max_attempts (:obj:`int`): Attempts allowed in total.
            durable_exhaustion (:obj:`bool`, optional): Keep a spent row as an unacknowledged
                exhaustion (``settled_at`` NULL) instead of ordinary prunable history.

        Returns:
            :obj:`int` | :obj:`None`: The attempt number, or :obj:`None` for a spend, a live
            lease, a final row or an unknown id.
        """
        identity = take(
            self._conns, self._sql, update_id, now, lease_until, max_attempts,
            durable_exhaustion, self._liveness.mine(), self._sql.claim_counted,
        )
        return None if identity is None else identity.attempt

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        """Extend the lease of ``attempt`` to at least ``lease_until``.

        A renewal never shortens a lease and, with ``now``, never revives an expired one
        (``due_at >= now`` is required).

        Returns:
            :obj:`bool`: :obj:`True` when the row matched (even if the lease stayed as it was).
        """
        params = {"update_id": update_id, "attempt": attempt, "lease_until": lease_until,
                  "now": now}
        with self._conns.immediate() as conn:
            return bool(conn.execute(self._sql.renew, params).fetchall())

    def renew_many(
        self, leases: Sequence[Tuple[int, int]], lease_until: int, now: int
    ) -> List[bool]:
        """:meth:`renew` for many ``(update_id, attempt)`` pairs in one statement.

        Larger batches than SQLite's host-parameter limit are split into chunks, all in one
        transaction.

        Returns:
            List[:obj:`bool`]: Per input position, whether that lease matched.
        """
        leases = [(update_id, attempt) for update_id, attempt in leases]
        if not leases:
            return []
        matched: Set[Tuple[int, int]] = set()
        with self._conns.immediate() as conn:
            per_statement = max(1, (max_variables(conn) - 3) // 2)
            for start in range(0, len(leases), per_statement):
                chunk = leases[start : start + per_statement]
                params: List[Any] = [lease_until, lease_until]
                for update_id, attempt in chunk:
                    params += (update_id, attempt)
                params.append(now)
                for row in conn.execute(self._sql.renew_many(len(chunk)), params).fetchall():
                    matched.add((row[0], row[1]))
        return [lease in matched for lease in leases]

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Record the result of ``attempt`` if it holds a lease unexpired at ``settlement.at``.

        :class:`~ptb_fence.Completed` and :class:`~ptb_fence.Abandoned` make the row final
        (``settled_at = at``); :class:`~ptb_fence.Failed` makes it due at ``retry_at``. A settle
        that does not land is ignored.
        """
        statement = settle_statement(self._sql, settlement, owned=False)
        with self._conns.immediate() as conn:
            conn.execute(statement, settle_params(update_id, attempt, settlement, None))

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """Rows to hand over, ordered by ``update_id``, at most ``limit``.

        Pending rows with ``received_at <= pending_before``, released rows (pending with a
        claim id, see :meth:`~ptb_fence.SQLiteUpdateStore.release_many`) whatever
        ``pending_before``, failed rows with ``due_at <= now`` and processing rows whose lease
        lapsed (``due_at < now``).
        """
        with self._conns.using() as conn:
            rows = conn.execute(
                self._sql.due,
                {"now": now, "pending_before": pending_before, "limit": max(int(limit), 0)},
            ).fetchall()
        return [StoredUpdate(int(update_id), body) for update_id, body in rows]

    def prune(self, before: int) -> int:
        """Delete completed and abandoned rows with ``settled_at < before``.

        Pending, processing and failed rows and unacknowledged exhaustions are never pruned.

        Returns:
            :obj:`int`: The number of rows deleted.
        """
        with self._conns.immediate() as conn:
            return int(conn.execute(self._sql.prune, {"before": before}).rowcount)
