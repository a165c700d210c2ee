-- ptb_fence: the PostgreSQL statements of release and liveness.
--
-- An instance holds a session advisory lock pg_advisory_lock({class_id}, key) on a dedicated
-- connection (the two-int form in a fixed namespace, apart from the single-bigint locks users
-- take) and has a row in the instances table, refreshed (seen_at, the server's clock) by
-- every take_over_dead of its holder. An instance is dead when its lock can be taken and its
-- row was not refreshed for {beat_stale_ms} ms and that last refresh came after the server
-- started (a lock lost in a restart is not a death). The proof is in stores/postgres/_sql.py.

-- release_many --
-- Give exact claims back (pending, attempts - 1, due at at), skipping rows an open transaction locks. Returns the released positions.
WITH v(pos, update_id, attempt, claim_id) AS (
    SELECT * FROM unnest(%(positions)s::INT[], %(update_ids)s::BIGINT[], %(attempts)s::INT[],
                         %(claim_ids)s::TEXT[])
),
first AS (SELECT DISTINCT ON (update_id, attempt, claim_id) pos, update_id, attempt, claim_id
          FROM v ORDER BY update_id, attempt, claim_id, pos),
lockable AS (
    SELECT t.update_id, f.pos FROM {table} AS t JOIN first AS f
      ON t.update_id = f.update_id AND t.attempts = f.attempt AND t.claim_id = f.claim_id
    WHERE t.state = 'processing'
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE {table} AS t
SET state = 'pending', attempts = t.attempts - 1, due_at = %(at)s::BIGINT, instance = NULL
FROM lockable AS l
WHERE t.update_id = l.update_id
RETURNING l.pos

-- lock_instance --
-- Hold an instance's session advisory lock (before its row is visible).
SELECT pg_advisory_lock({class_id}, %(lock_key)s)

-- unlock_instance --
-- Let go of an instance's session advisory lock.
SELECT pg_advisory_unlock({class_id}, %(lock_key)s)

-- insert_instance --
-- Record a live instance of the table (or refresh its row).
INSERT INTO {instances} (table_name, instance, lock_key, started_at, seen_at)
VALUES (%(table)s, %(instance)s, %(lock_key)s, %(started_at)s,
        (extract(epoch FROM statement_timestamp()) * 1000)::BIGINT)
ON CONFLICT (table_name, instance) DO UPDATE SET seen_at = EXCLUDED.seen_at

-- instances_have_beats --
-- Whether the instances table has seen_at (without it nothing is proven dead).
SELECT EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = to_regclass('{instances}') AND attname = 'seen_at'
                 AND NOT attisdropped)

-- delete_instance --
-- Forget an instance that stops holding liveness.
DELETE FROM {instances} WHERE table_name = %(table)s AND instance = %(instance)s

-- take_over_dead --
-- Refresh the caller's row, find the dead instances, give back or lapse their claims, forget them.
-- The instances not refreshed for the stale time since the server started are listed first.
-- So the lock is tried on their keys only. Those whose lock can be taken are dead. A claim
-- marked isolated keeps its attempt and claim id, and its lease lapses now. Its handler ran
-- alone in the dead process, or started there on probation, so the crash is its own. Every
-- other claim is given back as release_many gives it, since any handler of the process may
-- have killed it. Its row becomes suspect ('' given back). It becomes suspect again ('*')
-- when its handler had started there as a suspect. (NOT DISTINCT: a base claim writes no claim id and marks NULL.)
-- A row another session still locks is skipped, never waited for: the instance stays listed
-- until its last row is taken. While no instance is dead (the usual case) EXISTS (SELECT 1
-- FROM dead) skips the update table entirely (benchmarks/takeover_cost.py).
WITH beat AS (
    UPDATE {instances} SET seen_at = (extract(epoch FROM statement_timestamp()) * 1000)::BIGINT
    WHERE table_name = %(table)s AND instance = %(me)s::TEXT
),
candidates AS MATERIALIZED (
    SELECT instance, lock_key FROM {instances}
    WHERE table_name = %(table)s AND (%(me)s::TEXT IS NULL OR instance <> %(me)s::TEXT)
      AND seen_at < (extract(epoch FROM statement_timestamp()) * 1000)::BIGINT - {beat_stale_ms}
      AND seen_at >= (extract(epoch FROM pg_postmaster_start_time()) * 1000)::BIGINT
),
dead AS MATERIALIZED (
    SELECT instance FROM candidates WHERE pg_try_advisory_xact_lock({class_id}, lock_key)
),
free AS MATERIALIZED (
    SELECT r.update_id FROM {table} AS r
    WHERE EXISTS (SELECT 1 FROM dead)
      AND r.state = 'processing' AND r.instance IN (SELECT instance FROM dead)
    FOR UPDATE OF r SKIP LOCKED
),
taken AS (
    UPDATE {table} SET
        state = CASE WHEN isolated_claim IS NOT DISTINCT FROM claim_id THEN state
                     ELSE 'pending' END,
        attempts = CASE WHEN isolated_claim IS NOT DISTINCT FROM claim_id THEN attempts
                        ELSE attempts - 1 END,
        due_at = CASE WHEN isolated_claim IS NOT DISTINCT FROM claim_id
                      THEN LEAST(due_at, %(now)s::BIGINT - 1)
                      ELSE %(now)s::BIGINT END,
        instance = CASE WHEN isolated_claim IS NOT DISTINCT FROM claim_id THEN instance
                        ELSE NULL END,
        isolated_claim = CASE WHEN isolated_claim IS NOT DISTINCT FROM claim_id
                              THEN isolated_claim
                              WHEN isolated_claim IS NULL OR isolated_claim = '' THEN ''
                              ELSE '*' END
    WHERE EXISTS (SELECT 1 FROM dead) AND update_id IN (SELECT update_id FROM free)
      AND state = 'processing' AND instance IN (SELECT instance FROM dead)
    RETURNING update_id
),
gone AS (
    DELETE FROM {instances} AS d
    WHERE d.table_name = %(table)s AND d.instance IN (SELECT instance FROM dead)
      AND NOT EXISTS (
          SELECT 1 FROM {table} AS r
          WHERE r.state = 'processing' AND r.instance = d.instance
            AND r.update_id NOT IN (SELECT update_id FROM free))
)
SELECT (SELECT count(*) FROM taken), ARRAY(SELECT instance FROM dead)

-- mark_isolated --
-- The handler of this exact live claim starts on probation or alone in its process.
UPDATE {table} SET isolated_claim = claim_id
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND due_at >= %(at)s
RETURNING update_id

-- end_probation --
-- The handler of this exact live claim, marked, ran past its probation ('~').
UPDATE {table} SET isolated_claim = '~'
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND isolated_claim = claim_id AND due_at >= %(at)s
RETURNING update_id
