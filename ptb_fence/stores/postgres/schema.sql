-- ptb_fence: the PostgreSQL schema of an update table and the tables that go with it, and
-- the statements that check it. Placeholders in braces are table and index names (validated,
-- double-quoted) and lock keys derived from them, filled by ptb_fence/stores/_queries.py.

-- schema_tables --
-- The idempotent migration of an update table, its outbox, state, steps, jobs, pace, broadcasts, recipients, meta and instances tables, without their indexes.

-- ptb_fence: schema of the update table {table}. Idempotent: applying it again changes nothing.
-- Serialise concurrent migrations of this table (the lock is held until the transaction ends).
SELECT pg_advisory_xact_lock({schema_lock_key});

CREATE TABLE IF NOT EXISTS {table} (
    update_id   BIGINT PRIMARY KEY,   -- Telegram update_id
    body        TEXT   NOT NULL,      -- the update's JSON text, as received
    state       TEXT   NOT NULL,      -- pending, processing, failed, completed, abandoned
    attempts    INT    NOT NULL DEFAULT 0,
    due_at      BIGINT,               -- pending: received_at; lease expiry / retry time /
                                      -- when it was abandoned (never NULL; older tables
                                      -- declare it NOT NULL)
    received_at BIGINT NOT NULL,      -- epoch milliseconds
    settled_at  BIGINT,               -- NULL: not prunable (incl. unacknowledged exhaustion)
    error       TEXT,                 -- last failure text
    claim_id    TEXT,                 -- opaque token of the current or last claim
    fingerprint TEXT,                 -- which update the body is (same id, other update?)
    instance    TEXT,                 -- the live instance that made the claim (liveness)
    isolated_claim TEXT               -- NULL: never taken over from a dead process; else
                                      -- suspect, and = claim_id while that claim's handler
                                      -- runs on probation or alone in its process
);

-- Tables created before fencing lack claim_id. Older ones lack fingerprint, instance and
-- isolated_claim.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS claim_id TEXT;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS fingerprint TEXT;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS instance TEXT;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS isolated_claim TEXT;

-- strict_chat_order: the chat of each row (NULL: no chat).
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS chat_key BIGINT;

-- The outbox: the Bot API calls queued by attempts, sent iff their completion committed.
CREATE TABLE IF NOT EXISTS {outbox} (
    call_id      BIGSERIAL PRIMARY KEY,
    update_id    BIGINT  NOT NULL,    -- the attempt that queued the call
    attempt      INT     NOT NULL,
    claim_id     TEXT    NOT NULL,
    seq          INT     NOT NULL,    -- its position among the attempt's calls
    chat_key     BIGINT,              -- NULL: no chat, never ordered
    method       TEXT    NOT NULL,
    params       TEXT    NOT NULL,    -- a JSON object
    at_most_once BOOLEAN NOT NULL DEFAULT FALSE,
    state        TEXT    NOT NULL,    -- pending, sending, sent, failed
    tries        INT     NOT NULL DEFAULT 0,
    due_at       BIGINT  NOT NULL,    -- pending: when; sending: the lease; failed: when
    created_at   BIGINT  NOT NULL,
    sent_at      BIGINT,
    sender       TEXT,                -- the token of the sender that claimed it
    error        TEXT,
    result       TEXT,
    acknowledged BOOLEAN NOT NULL DEFAULT FALSE
);

-- Persisted bot state (FencedPersistence): one versioned row per user, chat, conversation.
CREATE TABLE IF NOT EXISTS {state} (
    kind       TEXT   NOT NULL,  -- user, chat, bot, conversation, callback
    name       TEXT   NOT NULL,  -- the conversation handler's name, else ''
    key        TEXT   NOT NULL,  -- user/chat id, conversation key JSON, else ''
    value      TEXT,             -- the encoded state; NULL: deleted (a tombstone)
    version    BIGINT NOT NULL,  -- how many writes landed on the row
    updated_at BIGINT NOT NULL,  -- epoch milliseconds of the last write
    PRIMARY KEY (kind, name, key)
);

-- Recorded steps (attempt.step): one recorded result per effect key.
CREATE TABLE IF NOT EXISTS {steps} (
    key         TEXT   PRIMARY KEY,  -- the effect key, [a-z0-9-], at most 64 characters
    update_id   BIGINT NOT NULL,     -- the update whose handling did the step
    name        TEXT   NOT NULL,     -- the step's name as the handler gave it
    result      TEXT   NOT NULL,     -- the step's result as JSON text
    attempt     INT    NOT NULL,     -- the attempt that recorded it
    claim_id    TEXT   NOT NULL,
    recorded_at BIGINT NOT NULL      -- epoch milliseconds
);

