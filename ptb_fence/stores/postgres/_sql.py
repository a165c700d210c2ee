"""All the SQL of :class:`ptb_fence.PostgresUpdateStore`, in one place.

Sections: the table and the store's statements; the claim of several rows; release and
liveness; chat order; the read-only and admin statements of the command line and the chaos
runner.

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

**The claim of several rows** (``claim_owned_many``) is one ``UPDATE`` applying the rule of
``claim_owned`` (take when attempts remain, else spend) to several given rows. It needs the
``claim_id`` column; ``instance`` is written where the table has it. The rows are locked first,
in ``update_id`` order, so two calls over overlapping ids never deadlock.

**Release and liveness.** The ``instance`` column (the live instance that made a claim) and
the ``isolated_claim`` column (suspect rows, see :class:`ptb_fence.IsolatingUpdateStore`) are
added by the idempotent migration; on a table managed with ``create_table=False`` and not
migrated yet the claims run the statements without them (the legacy rule still holds for the
base API) and ``take_over_dead`` counts every crashed attempt as spent.

Liveness: an instance holds a *session* advisory lock ``pg_advisory_lock(CLASS_ID, key)`` on a
dedicated connection (two-int form in a fixed namespace, so it does not collide with the
single-bigint locks users take) and has a row in ``ptb_fence_instances``. PostgreSQL ends the
lock with the backend when the process dies.

A free lock alone proves nothing: the backend also ends when it is terminated
(``pg_terminate_backend``, an idle-connection killer) or the server restarts, while the process
lives on. So every ``take_over_dead`` of a holder also refreshes its row's ``seen_at`` (the
server's clock) through the store's pool, and holds its lock again on a new connection when
that one broke. An instance is dead when its lock can be taken (``pg_try_advisory_xact_lock``)
*and* its row was not refreshed for :data:`BEAT_STALE_MS` *and* that last refresh came after
the server started: a live holder that lost its lock keeps refreshing (and holds the lock
again within a second), and a lock lost in a restart is not taken for a death.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

from ptb_fence.stores._admin_sql import ROW_COLUMNS, AdminStatements
from ptb_fence.stores._chat_order_sql import UNSETTLED, chat_index_name, due_predicate, in_turn
from ptb_fence.stores._figures_sql import figures_sql
from ptb_fence.stores._outbox_sql import OutboxStatements, outbox_table_name
from ptb_fence.stores._state_sql import StateStatements, state_table_name
from ptb_fence.stores._suspects import PROBATION_OVER, suspicion_sql, taken_over_mark_sql

__all__ = [
    "BEAT_STALE_MS",
    "CLASS_ID",
    "COLUMNS_CHECK",
    "INSTANCES_SQL",
    "INSTANCES_TABLE",
    "META_TABLE",
    "POSTGRES_FORGET_TABLE",
    "POSTGRES_META_EXISTS",
    "POSTGRES_TABLE_STATE",
    "ClaimStatements",
    "PostgresChatStatements",
    "PostgresStatements",
    "RecoveryStatements",
    "chat_statements",
    "instance_key",
    "postgres_admin_statements",
    "postgres_chat_schema",
    "schema_sql",
    "with_instance",
    "with_suspect",
]

# -- the table and the store's statements --------------------------------------------------
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
                                      -- runs on probation or alone in its process
);

-- Tables created before fencing lack claim_id; older ones lack fingerprint, instance and
-- isolated_claim.
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS claim_id TEXT;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS fingerprint TEXT;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS instance TEXT;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS isolated_claim TEXT;

CREATE INDEX IF NOT EXISTS "{_index_name(table)}" ON {t} (state, due_at);

{postgres_chat_schema(table)}
-- The outbox: the Bot API calls queued by attempts, sent iff their completion committed.
{";".join(OutboxStatements(table, postgres=True).create)};

-- Persisted bot state (FencedPersistence): one versioned row per user, chat, conversation.
{";".join(StateStatements(table, postgres=True).create)};

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
       to_regclass(%(outbox)s) IS NOT NULL,
       to_regclass(%(state)s) IS NOT NULL,
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


# An existing id: a different update (another fingerprint) replaces a settled row
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
    figures: str
    figures_unkeyed: str
    outbox: OutboxStatements
    state: StateStatements

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
                "outbox": f'"{outbox_table_name(table)}"',
                "state": f'"{state_table_name(table)}"',
            },
            schema_lock=f"SELECT pg_advisory_xact_lock({schema_lock_key(table)})",
            # legacy-safe. A pending row carries due_at = received_at (never NULL; older tables
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
            # legacy-safe (no claim_id). One read-only transaction of one SELECT that reads
            # only the waiting rows through the indexes; the second form for a table that has
            # no chat_key column yet (create_table=False, not migrated).
            figures="SET TRANSACTION READ ONLY;" + figures_sql(t),
            figures_unkeyed="SET TRANSACTION READ ONLY;" + figures_sql(t, chat_keys=False),
            outbox=OutboxStatements(table, postgres=True),
            state=StateStatements(table, postgres=True),
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

    def complete_owned_writing(self, count: int, writes: int) -> str:
        """:meth:`complete_owned_many` and the state writes of the completions that match,
        in one statement (one round trip instead of three: the store thread waits for the
        GIL after every one, up to the switch interval while the event loop is busy).

        Parameters: the ``count`` quadruples of :meth:`complete_owned_many`, then ``writes``
        rows ``(update_id, attempt, claim_id, kind, name, key, value, at, version)``, run
        under their keys' locks. A write lands only with its attempt's completion, and only
        on the version it read (version 0: the row was absent; inserted unless it is there
        now). Returns per matched completion ``(update_id, attempts, claim_id, written)``,
        ``written`` being how many writes landed in all: the caller compares it with the
        writes of the completions that matched."""
        state = f'"{self.state.name}"'
        rows = ", ".join(
            ["(%s::BIGINT, %s::INT, %s::TEXT, %s::TEXT, %s::TEXT, %s::TEXT, %s::TEXT, "
             "%s::BIGINT, %s::BIGINT)"] * writes
        )
        done = self.complete_owned_many(count)
        return f"""\
