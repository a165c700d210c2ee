-- ptb_fence: the PostgreSQL statements on store-wide pacing (the declared part pacing).
--
-- One row per bucket. take_send_slots makes the rows of its keys exist, locks them FOR UPDATE
-- in key order, and writes back the ones that moved, in one transaction. So the processes of
-- the bot never take overlapping slots of one bucket, and two takers never deadlock.

-- pace_ensure --
-- Make the rows of some buckets exist, free (parameter keys: a sorted text array).
INSERT INTO {pace} (key, tat, held_until)
SELECT k, 0, 0 FROM unnest(%(keys)s::TEXT[]) AS k
ON CONFLICT (key) DO NOTHING

-- pace_lock --
-- The rows of some buckets, locked in key order.
SELECT key, tat, held_until FROM {pace} WHERE key = ANY(%(keys)s::TEXT[])
ORDER BY key
FOR UPDATE

-- pace_read --
-- The rows of some buckets, not locked (a read that takes nothing).
SELECT key, tat, held_until FROM {pace} WHERE key = ANY(%(keys)s::TEXT[])

-- pace_write --
-- Move some buckets on (parameters keys and tats: arrays of one length).
UPDATE {pace} AS p SET tat = v.tat
FROM unnest(%(keys)s::TEXT[], %(tats)s::BIGINT[]) AS v(key, tat)
WHERE p.key = v.key

-- pace_hold --
-- Hold a bucket until a time, never shortening an earlier hold.
INSERT INTO {pace} (key, tat, held_until) VALUES (%(key)s, 0, %(until)s)
ON CONFLICT (key) DO UPDATE SET held_until = GREATEST({pace}.held_until, EXCLUDED.held_until)

-- pace_prune --
-- Delete the buckets whose next time and hold are both before a time.
DELETE FROM {pace} WHERE tat < %(before)s AND held_until < %(before)s

-- pace_exists --
-- Whether the pace table exists (parameter pace: its double-quoted name).
SELECT to_regclass(%(pace)s) IS NOT NULL
