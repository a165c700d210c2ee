"""All the SQL of :class:`ptb_fence.SQLiteUpdateStore`: each rule reads as one statement.

Sections: the store's statements, its chat-order statements, and the read-only and admin
statements of the command line and the chaos runner.

Every rule of the store contract is ONE conditional statement on one row: the ``WHERE`` clause is
the rule's precondition, and ``RETURNING`` reads back what the statement wrote, so there is never
a read-then-write window between checking a row and changing it.

The table name is validated (:func:`ptb_fence.stores.validate_table_name`) before it reaches this
module and is always double-quoted, so names that happen to be SQL keywords (``order``) work too.
"""

from __future__ import annotations

from typing import Tuple

from ptb_fence.stores._admin_sql import ROW_COLUMNS, AdminStatements
from ptb_fence.stores._chat_order_sql import UNSETTLED, chat_index_name, due_predicate, in_turn
from ptb_fence.stores._figures_sql import figures_sql
from ptb_fence.stores._outbox_sql import OutboxStatements
from ptb_fence.stores._state_sql import StateStatements
from ptb_fence.stores._suspects import PROBATION_OVER, suspicion_sql, taken_over_mark_sql

__all__ = [
    "REQUIRED_COLUMNS",
    "SQLiteChatStatements",
    "SQLiteStatements",
    "sqlite_admin_statements",
]

REQUIRED_COLUMNS: Tuple[str, ...] = (
    "update_id",
    "body",
    "state",
    "attempts",
    "due_at",
    "received_at",
    "settled_at",
    "error",
)
"""Columns an existing table must have (``claim_id``, ``fingerprint``, ``instance``,
``chat_key`` and ``isolated_claim`` are added when missing)."""

META_TABLE = "ptb_fence_meta"
"""The table recording which bot owns each update table (``bind_bot``)."""

INSTANCES_TABLE = "ptb_fence_instances"
"""The table of the live instances (``hold_liveness``) of every update table of the file."""

# Claimable at :now. The bounds are exact: a failed row is due when due_at <= now, a
# processing row may be taken over only when its lease lapsed, due_at < now (a lease is held
# while due_at >= t, inclusive).
_CLAIMABLE = """(
        state = 'pending'
        OR (state = 'failed' AND due_at <= :now)
        OR (state = 'processing' AND due_at < :now)
    )"""

def _take_or_spend(claim_id: str) -> str:
    """The SET clause of a claim: take the row for its next attempt (``attempts <
    :max_attempts``: processing, ``attempts + 1``, lease ``:lease_until``, the fresh claim id
    ``claim_id`` (an SQL expression), the claiming ``:instance``) or spend it (abandoned,
    ``'attempts spent'``; settled at ``:now``, or with ``:durable`` an unacknowledged
    exhaustion keeping its last claim id). SET expressions see the row as it was."""
    return f"""
                state = CASE WHEN attempts < :max_attempts
                             THEN 'processing' ELSE 'abandoned' END,
                attempts = CASE WHEN attempts < :max_attempts
                                THEN attempts + 1 ELSE attempts END,
                due_at = CASE WHEN attempts < :max_attempts
                              THEN :lease_until ELSE :now END,
                error = CASE WHEN attempts < :max_attempts
                             THEN NULL ELSE 'attempts spent' END,
                settled_at = CASE WHEN attempts < :max_attempts THEN settled_at
                                  WHEN :durable THEN NULL
                                  ELSE :now END,
                claim_id = CASE WHEN attempts < :max_attempts THEN {claim_id}
                                WHEN :durable THEN COALESCE(claim_id, {claim_id})
                                ELSE claim_id END,
                instance = CASE WHEN attempts < :max_attempts THEN :instance ELSE NULL END"""


# The exact live attempt at :at (``_live`` of the memory store).
_SUSPICION = suspicion_sql()
"""A claim's fourth (or fifth) returned column: the row's suspicion (stores/_suspects.py)."""

_LIVE = "state = 'processing' AND attempts = :attempt AND due_at >= :at"


