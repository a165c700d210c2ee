"""The chat-order predicates shared by the SQLite and PostgreSQL stores, and PostgreSQL's chat-order statements (:class:`~ptb_fence.ChatOrderedUpdateStore`).

A row is *in turn* at ``now`` when no other row of its chat (same ``chat_key``) is unsettled
(``pending``, ``processing``, ``failed``) with a smaller ``update_id``, and none is
``processing`` with a live lease (``due_at >= now``); a row without ``chat_key`` always is.
The predicate is part of the one conditional statement that claims or lists, and runs on a
partial index of the unsettled rows, ``(chat_key, update_id) WHERE state IN ('pending',
'processing', 'failed')``, so it reads only the waiting rows of one chat.

Table names are validated before they reach this module and always double-quoted.
"""

from __future__ import annotations

import hashlib

__all__ = [
    "UNSETTLED",
    "PostgresChatStatements",
    "chat_index_name",
    "due_predicate",
    "in_turn",
    "postgres_chat_schema",
]

UNSETTLED = "('pending', 'processing', 'failed')"
"""The states of a row that holds its chat."""


def chat_index_name(table: str) -> str:
    """The name of the chat-order index of ``table`` (at most 63 characters)."""
    name = f"{table}_chat_key_idx"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(table.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_chat_key_idx"


def in_turn(row: str, table: str, now: str) -> str:
    """The predicate "``row`` (an alias or the quoted table) is in turn at ``now`` (a
    placeholder)", one ``NOT EXISTS`` on the partial chat index."""
    return f"""({row}.chat_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {table} AS o
        WHERE o.chat_key = {row}.chat_key AND o.state IN {UNSETTLED}
          AND o.update_id <> {row}.update_id
          AND (o.update_id < {row}.update_id
               OR (o.state = 'processing' AND o.due_at >= {now}))))"""


def due_predicate(row: str, pending: str, now: str) -> str:
    # as the stores' due: pending after the grace period (or released: a claim id), failed
    # and due, processing with a lapsed lease
    return f"""(({row}.state = 'pending' AND ({row}.received_at <= {pending}
                                          OR {row}.claim_id IS NOT NULL))
        OR ({row}.state = 'failed' AND {row}.due_at <= {now})
        OR ({row}.state = 'processing' AND {row}.due_at < {now}))"""


def postgres_chat_schema(table: str) -> str:
    """The idempotent PostgreSQL DDL of chat order for ``table``: the nullable ``chat_key``
    column and the partial index (part of ``postgres_update_store_schema``)."""
    t = f'"{table}"'
    return (
        "-- strict_chat_order: the chat of each row (NULL: no chat) and the waiting rows\n"
        "-- of each chat (unsettled only, so the index stays small).\n"
        f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS chat_key BIGINT;\n"
        f'CREATE INDEX IF NOT EXISTS "{chat_index_name(table)}" ON {t} (chat_key, update_id)\n'
        f"    WHERE state IN {UNSETTLED};\n"
    )


class PostgresChatStatements:
    """The chat-order statements of one PostgreSQL table (``%(name)s`` parameters).

    Args:
        table: The validated table name.
        claim_fenced: The table's fenced claim (``PostgresStatements.claim_fenced``), which
            gets the predicate added to its ``WHERE``.
        replace_settled: The ``ON CONFLICT`` clause that replaces a settled row by a
            different update (``_postgres_sql``).
    """

    __slots__ = ("claim", "due", "due_of_chat", "fill_key", "replace", "table", "unkeyed")

    def __init__(self, table: str, claim_fenced: str, replace_settled: str) -> None:
        t = f'"{table}"'
        self.table = t
        anchor = "WHERE update_id = %(update_id)s\n"
        if claim_fenced.count(anchor) != 1:  # pragma: no cover - guards the statement's shape
            raise AssertionError("unexpected claim statement")
        self.claim = claim_fenced.replace(
            anchor, f"{anchor}  AND {in_turn(t, t, '%(now)s')}\n"
        )
        self.replace = replace_settled.replace(
            "fingerprint = EXCLUDED.fingerprint",
            "fingerprint = EXCLUDED.fingerprint, chat_key = EXCLUDED.chat_key",
        )
        self.due = f"""\
SELECT r.update_id, r.body FROM {t} AS r
WHERE {due_predicate('r', '%(pending_before)s', '%(now)s')} AND {in_turn('r', t, '%(now)s')}
ORDER BY r.update_id
LIMIT %(limit)s"""
        self.due_of_chat = f"""\
SELECT r.update_id, r.body FROM {t} AS r
WHERE r.chat_key = %(chat_key)s AND r.state IN {UNSETTLED}
  AND {due_predicate('r', '%(pending_before)s', '%(now)s')} AND {in_turn('r', t, '%(now)s')}
ORDER BY r.update_id
LIMIT %(limit)s"""
        # rows recorded without a chat key (by a process without strict_chat_order), read on
        # the partial chat index (NULL keys included), and their key set once derived
        self.unkeyed = f"""\
SELECT update_id, body FROM {t}
WHERE chat_key IS NULL AND state IN {UNSETTLED} AND update_id > %(after)s
ORDER BY update_id
LIMIT %(limit)s"""
        self.fill_key = f"""\
UPDATE {t} SET chat_key = %(chat_key)s
WHERE update_id = %(update_id)s AND chat_key IS NULL AND state IN {UNSETTLED}
  AND body = %(body)s"""

    def add_many(self, count: int) -> str:
        """Insert ``count`` pending rows with chat keys in one statement; ``%s`` quintuples
        ``(update_id, body, received_at, fingerprint, chat_key)``. Returns the inserted ids."""
        values = ",\n       ".join(
            ["(%s::BIGINT, %s::TEXT, %s::BIGINT, %s::TEXT, %s::BIGINT)"] * count
        )
        return f"""\
INSERT INTO {self.table} AS t
       (update_id, body, state, attempts, due_at, received_at, fingerprint, chat_key)
SELECT v.update_id, v.body, 'pending', 0, v.received_at, v.received_at, v.fingerprint,
       v.chat_key
FROM (VALUES {values}) AS v(update_id, body, received_at, fingerprint, chat_key)
{self.replace}
RETURNING update_id"""
