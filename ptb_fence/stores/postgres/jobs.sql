-- ptb_fence: the PostgreSQL statements on durable jobs (the declared part jobs).
--
-- A job is live while scheduled or paused. A keyed job is one live row per name: the partial
-- unique index on name decides, so concurrent declarations of one name leave one job (the
-- second waits for the first to commit, then updates its row). A fire moves a job on only
-- from the state it was read in (runs and next_run_at). A second fire of the same run waits
-- for the first's row lock, then finds the job moved and records nothing.

-- job_insert --
-- Add a job (ended when it has no next run) and return it.
INSERT INTO {jobs} (name, callback, data, chat_id, user_id, schedule, next_run_at, runs,
                    keyed, state, created_at, updated_at, options)
VALUES (%(name)s, %(callback)s, %(data)s, %(chat_id)s, %(user_id)s, %(schedule)s,
        %(next_run_at)s, 0, %(keyed)s,
        CASE WHEN %(next_run_at)s::BIGINT IS NULL THEN 'ended' ELSE 'scheduled' END,
        %(at)s, %(at)s, %(options)s)
RETURNING job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs, keyed,
          state, created_at, options

-- job_declare --
-- Declare a keyed job: add it, or update the live job of its name, keeping its next run unless the schedule changed.
INSERT INTO {jobs} AS j (name, callback, data, chat_id, user_id, schedule, next_run_at, runs,
                         keyed, state, created_at, updated_at, options)
VALUES (%(name)s, %(callback)s, %(data)s, %(chat_id)s, %(user_id)s, %(schedule)s,
        %(next_run_at)s, 0, TRUE, 'scheduled', %(at)s, %(at)s, %(options)s)
ON CONFLICT (name) WHERE keyed AND state IN ('scheduled', 'paused') DO UPDATE SET
    callback = EXCLUDED.callback, data = EXCLUDED.data, chat_id = EXCLUDED.chat_id,
    user_id = EXCLUDED.user_id, options = EXCLUDED.options, updated_at = EXCLUDED.updated_at,
    next_run_at = CASE WHEN j.schedule = EXCLUDED.schedule THEN j.next_run_at
                       ELSE EXCLUDED.next_run_at END,
    schedule = EXCLUDED.schedule
RETURNING job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs, keyed,
          state, created_at, options

-- job_declare_ended --
-- Declare a keyed job without a next run: a changed schedule ends the live job of its name, none adds it ended.
WITH live AS (
    UPDATE {jobs} SET
        callback = %(callback)s, data = %(data)s, chat_id = %(chat_id)s, user_id = %(user_id)s,
        options = %(options)s, updated_at = %(at)s,
        next_run_at = CASE WHEN schedule = %(schedule)s THEN next_run_at ELSE NULL END,
        state = CASE WHEN schedule = %(schedule)s THEN state ELSE 'ended' END,
        schedule = %(schedule)s
    WHERE name = %(name)s AND keyed AND state IN ('scheduled', 'paused')
    RETURNING job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs,
              keyed, state, created_at, options
), added AS (
    INSERT INTO {jobs} (name, callback, data, chat_id, user_id, schedule, next_run_at, runs,
                        keyed, state, created_at, updated_at, options)
    SELECT %(name)s, %(callback)s, %(data)s, %(chat_id)s::BIGINT, %(user_id)s::BIGINT,
           %(schedule)s, NULL, 0, TRUE, 'ended', %(at)s::BIGINT, %(at)s::BIGINT, %(options)s
    WHERE NOT EXISTS (SELECT 1 FROM live)
    RETURNING job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs,
              keyed, state, created_at, options
)
SELECT * FROM live UNION ALL SELECT * FROM added

-- job_cancel --
-- Cancel a live job (returns a row when it was live).
UPDATE {jobs} SET state = 'cancelled', next_run_at = NULL, updated_at = %(at)s
WHERE job_id = %(job_id)s AND state IN ('scheduled', 'paused')
RETURNING job_id

-- jobs_due --
-- The scheduled jobs due at now, the earliest first.
SELECT job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs, keyed,
       state, created_at, options
FROM {jobs}
WHERE state = 'scheduled' AND next_run_at <= %(now)s
ORDER BY next_run_at, job_id
LIMIT %(limit)s

-- job_fire --
-- Move a job on past one run, only from the state the fire read, and record the run as a pending update row as add_many does (one row: whether it moved).
WITH moved AS (
    UPDATE {jobs} SET
        runs = runs + 1, next_run_at = %(next_run_at)s,
        state = CASE WHEN %(next_run_at)s::BIGINT IS NULL THEN 'ended' ELSE 'scheduled' END,
        updated_at = %(at)s
    WHERE job_id = %(job_id)s AND state = 'scheduled' AND runs = %(runs)s
      AND next_run_at = %(due_at)s
    RETURNING job_id
), recorded AS (
    INSERT INTO {table} (update_id, body, state, attempts, due_at, received_at, fingerprint,
                         chat_key)
    SELECT %(update_id)s::BIGINT, %(body)s::TEXT, 'pending', 0, %(at)s::BIGINT,
           %(at)s::BIGINT, %(fingerprint)s::TEXT, %(chat_key)s::BIGINT
    FROM moved
    WHERE NOT %(skip)s
    ON CONFLICT (update_id) DO NOTHING
    RETURNING update_id
)
SELECT EXISTS (SELECT 1 FROM moved)

-- jobs_list --
-- The jobs after an id, by id: the live ones (all with every), of a name when given.
SELECT job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs, keyed,
       state, created_at, options
FROM {jobs}
WHERE job_id > %(after)s AND (%(name)s::TEXT IS NULL OR name = %(name)s)
  AND (%(every)s OR state IN ('scheduled', 'paused'))
ORDER BY job_id
LIMIT %(limit)s

-- job_get --
-- One job by id.
SELECT job_id, name, callback, data, chat_id, user_id, schedule, next_run_at, runs, keyed,
       state, created_at, options
FROM {jobs}
WHERE job_id = %(job_id)s

-- job_run_now --
-- Make a live job scheduled and due at now (returns a row when it was live).
UPDATE {jobs} SET next_run_at = %(at)s, state = 'scheduled', updated_at = %(at)s
WHERE job_id = %(job_id)s AND state IN ('scheduled', 'paused')
RETURNING job_id

-- jobs_exists --
-- Whether the jobs table exists (parameter jobs: its double-quoted name).
SELECT to_regclass(%(jobs)s) IS NOT NULL
