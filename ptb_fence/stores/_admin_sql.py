"""The read-only and admin SQL of a store table, as one shape for every dialect: used by the
``ptb-fence`` command line and the chaos runner. Each dialect builds it next to the rest of
its SQL (:func:`ptb_fence.stores.sqlite._sql.sqlite_admin_statements`, and
:meth:`AdminStatements.postgres`).

The command line reads the public table layout directly for ``status``, ``list`` and
``show`` and changes it directly only for ``retry``; everything else goes through the store's
public methods. Table names are validated with :func:`ptb_fence.stores.validate_table_name`
before they reach this module and are always double-quoted, as the stores do.

SQLite statements use ``:name`` placeholders, PostgreSQL statements psycopg2's ``%(name)s``.

The ``retry`` rule is ONE conditional ``UPDATE`` that matches only a ``failed`` or
``abandoned`` row (and only the row as it was just read, in the same transaction), so it can
never touch a pending row, a live (or lapsed) lease or a completed update::

    state -> 'pending', attempts -> 0, due_at -> received_at, settled_at -> NULL
    (error and claim_id are kept for the record)
"""

from __future__ import annotations

from dataclasses import dataclass

from ptb_fence.stores._postgres_sql import META_TABLE

__all__ = [
    "AdminStatements",
    "ROW_COLUMNS",
    "POSTGRES_FORGET_TABLE",
    "POSTGRES_META_EXISTS",
    "POSTGRES_TABLE_STATE",
]

ROW_COLUMNS = "update_id, state, attempts, due_at, received_at, settled_at, error, {claim_id}"

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


@dataclass(frozen=True)
class AdminStatements:
    """The statements of one table in one dialect. Build with
    :func:`ptb_fence.stores.sqlite._sql.sqlite_admin_statements` or :meth:`postgres`.

    ``claim_id`` is read as ``NULL`` when the table has no such column (a PostgreSQL table
    created before fencing and not migrated yet).
    """

    dialect: str
    begin_read: str
    begin_write: str
    table_exists: str
    columns: str
    counts: str
    oldest_pending: str
    due_now: str
    list_rows: str
    select_row: str
    select_row_for_retry: str
    retry: str
    state_totals: str
    """``state, count, unsettled`` per state (no parameters; the chaos runner's progress)."""
    all_rows: str
    """``update_id, state, attempts, settled_at, claim_id`` of every row (no parameters)."""

    @classmethod
    def postgres(cls, table: str, *, has_claim_id: bool = True) -> "AdminStatements":
        """The PostgreSQL statements for ``table`` (already validated)."""
        t = f'"{table}"'
        cols = ROW_COLUMNS.format(claim_id="claim_id" if has_claim_id else "NULL")
        row = f"SELECT {cols}, body FROM {t} WHERE update_id = %(update_id)s"
        return cls(
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
