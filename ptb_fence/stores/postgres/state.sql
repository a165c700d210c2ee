-- ptb_fence: the PostgreSQL statements on persisted bot state (StateStore).
--
-- A write is one conditional statement. A row read at version v is updated only WHERE
-- version = v. A row read as absent is inserted ON CONFLICT DO NOTHING. Either returns a row
-- exactly when it landed. A transaction first takes one advisory lock per key written, in
-- ascending order, so writers of overlapping keys queue instead of deadlocking. An attempt's
-- writes run in a savepoint with its settle: all land or none.

-- state_insert --
-- Insert a key read as absent (lands unless it is there now).
INSERT INTO {state} (kind, name, key, value, version, updated_at)
VALUES (%(kind)s, %(name)s, %(key)s, %(value)s, 1, %(at)s)
ON CONFLICT (kind, name, key) DO NOTHING
RETURNING version

-- state_update --
-- Update a key at the version it was read at.
UPDATE {state} SET value = %(value)s, version = version + 1, updated_at = %(at)s
WHERE kind = %(kind)s AND name = %(name)s AND key = %(key)s AND version = %(version)s
RETURNING version

-- state_read --
-- The rows of the keys of the parallel arrays, each key one search of the primary key.
-- The keys are unnested and each looked up in a LATERAL subquery with LIMIT 1, which the
-- planner cannot turn into a hash join or a filter (key = ANY(...) was planned, on a table not
-- yet analyzed, as a scan of every row of the kind and name: 27 ms against 1.4 ms for 97 keys).
SELECT s.kind, s.name, s.key, s.value, s.version
FROM unnest(%(read_kinds)s::TEXT[], %(read_names)s::TEXT[], %(read_keys)s::TEXT[])
     AS k(kind, name, key),
     LATERAL (SELECT kind, name, key, value, version FROM {state} AS t
              WHERE t.kind = k.kind AND t.name = k.name AND t.key = k.key LIMIT 1) AS s

-- state_lock --
-- One transaction advisory lock per key number written, ascending.
SELECT count(pg_advisory_xact_lock({state_lock_class}, k))
FROM (SELECT DISTINCT unnest(%(keys)s::INT[]) AS k ORDER BY k) AS keys

-- state_lock_then_read --
-- state_lock then state_read in one round trip (the read takes its snapshot once every lock is held).
-- The driver returns the rows of the last statement, the read's.
SELECT count(pg_advisory_xact_lock({state_lock_class}, k))
FROM (SELECT DISTINCT unnest(%(keys)s::INT[]) AS k ORDER BY k) AS keys;
SELECT s.kind, s.name, s.key, s.value, s.version
FROM unnest(%(read_kinds)s::TEXT[], %(read_names)s::TEXT[], %(read_keys)s::TEXT[])
     AS k(kind, name, key),
     LATERAL (SELECT kind, name, key, value, version FROM {state} AS t
              WHERE t.kind = k.kind AND t.name = k.name AND t.key = k.key LIMIT 1) AS s

-- state_group_then_lock --
-- The savepoint of a grouped completion's one-round-trip try, then state_lock (sent before the completion).
SAVEPOINT ptb_fence_group;
SELECT count(pg_advisory_xact_lock({state_lock_class}, k))
FROM (SELECT DISTINCT unnest(%(keys)s::INT[]) AS k ORDER BY k) AS keys;

-- state_rollback_group --
-- Undo a grouped completion's try.
ROLLBACK TO SAVEPOINT ptb_fence_group

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
WHERE (CAST(%(kind)s AS TEXT) IS NULL OR kind = %(kind)s)
  AND (CAST(%(name)s AS TEXT) IS NULL OR name = %(name)s)
  AND (CAST(%(after_kind)s AS TEXT) IS NULL
       OR (kind, name, key) > (%(after_kind)s, %(after_name)s, %(after_key)s))
ORDER BY kind, name, key
LIMIT %(limit)s

-- state_prune --
-- Delete the callback-data keyboards written before a time (the only state prune deletes).
DELETE FROM {state} WHERE kind = 'callback' AND updated_at < %(before)s

-- state_exists --
-- Whether the state table exists (parameter state: its double-quoted name).
SELECT to_regclass(%(state)s)
