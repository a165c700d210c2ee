"""The outbox's SQL (:class:`~ptb_fence.OutboxStore`), shared by the SQLite and PostgreSQL
stores: the table ``<table>_outbox`` of the Bot API calls an attempt queued, and every
statement on it, written once with ``:name`` placeholders (PostgreSQL gets ``%(name)s``).

Each rule is one conditional statement; its ``WHERE`` clause is the rule:

* claimable at ``now``: ``pending`` with ``due_at <= now``, or ``sending`` with ``due_at <
  now`` (a sender's lease is held while ``due_at >= now``);
* in turn in its chat: no other call of the chat ``pending`` or ``sending`` with a smaller
  ``call_id``, and none ``sending`` under a live lease; a call without a chat key always is.
  It reads the partial index ``(chat_key, call_id) WHERE state IN ('pending', 'sending')``;
* a sender's writes (sent, retry, fail, release) need ``state = 'sending'`` and its token;
* a sender whose process is provably dead (its store instance, the suffix ``@<instance>`` of
  its token, taken over by ``take_over_dead``) leaves its calls claimable at once.

The claim is one statement: SQLite runs it under the write lock (``BEGIN IMMEDIATE``);
PostgreSQL picks the rows ``FOR UPDATE SKIP LOCKED`` in a ``WITH`` and updates them in the
same statement, so concurrent claimers never get one call twice (a row another claimer
locked is skipped; one it changed and committed meanwhile is checked again as it is now).

Table names are validated before they reach this module and always double-quoted.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ptb_fence._values import (
    OUTBOX_STATES,
    AttemptEffects,
    AttemptIdentity,
    CallClaim,
    OutboxCall,
    OutboxEntry,
)

__all__ = [
    "COLUMNS",
    "OutboxStatements",
    "call_params",
    "counts_of",
    "effects_params",
    "entry_of",
    "outbox_table_name",
    "sender_pattern",
    "sender_token",
]

COLUMNS = (
    "call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once, "
    "state, tries, due_at, created_at, sent_at, error, result, acknowledged"
)
"""The columns of an :class:`~ptb_fence.OutboxEntry`, in its field order."""


def outbox_table_name(table: str) -> str:
    """The outbox table of the update table ``table``: ``<table>_outbox``, or a name derived
    from a digest when that would be longer than 63 characters (PostgreSQL would truncate it
    silently, and two long names with a common prefix would then share one table)."""
    name = f"{table}_outbox"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(table.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_outbox"


def _index(outbox: str, suffix: str) -> str:
    name = f"{outbox}_{suffix}"
    if len(name) <= 63:
        return f'"{name}"'
    digest = hashlib.sha256(outbox.encode("utf-8")).hexdigest()[:16]
    return f'"ptb_fence_{digest}_{suffix}"'


def _literal(text: str) -> str:
    """``text`` as an SQL string literal (a validated table name)."""
    return "'" + text.replace("'", "''") + "'"


def _postgres(sql: str) -> str:
    return re.sub(r"(?<![:\w]):([a-z_]+)", r"%(\1)s", sql)


class OutboxStatements:
    """Every statement on the outbox of one update table, for one dialect.

    Args:
        table: The update table (validated).
        postgres: PostgreSQL (``%(name)s``, ``BIGSERIAL``, ``BOOLEAN``, ``SKIP LOCKED``);
            else SQLite.
    """

    __slots__ = (
        "acknowledge",
        "claim",
        "claimed",
        "counts",
        "create",
        "drop",
        "due_failures",
        "exists",
        "fail",
        "get",
        "insert",
        "list_all",
        "list_state",
        "lock_chat",
        "name",
        "prune",
        "record_sent",
        "release",
        "retry",
        "retry_failed",
        "take_over",
    )

    def __init__(self, table: str, *, postgres: bool) -> None:
        self.name: str = outbox_table_name(table)
        o = f'"{self.name}"'
        key, integer, boolean = (
            ("BIGSERIAL PRIMARY KEY", "BIGINT", "BOOLEAN")
            if postgres
            else ("INTEGER PRIMARY KEY AUTOINCREMENT", "INTEGER", "INTEGER")
        )
        # the table, then its indexes: one statement each (SQLite runs one per execute)
        self.create: Tuple[str, ...] = (f"""
