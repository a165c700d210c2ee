"""Every SQL statement of :class:`ptb_fence.PostgresUpdateStore`, in one place.

Statements use psycopg2's ``%(name)s`` placeholders (``%s`` for the batched ones, whose ``VALUES``
list depends on the batch size). Table names are validated by
:func:`ptb_fence.stores.validate_table_name` before they reach this module and are always
double-quoted, so the table is named exactly as given (case included).

The **legacy rule** is visible here: the statements in :class:`PostgresStatements` marked
*legacy-safe* never mention ``claim_id``, so they work on an older table without that column.
Every statement that mentions ``claim_id`` fails on such a table with PostgreSQL's
``undefined_column`` error, which the store turns into :class:`ptb_fence.SchemaError`.

Every rule is one conditional statement on one row; the ``WHERE`` clause is the rule:

* claimable at ``now``: ``pending``; ``failed`` with ``due_at <= now``; ``processing`` with
  ``due_at < now`` (a lease is held while ``due_at >= t``);
* live at ``t``: ``processing``, same attempt (and same claim id when fenced), ``due_at >= t``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ptb_fence.stores._chat_order_sql import chat_index_name, postgres_chat_schema
from ptb_fence.stores._pg_recovery_sql import INSTANCES_SQL, INSTANCES_TABLE

__all__ = ["PostgresStatements", "schema_sql"]


def _quote(table: str) -> str:
    return f'"{table}"'


def _index_name(table: str) -> str:
    name = f"{table}_state_due_at_idx"
    if len(name) <= 63:
        return name
    # PostgreSQL would silently truncate a longer name, and two long table names with a common
    # prefix would then share one index name (relation names share a namespace).
    digest = hashlib.sha256(table.encode("utf-8")).hexdigest()[:16]
    return f"ptb_fence_{digest}_state_due_at_idx"


def schema_lock_key(table: str) -> int:
    """The ``pg_advisory_xact_lock`` key that serialises schema changes of ``table``."""
    digest = hashlib.sha256(b"ptb_fence schema:" + table.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


META_TABLE = "ptb_fence_meta"
"""The table recording which bot owns each update table (``bind_bot``)."""

META_LOCK_KEY = int.from_bytes(
    hashlib.sha256(b"ptb_fence schema:" + META_TABLE.encode()).digest()[:8], "big", signed=True
)
"""The advisory lock key serialising the creation of :data:`META_TABLE`."""

META_SQL = f"""\
SELECT pg_advisory_xact_lock({META_LOCK_KEY});
CREATE TABLE IF NOT EXISTS "{META_TABLE}" (
    table_name TEXT PRIMARY KEY,      -- an update table of this schema
    bot_id     BIGINT NOT NULL        -- the bot (id from its token) that owns it
);
"""


def schema_sql(table: str) -> str:
    """The idempotent migration for ``table`` (already validated).

    Takes a transaction-scoped advisory lock first, so several processes applying it at once
    (each in its own transaction) do not race on ``CREATE TABLE IF NOT EXISTS``.
    """
    t = _quote(table)
    return f"""\
-- ptb_fence: schema of the update table {t}. Idempotent: applying it again changes nothing.
-- Serialise concurrent migrations of this table (the lock is held until the transaction ends).
SELECT pg_advisory_xact_lock({schema_lock_key(table)});

CREATE TABLE IF NOT EXISTS {t} (
    update_id   BIGINT PRIMARY KEY,   -- Telegram update_id
    body        TEXT   NOT NULL,      -- the update's JSON text, as received
    state       TEXT   NOT NULL,      -- pending, processing, failed, completed, abandoned
    attempts    INT    NOT NULL DEFAULT 0,
    due_at      BIGINT,               -- pending: received_at; lease expiry / retry time /
                                      -- when it was abandoned (never NULL; older tables
                                      -- declare it NOT NULL)
    received_at BIGINT NOT NULL,      -- epoch milliseconds
    settled_at  BIGINT,               -- NULL: not prunable (incl. unacknowledged exhaustion)
    error       TEXT,                 -- last failure text
    claim_id    TEXT,                 -- opaque token of the current or last claim
    fingerprint TEXT,                 -- which update the body is (same id, other update?)
    instance    TEXT,                 -- the live instance that made the claim (liveness)
    isolated_claim TEXT               -- NULL: never taken over from a dead process; else
                                      -- suspect, and = claim_id while that claim's handler
                                      -- runs alone in its process
);