WITH done AS (
{done}
), w AS (
SELECT w.kind, w.name, w.key, w.value, w.at, w.version
FROM (VALUES {rows}) AS w(update_id, attempt, claim_id, kind, name, key, value, at, version)
JOIN done AS d ON d.update_id = w.update_id AND d.attempts = w.attempt
  AND d.claim_id = w.claim_id
), inserted AS (
INSERT INTO {state} (kind, name, key, value, version, updated_at)
SELECT kind, name, key, value, 1, at FROM w WHERE version = 0
ON CONFLICT (kind, name, key) DO NOTHING
RETURNING 1
), updated AS (
UPDATE {state} AS s SET value = w.value, version = s.version + 1, updated_at = w.at
FROM w WHERE w.version <> 0 AND s.kind = w.kind AND s.name = w.name AND s.key = w.key
  AND s.version = w.version
RETURNING 1
)
SELECT d.update_id, d.attempts, d.claim_id,
       (SELECT count(*) FROM inserted) + (SELECT count(*) FROM updated)
FROM done AS d"""

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


# -- the claim of several rows -------------------------------------------------------------
def _take_or_spend(claim_id: str, instance: bool) -> str:
    """The SET clause of a claim: take (``attempts < max_attempts``: processing, the next
    attempt, the lease, the fresh claim id ``claim_id`` — an SQL expression —, the instance)
    or spend (abandoned; settled at ``now``, or with ``durable`` an unacknowledged exhaustion
    keeping its last claim id). SET expressions see the row as it was."""
    take = "attempts < %(max_attempts)s"
    clause = f"""\
    state      = CASE WHEN {take} THEN 'processing' ELSE 'abandoned' END,
    attempts   = CASE WHEN {take} THEN attempts + 1 ELSE attempts END,
    due_at     = CASE WHEN {take} THEN %(lease_until)s::BIGINT ELSE %(now)s::BIGINT END,
    error      = CASE WHEN {take} THEN NULL ELSE 'attempts spent' END,
    settled_at = CASE WHEN {take} THEN settled_at
                      WHEN %(durable)s THEN NULL
                      ELSE %(now)s::BIGINT END,
    claim_id   = CASE WHEN {take} THEN {claim_id}
                      WHEN %(durable)s THEN COALESCE(claim_id, {claim_id})
                      ELSE claim_id END"""
    if instance:
        clause += f",\n    instance   = CASE WHEN {take} THEN %(instance)s::TEXT ELSE NULL END"
    return clause


class ClaimStatements:
    """The multi-row claim statement of one table (already validated)."""

    __slots__ = ("table",)

    def __init__(self, table: str) -> None:
        self.table = f'"{table}"'

    def claim_owned_many(self, instance: bool, suspect: bool = False) -> str:
        """``claim_owned`` for the distinct ids of ``%(update_ids)s`` with the fresh claim ids
        ``%(claim_ids)s`` (same length). Returns ``update_id, state, attempts, claim_id`` of
        every row it changed (``state = 'abandoned'``: spent, not taken), with ``suspect``
        a fifth column: the row's suspicion (0, 1 or 2, see ``stores/_suspects.py``)."""
        t = self.table
        suspect_column = ", " + suspicion_sql("t.isolated_claim") if suspect else ""
        return f"""\
WITH v(update_id, new_claim_id) AS (
    SELECT * FROM unnest(%(update_ids)s::BIGINT[], %(claim_ids)s::TEXT[])
),
locked AS MATERIALIZED (
    SELECT r.update_id FROM {t} AS r JOIN v ON r.update_id = v.update_id
    WHERE {_CLAIMABLE}
    ORDER BY r.update_id
    FOR UPDATE OF r
)
UPDATE {t} AS t SET
{_take_or_spend("v.new_claim_id", instance)}
FROM locked JOIN v ON v.update_id = locked.update_id
WHERE t.update_id = locked.update_id AND {_CLAIMABLE}
RETURNING t.update_id, t.state, t.attempts, t.claim_id{suspect_column}"""


