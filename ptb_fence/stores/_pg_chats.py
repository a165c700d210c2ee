"""Chat order of a PostgresUpdateStore (:class:`~ptb_fence.ChatOrderedUpdateStore`); the
statements are in :mod:`ptb_fence.stores._chat_order_sql`."""

from __future__ import annotations

import uuid
from functools import lru_cache
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ptb_fence._fingerprint import update_fingerprint
from ptb_fence._protocols import ChatKey
from ptb_fence._values import AttemptIdentity, StoredUpdate
from ptb_fence.stores._duplicates import warn_conflict
from ptb_fence.stores._names import validate_update_id
from ptb_fence.stores._chat_order_sql import PostgresChatStatements
from ptb_fence.stores._pg_executor import PgExecutor
from ptb_fence.stores._pg_recovery import PgLiveness
from ptb_fence.stores._pg_recovery_sql import with_instance, with_suspect
from ptb_fence.stores._suspects import SuspectClaims
from ptb_fence.stores._postgres_sql import PostgresStatements

__all__ = ["PostgresChatOrder"]

ChatRow = Tuple[int, str, int, Optional[int]]


@lru_cache(maxsize=64)
def chat_statements(table: str, suspect: bool = False) -> PostgresChatStatements:
    """The chat-order statements of ``table`` (built once per table): the store's fenced claim
    (recording the instance; with ``suspect`` reading back whether the row is suspect) and its
    replace-a-settled-row clause, with the chat predicate."""
    sql = PostgresStatements.for_table(table)
    add_one = sql.add_many(1)
    replace = add_one[add_one.index("ON CONFLICT"):add_one.index("RETURNING")]
    claim = with_instance(sql.claim_fenced)
    return PostgresChatStatements(table, with_suspect(claim) if suspect else claim, replace)


class PostgresChatOrder:
    """``add_many_in_chats``, ``claim_in_chat_order`` and ``due_in_chat_order`` of
    :class:`ptb_fence.PostgresUpdateStore` (a mixin), and ``unkeyed_in_chats`` and
    ``set_chat_keys`` for the rows recorded without a chat key. They need the ``chat_key``
    column (the migration adds it)."""

    __slots__ = ()

    _db: PgExecutor
    _liveness: PgLiveness
    _suspects: SuspectClaims

    def add_many_in_chats(self, rows: Sequence[ChatRow]) -> List[bool]:
        """Insert ``(update_id, body, received_at, chat_key)`` rows as pending in one
        statement and commit, recording each chat key (optional capability, see
        :class:`ptb_fence.ChatOrderedUpdateStore`).

        Returns:
            List[:obj:`bool`]: Per input position, as :meth:`add_many` (:obj:`False` if the
            id existed, or appeared earlier in ``rows``).
        """
        rows = list(rows)
        first: Dict[int, int] = {}
        for position, row in enumerate(rows):
            validate_update_id(row[0])
            first.setdefault(row[0], position)
        if not rows:
            return []
        batch = [rows[position] for position in sorted(first.values())]
        prints = [update_fingerprint(body) for _, body, _, _ in batch]
        sql = chat_statements(self._db.table).add_many(len(batch))
        params: List[Any] = []
        for (update_id, body, received_at, chat_key), fingerprint in zip(batch, prints):
            chat = None if chat_key is None else int(chat_key)
            params += [update_id, body, received_at, fingerprint, chat]

        def work(cur: Any) -> Tuple[Set[int], List[Any]]:
            cur.execute(sql, params)
            done = {int(row[0]) for row in cur.fetchall()}
            missing = [
                (u, fp) for (u, _, _, _), fp in zip(batch, prints) if u not in done and fp
            ]
            if not missing:
                return done, []
            cur.execute(self._db.sql.conflicts, ([u for u, _ in missing], [f for _, f in missing]))
            return done, [tuple(row) for row in cur.fetchall()]

        inserted, conflicts = self._db.run(work)
        for update_id, stored, state, settled_at, new in conflicts:
            warn_conflict(int(update_id), stored, new, str(state), settled_at)
        return [
            first[row[0]] == position and row[0] in inserted for position, row in enumerate(rows)
        ]

    def claim_in_chat_order(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> Optional[AttemptIdentity]:
        """As :meth:`claim_owned`, in the same one ``UPDATE``, only when the row is its chat's
        turn at ``now`` (optional capability, see :class:`ptb_fence.ChatOrderedUpdateStore`).
        """
        params = {
            "update_id": update_id,
            "now": now,
            "lease_until": lease_until,
            "max_attempts": max_attempts,
            "durable": bool(durable_exhaustion),
            "claim_id": uuid.uuid4().hex,
            "instance": self._liveness.mine(),
        }
        suspect = self._db.has_column("isolated_claim")
        sql = chat_statements(self._db.table, suspect).claim

        def work(cur: Any) -> Optional[Tuple[Any, ...]]:
            cur.execute(sql, params)
            row = cur.fetchone()
            return None if row is None else tuple(row)

        row = self._db.run(work)
        if row is None or row[0] != "processing":
            return None
        identity = AttemptIdentity(update_id=update_id, attempt=int(row[1]), claim_id=str(row[2]))
        if suspect and row[3]:
            self._suspects.note(identity)
        return identity

    def due_in_chat_order(
        self, *, now: int, pending_before: int, limit: int, chat_key: Optional[int] = None
    ) -> List[StoredUpdate]:
        """As :meth:`due`, listing only rows that are their chat's turn at ``now`` (with
        ``chat_key``: of that chat only), in one statement."""
        params = {
            "now": now,
            "pending_before": pending_before,
            "limit": max(int(limit), 0),
            "chat_key": chat_key,
        }
        chat = chat_statements(self._db.table)
        sql = chat.due if chat_key is None else chat.due_of_chat

        def work(cur: Any) -> List[StoredUpdate]:
            cur.execute(sql, params)
            return [StoredUpdate(int(u), body) for u, body in cur.fetchall()]

        return self._db.run(work)

    def unkeyed_in_chats(
        self, *, after_update_id: Optional[int] = None, limit: int
    ) -> List[StoredUpdate]:
        """Unsettled rows (pending, processing, failed) without a chat key, by ``update_id``,
        after ``after_update_id`` (see :class:`ptb_fence.ChatOrderedUpdateStore`)."""
        params = {
            "after": -1 if after_update_id is None else int(after_update_id),
            "limit": max(int(limit), 0),
        }
        sql = chat_statements(self._db.table).unkeyed

        def work(cur: Any) -> List[StoredUpdate]:
            cur.execute(sql, params)
            return [StoredUpdate(int(u), body) for u, body in cur.fetchall()]

        return self._db.run(work)

    def set_chat_keys(self, keys: Sequence[ChatKey]) -> int:
        """For ``(update_id, body, chat_key)``: record the chat key of the row if it has none,
        is unsettled and holds exactly ``body``; one transaction. Returns how many were set."""
        params = [
            {"update_id": int(update_id), "body": body, "chat_key": int(chat_key)}
            for update_id, body, chat_key in keys
        ]
        if not params:
            return 0
        sql = chat_statements(self._db.table).fill_key

        def work(cur: Any) -> int:
            done = 0
            for values in params:
                cur.execute(sql, values)
                done += max(cur.rowcount, 0)
            return done

        return self._db.run(work)