CREATE TABLE IF NOT EXISTS {o} (
    call_id      {key},
    update_id    {integer} NOT NULL,  -- the attempt that queued the call
    attempt      INT     NOT NULL,
    claim_id     TEXT    NOT NULL,
    seq          INT     NOT NULL,    -- its position among the attempt's calls
    chat_key     {integer},           -- NULL: no chat, never ordered
    method       TEXT    NOT NULL,
    params       TEXT    NOT NULL,    -- a JSON object
    at_most_once {boolean} NOT NULL DEFAULT FALSE,
    state        TEXT    NOT NULL,    -- pending, sending, sent, failed
    tries        INT     NOT NULL DEFAULT 0,
    due_at       {integer} NOT NULL,  -- pending: when; sending: the lease; failed: when
    created_at   {integer} NOT NULL,
    sent_at      {integer},
    sender       TEXT,                -- the token of the sender that claimed it
    error        TEXT,
    result       TEXT,
    acknowledged {boolean} NOT NULL DEFAULT FALSE
)""",
            f"CREATE INDEX IF NOT EXISTS {_index(self.name, 'state_due_idx')} "
            f"ON {o} (state, due_at)",
            f"CREATE INDEX IF NOT EXISTS {_index(self.name, 'chat_idx')} ON {o} "
            "(chat_key, call_id) WHERE state IN ('pending', 'sending')",
            f"CREATE INDEX IF NOT EXISTS {_index(self.name, 'failed_idx')} ON {o} (call_id) "
            "WHERE state = 'failed' AND NOT acknowledged",
        )
        claimable = """((c.state = 'pending' AND c.due_at <= :now)
         OR (c.state = 'sending' AND c.due_at < :now))"""
        in_turn = f"""(c.chat_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {o} AS e
            WHERE e.chat_key = c.chat_key AND e.state IN ('pending', 'sending')
              AND e.call_id <> c.call_id
              AND (e.call_id < c.call_id OR (e.state = 'sending' AND e.due_at >= :now))))"""
        take = "state = 'sending', due_at = :lease_until, tries = tries + 1, sender = :sender"
        if postgres:
            claim = f"""
WITH picked AS (
    SELECT c.call_id FROM {o} AS c
    WHERE {claimable} AND {in_turn}
    ORDER BY c.call_id
    LIMIT :limit
    FOR UPDATE OF c SKIP LOCKED
)
UPDATE {o} AS u SET {take}
FROM picked WHERE u.call_id = picked.call_id
RETURNING {", ".join("u." + c for c in COLUMNS.split(", "))}"""
        else:
            claim = f"""
UPDATE {o} SET {take}
WHERE call_id IN (
    SELECT c.call_id FROM {o} AS c
    WHERE {claimable} AND {in_turn}
    ORDER BY c.call_id
    LIMIT :limit
)
RETURNING {COLUMNS}"""
        sender = "call_id = :call_id AND state = 'sending' AND sender = :sender"
        claim_go = f"""{'CAST(:claim AS BOOLEAN)' if postgres else ':claim'} AND (
            CAST(:chat_key AS {integer}) IS NULL OR NOT EXISTS (
                SELECT 1 FROM {o} AS e
                WHERE e.chat_key = :chat_key AND e.state IN ('pending', 'sending')))"""
        statements: Dict[str, str] = {
            "claim": claim,
            # claimed at insert (AttemptEffects.claim) only when the chat has no call pending
            # or sending (the earlier inserts of this transaction included): the chat's
            # earlier calls keep it, in call_id order, as claim_calls would
            "insert": f"""