-- Durable jobs: one row per job, its runs recorded as update rows.
CREATE TABLE IF NOT EXISTS {jobs} (
    job_id      BIGSERIAL PRIMARY KEY,
    name        TEXT    NOT NULL,
    callback    TEXT    NOT NULL,    -- an import path or a registered name
    data        TEXT    NOT NULL,    -- the job's data, encoded as persisted state is
    chat_id     BIGINT,
    user_id     BIGINT,
    schedule    TEXT    NOT NULL,    -- when it runs, as JSON text
    next_run_at BIGINT,              -- epoch milliseconds; NULL: no more runs
    runs        INT     NOT NULL DEFAULT 0,
    keyed       BOOLEAN NOT NULL DEFAULT FALSE,  -- one live job per name
    state       TEXT    NOT NULL,    -- scheduled, paused, ended, cancelled
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL,
    options     TEXT    NOT NULL     -- its run options as JSON text
);

-- Store-wide pacing: one row per bucket the sends are paced by.
CREATE TABLE IF NOT EXISTS {pace} (
    key        TEXT   PRIMARY KEY,   -- bot, paid or chat:<id>
    tat        BIGINT NOT NULL,      -- the bucket's next send time without a burst (epoch ms)
    held_until BIGINT NOT NULL       -- no slot before this time (epoch ms)
);

-- Broadcasts: one row per broadcast, its call kept once.
CREATE TABLE IF NOT EXISTS {broadcasts} (
    broadcast_id BIGSERIAL PRIMARY KEY,
    name         TEXT   NOT NULL UNIQUE,
    method       TEXT   NOT NULL,
    params       TEXT   NOT NULL,      -- a JSON object, without chat_id
    state        TEXT   NOT NULL,      -- active, paused, cancelled
    created_at   BIGINT NOT NULL
);

-- One row per chat of a broadcast.
CREATE TABLE IF NOT EXISTS {recipients} (
    broadcast_id BIGINT NOT NULL,
    chat_id      BIGINT NOT NULL,
    state        TEXT   NOT NULL,      -- pending, sending, sent, failed, blocked, cancelled
    due_at       BIGINT NOT NULL,      -- pending: when due, sending: the lease, else: when settled
    tries        INT    NOT NULL DEFAULT 0,
    sender       TEXT,
    error        TEXT,
    PRIMARY KEY (broadcast_id, chat_id)
);

-- Which bot owns which update table (one table per bot).
SELECT pg_advisory_xact_lock({meta_lock_key});
CREATE TABLE IF NOT EXISTS {meta} (
    table_name TEXT PRIMARY KEY,      -- an update table of this schema
    bot_id     BIGINT NOT NULL        -- the bot (id from its token) that owns it
);

-- The live instances of the update tables (hold_liveness / take_over_dead).
CREATE TABLE IF NOT EXISTS {instances} (
    table_name TEXT   NOT NULL,       -- an update table of this schema
    instance   TEXT   NOT NULL,       -- the instance id (hold_liveness)
    lock_key   INT    NOT NULL,       -- pg_advisory_lock({class_id}, lock_key) while alive
    started_at BIGINT NOT NULL,       -- epoch milliseconds
    seen_at    BIGINT,                -- last refresh by its holder (server clock, epoch ms)
    PRIMARY KEY (table_name, instance)
);
-- Every new update table's schema runs this: an unconditional ALTER TABLE would queue for an
-- ACCESS EXCLUSIVE lock on the table that every live instance of the database refreshes, and
-- while one open transaction (a frozen process between a statement and its commit) keeps it
-- waiting, every instance's takeover check would wait behind it. Only a table that lacks the
-- column is altered.
DO $ptb_fence$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = to_regclass('{instances}')
                     AND attname = 'seen_at' AND NOT attisdropped) THEN
        ALTER TABLE {instances} ADD COLUMN IF NOT EXISTS seen_at BIGINT;
    END IF;
END
$ptb_fence$;

-- index_index --
-- The (state, due_at) index of the update table (claims and due read it).
CREATE INDEX IF NOT EXISTS {index} ON {table} (state, due_at);

-- index_chat_index --
-- The waiting rows of each chat (unsettled only, so the index stays small).
CREATE INDEX IF NOT EXISTS {chat_index} ON {table} (chat_key, update_id) WHERE state IN ('pending', 'processing', 'failed');

