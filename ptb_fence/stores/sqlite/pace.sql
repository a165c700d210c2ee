-- ptb_fence: the SQLite statements on store-wide pacing (the declared part pacing).
--
-- One row per bucket. take_send_slots reads the rows of its keys and writes back the ones
-- that moved, inside one write transaction (BEGIN IMMEDIATE). So the processes of the bot
-- never take overlapping slots of one bucket.

-- create_pace --
-- Create the pace table: one row per bucket the sends are paced by.
CREATE TABLE IF NOT EXISTS {pace} (
    key        TEXT    PRIMARY KEY,  -- bot, paid or chat:<id>
    tat        INTEGER NOT NULL,     -- the bucket's next send time without a burst (epoch ms)
    held_until INTEGER NOT NULL      -- no slot before this time (epoch ms)
)

-- pace_exists --
-- Whether the pace table exists (parameter pace: its name).
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :pace

-- pace_read --
-- The rows of some buckets (parameter keys: a JSON array of keys).
SELECT key, tat, held_until FROM {pace} WHERE key IN (SELECT value FROM json_each(:keys))

-- pace_write --
-- Write a bucket's row.
INSERT INTO {pace} (key, tat, held_until) VALUES (:key, :tat, :held_until)
ON CONFLICT (key) DO UPDATE SET tat = excluded.tat, held_until = excluded.held_until

-- pace_hold --
-- Hold a bucket until a time, never shortening an earlier hold.
INSERT INTO {pace} (key, tat, held_until) VALUES (:key, 0, :until)
ON CONFLICT (key) DO UPDATE SET held_until = max(held_until, excluded.held_until)

-- pace_prune --
-- Delete the buckets whose next time and hold are both before a time.
DELETE FROM {pace} WHERE tat < :before AND held_until < :before