INSERT INTO {o} (update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
                 state, tries, due_at, created_at, sender, acknowledged)
SELECT :update_id, :attempt, :claim_id, :seq, CAST(:chat_key AS {integer}), :method, :params,
       :at_most_once,
       CASE WHEN t.go THEN 'sending' ELSE 'pending' END,
       CASE WHEN t.go THEN 1 ELSE 0 END,
       CASE WHEN t.go THEN :lease_until ELSE :at END,
       :at,
       CASE WHEN t.go THEN :sender ELSE NULL END,
       FALSE
FROM (SELECT ({claim_go}) AS go) AS t
RETURNING call_id""",
            "claimed": f"""
SELECT {COLUMNS} FROM {o} WHERE state = 'sending' AND sender = :sender
ORDER BY call_id LIMIT :limit""",
            "record_sent": f"""
UPDATE {o} SET state = 'sent', sent_at = :at, result = :result
WHERE {sender} RETURNING call_id""",
            "retry": f"""
UPDATE {o} SET state = 'pending', due_at = :due_at, error = :error, sender = NULL
WHERE {sender} RETURNING call_id""",
            "fail": f"""
UPDATE {o} SET state = 'failed', due_at = :at, error = :error, acknowledged = FALSE,
               sent_at = NULL
WHERE {sender} RETURNING call_id""",
            "release": f"""
UPDATE {o} SET state = 'pending', due_at = :at, tries = tries - 1, sender = NULL
WHERE {sender} RETURNING call_id""",
            "due_failures": f"""
SELECT {COLUMNS} FROM {o}
WHERE state = 'failed' AND NOT acknowledged AND call_id > :after
ORDER BY call_id LIMIT :limit""",
            "acknowledge": f"""
UPDATE {o} SET acknowledged = TRUE, due_at = :at
WHERE call_id = :call_id AND state = 'failed' AND NOT acknowledged RETURNING call_id""",
            "get": f"SELECT {COLUMNS} FROM {o} WHERE call_id = :call_id",
            "list_all": f"""
SELECT {COLUMNS} FROM {o} WHERE call_id > :after ORDER BY call_id LIMIT :limit""",
            "list_state": f"""
SELECT {COLUMNS} FROM {o} WHERE call_id > :after AND state = :state
ORDER BY call_id LIMIT :limit""",
            "counts": f"SELECT state, acknowledged, COUNT(*) FROM {o} GROUP BY state, acknowledged",
            "retry_failed": f"""
UPDATE {o} SET state = 'pending', due_at = :at, acknowledged = FALSE, sender = NULL
WHERE call_id = :call_id AND state = 'failed' RETURNING call_id""",
            "drop": f"""
DELETE FROM {o} WHERE call_id = :call_id AND state IN ('pending', 'failed')
RETURNING call_id""",
            # the calls a provably dead instance's sender holds: their lease lapses now, as
            # its updates' do (the sender token ends with "@<instance>"). PostgreSQL skips a
            # row another session still locks (the next takeover check of the instance, or
            # its lease, takes it)
            "take_over": f"""
UPDATE {o} SET due_at = :now - 1
WHERE call_id IN (
    SELECT call_id FROM {o}
    WHERE state = 'sending' AND due_at >= :now - 1 AND sender LIKE :pattern ESCAPE '!'
    {'FOR UPDATE SKIP LOCKED' if postgres else ''}
)
RETURNING call_id""",
            # the history of the pruned window: sent calls, and failures acknowledged (an
            # acknowledgement sets due_at to its time)
            "prune": f"""