-- Tables created before fencing lack claim_id; older ones lack fingerprint, instance and
-- isolated_claim.
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS claim_id TEXT;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS fingerprint TEXT;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS instance TEXT;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS isolated_claim TEXT;

CREATE INDEX IF NOT EXISTS "{_index_name(table)}" ON {t} (state, due_at);

{postgres_chat_schema(table)}
-- Which bot owns which update table (one table per bot).
{META_SQL}
-- The live instances of the update tables (hold_liveness / take_over_dead).
{INSTANCES_SQL}"""


# Whether the table, its claim_id column and its index all exist (the store then skips the DDL,
# whose ALTER TABLE would take an ACCESS EXCLUSIVE lock even when the column already exists).
_SCHEMA_CHECK = """\
SELECT to_regclass(%(table)s) IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%(table)s)
                  AND attname = 'claim_id' AND NOT attisdropped),
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%(table)s)
                  AND attname = 'fingerprint' AND NOT attisdropped),
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%(table)s)
                  AND attname = 'instance' AND NOT attisdropped),
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%(table)s)
                  AND attname = 'isolated_claim' AND NOT attisdropped),
       to_regclass(%(index)s) IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%(table)s)
                  AND attname = 'chat_key' AND NOT attisdropped),
       to_regclass(%(chat_index)s) IS NOT NULL,
       to_regclass(%(meta)s) IS NOT NULL,
       to_regclass(%(instances)s) IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%(instances)s)
                  AND attname = 'seen_at' AND NOT attisdropped)
"""

# Which of the optional columns the table has (for a table managed with create_table=False).
COLUMNS_CHECK = """SELECT attname FROM pg_attribute
WHERE attrelid = to_regclass(%(table)s) AND attnum > 0 AND NOT attisdropped"""

_CLAIMABLE = """(state = 'pending'
       OR (state = 'failed' AND due_at <= %(now)s)
       OR (state = 'processing' AND due_at < %(now)s))"""


# An existing id (SPEC §12): a different update (another fingerprint) replaces a settled row
# (completed, or abandoned with settled_at set) exactly like a fresh insert; the same update, a
# row without a fingerprint, or a live row is left alone (nothing returned).
_REPLACE_SETTLED = """\
ON CONFLICT (update_id) DO UPDATE SET
    body = EXCLUDED.body, state = EXCLUDED.state, attempts = EXCLUDED.attempts,
    due_at = EXCLUDED.due_at, received_at = EXCLUDED.received_at, settled_at = NULL,
    error = NULL, claim_id = EXCLUDED.claim_id, fingerprint = EXCLUDED.fingerprint
WHERE (t.state = 'completed' OR (t.state = 'abandoned' AND t.settled_at IS NOT NULL))
  AND t.fingerprint IS NOT NULL AND t.fingerprint <> EXCLUDED.fingerprint"""


@dataclass(frozen=True)
class PostgresStatements:
    """The statements for one table. Build with :meth:`for_table`."""

    table: str
    schema: str
    schema_check: str
    schema_check_args: "dict[str, str]"
    schema_lock: str
    add: str
    claim: str
    claim_fenced: str
    renew: str
    renew_owned: str
    settle_completed: str
    settle_failed: str
    settle_abandoned: str
    settle_completed_owned: str
    settle_failed_owned: str
    settle_abandoned_owned: str
    due: str
    prune: str
    owns: str
    owns_for_update: str
    reopen_completed: str
    exhaust: str
    due_exhaustions: str
    acknowledge_exhaustion: str
    probe: str
    renew_lock_timeout: str
    conflicts: str
    create_meta: str
    bind_bot: str

    @classmethod
    def for_table(cls, table: str) -> "PostgresStatements":
        """Build every statement for ``table`` (already validated)."""
        t = _quote(table)
        live = (
            "update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s"
        )
        live_owned = live + " AND claim_id = %(claim_id)s"
        return cls(
            table=table,
            schema=schema_sql(table),
            schema_check=_SCHEMA_CHECK,
            schema_check_args={
                "table": t,
                "index": f'"{_index_name(table)}"',
                "chat_index": f'"{chat_index_name(table)}"',
                "meta": f'"{META_TABLE}"',
                "instances": f'"{INSTANCES_TABLE}"',
            },
            schema_lock=f"SELECT pg_advisory_xact_lock({schema_lock_key(table)})",
            # legacy-safe. A pending row carries due_at = received_at (SPEC §3; older tables
            # declare due_at NOT NULL). Pending rows are found by their state.
            add=f"""\