class SQLiteStatements:
    """The statements of one store table (internal).

    Args:
        table (:obj:`str`): An already validated table name.
    """

    __slots__ = (
        "ack_exhaustion",
        "add",
        "add_claim_id",
        "add_fingerprint",
        "add_instance",
        "add_isolated_claim",
        "mark_isolated",
        "end_probation",
        "create_instances",
        "delete_instance",
        "insert_instance",
        "instances_of",
        "instances_table_exists",
        "take_over",
        "bind_bot",
        "bot_of",
        "chat",
        "create_meta",
        "stored_fingerprint",
        "add_claimed",
        "claim",
        "claim_counted",
        "claim_owned_many",
        "create_index",
        "create_table",
        "due",
        "due_exhaustions",
        "exhaust",
        "figures",
        "owns",
        "prune",
        "renew",
        "renew_owned",
        "reopen_completed",
        "settle_abandoned",
        "settle_abandoned_owned",
        "settle_completed",
        "settle_completed_owned",
        "settle_failed",
        "settle_failed_owned",
        "table",
        "table_info",
        "unclaimed_exhaustions",
        "backfill_claim_id",
        "write_lock",
        "outbox",
        "state",
    )

    def __init__(self, table: str) -> None:
        t = f'"{table}"'
        self.table = t

        # -- schema ----------------------------------------------------------------------
        self.create_table = f"""
            CREATE TABLE IF NOT EXISTS {t} (
                update_id   INTEGER PRIMARY KEY,
                body        TEXT    NOT NULL,
                state       TEXT    NOT NULL DEFAULT 'pending',
                attempts    INTEGER NOT NULL DEFAULT 0,
                due_at      INTEGER,
                received_at INTEGER NOT NULL,
                settled_at  INTEGER,
                error       TEXT,
                claim_id    TEXT,
                fingerprint TEXT,
                instance    TEXT,
                chat_key    INTEGER,
                isolated_claim TEXT
            )"""
        self.create_index = (
            f'CREATE INDEX IF NOT EXISTS "{table}_state_due_at_idx" ON {t} (state, due_at)'
        )
        self.table_info = f"PRAGMA table_info({t})"
        self.add_claim_id = f"ALTER TABLE {t} ADD COLUMN claim_id TEXT"
        self.add_fingerprint = f"ALTER TABLE {t} ADD COLUMN fingerprint TEXT"
        self.add_instance = f"ALTER TABLE {t} ADD COLUMN instance TEXT"
        self.add_isolated_claim = f"ALTER TABLE {t} ADD COLUMN isolated_claim TEXT"
        # An older table may hold unacknowledged exhaustions without a claim id; give each one
        # so that it can be delivered and acknowledged with an exact identity.
        self.unclaimed_exhaustions = (
            f"SELECT update_id FROM {t} "
            "WHERE state = 'abandoned' AND settled_at IS NULL AND claim_id IS NULL"
        )
        self.backfill_claim_id = (
            f"UPDATE {t} SET claim_id = :claim_id "
            "WHERE update_id = :update_id AND claim_id IS NULL"
        )

        # -- base ------------------------------------------------------------------------
        # A pending row carries due_at = received_at (due_at is never NULL; older
        # tables declare it NOT NULL). Pending rows are found by their state, never by due_at.
        #
        # An existing id: a different update (another fingerprint) replaces a
        # settled row (completed, or abandoned with settled_at set) exactly like a fresh
        # insert; the same update, a row without a fingerprint, or a live row stays as it is.
        replace = f"""
            ON CONFLICT (update_id) DO UPDATE SET
                body = excluded.body, state = excluded.state, attempts = excluded.attempts,
                due_at = excluded.due_at, received_at = excluded.received_at,
                settled_at = NULL, error = NULL, claim_id = excluded.claim_id,
                fingerprint = excluded.fingerprint, instance = excluded.instance,
                chat_key = NULL, isolated_claim = NULL
            WHERE ({t}.state = 'completed'
                   OR ({t}.state = 'abandoned' AND {t}.settled_at IS NOT NULL))
              AND {t}.fingerprint IS NOT NULL AND {t}.fingerprint <> excluded.fingerprint"""
        self.add = f"""
            INSERT INTO {t} (update_id, body, state, attempts, due_at, received_at, fingerprint)
            VALUES (:update_id, :body, 'pending', 0, :received_at, :received_at, :fingerprint)
            {replace}"""
        # Read only when an insert did not happen: is it a different update (WARNING)?
        self.stored_fingerprint = (
            f"SELECT fingerprint, state, settled_at FROM {t} WHERE update_id = :update_id"
        )

        # Record a fresh update already claimed for attempt 1 (the receiving process's fast
        # path); an existing id is left alone and returns nothing (unless replaced, above).
        self.add_claimed = f"""
            INSERT INTO {t} (update_id, body, state, attempts, due_at, received_at, claim_id,
                             fingerprint, instance)
            VALUES (:update_id, :body, 'processing', 1, :lease_until, :received_at, :claim_id,
                    :fingerprint, :instance)
            {replace}
            RETURNING attempts, claim_id"""

        # -- which bot owns the table (bind_bot) -------------------------------------------
        self.create_meta = (
            f'CREATE TABLE IF NOT EXISTS "{META_TABLE}" '
            "(table_name TEXT PRIMARY KEY, bot_id INTEGER NOT NULL)"
        )
        self.bind_bot = (
            f'INSERT INTO "{META_TABLE}" (table_name, bot_id) VALUES (:table, :bot_id) '
            "ON CONFLICT (table_name) DO NOTHING"
        )
        self.bot_of = f'SELECT bot_id FROM "{META_TABLE}" WHERE table_name = :table'

        # Take (attempts < max) or spend (attempts >= max) in one statement. SET expressions
        # see the row as it was before the update.
        self.claim = f"""
            UPDATE {t} SET {_take_or_spend(":claim_id")}
            WHERE update_id = :update_id AND {_CLAIMABLE}
            RETURNING state, attempts, claim_id, {_SUSPICION}"""
        # The base claim (its attempt never runs alone: the runtime claims with claim_owned
        # wherever it isolates) marks its take as isolated at once: a crash during it counts
        # (take_over_dead), as it always did.
        self.claim_counted = self.claim.replace(
            "\n            WHERE update_id = :update_id",
            """,
                isolated_claim = CASE WHEN attempts < :max_attempts
                                      THEN :claim_id ELSE isolated_claim END
            WHERE update_id = :update_id""",
        )
        # the same claim, only for a row that is its chat's turn (strict_chat_order)
        self.chat = SQLiteChatStatements(table, self.claim)

        # claim_owned_many: the same rule for the ids of a JSON array (distinct ids), in one
        # statement; each take writes a fresh random claim id. The rows are found by their
        # ids (primary key: "+state" keeps the planner off the state index).
        self.claim_owned_many = f"""
            UPDATE {t} SET {_take_or_spend("lower(hex(randomblob(16)))")}
            WHERE update_id IN (SELECT value FROM json_each(:ids))
              AND {_CLAIMABLE.replace("state =", "+state =")}
            RETURNING update_id, state, attempts, claim_id, {_SUSPICION}"""

        # A renewal never shortens a lease and, with :now, never revives an expired one.
        self.renew = f"""
            UPDATE {t} SET due_at = MAX(COALESCE(due_at, :lease_until), :lease_until)
            WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt
              AND (:now IS NULL OR due_at >= :now)
            RETURNING update_id"""
        self.renew_owned = f"""
            UPDATE {t} SET due_at = MAX(COALESCE(due_at, :lease_until), :lease_until)
            WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt
              AND claim_id = :claim_id
              AND (:now IS NULL OR due_at >= :now)
            RETURNING update_id"""

        completed = "state = 'completed', settled_at = :at, error = NULL"
        failed = "state = 'failed', due_at = :retry_at, settled_at = NULL, error = :error"
        abandoned = "state = 'abandoned', settled_at = :at, error = :error"
        where = f"WHERE update_id = :update_id AND {_LIVE}"
        owned = f"{where} AND claim_id = :claim_id"
        self.settle_completed = f"UPDATE {t} SET {completed} {where} RETURNING update_id"
        self.settle_failed = f"UPDATE {t} SET {failed} {where} RETURNING update_id"
        self.settle_abandoned = f"UPDATE {t} SET {abandoned} {where} RETURNING update_id"
        self.settle_completed_owned = f"UPDATE {t} SET {completed} {owned} RETURNING update_id"
        self.settle_failed_owned = f"UPDATE {t} SET {failed} {owned} RETURNING update_id"
        self.settle_abandoned_owned = f"UPDATE {t} SET {abandoned} {owned} RETURNING update_id"

        # A released row (pending with a claim id: add never writes one) is listed at once.
        self.due = f"""
            SELECT update_id, body FROM {t}
            WHERE (state = 'pending' AND (received_at <= :pending_before
                                          OR claim_id IS NOT NULL))
               OR (state = 'failed' AND due_at <= :now)
               OR (state = 'processing' AND due_at < :now)
            ORDER BY update_id
            LIMIT :limit"""
        self.prune = f"""
            DELETE FROM {t}
            WHERE state IN ('completed', 'abandoned') AND settled_at < :before"""

        # the outbox of Bot API calls (its own table, <table>_outbox)
        self.outbox = OutboxStatements(table, postgres=False)
        # persisted bot state (its own table, <table>_persistence)
        self.state = StateStatements(table, postgres=False)

        # -- fenced ----------------------------------------------------------------------
        self.owns = f"SELECT 1 FROM {t} {owned}"
        # Undo a completion that the caller's own commit landed by mistake (complete_owned).
        self.reopen_completed = f"""
            UPDATE {t} SET state = 'processing', settled_at = NULL
            WHERE update_id = :update_id AND state = 'completed' AND attempts = :attempt
              AND claim_id = :claim_id AND settled_at = :at
            RETURNING update_id"""
        # Changes nothing, but takes the database's write lock inside the caller's transaction.
        self.write_lock = f"UPDATE {t} SET state = state WHERE 0"

        # -- durable ---------------------------------------------------------------------
        self.exhaust = f"""
            UPDATE {t} SET state = 'abandoned', due_at = :at, settled_at = NULL, error = :error
            {owned}
            RETURNING update_id"""
        self.due_exhaustions = f"""
            SELECT update_id, attempts, claim_id, body, due_at, error FROM {t}
            WHERE state = 'abandoned' AND settled_at IS NULL
              AND (:after IS NULL OR update_id > :after)
            ORDER BY update_id
            LIMIT :limit"""
        self.ack_exhaustion = f"""
            UPDATE {t} SET settled_at = :at
            WHERE update_id = :update_id AND state = 'abandoned' AND settled_at IS NULL
              AND attempts = :attempt AND claim_id = :claim_id
            RETURNING update_id"""

        # -- figures (read-only; the waiting rows only, through the indexes) ----------------
        self.figures = figures_sql(t)

        # -- liveness (hold_liveness / take_over_dead) -------------------------------------
        i = f'"{INSTANCES_TABLE}"'
        self.create_instances = (
            f"CREATE TABLE IF NOT EXISTS {i} (table_name TEXT NOT NULL, instance TEXT NOT NULL, "
            "lock_path TEXT NOT NULL, started_at INTEGER NOT NULL, "
            "PRIMARY KEY (table_name, instance))"
        )
        self.insert_instance = (
            f"INSERT OR REPLACE INTO {i} (table_name, instance, lock_path, started_at) "
            "VALUES (:table, :instance, :lock_path, :started_at)"
        )
        self.delete_instance = (
            f"DELETE FROM {i} WHERE table_name = :table AND instance = :instance"
        )
        self.instances_table_exists = (
            f"SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{INSTANCES_TABLE}'"
        )
        self.instances_of = (
            f"SELECT instance, lock_path FROM {i} "
            "WHERE table_name = :table AND (:me IS NULL OR instance <> :me)"
        )
        # The dead instance's claims: a claim marked isolated (its handler ran alone in the
        # dead process, or started there on probation, so the crash is its own) keeps its
        # attempt and claim id and its lease lapses now; every other claim is given back as
        # release_many gives it (the attempt not spent: any handler of the process may have
        # killed it) and the row becomes suspect, or suspect again when its handler had
        # started there as a suspect (see stores/_suspects.py).
        isolated = "isolated_claim = claim_id"
        self.take_over = f"""
            UPDATE {t} SET
                state = CASE WHEN {isolated} THEN state ELSE 'pending' END,
                attempts = CASE WHEN {isolated} THEN attempts ELSE attempts - 1 END,
                due_at = CASE WHEN {isolated} THEN MIN(COALESCE(due_at, :now - 1), :now - 1)
                              ELSE :now END,
                instance = CASE WHEN {isolated} THEN instance ELSE NULL END,
                isolated_claim = CASE WHEN {isolated} THEN isolated_claim
                                      ELSE {taken_over_mark_sql()} END
            WHERE state = 'processing' AND instance = :instance
            RETURNING update_id"""
        # The handler of this exact live claim starts on probation or alone in its process
        # (claims of suspect rows only).
        self.mark_isolated = f"""
            UPDATE {t} SET isolated_claim = claim_id
            WHERE update_id = :update_id AND {_LIVE} AND claim_id = :claim_id
            RETURNING update_id"""
        # The handler of this exact live claim, marked, ran past its probation.
        self.end_probation = f"""
            UPDATE {t} SET isolated_claim = '{PROBATION_OVER}'
            WHERE update_id = :update_id AND {_LIVE} AND claim_id = :claim_id
              AND isolated_claim = claim_id
            RETURNING update_id"""

    def release_many(self, count: int) -> str:
        """``release_many`` for ``count`` identities in one statement.

        Parameters, in order: ``at``, the ``(update_id, attempt, claim_id)`` triples
        flattened. Returns the released ``(update_id, attempt, claim_id)`` (the attempt that
        was released, i.e. ``attempts + 1`` after the update).
        """
        values = ", ".join(["(?, ?, ?)"] * count)
        return f"""
            UPDATE {self.table} AS t
            SET state = 'pending', attempts = t.attempts - 1, due_at = ?, instance = NULL
            FROM (VALUES {values}) AS v
            WHERE t.update_id = v.column1 AND t.attempts = v.column2 AND t.claim_id = v.column3
              AND t.state = 'processing'
            RETURNING update_id, attempts + 1, claim_id"""

    def complete_owned_many(self, count: int) -> str:
        """``settle_owned(identity, Completed(at))`` for ``count`` distinct identities in one
        statement.

        Parameters, in order: the ``(update_id, attempt, claim_id, at)`` quadruples
        flattened. Returns the completed ``(update_id, attempts, claim_id)``.
        """
        values = ", ".join(["(?, ?, ?, ?)"] * count)
        return f"""
            UPDATE {self.table} AS t
            SET state = 'completed', settled_at = v.column4, error = NULL
            FROM (VALUES {values}) AS v
            WHERE t.update_id = v.column1 AND t.state = 'processing'
              AND t.attempts = v.column2 AND t.due_at >= v.column4 AND t.claim_id = v.column3
            RETURNING update_id, attempts, claim_id"""

    # -- batched renewals (positional parameters; one statement per chunk) -----------------
    def renew_many(self, count: int) -> str:
        """``renew`` for ``count`` ``(update_id, attempt)`` pairs in one statement.

        Parameters, in order: ``lease_until, lease_until``, the pairs flattened, ``now``.
        """
        values = ", ".join(["(?, ?)"] * count)
        return f"""
            UPDATE {self.table} AS t
            SET due_at = MAX(COALESCE(t.due_at, ?), ?)
            FROM (VALUES {values}) AS v
            WHERE t.update_id = v.column1 AND t.attempts = v.column2
              AND t.state = 'processing' AND t.due_at >= ?
            RETURNING update_id, attempts"""

    def renew_owned_many(self, count: int) -> str:
        """``renew_owned`` for ``count`` identities in one statement.

        Parameters, in order: ``lease_until, lease_until``, the ``(update_id, attempt,
        claim_id)`` triples flattened, ``now``.
        """
        values = ", ".join(["(?, ?, ?)"] * count)
        return f"""
            UPDATE {self.table} AS t
            SET due_at = MAX(COALESCE(t.due_at, ?), ?)
            FROM (VALUES {values}) AS v
            WHERE t.update_id = v.column1 AND t.attempts = v.column2 AND t.claim_id = v.column3
              AND t.state = 'processing' AND t.due_at >= ?
            RETURNING update_id, attempts, claim_id"""


