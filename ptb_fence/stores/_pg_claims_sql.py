"""The SQL of ``claim_owned_many`` in a PostgresUpdateStore (``%(name)s`` placeholders): the
claim of several given rows in one statement. It needs the ``claim_id`` column; ``instance`` is
written where the table has it.

It is one ``UPDATE`` applying the rule of ``claim_owned`` (see ``_postgres_sql``: take when
attempts remain, else spend) to several rows. The rows are locked first, in ``update_id`` order,
so two calls over overlapping ids never deadlock.
"""

from __future__ import annotations

__all__ = ["ClaimStatements"]

# Claimable at %(now)s (claim_owned's rule): pending, failed from its retry time, processing
# after its lease.
_CLAIMABLE = """(state = 'pending'
       OR (state = 'failed' AND due_at <= %(now)s)
       OR (state = 'processing' AND due_at < %(now)s))"""


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
        a fifth column: whether the row is suspect (``isolated_claim`` not NULL)."""
        t = self.table
        suspect_column = ", t.isolated_claim IS NOT NULL" if suspect else ""
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