INSERT INTO {t} (update_id, body, state, attempts, due_at, received_at)
VALUES (%(update_id)s, %(body)s, 'pending', 0, %(received_at)s, %(received_at)s)
ON CONFLICT (update_id) DO NOTHING
RETURNING update_id""",
            # legacy-safe: the base claim without durable_exhaustion leaves claim_id alone.
            # Take when attempts remain, else spend (abandon, settled now). SET expressions see
            # the row as it was; RETURNING sees it as it is now.
            claim=f"""\
UPDATE {t} SET
    state      = CASE WHEN attempts < %(max_attempts)s THEN 'processing' ELSE 'abandoned' END,
    attempts   = CASE WHEN attempts < %(max_attempts)s THEN attempts + 1 ELSE attempts END,
    due_at     = CASE WHEN attempts < %(max_attempts)s THEN %(lease_until)s ELSE %(now)s END,
    error      = CASE WHEN attempts < %(max_attempts)s THEN NULL ELSE 'attempts spent' END,
    settled_at = CASE WHEN attempts < %(max_attempts)s THEN settled_at ELSE %(now)s END
WHERE update_id = %(update_id)s
  AND {_CLAIMABLE}
RETURNING state, attempts""",
            # claim_owned, and the base claim with durable_exhaustion: a take writes the fresh
            # claim id; a durable spend keeps the last claim id (or writes the fresh one if there
            # is none) and leaves settled_at NULL, so the row stays an unacknowledged exhaustion.
            claim_fenced=f"""\
UPDATE {t} SET
    state      = CASE WHEN attempts < %(max_attempts)s THEN 'processing' ELSE 'abandoned' END,
    attempts   = CASE WHEN attempts < %(max_attempts)s THEN attempts + 1 ELSE attempts END,
    due_at     = CASE WHEN attempts < %(max_attempts)s THEN %(lease_until)s ELSE %(now)s END,
    error      = CASE WHEN attempts < %(max_attempts)s THEN NULL ELSE 'attempts spent' END,
    settled_at = CASE WHEN attempts < %(max_attempts)s THEN settled_at
                      WHEN %(durable)s THEN NULL
                      ELSE %(now)s END,
    claim_id   = CASE WHEN attempts < %(max_attempts)s THEN %(claim_id)s
                      WHEN %(durable)s THEN COALESCE(claim_id, %(claim_id)s)
                      ELSE claim_id END
WHERE update_id = %(update_id)s
  AND {_CLAIMABLE}
RETURNING state, attempts, claim_id""",
            # legacy-safe. Never shortens a lease; with now, never revives an expired one.
            renew=f"""\
UPDATE {t} SET due_at = GREATEST(due_at, %(lease_until)s)
WHERE {live}
  AND (%(now)s::BIGINT IS NULL OR due_at >= %(now)s)
RETURNING update_id""",
            renew_owned=f"""\
UPDATE {t} SET due_at = GREATEST(due_at, %(lease_until)s)
WHERE {live_owned}
  AND (%(now)s::BIGINT IS NULL OR due_at >= %(now)s)
RETURNING update_id""",
            # legacy-safe settles: land only on the attempt whose lease holds at settlement.at.
            settle_completed=f"""\
UPDATE {t} SET state = 'completed', settled_at = %(at)s, error = NULL
WHERE {live} AND due_at >= %(at)s
RETURNING update_id""",
            settle_failed=f"""\
UPDATE {t} SET state = 'failed', due_at = %(retry_at)s, settled_at = NULL, error = %(error)s
WHERE {live} AND due_at >= %(at)s
RETURNING update_id""",
            settle_abandoned=f"""\
UPDATE {t} SET state = 'abandoned', settled_at = %(at)s, error = %(error)s
WHERE {live} AND due_at >= %(at)s
RETURNING update_id""",
            settle_completed_owned=f"""\