-- index_outbox_state_due_idx --
-- The (state, due_at) index of the outbox.
CREATE INDEX IF NOT EXISTS {outbox_state_due_idx} ON {outbox} (state, due_at);

-- index_outbox_chat_idx --
-- The unsent calls of each chat.
CREATE INDEX IF NOT EXISTS {outbox_chat_idx} ON {outbox} (chat_key, call_id) WHERE state IN ('pending', 'sending');

-- index_outbox_failed_idx --
-- The unacknowledged failures.
CREATE INDEX IF NOT EXISTS {outbox_failed_idx} ON {outbox} (call_id) WHERE state = 'failed' AND NOT acknowledged;

-- index_steps_update_idx --
-- The records of each update (steps_of and prune read it).
CREATE INDEX IF NOT EXISTS {steps_update_idx} ON {steps} (update_id);

-- index_jobs_due_idx --
-- The scheduled jobs by next run (due_jobs reads it).
CREATE INDEX IF NOT EXISTS {jobs_due_idx} ON {jobs} (next_run_at, job_id) WHERE state = 'scheduled';

-- index_jobs_name_idx --
-- One live keyed job per name (a declaration's ON CONFLICT names it).
CREATE UNIQUE INDEX IF NOT EXISTS {jobs_name_idx} ON {jobs} (name) WHERE keyed AND state IN ('scheduled', 'paused');

-- index_recipients_due_idx --
-- The unsettled recipients by due time (claim_recipients reads it).
CREATE INDEX IF NOT EXISTS {recipients_due_idx} ON {recipients} (due_at) WHERE state IN ('pending', 'sending');

-- build_index --
-- index_index on an existing table without blocking its writers (outside a transaction).
CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {table} (state, due_at)

-- build_chat_index --
-- index_chat_index on an existing table without blocking its writers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {chat_index} ON {table} (chat_key, update_id) WHERE state IN ('pending', 'processing', 'failed')

-- build_outbox_state_due_idx --
-- index_outbox_state_due_idx on an existing outbox without blocking its writers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {outbox_state_due_idx} ON {outbox} (state, due_at)

-- build_outbox_chat_idx --
-- index_outbox_chat_idx on an existing outbox without blocking its writers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {outbox_chat_idx} ON {outbox} (chat_key, call_id) WHERE state IN ('pending', 'sending')

-- build_outbox_failed_idx --
-- index_outbox_failed_idx on an existing outbox without blocking its writers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {outbox_failed_idx} ON {outbox} (call_id) WHERE state = 'failed' AND NOT acknowledged

-- build_steps_update_idx --
-- index_steps_update_idx on an existing steps table without blocking its writers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {steps_update_idx} ON {steps} (update_id)

-- build_jobs_due_idx --
-- index_jobs_due_idx on an existing jobs table without blocking its writers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {jobs_due_idx} ON {jobs} (next_run_at, job_id) WHERE state = 'scheduled'

-- build_jobs_name_idx --
-- index_jobs_name_idx on an existing jobs table without blocking its writers.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {jobs_name_idx} ON {jobs} (name) WHERE keyed AND state IN ('scheduled', 'paused')

-- build_recipients_due_idx --
-- index_recipients_due_idx on an existing recipients table without blocking its writers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {recipients_due_idx} ON {recipients} (due_at) WHERE state IN ('pending', 'sending')

-- drop_index --
-- Drop an invalid index_index (an interrupted concurrent build) without blocking writers.
DROP INDEX CONCURRENTLY IF EXISTS {index}

-- drop_chat_index --
-- Drop an invalid index_chat_index without blocking writers.
DROP INDEX CONCURRENTLY IF EXISTS {chat_index}

-- drop_outbox_state_due_idx --
-- Drop an invalid index_outbox_state_due_idx without blocking writers.
DROP INDEX CONCURRENTLY IF EXISTS {outbox_state_due_idx}

-- drop_outbox_chat_idx --
-- Drop an invalid index_outbox_chat_idx without blocking writers.
DROP INDEX CONCURRENTLY IF EXISTS {outbox_chat_idx}

-- drop_outbox_failed_idx --
-- Drop an invalid index_outbox_failed_idx without blocking writers.
DROP INDEX CONCURRENTLY IF EXISTS {outbox_failed_idx}

-- drop_steps_update_idx --
-- Drop an invalid index_steps_update_idx without blocking writers.
DROP INDEX CONCURRENTLY IF EXISTS {steps_update_idx}

-- drop_jobs_due_idx --
-- Drop an invalid index_jobs_due_idx without blocking writers.
DROP INDEX CONCURRENTLY IF EXISTS {jobs_due_idx}

-- drop_jobs_name_idx --
-- Drop an invalid index_jobs_name_idx without blocking writers.
DROP INDEX CONCURRENTLY IF EXISTS {jobs_name_idx}

-- drop_recipients_due_idx --
-- Drop an invalid index_recipients_due_idx without blocking writers.
DROP INDEX CONCURRENTLY IF EXISTS {recipients_due_idx}

-- schema_lock --
-- Serialise schema changes of the table until the transaction ends.
SELECT pg_advisory_xact_lock({schema_lock_key})

-- schema_check --
-- Whether every table, column and index of the schema exists (then the DDL is skipped: its ALTER TABLE would lock the table).
SELECT to_regclass(%(table)s) IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%(table)s)
                  AND attname = 'claim_id' AND NOT attisdropped),
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%(table)s)
                  AND attname = 'fingerprint' AND NOT attisdropped),
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%(table)s)
                  AND attname = 'instance' AND NOT attisdropped),
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%(table)s)
                  AND attname = 'isolated_claim' AND NOT attisdropped),
       to_regclass(%(index)s) IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%(table)s)
                  AND attname = 'chat_key' AND NOT attisdropped),
       to_regclass(%(chat_index)s) IS NOT NULL,
       to_regclass(%(meta)s) IS NOT NULL,
       to_regclass(%(instances)s) IS NOT NULL,
       to_regclass(%(outbox)s) IS NOT NULL,
       to_regclass(%(state)s) IS NOT NULL,
       to_regclass(%(steps)s) IS NOT NULL,
       to_regclass(%(steps_update_idx)s) IS NOT NULL,
       to_regclass(%(jobs)s) IS NOT NULL,
       to_regclass(%(jobs_due_idx)s) IS NOT NULL,
       to_regclass(%(jobs_name_idx)s) IS NOT NULL,
       to_regclass(%(pace)s) IS NOT NULL,
       to_regclass(%(broadcasts)s) IS NOT NULL,
       to_regclass(%(recipients)s) IS NOT NULL,
       to_regclass(%(recipients_due_idx)s) IS NOT NULL,
       EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%(instances)s)
                  AND attname = 'seen_at' AND NOT attisdropped)

