-- ptb_fence: the SQLite statements on recorded steps (the declared part steps).
--
-- A record lands only while its attempt owns the update at recorded_at, as owns decides. The
-- first record of a key stands. The write lock (BEGIN IMMEDIATE) holds the update row from
-- the insert to the commit, so no claim takes the update over in between.

-- create_steps --
-- Create the steps table: one recorded result per effect key.
CREATE TABLE IF NOT EXISTS {steps} (
    key         TEXT    PRIMARY KEY,  -- the effect key, [a-z0-9-], at most 64 characters
    update_id   INTEGER NOT NULL,     -- the update whose handling did the step
    name        TEXT    NOT NULL,     -- the step's name as the handler gave it
    result      TEXT    NOT NULL,     -- the step's result as JSON text
    attempt     INT     NOT NULL,     -- the attempt that recorded it
    claim_id    TEXT    NOT NULL,
    recorded_at INTEGER NOT NULL      -- epoch milliseconds
)

-- create_steps_index --
-- The records of each update (steps_of and prune read it).
CREATE INDEX IF NOT EXISTS {steps_update_idx} ON {steps} (update_id)

-- steps_exists --
-- Whether the steps table exists (parameter steps: its name).
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :steps

-- step_insert --
-- Record a step while its attempt owns the update (returns a row when it was inserted).
INSERT INTO {steps} (key, update_id, name, result, attempt, claim_id, recorded_at)
SELECT :key, :update_id, :name, :result, :attempt, :claim_id, :recorded_at
WHERE EXISTS (
    SELECT 1 FROM {table}
    WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt
      AND claim_id = :claim_id AND due_at >= :recorded_at
)
ON CONFLICT (key) DO NOTHING
RETURNING key

-- step_owned --
-- Whether the attempt of a record owns its update at recorded_at (when the insert returned no row).
SELECT 1 FROM {table}
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt
  AND claim_id = :claim_id AND due_at >= :recorded_at

-- step_read --
-- The record of an effect key.
SELECT key, update_id, name, result, attempt, claim_id, recorded_at FROM {steps}
WHERE key = :key

-- steps_of --
-- The records of an update, by recorded_at and then by key.
SELECT key, update_id, name, result, attempt, claim_id, recorded_at FROM {steps}
WHERE update_id = :update_id
ORDER BY recorded_at, key

-- steps_prune --
-- Delete the records of the update rows prune deletes (run before it, in its transaction).
DELETE FROM {steps}
WHERE update_id IN (
    SELECT update_id FROM {table}
    WHERE state IN ('completed', 'abandoned') AND settled_at < :before
)