UPDATE {t} SET state = 'completed', settled_at = %(at)s, error = NULL
WHERE {live_owned} AND due_at >= %(at)s
RETURNING update_id""",
            settle_failed_owned=f"""\
UPDATE {t} SET state = 'failed', due_at = %(retry_at)s, settled_at = NULL, error = %(error)s
WHERE {live_owned} AND due_at >= %(at)s
RETURNING update_id""",
            settle_abandoned_owned=f"""\
UPDATE {t} SET state = 'abandoned', settled_at = %(at)s, error = %(error)s
WHERE {live_owned} AND due_at >= %(at)s
RETURNING update_id""",
            # legacy-safe
            due=f"""\
SELECT update_id, body FROM {t}
WHERE (state = 'pending' AND received_at <= %(pending_before)s)
   OR (state = 'failed' AND due_at <= %(now)s)
   OR (state = 'processing' AND due_at < %(now)s)
ORDER BY update_id
LIMIT %(limit)s""",
            # legacy-safe. Pending, processing, failed rows and unacknowledged exhaustions
            # (settled_at NULL) are never pruned.
            prune=f"""\
DELETE FROM {t}
WHERE state IN ('completed', 'abandoned') AND settled_at < %(before)s""",
            owns=f"""\
SELECT update_id FROM {t}
WHERE {live_owned} AND due_at >= %(at)s""",
            # On the caller's connection: the row lock makes a competing claim wait for the
            # caller's transaction, and a competing claim in flight makes this wait and re-check.
            owns_for_update=f"""\
SELECT update_id FROM {t}
WHERE {live_owned} AND due_at >= %(at)s
FOR UPDATE""",
            # Undo a completion that the caller's own commit landed by mistake (complete_owned).
            reopen_completed=f"""\
UPDATE {t} SET state = 'processing', settled_at = NULL
WHERE update_id = %(update_id)s AND state = 'completed' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND settled_at = %(at)s
RETURNING update_id""",
            exhaust=f"""\
UPDATE {t} SET state = 'abandoned', due_at = %(at)s, settled_at = NULL, error = %(error)s
WHERE {live_owned} AND due_at >= %(at)s
RETURNING update_id""",
            due_exhaustions=f"""\
SELECT update_id, attempts, claim_id, body, due_at, error FROM {t}
WHERE state = 'abandoned' AND settled_at IS NULL AND claim_id IS NOT NULL
  AND (%(after_update_id)s::BIGINT IS NULL OR update_id > %(after_update_id)s)
ORDER BY update_id
LIMIT %(limit)s""",
            acknowledge_exhaustion=f"""\
UPDATE {t} SET settled_at = %(at)s
WHERE update_id = %(update_id)s AND state = 'abandoned' AND settled_at IS NULL
  AND attempts = %(attempt)s AND claim_id = %(claim_id)s
RETURNING update_id""",
            probe="SELECT 1",
            # A single renewal waits at most this long for a row lock (then 55P03).
            renew_lock_timeout="SET LOCAL lock_timeout = '200ms'",
            # After an insert that did not happen: stored rows holding a different update.
            conflicts=f"""\
SELECT t.update_id, t.fingerprint, t.state, t.settled_at, v.fingerprint
FROM unnest(%s::BIGINT[], %s::TEXT[]) AS v(update_id, fingerprint)
JOIN {t} AS t ON t.update_id = v.update_id
WHERE t.fingerprint IS NOT NULL AND t.fingerprint <> v.fingerprint""",
            create_meta=META_SQL,
            # The first binder wins; a no-op DO UPDATE returns the owner in one statement.
            bind_bot=f"""\
INSERT INTO "{META_TABLE}" (table_name, bot_id) VALUES (%(table)s, %(bot_id)s)
ON CONFLICT (table_name) DO UPDATE SET table_name = EXCLUDED.table_name
RETURNING bot_id""",
        )

    def add_many(self, count: int, fingerprint: bool = True) -> str:
        """Insert ``count`` rows in one statement; ``%s`` quadruples ``(update_id, body, at,
        fingerprint)`` (triples without ``fingerprint``).

        The caller removes duplicate ids from the batch first (``ON CONFLICT`` would otherwise
        pick one of them unpredictably). With ``fingerprint=False`` (a table without that
        column) an existing id is always left alone: legacy-safe.
        """
        if not fingerprint:
            values = ",\n       ".join(["(%s::BIGINT, %s::TEXT, %s::BIGINT)"] * count)
            return f"""\
