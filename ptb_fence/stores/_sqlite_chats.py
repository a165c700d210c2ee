"""Chat order of a SQLiteUpdateStore (:class:`~ptb_fence.ChatOrderedUpdateStore`); the
statements are in :mod:`ptb_fence.stores._chat_order_sql`."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ptb_fence._protocols import ChatKey

from ptb_fence._values import AttemptIdentity, StoredUpdate
from ptb_fence.stores._names import validate_update_id
from ptb_fence.stores._sqlite_connections import SQLiteConnections
from ptb_fence.stores._sqlite_recovery import FileLiveness
from ptb_fence.stores._sqlite_sql import SQLiteStatements
from ptb_fence.stores._sqlite_writes import add_in, int_arg, take
from ptb_fence.stores._suspects import SuspectClaims

__all__ = ["SQLiteChatOrder"]


class SQLiteChatOrder:
    """``add_many_in_chats``, ``claim_in_chat_order`` and ``due_in_chat_order`` of
    :class:`ptb_fence.SQLiteUpdateStore` (a mixin), and ``unkeyed_in_chats`` and
    ``set_chat_keys`` for the rows recorded without a chat key."""

    __slots__ = ()

    _conns: SQLiteConnections
    _sql: SQLiteStatements
    _liveness: FileLiveness
    _suspects: SuspectClaims

    def add_many_in_chats(
        self, rows: Sequence[Tuple[int, str, int, Optional[int]]]
    ) -> List[bool]:
        """Insert ``(update_id, body, received_at, chat_key)`` rows as pending in one
        transaction, recording each chat key (optional capability, see
        :class:`ptb_fence.ChatOrderedUpdateStore`).

        Returns:
            List[:obj:`bool`]: Per row, as :meth:`add_many`.
        """
        rows = list(rows)
        for row in rows:
            validate_update_id(row[0])
        if not rows:
            return []
        result: List[bool] = []
        with self._conns.immediate() as conn:
            for update_id, body, received_at, chat_key in rows:
                added = add_in(self._sql, conn, update_id, body, received_at)
                if added and chat_key is not None:
                    conn.execute(
                        self._sql.chat.set_key,
                        {"update_id": update_id, "chat_key": int_arg("chat_key", chat_key)},
                    )
                result.append(added)
        return result

    def claim_in_chat_order(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """As :meth:`claim_owned`, in the same one statement, only when the row is its chat's
        turn at ``now`` (optional capability, see :class:`ptb_fence.ChatOrderedUpdateStore`).
        """
        return take(
            self._conns, self._sql, update_id, now, lease_until, max_attempts,
            durable_exhaustion, self._liveness.mine(), self._sql.chat.claim,
            suspects=self._suspects,
        )

    def due_in_chat_order(
        self, *, now: int, pending_before: int, limit: int, chat_key: Optional[int] = None
    ) -> List[StoredUpdate]:
        """As :meth:`due`, listing only rows that are their chat's turn at ``now`` (with
        ``chat_key``: of that chat only), in one statement."""
        params = {
            "now": int_arg("now", now),
            "pending_before": int_arg("pending_before", pending_before),
            "limit": max(int(limit), 0),
            "chat_key": chat_key,
        }
        sql = self._sql.chat.due if chat_key is None else self._sql.chat.due_of_chat
        with self._conns.using() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [StoredUpdate(int(update_id), body) for update_id, body in rows]

    def unkeyed_in_chats(
        self, *, after_update_id: Optional[int] = None, limit: int
    ) -> List[StoredUpdate]:
        """Unsettled rows (pending, processing, failed) without a chat key, by ``update_id``,
        after ``after_update_id`` (see :class:`ptb_fence.ChatOrderedUpdateStore`)."""
        params = {
            "after": -1 if after_update_id is None else int_arg("after_update_id", after_update_id),
            "limit": max(int(limit), 0),
        }
        with self._conns.using() as conn:
            rows = conn.execute(self._sql.chat.unkeyed, params).fetchall()
        return [StoredUpdate(int(update_id), body) for update_id, body in rows]

    def set_chat_keys(self, keys: Sequence[ChatKey]) -> int:
        """For ``(update_id, body, chat_key)``: record the chat key of the row if it has none,
        is unsettled and holds exactly ``body``; one transaction. Returns how many were set."""
        keys = list(keys)
        if not keys:
            return 0
        done = 0
        with self._conns.immediate() as conn:
            for update_id, body, chat_key in keys:
                params = {
                    "update_id": int_arg("update_id", update_id),
                    "body": body,
                    "chat_key": int_arg("chat_key", chat_key),
                }
                done += conn.execute(self._sql.chat.fill_key, params).rowcount
        return done