# -- chat order ----------------------------------------------------------------------------
class SQLiteChatStatements:
    """The chat-order statements of one SQLite table (named parameters).

    Args:
        table: The validated table name.
        claim: The table's claim statement (``SQLiteStatements.claim``), which gets the
            predicate added to its ``WHERE``.
    """

    __slots__ = (
        "add_column",
        "claim",
        "create_index",
        "due",
        "due_of_chat",
        "fill_key",
        "index",
        "set_key",
        "unkeyed",
    )

    def __init__(self, table: str, claim: str) -> None:
        t = f'"{table}"'
        self.index = chat_index_name(table)
        self.add_column = f"ALTER TABLE {t} ADD COLUMN chat_key INTEGER"
        self.create_index = (
            f'CREATE INDEX IF NOT EXISTS "{self.index}" ON {t} (chat_key, update_id) '
            f"WHERE state IN {UNSETTLED}"
        )
        # inside the transaction of the insert that just landed (rowcount 1)
        self.set_key = f"UPDATE {t} SET chat_key = :chat_key WHERE update_id = :update_id"
        anchor = "WHERE update_id = :update_id AND"
        if claim.count(anchor) != 1:  # pragma: no cover - guards the statement's shape
            raise AssertionError("unexpected claim statement")
        self.claim = claim.replace(anchor, f"{anchor} {in_turn(t, t, ':now')} AND")
        self.due = f"""
            SELECT r.update_id, r.body FROM {t} AS r
            WHERE {due_predicate('r', ':pending_before', ':now')} AND {in_turn('r', t, ':now')}
            ORDER BY r.update_id
            LIMIT :limit"""
        self.due_of_chat = f"""
            SELECT r.update_id, r.body FROM {t} AS r
            WHERE r.chat_key = :chat_key AND r.state IN {UNSETTLED}
              AND {due_predicate('r', ':pending_before', ':now')} AND {in_turn('r', t, ':now')}
            ORDER BY r.update_id
            LIMIT :limit"""
        self.unkeyed = f"""
            SELECT update_id, body FROM {t}
            WHERE chat_key IS NULL AND state IN {UNSETTLED} AND update_id > :after
            ORDER BY update_id
            LIMIT :limit"""
        self.fill_key = f"""
            UPDATE {t} SET chat_key = :chat_key
            WHERE update_id = :update_id AND chat_key IS NULL AND state IN {UNSETTLED}
              AND body = :body"""