INSERT INTO {_quote(self.table)} (update_id, body, state, attempts, due_at, received_at)
SELECT v.update_id, v.body, 'pending', 0, v.received_at, v.received_at
FROM (VALUES {values}) AS v(update_id, body, received_at)
ON CONFLICT (update_id) DO NOTHING
RETURNING update_id"""
        values = ",\n       ".join(["(%s::BIGINT, %s::TEXT, %s::BIGINT, %s::TEXT)"] * count)
        return f"""\
INSERT INTO {_quote(self.table)} AS t
       (update_id, body, state, attempts, due_at, received_at, fingerprint)
SELECT v.update_id, v.body, 'pending', 0, v.received_at, v.received_at, v.fingerprint
FROM (VALUES {values}) AS v(update_id, body, received_at, fingerprint)
{_REPLACE_SETTLED}
RETURNING update_id"""

    def add_claimed_many(
        self, count: int, fingerprint: bool = True, instance: bool = False
    ) -> str:
        """Record ``count`` fresh updates already claimed for attempt 1, in one statement.

        Parameters: ``lease_until``, then ``(update_id, body, received_at, claim_id,
        fingerprint)`` quintuples (quadruples without ``fingerprint``). An existing id is left
        alone, or (with ``fingerprint``) replaced when it holds a different, settled update;
        returns the inserted ``(update_id, attempts, claim_id)``. Needs the ``claim_id``
        column. With ``instance`` (and ``fingerprint``) a second parameter after
        ``lease_until`` is recorded in the ``instance`` column.
        """
        if not fingerprint:
            values = ",\n       ".join(["(%s::BIGINT, %s::TEXT, %s::BIGINT, %s::TEXT)"] * count)
            return f"""\
INSERT INTO {_quote(self.table)} (update_id, body, state, attempts, due_at, received_at, claim_id)
SELECT v.update_id, v.body, 'processing', 1, %s::BIGINT, v.received_at, v.claim_id
FROM (VALUES {values}) AS v(update_id, body, received_at, claim_id)
ON CONFLICT (update_id) DO NOTHING
RETURNING update_id, attempts, claim_id"""
        values = ",\n       ".join(
            ["(%s::BIGINT, %s::TEXT, %s::BIGINT, %s::TEXT, %s::TEXT)"] * count
        )
        column, value, replace = "", "", _REPLACE_SETTLED
        if instance:
            column, value = ", instance", ", %s::TEXT"
            replace = replace.replace(
                "fingerprint = EXCLUDED.fingerprint",
                "fingerprint = EXCLUDED.fingerprint, instance = EXCLUDED.instance",
            )
        return f"""\
INSERT INTO {_quote(self.table)} AS t
       (update_id, body, state, attempts, due_at, received_at, claim_id, fingerprint{column})
SELECT v.update_id, v.body, 'processing', 1, %s::BIGINT, v.received_at, v.claim_id,
       v.fingerprint{value}
FROM (VALUES {values}) AS v(update_id, body, received_at, claim_id, fingerprint)
{replace}
RETURNING update_id, attempts, claim_id"""

    def complete_owned_many(self, count: int) -> str:
        """Settle ``count`` fenced attempts as completed in one statement.

        Parameters: ``(update_id, attempt, claim_id, at)`` quadruples. Returns the matched
        ``(update_id, attempts, claim_id)``.
        """
        values = ", ".join(["(%s::BIGINT, %s::INT, %s::TEXT, %s::BIGINT)"] * count)
        return f"""\
UPDATE {_quote(self.table)} AS t SET state = 'completed', settled_at = v.at, error = NULL
FROM (VALUES {values}) AS v(update_id, attempt, claim_id, at)
WHERE t.update_id = v.update_id AND t.state = 'processing' AND t.attempts = v.attempt
  AND t.claim_id = v.claim_id AND t.due_at >= v.at
