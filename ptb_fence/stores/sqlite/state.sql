-- ptb_fence: the SQLite statements on persisted bot state (StateStore).
--
-- A write is one conditional statement. A row read at version v is updated only WHERE
-- version = v. A row read as absent is inserted ON CONFLICT DO NOTHING. Either returns a row
-- exactly when it landed. The write lock (BEGIN IMMEDIATE) orders the writers. An attempt's
-- writes run in a savepoint with its settle: all land or none. Python's sqlite3 lets go of
-- the GIL at every step, so the batches are one statement of one step each where they can be.

-- state_insert --
-- Insert a key read as absent (lands unless it is there now).
INSERT INTO {state} (kind, name, key, value, version, updated_at)
VALUES (:kind, :name, :key, :value, 1, :at)
ON CONFLICT (kind, name, key) DO NOTHING
RETURNING version

-- state_update --
-- Update a key at the version it was read at.
UPDATE {state} SET value = :value, version = version + 1, updated_at = :at
WHERE kind = :kind AND name = :name AND key = :key AND version = :version
RETURNING version

-- state_read --
-- The rows of the [kind, name, key] keys of a JSON array, as one JSON array of [kind, name, key, value, version] arrays.
-- One row: the store thread waits for the GIL once, not once per row. CROSS JOIN keeps the
-- keys outside, so each is one search of the primary key.
SELECT json_group_array(json_array(t.kind, t.name, t.key, t.value, t.version))
FROM json_each(:keys) AS k
CROSS JOIN {state} AS t
WHERE t.kind = json_extract(k.value, '$[0]') AND t.name = json_extract(k.value, '$[1]')
  AND t.key = json_extract(k.value, '$[2]')

-- state_insert_rows --
-- Checked inserts of the [kind, name, key, value, at] rows of a JSON array, in one statement.
INSERT INTO {state} (kind, name, key, value, version, updated_at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), 1, json_extract(value, '$[4]')
FROM json_each(:rows)

-- state_update_rows --
-- Checked updates of the [kind, name, key, value, at, version] rows of a JSON array, in one statement.
UPDATE {state} AS t
SET value = v.new_value, version = t.version + 1, updated_at = v.at
FROM (SELECT json_extract(value, '$[0]') AS kind, json_extract(value, '$[1]') AS name,
             json_extract(value, '$[2]') AS key, json_extract(value, '$[3]') AS new_value,
             json_extract(value, '$[4]') AS at, json_extract(value, '$[5]') AS version
      FROM json_each(:rows)) AS v
WHERE t.kind = v.kind AND t.name = v.name AND t.key = v.key AND t.version = v.version

-- state_savepoint --
-- The savepoint that holds one attempt's settle and state writes.
SAVEPOINT ptb_fence_state

-- state_rollback_to --
-- Undo one attempt's settle and state writes.
ROLLBACK TO SAVEPOINT ptb_fence_state

-- state_release --
-- End the savepoint of one attempt.
RELEASE SAVEPOINT ptb_fence_state

-- state_list --
-- The rows by (kind, name, key) after a key, optionally of one kind and name.
SELECT kind, name, key, value, version FROM {state}
WHERE (CAST(:kind AS TEXT) IS NULL OR kind = :kind)
  AND (CAST(:name AS TEXT) IS NULL OR name = :name)
  AND (CAST(:after_kind AS TEXT) IS NULL
       OR (kind, name, key) > (:after_kind, :after_name, :after_key))
ORDER BY kind, name, key
LIMIT :limit

-- state_prune --
-- Delete the callback-data keyboards written before a time (the only state prune deletes).
DELETE FROM {state} WHERE kind = 'callback' AND updated_at < :before
