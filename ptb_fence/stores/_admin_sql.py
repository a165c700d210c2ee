"""The read-only and admin statements of a store table as one typed shape for every dialect.

The ``ptb-fence`` command line and the chaos runner use them. The statements are the
``admin_*`` ones of each dialect's ``admin.sql``, where the rules are written.

SQLite statements use ``:name`` placeholders, PostgreSQL statements psycopg2's ``%(name)s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ptb_fence.stores._queries import Statements

__all__ = ["AdminStatements", "admin_statements"]


@dataclass(frozen=True)
class AdminStatements:
    """The admin statements of one table in one dialect (see :func:`admin_statements`).

    ``claim_id`` is read as ``NULL`` on a table without that column (the seed's legacy table).
    """

    dialect: str
    begin_read: str
    begin_write: str
    counts: str
    oldest_pending: str
    due_now: str
    oldest_failed_due: str
    """``update_id, due_at`` of the failed row whose retry has been due longest (``now``)."""
    oldest_lapsed_lease: str
    """``update_id, due_at`` of the processing row whose lease lapsed longest ago (``now``)."""
    oldest_exhaustion: str
    """``update_id, due_at`` of the oldest unacknowledged exhaustion (no parameters).

    ``due_at`` is when it was exhausted."""
    exhaustion_count: str
    """The number of unacknowledged exhaustions (no parameters)."""
    list_rows: str
    select_row: str
    select_row_for_retry: str
    retry: str
    prune_count: str
    prune_bounds: str
    state_totals: str
    """``state, count, unsettled`` per state, for the chaos runner's progress (no parameters)."""
    all_rows: str
    """``update_id, state, attempts, settled_at, claim_id`` of every row (no parameters)."""
    oldest_unsent_call: str
    failed_call_count: str
    oldest_unsent_at: str


def admin_statements(sql: Statements, *, has_claim_id: bool = True) -> AdminStatements:
    """The ``admin_*`` statements of ``sql`` (one table's), the ``_legacy`` row reads for a
    table without ``claim_id``."""
    legacy = "" if has_claim_id else "_legacy"
    # SQLite's write lock (BEGIN IMMEDIATE) already keeps the row read for a retry
    for_retry = (
        "admin_select_row_for_retry" if "admin_select_row_for_retry" in sql
        else "admin_select_row"
    )
    return AdminStatements(
        dialect=sql.dialect,
        begin_read=sql["admin_begin_read"],
        begin_write=sql["admin_begin_write"],
        counts=sql["admin_counts"],
        oldest_pending=sql["admin_oldest_pending"],
        due_now=sql["admin_due_now"],
        oldest_failed_due=sql["admin_oldest_failed_due"],
        oldest_lapsed_lease=sql["admin_oldest_lapsed_lease"],
        oldest_exhaustion=sql["admin_oldest_exhaustion"],
        exhaustion_count=sql["admin_exhaustion_count"],
        list_rows=sql["admin_list_rows" + legacy],
        select_row=sql["admin_select_row" + legacy],
        select_row_for_retry=sql[for_retry + legacy],
        retry=sql["admin_retry"],
        prune_count=sql["admin_prune_count"],
        prune_bounds=sql["admin_prune_bounds"],
        state_totals=sql["admin_state_totals"],
        all_rows=sql["admin_all_rows"],
        oldest_unsent_call=sql["admin_oldest_unsent_call"],
        failed_call_count=sql["admin_failed_call_count"],
        oldest_unsent_at=sql["admin_oldest_unsent_at"],
    )