-- table_columns --
-- The columns of a table (parameter quoted: its double-quoted name), none when it is missing.
SELECT attname FROM pg_attribute
WHERE attrelid = to_regclass(%(quoted)s) AND attnum > 0 AND NOT attisdropped

-- table_exists --
-- Whether a table exists (parameter quoted: its double-quoted name).
SELECT to_regclass(%(quoted)s) IS NOT NULL

-- create_meta --
-- Create the table of bind_bot owners once, serialised by its lock.
SELECT pg_advisory_xact_lock({meta_lock_key});
CREATE TABLE IF NOT EXISTS {meta} (
    table_name TEXT PRIMARY KEY,      -- an update table of this schema
    bot_id     BIGINT NOT NULL        -- the bot (id from its token) that owns it
);

-- bind_bot --
-- Record the table's bot (the first binder wins) and return the owner in one statement.
INSERT INTO {meta} (table_name, bot_id) VALUES (%(table)s, %(bot_id)s)
ON CONFLICT (table_name) DO UPDATE SET table_name = EXCLUDED.table_name
RETURNING bot_id

-- meta_exists --
-- Whether the table of bind_bot owners exists.
SELECT to_regclass('{meta}') IS NOT NULL

-- forget_table --
-- Forget which bot owned a dropped table (its bind_bot row).
DELETE FROM {meta} WHERE table_name = %(table)s

-- probe --
-- Prove a pooled connection alive.
SELECT 1

-- renew_lock_timeout --
-- A single renewal waits at most this long for a row lock (then 55P03).
SET LOCAL lock_timeout = '200ms'

-- instances_have_seen_at --
-- Whether the instances table has seen_at (ptb-fence migrate --check).
SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%(quoted)s)
               AND attname = 'seen_at' AND NOT attisdropped)

-- index_validity --
-- Whether an index (parameter quoted: its double-quoted name) is valid, no row when it is missing.
SELECT i.indisvalid FROM pg_index AS i WHERE i.indexrelid = to_regclass(%(quoted)s)