# -- command line and chaos runner --------------------------------------------------------
def sqlite_admin_statements(table: str, *, has_claim_id: bool = True) -> AdminStatements:
    """The read-only and admin statements of the command line and the chaos runner for the
    SQLite table ``table`` (already validated; see :class:`~ptb_fence.stores._admin_sql.AdminStatements`)."""
    t = f'"{table}"'
    cols = ROW_COLUMNS.format(claim_id="claim_id" if has_claim_id else "NULL")
    row = f"SELECT {cols}, body FROM {t} WHERE update_id = :update_id"
    return AdminStatements(
        dialect="sqlite",
        begin_read="BEGIN",
        begin_write="BEGIN IMMEDIATE",
        # SQLite table names are case-insensitive
        table_exists=(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :table "
            "COLLATE NOCASE"
        ),
        columns=f"PRAGMA table_info({t})",
        counts=f"SELECT state, COUNT(*) FROM {t} GROUP BY state ORDER BY state",
        oldest_pending=(
            f"SELECT update_id, received_at FROM {t} WHERE state = 'pending' "
            "ORDER BY received_at, update_id LIMIT 1"
        ),
        due_now=f"""
            SELECT
              COALESCE(SUM(CASE WHEN state = 'failed' AND due_at <= :now
                                THEN 1 ELSE 0 END), 0),
              COALESCE(SUM(CASE WHEN state = 'processing' AND due_at < :now
                                THEN 1 ELSE 0 END), 0),
              COALESCE(SUM(CASE WHEN state = 'abandoned' AND settled_at IS NULL
                                THEN 1 ELSE 0 END), 0)
            FROM {t}""",
        # the (state, due_at) index answers each of these without reading other states
        oldest_failed_due=(
            f"SELECT update_id, due_at FROM {t} WHERE state = 'failed' AND due_at <= :now "
            "ORDER BY due_at, update_id LIMIT 1"
        ),
        oldest_lapsed_lease=(
            f"SELECT update_id, due_at FROM {t} WHERE state = 'processing' AND due_at < :now "
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
            WHERE (:state IS NULL OR state = :state)
              AND (:after IS NULL OR update_id > :after)
            ORDER BY update_id
            LIMIT :limit""",
        select_row=row,
        # BEGIN IMMEDIATE already holds the write lock: the row cannot change before the
        # UPDATE below
        select_row_for_retry=row,
        retry=f"""
            UPDATE {t}
            SET state = 'pending', attempts = 0, due_at = received_at, settled_at = NULL
            WHERE update_id = :update_id
              AND state IN ('failed', 'abandoned')
              AND state = :state AND attempts = :attempts
            RETURNING update_id""",
        state_totals=(
            "SELECT state, count(*), sum(CASE WHEN settled_at IS NULL THEN 1 ELSE 0 END) "
            f"FROM {t} GROUP BY state"
        ),
        all_rows=f"SELECT update_id, state, attempts, settled_at, claim_id FROM {t}",
    )
