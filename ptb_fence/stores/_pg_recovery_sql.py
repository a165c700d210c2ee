"""The SQL of release and liveness in a PostgresUpdateStore (``%(name)s`` placeholders).

The ``instance`` column (the live instance that made a claim) and the ``isolated_claim``
column (suspect rows, see :class:`ptb_fence.IsolatingUpdateStore`) are added by the idempotent
migration; on a table managed with ``create_table=False`` and not migrated yet the claims
run the statements without them (the legacy rule of SPEC §5 still holds for the base API) and
``take_over_dead`` counts every crashed attempt as spent.

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

__all__ = [
    "BEAT_STALE_MS",
    "CLASS_ID",
    "INSTANCES_SQL",
    "INSTANCES_TABLE",
    "RecoveryStatements",
    "instance_key",
    "with_instance",
    "with_suspect",
]

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
ALTER TABLE "{INSTANCES_TABLE}" ADD COLUMN IF NOT EXISTS seen_at BIGINT;
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
    """A fenced claim statement that also reads back whether the row is suspect (a fourth
    column, ``isolated_claim IS NOT NULL``; the claim does not change that column)."""
    tail = "RETURNING state, attempts, claim_id"
    if not claim.endswith(tail):  # pragma: no cover - guards the statement's shape
        raise AssertionError("unexpected claim statement")
    return claim + ", isolated_claim IS NOT NULL"


class RecoveryStatements:
    """The release and liveness statements of one table (already validated)."""

    __slots__ = (
        "beats",
        "delete_instance",
        "due_released",
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
        # deleted. The transaction-scoped lock ends with the commit. It runs every second in every process:
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
taken AS (
    UPDATE {t} SET due_at = LEAST(due_at, %(now)s::BIGINT - 1)
    WHERE EXISTS (SELECT 1 FROM dead)
      AND state = 'processing' AND instance IN (SELECT instance FROM dead)
      AND due_at >= %(now)s::BIGINT - 1
    RETURNING update_id
),
gone AS (
    DELETE FROM {i}
    WHERE table_name = %(table)s AND instance IN (SELECT instance FROM dead)
)
SELECT count(*) FROM taken"""
        # The same on a table with isolated_claim: a claim marked isolated (its handler ran
        # alone in the dead process, so the crash is its own) keeps its attempt and claim id
        # and its lease lapses now; every other claim is given back as release_many gives it
        # (the attempt not spent: any handler of the process may have killed it) and the row
        # becomes suspect (isolated_claim not NULL, equal to no claim id): its next attempt
        # runs alone.
        # (NOT DISTINCT: a legacy unary claim writes no claim id and marks NULL = NULL)
        isolated = "isolated_claim IS NOT DISTINCT FROM claim_id"
        self.take_over_dead_isolating = self.take_over_dead.replace(
            """\
    UPDATE {t} SET due_at = LEAST(due_at, %(now)s::BIGINT - 1)
    WHERE EXISTS (SELECT 1 FROM dead)
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
                              ELSE COALESCE(isolated_claim, '') END
    WHERE EXISTS (SELECT 1 FROM dead)
      AND state = 'processing' AND instance IN (SELECT instance FROM dead)
""",
        )
        if self.take_over_dead_isolating == self.take_over_dead:  # pragma: no cover
            raise AssertionError("unexpected take_over_dead statement")
        # The handler of this exact live claim starts alone in its process (claims of
        # suspect rows only).
        self.mark_isolated = f"""\
UPDATE {t} SET isolated_claim = claim_id
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND due_at >= %(at)s
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
