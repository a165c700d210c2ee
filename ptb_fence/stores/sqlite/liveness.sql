-- ptb_fence: the SQLite statements of release and liveness.
-- An instance holds a lock file, recorded in the instances table.
-- ptb_fence/stores/sqlite/_liveness.py proves it dead.

-- release_many --
-- Give exact claims back (pending, attempts - 1, due at at) for the [update_id, attempt, claim_id] triples of a JSON array.
-- Returns the released (update_id, attempt, claim_id): the attempt that was released.
UPDATE {table} AS t
SET state = 'pending', attempts = t.attempts - 1, due_at = :at, instance = NULL
FROM (SELECT json_extract(value, '$[0]') AS update_id, json_extract(value, '$[1]') AS attempt,
             json_extract(value, '$[2]') AS claim_id
      FROM json_each(:identities)) AS v
WHERE t.update_id = v.update_id AND t.attempts = v.attempt AND t.claim_id = v.claim_id
  AND +t.state = 'processing'
RETURNING update_id, attempts + 1, claim_id

-- create_instances --
-- Create the table of the live instances of the file's update tables.
CREATE TABLE IF NOT EXISTS {instances} (table_name TEXT NOT NULL, instance TEXT NOT NULL,
    lock_path TEXT NOT NULL, started_at INTEGER NOT NULL, PRIMARY KEY (table_name, instance))

-- insert_instance --
-- Record a live instance of the table.
INSERT OR REPLACE INTO {instances} (table_name, instance, lock_path, started_at)
VALUES (:table, :instance, :lock_path, :started_at)

-- delete_instance --
-- Forget an instance that stops holding liveness, or that is dead.
DELETE FROM {instances} WHERE table_name = :table AND instance = :instance

-- instances_table_exists --
-- Whether the instances table exists.
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ptb_fence_instances'

-- instances_of --
-- The instances of the table other than the caller's, with their lock files.
SELECT instance, lock_path FROM {instances}
WHERE table_name = :table AND (:me IS NULL OR instance <> :me)

-- take_over --
-- A dead instance's claims: a claim marked isolated lapses now, every other is given back and its row becomes suspect.
-- A claim marked isolated keeps its attempt and claim id. Its handler ran alone in the dead
-- process, or started there on probation, so the crash is its own. Every other claim is given
-- back as release_many gives it, since any handler of the process may have killed it. Its row
-- becomes suspect (''). It becomes suspect again ('*') when its handler had started there as
-- one.
UPDATE {table} SET
    state = CASE WHEN isolated_claim = claim_id THEN state ELSE 'pending' END,
    attempts = CASE WHEN isolated_claim = claim_id THEN attempts ELSE attempts - 1 END,
    due_at = CASE WHEN isolated_claim = claim_id THEN MIN(COALESCE(due_at, :now - 1), :now - 1)
                  ELSE :now END,
    instance = CASE WHEN isolated_claim = claim_id THEN instance ELSE NULL END,
    isolated_claim = CASE WHEN isolated_claim = claim_id THEN isolated_claim
                          WHEN isolated_claim IS NULL OR isolated_claim = '' THEN ''
                          ELSE '*' END
WHERE state = 'processing' AND instance = :instance
RETURNING update_id

-- mark_isolated --
-- The handler of this exact live claim starts on probation or alone in its process.
UPDATE {table} SET isolated_claim = claim_id
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt AND due_at >= :at
  AND claim_id = :claim_id
RETURNING update_id

-- end_probation --
-- The handler of this exact live claim, marked, ran past its probation ('~').
UPDATE {table} SET isolated_claim = '~'
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt AND due_at >= :at
  AND claim_id = :claim_id AND isolated_claim = claim_id
RETURNING update_id