DELETE FROM {o}
WHERE (state = 'sent' AND sent_at < :before)
   OR (state = 'failed' AND acknowledged AND due_at < :before)""",
        }
        st = {name: _postgres(sql) if postgres else sql for name, sql in statements.items()}
        self.claim: str = st["claim"]
        self.insert: str = st["insert"]
        self.claimed: str = st["claimed"]
        # one chat's claimed inserts of concurrent transactions one after the other: the
        # second's NOT EXISTS then sees the first's committed call (READ COMMITTED)
        self.lock_chat: str = (
            f"SELECT pg_advisory_xact_lock(hashtext({_literal(self.name)}), "
            "hashint8(%(chat_key)s))" if postgres else ""
        )
        self.record_sent: str = st["record_sent"]
        self.retry: str = st["retry"]
        self.fail: str = st["fail"]
        self.release: str = st["release"]
        self.due_failures: str = st["due_failures"]
        self.acknowledge: str = st["acknowledge"]
        self.get: str = st["get"]
        self.list_all: str = st["list_all"]
        self.list_state: str = st["list_state"]
        self.counts: str = st["counts"]
        self.retry_failed: str = st["retry_failed"]
        self.drop: str = st["drop"]
        self.prune: str = st["prune"]
        self.take_over: str = st["take_over"]
        self.exists: str = (
            "SELECT to_regclass(%(outbox)s) IS NOT NULL" if postgres
            else "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :outbox"
        )


def sender_pattern(instance: str) -> str:
    """The ``LIKE`` pattern (escape ``!``) of every sender token of store instance
    ``instance`` (see :func:`sender_token`)."""
    escaped = instance.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return "%@" + escaped


def sender_token(base: str, instance: Optional[str]) -> str:
    """A sender token: ``base`` (``host:pid:random``), with ``@<instance>`` when the
    sender's process holds a store liveness instance (its calls are then taken over with
    its updates when the process dies)."""
    return base if not instance else f"{base}@{instance}"


def call_params(
    identity: AttemptIdentity, call: OutboxCall, at: int, claim: Optional[CallClaim] = None
) -> Dict[str, Any]:
    """The parameters of :attr:`OutboxStatements.insert` for one call (``claim``: inserted
    claimed by its sender when the chat has no unsent call)."""
    return {
        "claim": claim is not None,
        "sender": None if claim is None else claim.sender,
        "lease_until": int(at) if claim is None else int(claim.lease_until),
        "update_id": identity.update_id,
        "attempt": identity.attempt,
        "claim_id": identity.claim_id,
        "seq": int(call.seq),
        "chat_key": None if call.chat_key is None else int(call.chat_key),
        "method": call.method,
        "params": call.params_json,
        "at_most_once": bool(call.at_most_once),
        "at": int(at),
    }


def effects_params(
    identity: AttemptIdentity, effects: Optional[AttemptEffects], at: int
) -> List[Dict[str, Any]]:
    """The insert parameters of every call of ``effects`` (none for :obj:`None`)."""
    if effects is None:
        return []
    claim = effects.claim
    limit = 0 if claim is None else max(int(claim.limit), 0)
    return [
        call_params(identity, call, at, claim if i < limit else None)
        for i, call in enumerate(effects.calls)
    ]


def _optional_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def entry_of(row: Sequence[Any]) -> OutboxEntry:
    """The :class:`~ptb_fence.OutboxEntry` of a row of :data:`COLUMNS` (plain ints and bools
    whatever the driver gives)."""
    (call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
     state, tries, due_at, created_at, sent_at, error, result, acknowledged) = row
    return OutboxEntry(
        int(call_id), int(update_id), int(attempt), str(claim_id), int(seq),
        _optional_int(chat_key), str(method), str(params), bool(at_most_once), str(state),
        int(tries), int(due_at), int(created_at), _optional_int(sent_at), error, result,
        bool(acknowledged),
    )


def counts_of(rows: Sequence[Sequence[Any]]) -> Dict[str, int]:
    """``outbox_counts()`` from the rows of :attr:`OutboxStatements.counts`."""
    counts = {state: 0 for state in OUTBOX_STATES}
    counts["failed_acknowledged"] = 0
    for state, acknowledged, count in rows:
        key = "failed_acknowledged" if state == "failed" and acknowledged else str(state)
        counts[key] = counts.get(key, 0) + int(count)
    return counts
