-- ptb_fence: the SQLite schema of an update table and the tables that go with it (one
-- statement per block: SQLite runs one per execute). An older table is upgraded in place by
-- ptb_fence/stores/sqlite/_schema.py, which adds the columns it lacks.

-- create_table --
-- Create the update table.
CREATE TABLE IF NOT EXISTS {table} (
    update_id   INTEGER PRIMARY KEY,
    body        TEXT    NOT NULL,
    state       TEXT    NOT NULL DEFAULT 'pending',
    attempts    INTEGER NOT NULL DEFAULT 0,
    due_at      INTEGER,
    received_at INTEGER NOT NULL,
    settled_at  INTEGER,
    error       TEXT,
    claim_id    TEXT,
    fingerprint TEXT,
    instance    TEXT,
    chat_key    INTEGER,
    isolated_claim TEXT
)

-- create_index --
-- The (state, due_at) index of the update table.
CREATE INDEX IF NOT EXISTS {index} ON {table} (state, due_at)

-- create_chat_index --
-- The waiting rows of each chat (unsettled only, so the index stays small).
CREATE INDEX IF NOT EXISTS {chat_index} ON {table} (chat_key, update_id)
WHERE state IN ('pending', 'processing', 'failed')

-- table_info --
-- The columns of the update table.
PRAGMA table_info({table})

-- index_names --
-- The names of every index of the file.
SELECT name FROM sqlite_master WHERE type = 'index'

-- add_claim_id --
-- Upgrade a table created before fencing.
ALTER TABLE {table} ADD COLUMN claim_id TEXT

-- add_fingerprint --
-- Upgrade a table created before fingerprints.
ALTER TABLE {table} ADD COLUMN fingerprint TEXT

-- add_instance --
-- Upgrade a table created before liveness.
ALTER TABLE {table} ADD COLUMN instance TEXT

-- add_chat_key --
-- Upgrade a table created before strict chat order.
ALTER TABLE {table} ADD COLUMN chat_key INTEGER

-- add_isolated_claim --
-- Upgrade a table created before suspect isolation.
ALTER TABLE {table} ADD COLUMN isolated_claim TEXT

-- unclaimed_exhaustions --
-- An older table's unacknowledged exhaustions without a claim id (each gets one to be delivered and acknowledged).
SELECT update_id FROM {table}
WHERE state = 'abandoned' AND settled_at IS NULL AND claim_id IS NULL

-- backfill_claim_id --
-- Give such an exhaustion its claim id.
UPDATE {table} SET claim_id = :claim_id WHERE update_id = :update_id AND claim_id IS NULL

-- create_outbox --
-- Create the outbox: the Bot API calls queued by attempts, sent iff their completion committed.
CREATE TABLE IF NOT EXISTS {outbox} (
    call_id      INTEGER PRIMARY KEY AUTOINCREMENT,
    update_id    INTEGER NOT NULL,    -- the attempt that queued the call
    attempt      INT     NOT NULL,
    claim_id     TEXT    NOT NULL,
    seq          INT     NOT NULL,    -- its position among the attempt's calls
    chat_key     INTEGER,             -- NULL: no chat, never ordered
    method       TEXT    NOT NULL,
    params       TEXT    NOT NULL,    -- a JSON object
    at_most_once INTEGER NOT NULL DEFAULT FALSE,
    state        TEXT    NOT NULL,    -- pending, sending, sent, failed
    tries        INT     NOT NULL DEFAULT 0,
    due_at       INTEGER NOT NULL,    -- pending: when; sending: the lease; failed: when
    created_at   INTEGER NOT NULL,
    sent_at      INTEGER,
    sender       TEXT,                -- the token of the sender that claimed it
    error        TEXT,
    result       TEXT,
    acknowledged INTEGER NOT NULL DEFAULT FALSE
)

-- create_outbox_state_due_index --
-- The (state, due_at) index of the outbox.
CREATE INDEX IF NOT EXISTS {outbox_state_due_idx} ON {outbox} (state, due_at)

-- create_outbox_chat_index --
-- The unsent calls of each chat.
CREATE INDEX IF NOT EXISTS {outbox_chat_idx} ON {outbox} (chat_key, call_id) WHERE state IN ('pending', 'sending')

-- create_outbox_failed_index --
-- The unacknowledged failures.
CREATE INDEX IF NOT EXISTS {outbox_failed_idx} ON {outbox} (call_id) WHERE state = 'failed' AND NOT acknowledged

-- create_state --
-- Create the state table (FencedPersistence): one versioned row per user, chat, conversation.
CREATE TABLE IF NOT EXISTS {state} (
    kind       TEXT    NOT NULL,  -- user, chat, bot, conversation, callback
    name       TEXT    NOT NULL,  -- the conversation handler's name, else ''
    key        TEXT    NOT NULL,  -- user/chat id, conversation key JSON, else ''
    value      TEXT,              -- the encoded state; NULL: deleted (a tombstone)
    version    INTEGER NOT NULL,  -- how many writes landed on the row
    updated_at INTEGER NOT NULL,  -- epoch milliseconds of the last write
    PRIMARY KEY (kind, name, key)
)

-- outbox_exists --
-- Whether the outbox table exists (parameter outbox: its name).
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :outbox

-- state_exists --
-- Whether the state table exists (parameter state: its name).
SELECT name FROM sqlite_master WHERE type = 'table' AND name = :state

-- create_meta --
-- Create the table of bind_bot owners.
CREATE TABLE IF NOT EXISTS {meta} (table_name TEXT PRIMARY KEY, bot_id INTEGER NOT NULL)

-- bind_bot --
-- Record the table's bot (the first binder wins).
INSERT INTO {meta} (table_name, bot_id) VALUES (:table, :bot_id)
ON CONFLICT (table_name) DO NOTHING

-- bot_of --
-- The bot that owns the table.
SELECT bot_id FROM {meta} WHERE table_name = :table
