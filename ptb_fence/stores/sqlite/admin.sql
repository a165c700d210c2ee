-- ptb_fence: the read-only and admin statements of the command line and the chaos runner on
-- a SQLite update table. The command line reads the public table layout directly for
-- status, health, list and show and changes it directly only for retry. The retry rule is
-- ONE conditional UPDATE that matches only a failed or abandoned row as it was just read in
-- the same transaction, so it never touches a pending row, a lease or a completed update.

-- admin_begin_read --
-- The snapshot of a read of several statements.
BEGIN

-- admin_begin_write --
-- The transaction of a change: it holds the write lock, so a row read cannot change before the UPDATE.
BEGIN IMMEDIATE

-- admin_commit --
-- End a change.
COMMIT

-- admin_rollback --
-- End a read, or a change that changed nothing.
ROLLBACK

-- admin_table_exists --
-- Whether a table named by the parameter table exists, matched case-insensitively as SQLite names are.
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :table COLLATE NOCASE

-- admin_counts --
-- Rows per state.
SELECT state, COUNT(*) FROM {table} GROUP BY state ORDER BY state

-- admin_oldest_pending --
-- The pending row received first.
SELECT update_id, received_at FROM {table} WHERE state = 'pending'
ORDER BY received_at, update_id LIMIT 1

-- admin_due_now --
-- Failed rows due, lapsed leases and unacknowledged exhaustions at now.
SELECT
  COALESCE(SUM(CASE WHEN state = 'failed' AND due_at <= :now THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 'processing' AND due_at < :now THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 'abandoned' AND settled_at IS NULL THEN 1 ELSE 0 END), 0)
FROM {table}

-- admin_oldest_failed_due --
-- The failed row whose retry has been due longest at now (the (state, due_at) index answers it).
SELECT update_id, due_at FROM {table} WHERE state = 'failed' AND due_at <= :now
ORDER BY due_at, update_id LIMIT 1

-- admin_oldest_lapsed_lease --
-- The processing row whose lease lapsed longest ago at now.
SELECT update_id, due_at FROM {table} WHERE state = 'processing' AND due_at < :now
ORDER BY due_at, update_id LIMIT 1

-- admin_oldest_exhaustion --
-- The oldest unacknowledged exhaustion (due_at: when it was exhausted).
SELECT update_id, due_at FROM {table} WHERE state = 'abandoned' AND settled_at IS NULL
ORDER BY due_at, update_id LIMIT 1

-- admin_exhaustion_count --
-- How many unacknowledged exhaustions.
SELECT COUNT(*) FROM {table} WHERE state = 'abandoned' AND settled_at IS NULL

-- admin_list_rows --
-- Rows by id, optionally of one state, after an id (bodies not read).
SELECT update_id, state, attempts, due_at, received_at, settled_at, error, claim_id FROM {table}
WHERE (:state IS NULL OR state = :state)
  AND (:after IS NULL OR update_id > :after)
ORDER BY update_id
LIMIT :limit

-- admin_select_row --
-- One row with its body.
SELECT update_id, state, attempts, due_at, received_at, settled_at, error, claim_id, body
FROM {table} WHERE update_id = :update_id

-- admin_retry --
-- Make a failed or abandoned row, exactly as it was read, pending again (error and claim_id kept).
UPDATE {table}
SET state = 'pending', attempts = 0, due_at = received_at, settled_at = NULL
WHERE update_id = :update_id
  AND state IN ('failed', 'abandoned')
  AND state = :state AND attempts = :attempts
RETURNING update_id

-- admin_prune_count --
-- How many rows prune would delete before a time.
SELECT COUNT(*) FROM {table}
WHERE state IN ('completed', 'abandoned') AND settled_at IS NOT NULL AND settled_at < :before

-- admin_prune_bounds --
-- The settled_at of every every-th row prune would delete, oldest first (the bounds of batches).
SELECT settled_at FROM (
    SELECT settled_at, ROW_NUMBER() OVER (ORDER BY settled_at) AS n FROM {table}
    WHERE state IN ('completed', 'abandoned') AND settled_at IS NOT NULL
      AND settled_at < :before
) AS ranked
WHERE n % :every = 0 ORDER BY settled_at

-- admin_state_totals --
-- Rows and unsettled rows per state (the chaos runner's progress).
SELECT state, count(*), sum(CASE WHEN settled_at IS NULL THEN 1 ELSE 0 END)
FROM {table} GROUP BY state

-- admin_all_rows --
-- Every row's id, state, attempts, settled_at and claim id (the chaos runner's check).
SELECT update_id, state, attempts, settled_at, claim_id FROM {table}

-- admin_oldest_unsent_call --
-- The unsent outbox call (pending or sending) created first.
SELECT call_id, update_id, created_at FROM {outbox}
WHERE state IN ('pending', 'sending') ORDER BY created_at, call_id LIMIT 1

-- admin_failed_call_count --
-- How many outbox calls failed and are not acknowledged.
SELECT COUNT(*) FROM {outbox} WHERE state = 'failed' AND NOT acknowledged

-- admin_oldest_unsent_at --
-- When the oldest unsent outbox call was created.
SELECT MIN(created_at) FROM {outbox} WHERE state IN ('pending', 'sending')

-- admin_list_rows_legacy --
-- admin_list_rows on a table from before fencing, not opened by a store since (claim_id read as NULL).
SELECT update_id, state, attempts, due_at, received_at, settled_at, error, NULL FROM {table}
WHERE (:state IS NULL OR state = :state)
  AND (:after IS NULL OR update_id > :after)
ORDER BY update_id
LIMIT :limit

-- admin_select_row_legacy --
-- admin_select_row on such a table (claim_id read as NULL).
SELECT update_id, state, attempts, due_at, received_at, settled_at, error, NULL, body
FROM {table} WHERE update_id = :update_id
