-- ptb_fence: the PostgreSQL statements on recorded steps (the declared part steps).
--
-- A record lands only while its attempt owns the update at recorded_at, as owns decides. The
-- first record of a key stands. One statement decides both: it locks the owned row FOR SHARE,
-- so a claim that would take the update over waits for the record's transaction.

-- step_record --
-- Record a step while its attempt owns the update, and tell whether it owns it (one row: owned).
WITH owned AS (
    SELECT update_id FROM {table}
    WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
      AND claim_id = %(claim_id)s AND due_at >= %(recorded_at)s
    FOR SHARE
), recorded AS (
    INSERT INTO {steps} (key, update_id, name, result, attempt, claim_id, recorded_at)
    SELECT %(key)s, %(update_id)s, %(name)s, %(result)s, %(attempt)s, %(claim_id)s,
           %(recorded_at)s
    FROM owned
    ON CONFLICT (key) DO NOTHING
    RETURNING key
)
SELECT EXISTS (SELECT 1 FROM owned)

-- step_read --
-- The record of an effect key.
SELECT key, update_id, name, result, attempt, claim_id, recorded_at FROM {steps}
WHERE key = %(key)s

-- steps_of --
-- The records of an update, by recorded_at and then by key (byte order, as everywhere).
SELECT key, update_id, name, result, attempt, claim_id, recorded_at FROM {steps}
WHERE update_id = %(update_id)s
ORDER BY recorded_at, key COLLATE "C"

-- steps_exists --
-- Whether the steps table exists (parameter steps: its double-quoted name).
SELECT to_regclass(%(steps)s) IS NOT NULL

-- prune_with_steps --
-- prune, and the records of the rows it deletes, in one statement (returns the count of rows).
WITH pruned AS (
    DELETE FROM {table}
    WHERE state IN ('completed', 'abandoned') AND settled_at < %(before)s
    RETURNING update_id
), forgotten AS (
    DELETE FROM {steps} WHERE update_id IN (SELECT update_id FROM pruned)
)
SELECT count(*) FROM pruned
