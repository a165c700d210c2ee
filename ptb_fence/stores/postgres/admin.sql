-- ptb_fence: the read-only and admin statements of the command line and the chaos runner on
-- a PostgreSQL update table. The command line reads the public table layout directly for
-- status, health, list and show and changes it directly only for retry. The retry rule is
-- ONE conditional UPDATE that matches only a failed or abandoned row as it was just read in
-- the same transaction, so it never touches a pending row, a lease or a completed update.
-- The seed's legacy table (no claim_id) reads its rows with the _legacy forms.

-- admin_begin_read --
-- The snapshot of a read of several statements.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY

-- admin_begin_write --
-- The transaction of a change (retry, outbox changes).
SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE

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
  COUNT(*) FILTER (WHERE state = 'failed' AND due_at <= %(now)s),
  COUNT(*) FILTER (WHERE state = 'processing' AND due_at < %(now)s),
  COUNT(*) FILTER (WHERE state = 'abandoned' AND settled_at IS NULL)
FROM {table}

-- admin_oldest_failed_due --
-- The failed row whose retry has been due longest at now (the (state, due_at) index answers it).
SELECT update_id, due_at FROM {table} WHERE state = 'failed' AND due_at <= %(now)s
ORDER BY due_at, update_id LIMIT 1

-- admin_oldest_lapsed_lease --
-- The processing row whose lease lapsed longest ago at now.
SELECT update_id, due_at FROM {table} WHERE state = 'processing' AND due_at < %(now)s
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
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(after)s::bigint IS NULL OR update_id > %(after)s::bigint)
ORDER BY update_id
LIMIT %(limit)s

-- admin_list_rows_legacy --
-- admin_list_rows on the legacy table (claim_id read as NULL).
SELECT update_id, state, attempts, due_at, received_at, settled_at, error, NULL FROM {table}
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(after)s::bigint IS NULL OR update_id > %(after)s::bigint)
ORDER BY update_id
LIMIT %(limit)s

-- admin_select_row --
-- One row with its body.
SELECT update_id, state, attempts, due_at, received_at, settled_at, error, claim_id, body
FROM {table} WHERE update_id = %(update_id)s

-- admin_select_row_legacy --
-- admin_select_row on the legacy table (claim_id read as NULL).
SELECT update_id, state, attempts, due_at, received_at, settled_at, error, NULL, body
FROM {table} WHERE update_id = %(update_id)s

-- admin_select_row_for_retry --
-- One row with its body, locked: a competing claim waits for this transaction.
SELECT update_id, state, attempts, due_at, received_at, settled_at, error, claim_id, body
FROM {table} WHERE update_id = %(update_id)s FOR UPDATE

-- admin_select_row_for_retry_legacy --
-- admin_select_row_for_retry on the legacy table (claim_id read as NULL).
SELECT update_id, state, attempts, due_at, received_at, settled_at, error, NULL, body
FROM {table} WHERE update_id = %(update_id)s FOR UPDATE

-- admin_retry --
-- Make a failed or abandoned row, exactly as it was read, pending again (error and claim_id kept).
UPDATE {table}
SET state = 'pending', attempts = 0, due_at = received_at, settled_at = NULL
WHERE update_id = %(update_id)s
  AND state IN ('failed', 'abandoned')
  AND state = %(state)s AND attempts = %(attempts)s
RETURNING update_id

-- admin_prune_count --
-- How many rows prune would delete before a time.
SELECT COUNT(*) FROM {table}
WHERE state IN ('completed', 'abandoned') AND settled_at IS NOT NULL AND settled_at < %(before)s

-- admin_prune_bounds --
-- The settled_at of every every-th row prune would delete, oldest first (the bounds of batches).
SELECT settled_at FROM (
    SELECT settled_at, ROW_NUMBER() OVER (ORDER BY settled_at) AS n FROM {table}
    WHERE state IN ('completed', 'abandoned') AND settled_at IS NOT NULL
      AND settled_at < %(before)s
) AS ranked
WHERE n %% %(every)s = 0 ORDER BY settled_at

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

-- admin_lock_schema --
-- Serialise a migration with every store's schema check (session lock, parameter key).
SELECT pg_advisory_lock(%(key)s)

-- admin_unlock_schema --
-- End admin_lock_schema.
SELECT pg_advisory_unlock(%(key)s)

-- admin_drop_table --
-- Drop the update table (the command line's drop).
DROP TABLE IF EXISTS {table}

-- admin_drop_outbox --
-- Drop the outbox table.
DROP TABLE IF EXISTS {outbox}

-- admin_drop_state --
-- Drop the state table.
DROP TABLE IF EXISTS {state}

-- admin_drop_steps --
-- Drop the steps table.
DROP TABLE IF EXISTS {steps}

-- admin_drop_jobs --
-- Drop the jobs table.
DROP TABLE IF EXISTS {jobs}

-- admin_drop_pace --
-- Drop the pace table.
DROP TABLE IF EXISTS {pace}

-- admin_drop_broadcasts --
-- Drop the broadcasts and recipients tables.
DROP TABLE IF EXISTS {recipients}, {broadcasts}