# -- release and liveness ------------------------------------------------------------------
CLASS_ID = 0x70746266  # "ptbf": the advisory-lock namespace of ptb_fence instances

BEAT_STALE_MS = 3000
"""How long an instance whose lock is free must have left its row unrefreshed to be dead. A
holder refreshes it at every ``take_over_dead`` (the runtime calls it every second); three
missed refreshes are a death, not a delay."""

NOW_MS = "(extract(epoch FROM statement_timestamp()) * 1000)::BIGINT"
"""The server's clock, in epoch milliseconds (every ``seen_at`` is written and read by it)."""

INSTANCES_TABLE = "ptb_fence_instances"
"""The live instances (``hold_liveness``) of every update table of the database."""

INSTANCES_SQL = f"""\
CREATE TABLE IF NOT EXISTS "{INSTANCES_TABLE}" (
    table_name TEXT   NOT NULL,       -- an update table of this schema
    instance   TEXT   NOT NULL,       -- the instance id (hold_liveness)
    lock_key   INT    NOT NULL,       -- pg_advisory_lock({CLASS_ID}, lock_key) while alive
    started_at BIGINT NOT NULL,       -- epoch milliseconds
    seen_at    BIGINT,                -- last refresh by its holder (server clock, epoch ms)
    PRIMARY KEY (table_name, instance)
);
-- Every new update table's schema runs this: an unconditional ALTER TABLE would queue for an
-- ACCESS EXCLUSIVE lock on the table that every live instance of the database refreshes, and
-- while one open transaction (a frozen process between a statement and its commit) keeps it
-- waiting, every instance's takeover check would wait behind it. Only a table that lacks the
-- column is altered.
DO $ptb_fence$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = to_regclass('"{INSTANCES_TABLE}"')
                     AND attname = 'seen_at' AND NOT attisdropped) THEN
        ALTER TABLE "{INSTANCES_TABLE}" ADD COLUMN IF NOT EXISTS seen_at BIGINT;
    END IF;
END
$ptb_fence$;
"""


