"""The read-only and admin SQL of a store table, as one shape for every dialect: used by the
``ptb-fence`` command line and the chaos runner. Each dialect builds it next to the rest of
its SQL (:func:`ptb_fence.stores.sqlite._sql.sqlite_admin_statements` and
:func:`ptb_fence.stores.postgres._sql.postgres_admin_statements`).

The command line reads the public table layout directly for ``status``, ``health``, ``list``
and ``show`` and changes it directly only for ``retry``; everything else goes through the store's
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

__all__ = ["AdminStatements", "ROW_COLUMNS"]

ROW_COLUMNS = "update_id, state, attempts, due_at, received_at, settled_at, error, {claim_id}"
"""The row columns the command line reads (``{claim_id}``: the column, or ``NULL``)."""


@dataclass(frozen=True)
class AdminStatements:
    """The statements of one table in one dialect, built by each dialect's
    ``*_admin_statements`` function.

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
    oldest_failed_due: str
    """``update_id, due_at`` of the failed row whose retry has been due longest (``now``)."""
    oldest_lapsed_lease: str
    """``update_id, due_at`` of the processing row whose lease lapsed longest ago (``now``)."""
    oldest_exhaustion: str
    """``update_id, due_at`` of the oldest unacknowledged exhaustion (``due_at`` is when it
    was exhausted; no parameters)."""
    exhaustion_count: str
    """The number of unacknowledged exhaustions (no parameters)."""
    list_rows: str
    select_row: str
    select_row_for_retry: str
    retry: str
    state_totals: str
    """``state, count, unsettled`` per state (no parameters; the chaos runner's progress)."""
    all_rows: str
    """``update_id, state, attempts, settled_at, claim_id`` of every row (no parameters)."""
