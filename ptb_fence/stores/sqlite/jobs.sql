-- ptb_fence: the SQLite statements on durable jobs (the declared part jobs).
--
-- A job is live while scheduled or paused. A keyed job is one live row per name: the partial
-- unique index on name decides, and a declaration of a live name updates that row. A fire
-- moves a job on only from the state it was read in (runs and next_run_at), and records its
-- run as a pending update row in the same transaction. The write lock (BEGIN IMMEDIATE)
-- holds both from the first statement to the commit.

-- create_jobs --
-- Create the jobs table: one row per durable job.
CREATE TABLE IF NOT EXISTS {jobs} (
    job_id      INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT    NOT NULL,
    callback    TEXT    NOT NULL,  -- an import path or a registered name
    data        TEXT    NOT NULL,  -- the job's data, encoded as persisted state is
    chat_id     INTEGER,
    user_id     INTEGER,
    schedule    TEXT    NOT NULL,  -- when it runs, as JSON text
    next_run_at INTEGER,           -- epoch milliseconds; NULL: no more runs
    runs        INT     NOT NULL DEFAULT 0,
    keyed       INTEGER NOT NULL DEFAULT 0,  -- 1: one live job per name
    state       TEXT    NOT NULL,  -- scheduled, paused, ended, cancelled
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    options     TEXT    NOT NULL   -- its run options as JSON text
)

-- create_jobs_due_index --
-- The scheduled jobs by next run (due_jobs reads it).
CREATE INDEX IF NOT EXISTS {jobs_due_idx} ON {jobs} (next_run_at, job_id)
WHERE state = 'scheduled'

-- create_jobs_name_index --
-- One live keyed job per name.
CREATE UNIQUE INDEX IF NOT EXISTS {jobs_name_idx} ON {jobs} (name)
WHERE keyed AND state IN ('scheduled', 'paused')

-- jobs_exists --
-- Whether the jobs table exists (parameter jobs: its name).
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :jobs

-- job_insert --
-- Add a job (ended when it has no next run) and return it.
INSERT INTO {jobs} (name, callback, data, chat_id, user_id, schedule, next_run_at, runs,
                    keyed, state, created_at, updated_at, options)
VALUES (:name, :callback, :data, :chat_id, :user_id, :schedule, :next_run_at, 0, :keyed,
        CASE WHEN :next_run_at IS NULL THEN 'ended' ELSE 'scheduled' END, :at, :at, :options)
RETURNING job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs, keyed,
          state, created_at, options

-- job_declare --
-- Declare a keyed job: add it, or update the live job of its name, keeping its next run unless the schedule changed.
INSERT INTO {jobs} (name, callback, data, chat_id, user_id, schedule, next_run_at, runs,
                    keyed, state, created_at, updated_at, options)
VALUES (:name, :callback, :data, :chat_id, :user_id, :schedule, :next_run_at, 0, 1,
        'scheduled', :at, :at, :options)
ON CONFLICT (name) WHERE keyed AND state IN ('scheduled', 'paused') DO UPDATE SET
    callback = excluded.callback, data = excluded.data, chat_id = excluded.chat_id,
    user_id = excluded.user_id, options = excluded.options, updated_at = excluded.updated_at,
    next_run_at = CASE WHEN {jobs}.schedule = excluded.schedule THEN {jobs}.next_run_at
                       ELSE excluded.next_run_at END,
    schedule = excluded.schedule
RETURNING job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs, keyed,
          state, created_at, options

-- job_declare_ended --
-- Declare a keyed job without a next run on the live job of its name: a changed schedule ends it.
UPDATE {jobs} SET
    callback = :callback, data = :data, chat_id = :chat_id, user_id = :user_id,
    options = :options, updated_at = :at,
    next_run_at = CASE WHEN schedule = :schedule THEN next_run_at ELSE NULL END,
    state = CASE WHEN schedule = :schedule THEN state ELSE 'ended' END,
    schedule = :schedule
WHERE name = :name AND keyed AND state IN ('scheduled', 'paused')
RETURNING job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs, keyed,
          state, created_at, options

-- job_cancel --
-- Cancel a live job (returns a row when it was live).
UPDATE {jobs} SET state = 'cancelled', next_run_at = NULL, updated_at = :at
WHERE job_id = :job_id AND state IN ('scheduled', 'paused')
RETURNING job_id

-- jobs_due --
-- The scheduled jobs due at now, the earliest first.
SELECT job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs, keyed,
       state, created_at, options
FROM {jobs}
WHERE state = 'scheduled' AND next_run_at <= :now
ORDER BY next_run_at, job_id
LIMIT :limit

-- job_advance --
-- Count a run and move the job on, only from the state the fire read (returns a row when it moved).
UPDATE {jobs} SET
    runs = runs + 1, next_run_at = :next_run_at,
    state = CASE WHEN :next_run_at IS NULL THEN 'ended' ELSE 'scheduled' END,
    updated_at = :at
WHERE job_id = :job_id AND state = 'scheduled' AND runs = :runs AND next_run_at = :due_at
RETURNING job_id

-- job_run_record --
-- Record a run as a pending update row, as add records an update (an existing id stays).
INSERT INTO {table} (update_id, body, state, attempts, due_at, received_at, fingerprint,
                     chat_key)
VALUES (:update_id, :body, 'pending', 0, :at, :at, :fingerprint, :chat_key)
ON CONFLICT (update_id) DO NOTHING

-- jobs_list --
-- The jobs after an id, by id: the live ones (all with every), of a name when given.
SELECT job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs, keyed,
       state, created_at, options
FROM {jobs}
WHERE job_id > :after AND (:name IS NULL OR name = :name)
  AND (:every OR state IN ('scheduled', 'paused'))
ORDER BY job_id
LIMIT :limit

-- job_get --
-- One job by id.
SELECT job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs, keyed,
       state, created_at, options
FROM {jobs}
WHERE job_id = :job_id

-- job_run_now --
-- Make a live job scheduled and due at now (returns a row when it was live).
UPDATE {jobs} SET next_run_at = :at, state = 'scheduled', updated_at = :at
WHERE job_id = :job_id AND state IN ('scheduled', 'paused')
RETURNING job_id