RETURNING t.update_id, t.attempts, t.claim_id"""

    # -- batched renewals ------------------------------------------------------------------
    # A renewal must never wait on a row lock: a handler's fenced transaction holds its row
    # FOR UPDATE (owns(..., connection=conn)) for as long as the transaction is open, and one
    # waiting statement would stop the renewals of every other attempt of the process. So the
    # batch is ONE statement in three parts:
    #
    # * ``lockable`` locks the candidate rows (matching identity, lease unexpired at now) with
    #   FOR UPDATE SKIP LOCKED: a row another open transaction holds is skipped, never waited
    #   for;
    # * ``renewed`` extends exactly the rows locked by ``lockable`` and returns them;
    # * the final SELECT answers per input position: renewed -> True; otherwise a plain,
    #   non-locking read of the same row (the statement's snapshot: the committed version, not
    #   blocked by the lock) tells whether it still matches the claim with an unexpired lease.
    #   If it does, the row was skipped only because it is locked right now -> NULL (undecided:
    #   the caller must not treat it as refused); if not, the renewal is refused -> FALSE.
    #
    # A row that a transaction committed between the snapshot and the lock and that no longer
    # matches is reported NULL too (undecided), never as renewed; the next renewal decides.
    def renew_many(self, count: int) -> str:
        """Renew ``count`` ``(update_id, attempt)`` leases in one statement. Legacy-safe.

        Parameters, in order: the ``(position, update_id, attempt)`` triples, ``now``,
        ``lease_until``, ``now``. Returns ``(position, renewed, still_matches)`` per input
        position, in order (see the comment above).
        """
        values = ", ".join(["(%s::INT, %s::BIGINT, %s::INT)"] * count)
        t = _quote(self.table)
        return f"""\
WITH v(pos, update_id, attempt) AS (VALUES {values}),
lockable AS (
    SELECT t.update_id FROM {t} AS t JOIN v ON t.update_id = v.update_id
    WHERE t.state = 'processing' AND t.attempts = v.attempt AND t.due_at >= %s
    FOR UPDATE OF t SKIP LOCKED
),
renewed AS (
    UPDATE {t} AS t SET due_at = GREATEST(t.due_at, %s)
    FROM lockable AS l
    WHERE t.update_id = l.update_id
    RETURNING t.update_id, t.attempts
)
SELECT v.pos,
       EXISTS (SELECT 1 FROM renewed AS r
                WHERE r.update_id = v.update_id AND r.attempts = v.attempt),
       EXISTS (SELECT 1 FROM {t} AS c
                WHERE c.update_id = v.update_id AND c.state = 'processing'
                  AND c.attempts = v.attempt AND c.due_at >= %s)
FROM v ORDER BY v.pos"""

    def renew_owned_many(self, count: int) -> str:
        """Renew ``count`` fenced leases in one statement.

        Parameters, in order: the ``(position, update_id, attempt, claim_id)`` quadruples,
        ``now``, ``lease_until``, ``now``. Returns ``(position, renewed, still_matches)`` per
        input position, in order (see the comment above).
        """
        values = ", ".join(["(%s::INT, %s::BIGINT, %s::INT, %s::TEXT)"] * count)
        t = _quote(self.table)
        return f"""\
WITH v(pos, update_id, attempt, claim_id) AS (VALUES {values}),
lockable AS (
    SELECT t.update_id FROM {t} AS t JOIN v ON t.update_id = v.update_id
    WHERE t.state = 'processing' AND t.attempts = v.attempt AND t.claim_id = v.claim_id
      AND t.due_at >= %s
    FOR UPDATE OF t SKIP LOCKED
),
renewed AS (
    UPDATE {t} AS t SET due_at = GREATEST(t.due_at, %s)
    FROM lockable AS l
    WHERE t.update_id = l.update_id
    RETURNING t.update_id, t.attempts, t.claim_id
)
SELECT v.pos,
       EXISTS (SELECT 1 FROM renewed AS r
                WHERE r.update_id = v.update_id AND r.attempts = v.attempt
                  AND r.claim_id = v.claim_id),
       EXISTS (SELECT 1 FROM {t} AS c
                WHERE c.update_id = v.update_id AND c.state = 'processing'
                  AND c.attempts = v.attempt AND c.claim_id = v.claim_id AND c.due_at >= %s)
FROM v ORDER BY v.pos"""