def instance_key(instance: str) -> int:
    """The signed 32-bit advisory-lock key of ``instance`` (second half of the two-int form)."""
    digest = hashlib.sha256(b"ptb_fence instance:" + instance.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


def with_instance(claim: str) -> str:
    """A claim statement (``claim`` or ``claim_fenced``) that also records ``%(instance)s`` on a
    take (and clears it on a spend)."""
    head, where = claim.split("\nWHERE update_id", 1)
    return (
        head
        + ",\n    instance   = CASE WHEN attempts < %(max_attempts)s THEN %(instance)s::TEXT"
        + " ELSE NULL END"
        + "\nWHERE update_id"
        + where
    )


def with_suspect(claim: str) -> str:
    """A fenced claim statement that also reads back the row's suspicion (a fourth column: 0,
    1 or 2, see ``stores/_suspects.py``; the claim does not change ``isolated_claim``)."""
    tail = "RETURNING state, attempts, claim_id"
    if not claim.endswith(tail):  # pragma: no cover - guards the statement's shape
        raise AssertionError("unexpected claim statement")
    return claim + ", " + suspicion_sql()


class RecoveryStatements:
    """The release and liveness statements of one table (already validated)."""

    __slots__ = (
        "beats",
        "delete_instance",
        "due_released",
        "end_probation",
        "insert_instance",
        "lock_instance",
        "mark_isolated",
        "take_over_dead",
        "take_over_dead_isolating",
        "table",
        "unlock_instance",
    )

    def __init__(self, table: str) -> None:
        t = f'"{table}"'
        i = f'"{INSTANCES_TABLE}"'
        self.table = t
        # due, with released rows (pending with a claim id: add never writes one) at once.
        self.due_released = f"""\
SELECT update_id, body FROM {t}
WHERE (state = 'pending' AND (received_at <= %(pending_before)s OR claim_id IS NOT NULL))
   OR (state = 'failed' AND due_at <= %(now)s)
   OR (state = 'processing' AND due_at < %(now)s)
ORDER BY update_id
LIMIT %(limit)s"""
        self.lock_instance = f"SELECT pg_advisory_lock({CLASS_ID}, %(lock_key)s)"
        self.unlock_instance = f"SELECT pg_advisory_unlock({CLASS_ID}, %(lock_key)s)"
        self.insert_instance = f"""\
INSERT INTO {i} (table_name, instance, lock_key, started_at, seen_at)
VALUES (%(table)s, %(instance)s, %(lock_key)s, %(started_at)s, {NOW_MS})
ON CONFLICT (table_name, instance) DO UPDATE SET seen_at = EXCLUDED.seen_at"""
        self.beats = f"""\
SELECT EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = to_regclass('{i}') AND attname = 'seen_at'
                 AND NOT attisdropped)"""
        self.delete_instance = (
            f"DELETE FROM {i} WHERE table_name = %(table)s AND instance = %(instance)s"
        )
        # One statement: the caller's own row is refreshed; the instances of this table (not
        # the caller's own) not refreshed for BEAT_STALE_MS since the server started are listed
        # first, so the lock is tried on their keys only; those whose lock can be taken are
        # dead; their live leases lapse now (attempts and claim id kept) and their rows are
        # deleted. A row that another session still locks (a session the server keeps after
        # its process died: a dead host's connection until TCP gives up, a forked child's copy
        # of a connection of the caller's own) is skipped, never waited for: the instance stays
        # listed until its last row is taken, so the next check takes it once the lock is gone.
        # The transaction-scoped lock ends with the commit. It runs every second in every process:
        # while no instance is dead (the usual case) ``EXISTS (SELECT 1 FROM dead)`` is a
        # one-time filter that skips the update table entirely, instead of walking every
        # processing row of the (state, due_at) index (benchmarks/takeover_cost.py).
        self.take_over_dead = f"""\
WITH beat AS (
    UPDATE {i} SET seen_at = {NOW_MS}
    WHERE table_name = %(table)s AND instance = %(me)s::TEXT
),
candidates AS MATERIALIZED (
    SELECT instance, lock_key FROM {i}
    WHERE table_name = %(table)s AND (%(me)s::TEXT IS NULL OR instance <> %(me)s::TEXT)
      AND seen_at < {NOW_MS} - {BEAT_STALE_MS}
      AND seen_at >= (extract(epoch FROM pg_postmaster_start_time()) * 1000)::BIGINT
),
dead AS MATERIALIZED (
    SELECT instance FROM candidates WHERE pg_try_advisory_xact_lock({CLASS_ID}, lock_key)
),
free AS MATERIALIZED (
    SELECT r.update_id FROM {t} AS r
    WHERE EXISTS (SELECT 1 FROM dead)
      AND r.state = 'processing' AND r.instance IN (SELECT instance FROM dead)
    FOR UPDATE OF r SKIP LOCKED
),
taken AS (
    UPDATE {t} SET due_at = LEAST(due_at, %(now)s::BIGINT - 1)
    WHERE EXISTS (SELECT 1 FROM dead) AND update_id IN (SELECT update_id FROM free)
      AND state = 'processing' AND instance IN (SELECT instance FROM dead)
      AND due_at >= %(now)s::BIGINT - 1
    RETURNING update_id
),
gone AS (
    DELETE FROM {i} AS d
    WHERE d.table_name = %(table)s AND d.instance IN (SELECT instance FROM dead)
      AND NOT EXISTS (
          SELECT 1 FROM {t} AS r
          WHERE r.state = 'processing' AND r.instance = d.instance
            AND r.update_id NOT IN (SELECT update_id FROM free))
)
SELECT (SELECT count(*) FROM taken), ARRAY(SELECT instance FROM dead)"""
        # The same on a table with isolated_claim: a claim marked isolated (its handler ran
        # alone in the dead process, or started there on probation, so the crash is its own)
        # keeps its attempt and claim id and its lease lapses now; every other claim is given
        # back as release_many gives it (the attempt not spent: any handler of the process may
        # have killed it) and the row becomes suspect, or suspect again when its handler had
        # started there as a suspect (see stores/_suspects.py).
        # (NOT DISTINCT: a legacy unary claim writes no claim id and marks NULL = NULL)
        isolated = "isolated_claim IS NOT DISTINCT FROM claim_id"
        self.take_over_dead_isolating = self.take_over_dead.replace(
            """\
    UPDATE {t} SET due_at = LEAST(due_at, %(now)s::BIGINT - 1)
    WHERE EXISTS (SELECT 1 FROM dead) AND update_id IN (SELECT update_id FROM free)
      AND state = 'processing' AND instance IN (SELECT instance FROM dead)
      AND due_at >= %(now)s::BIGINT - 1
""".format(t=t),
            f"""\
    UPDATE {t} SET
        state = CASE WHEN {isolated} THEN state ELSE 'pending' END,
        attempts = CASE WHEN {isolated} THEN attempts ELSE attempts - 1 END,
        due_at = CASE WHEN {isolated} THEN LEAST(due_at, %(now)s::BIGINT - 1)
                      ELSE %(now)s::BIGINT END,
        instance = CASE WHEN {isolated} THEN instance ELSE NULL END,
        isolated_claim = CASE WHEN {isolated} THEN isolated_claim
                              ELSE {taken_over_mark_sql()} END
    WHERE EXISTS (SELECT 1 FROM dead) AND update_id IN (SELECT update_id FROM free)
      AND state = 'processing' AND instance IN (SELECT instance FROM dead)
""",
        )
        if self.take_over_dead_isolating == self.take_over_dead:  # pragma: no cover
            raise AssertionError("unexpected take_over_dead statement")
        # The handler of this exact live claim starts on probation or alone in its process
        # (claims of suspect rows only).
        self.mark_isolated = f"""\
UPDATE {t} SET isolated_claim = claim_id
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND due_at >= %(at)s
RETURNING update_id"""
        # The handler of this exact live claim, marked, ran past its probation.
        self.end_probation = f"""\
UPDATE {t} SET isolated_claim = '{PROBATION_OVER}'
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND isolated_claim = claim_id AND due_at >= %(at)s
RETURNING update_id"""

    def release_many(self, count: int, instance: bool) -> str:
        """Release ``count`` identities in one statement: ``(position, update_id, attempt,
        claim_id)`` quadruples, then ``at``. A row locked by an open transaction is skipped
        (not released: its lease holds). Returns the released positions."""
        values = ", ".join(["(%s::INT, %s::BIGINT, %s::INT, %s::TEXT)"] * count)
        clear = ", instance = NULL" if instance else ""
        return f"""\
WITH v(pos, update_id, attempt, claim_id) AS (VALUES {values}),
first AS (SELECT DISTINCT ON (update_id, attempt, claim_id) pos, update_id, attempt, claim_id
          FROM v ORDER BY update_id, attempt, claim_id, pos),
lockable AS (
    SELECT t.update_id, f.pos FROM {self.table} AS t JOIN first AS f
      ON t.update_id = f.update_id AND t.attempts = f.attempt AND t.claim_id = f.claim_id
    WHERE t.state = 'processing'
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE {self.table} AS t
SET state = 'pending', attempts = t.attempts - 1, due_at = %s::BIGINT{clear}
FROM lockable AS l
WHERE t.update_id = l.update_id
RETURNING l.pos"""


# -- chat order ----------------------------------------------------------------------------
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
            different update (``PostgresStatements.add_many``).
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


# -- command line and chaos runner ---------------------------------------------------------
POSTGRES_TABLE_STATE = (
    "SELECT to_regclass(%(q)s) IS NOT NULL, "
    "EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%(q)s) "
    "        AND attname = 'claim_id' AND NOT attisdropped), "
    "(SELECT COUNT(*) FROM pg_index WHERE indrelid = to_regclass(%(q)s))"
)
"""Whether a PostgreSQL table exists, has ``claim_id``, and how many indexes it has
(parameter ``q``: the double-quoted table name)."""

POSTGRES_META_EXISTS = f"SELECT to_regclass('\"{META_TABLE}\"') IS NOT NULL"
"""Whether the table of ``bind_bot`` owners exists (no parameters)."""

POSTGRES_FORGET_TABLE = f'DELETE FROM "{META_TABLE}" WHERE table_name = %(table)s'
"""Forget which bot owned a dropped table (``bind_bot``'s row; parameter ``table``)."""


def postgres_admin_statements(table: str, *, has_claim_id: bool = True) -> AdminStatements:
    """The read-only and admin statements of the command line and the chaos runner for the
    PostgreSQL table ``table`` (already validated; see
    :class:`~ptb_fence.stores._admin_sql.AdminStatements`)."""
    t = f'"{table}"'
    cols = ROW_COLUMNS.format(claim_id="claim_id" if has_claim_id else "NULL")
    row = f"SELECT {cols}, body FROM {t} WHERE update_id = %(update_id)s"
    return AdminStatements(
        dialect="postgresql",
        begin_read="SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY",
        begin_write="SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE",
        table_exists="SELECT to_regclass(%(quoted)s) IS NOT NULL",
        columns=(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%(quoted)s) "
            "AND attnum > 0 AND NOT attisdropped"
        ),
        counts=f"SELECT state, COUNT(*) FROM {t} GROUP BY state ORDER BY state",
        oldest_pending=(
            f"SELECT update_id, received_at FROM {t} WHERE state = 'pending' "
            "ORDER BY received_at, update_id LIMIT 1"
        ),
        due_now=f"""
            SELECT
              COUNT(*) FILTER (WHERE state = 'failed' AND due_at <= %(now)s),
              COUNT(*) FILTER (WHERE state = 'processing' AND due_at < %(now)s),
              COUNT(*) FILTER (WHERE state = 'abandoned' AND settled_at IS NULL)
            FROM {t}""",
        # the (state, due_at) index answers each of these without reading other states
        oldest_failed_due=(
            f"SELECT update_id, due_at FROM {t} WHERE state = 'failed' AND due_at <= %(now)s "
            "ORDER BY due_at, update_id LIMIT 1"
        ),
        oldest_lapsed_lease=(
            f"SELECT update_id, due_at FROM {t} WHERE state = 'processing' AND due_at < %(now)s "
            "ORDER BY due_at, update_id LIMIT 1"
        ),
        oldest_exhaustion=(
            f"SELECT update_id, due_at FROM {t} WHERE state = 'abandoned' "
            "AND settled_at IS NULL ORDER BY due_at, update_id LIMIT 1"
        ),
        exhaustion_count=(
            f"SELECT COUNT(*) FROM {t} WHERE state = 'abandoned' AND settled_at IS NULL"
        ),
        list_rows=f"""
            SELECT {cols} FROM {t}
            WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
              AND (%(after)s::bigint IS NULL OR update_id > %(after)s::bigint)
            ORDER BY update_id
            LIMIT %(limit)s""",
        select_row=row,
        # the row lock makes a competing claim wait for this transaction
        select_row_for_retry=row + " FOR UPDATE",
        retry=f"""
            UPDATE {t}
            SET state = 'pending', attempts = 0, due_at = received_at, settled_at = NULL
            WHERE update_id = %(update_id)s
              AND state IN ('failed', 'abandoned')
              AND state = %(state)s AND attempts = %(attempts)s
            RETURNING update_id""",
        state_totals=(
            "SELECT state, count(*), sum(CASE WHEN settled_at IS NULL THEN 1 ELSE 0 END) "
            f"FROM {t} GROUP BY state"
        ),
        all_rows=f"SELECT update_id, state, attempts, settled_at, claim_id FROM {t}",
    )
