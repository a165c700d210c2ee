-- ptb_fence: the SQLite statements of the chaos runner's own tables (ptb_fence/chaos):
-- the handlers' domain writes, the handler-run log, the workers' events, the exhaustions
-- delivered and the claim log written by triggers on the run's update table.

-- chaos_create_domain --
-- The handlers' fenced domain writes: no unique key, so a double write shows up as a second row.
CREATE TABLE IF NOT EXISTS {domain} (update_id INTEGER NOT NULL, attempt INTEGER NOT NULL,
    claim_id TEXT NOT NULL, pid INTEGER NOT NULL, path TEXT NOT NULL, written_at INTEGER NOT NULL)

-- chaos_create_domain_index --
-- The domain writes by update.
CREATE INDEX IF NOT EXISTS {domain_index} ON {domain} (update_id)

-- chaos_create_runs --
-- The handler-run log, one row per run (written before the handler does anything else).
CREATE TABLE IF NOT EXISTS {runs} (update_id INTEGER NOT NULL, attempt INTEGER NOT NULL,
    claim_id TEXT NOT NULL, pid INTEGER NOT NULL, started_at INTEGER NOT NULL)

-- chaos_create_events --
-- What the workers report (fenced_out, skip, tx_error, exhaustion_failed).
CREATE TABLE IF NOT EXISTS {events} (kind TEXT NOT NULL, update_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL, claim_id TEXT NOT NULL, pid INTEGER NOT NULL, at INTEGER NOT NULL,
    detail TEXT)

-- chaos_create_exhaustions --
-- One row per exhaustion delivered to handle_exhaustion.
CREATE TABLE IF NOT EXISTS {exhaustions} (update_id INTEGER NOT NULL, attempt INTEGER NOT NULL,
    claim_id TEXT NOT NULL, error TEXT, pid INTEGER NOT NULL, delivered_at INTEGER NOT NULL)

-- chaos_create_claims --
-- Every claim of the update table, written by a trigger in the claim's own transaction.
CREATE TABLE IF NOT EXISTS {claims} (update_id INTEGER NOT NULL, attempt INTEGER NOT NULL,
    claim_id TEXT NOT NULL, due_at INTEGER NOT NULL)

-- chaos_claim_log_update_trigger --
-- Log a row that becomes processing with a new claim id.
CREATE TRIGGER IF NOT EXISTS {claims_update_trigger} AFTER UPDATE OF claim_id ON {updates}
WHEN NEW.claim_id IS NOT OLD.claim_id AND NEW.state = 'processing'
BEGIN INSERT INTO {claims} (update_id, attempt, claim_id, due_at)
VALUES (NEW.update_id, NEW.attempts, NEW.claim_id, NEW.due_at); END

-- chaos_claim_log_insert_trigger --
-- Log a row inserted as processing (claimed at ingest).
CREATE TRIGGER IF NOT EXISTS {claims_insert_trigger} AFTER INSERT ON {updates}
WHEN NEW.state = 'processing'
BEGIN INSERT INTO {claims} (update_id, attempt, claim_id, due_at)
VALUES (NEW.update_id, NEW.attempts, NEW.claim_id, NEW.due_at); END

-- chaos_drop_domain --
-- Drop a table of the run.
DROP TABLE IF EXISTS {domain}

-- chaos_drop_runs --
-- Drop a table of the run.
DROP TABLE IF EXISTS {runs}

-- chaos_drop_events --
-- Drop a table of the run.
DROP TABLE IF EXISTS {events}

-- chaos_drop_exhaustions --
-- Drop a table of the run.
DROP TABLE IF EXISTS {exhaustions}

-- chaos_drop_claims --
-- Drop a table of the run.
DROP TABLE IF EXISTS {claims}

-- chaos_drop_updates --
-- Drop the run's update table.
DROP TABLE IF EXISTS {updates}

-- chaos_drop_outbox --
-- Drop the outbox the update store made beside its table.
DROP TABLE IF EXISTS {outbox}

-- chaos_drop_state --
-- Drop the state table the update store made beside its table.
DROP TABLE IF EXISTS {state}

-- chaos_drop_steps --
-- Drop the steps table the update store made beside its table.
DROP TABLE IF EXISTS {steps}

-- chaos_drop_jobs --
-- Drop the jobs table the update store made beside its table.
DROP TABLE IF EXISTS {jobs}

-- chaos_drop_pace --
-- Drop the pace table the update store made beside its table.
DROP TABLE IF EXISTS {pace}

-- chaos_drop_broadcasts --
-- Drop the broadcasts table the update store made beside its table.
DROP TABLE IF EXISTS {broadcasts}

-- chaos_drop_recipients --
-- Drop the recipients table the update store made beside its table.
DROP TABLE IF EXISTS {recipients}

-- chaos_insert_run --
-- Log one handler run (the handler's first write).
INSERT INTO {runs} (update_id, attempt, claim_id, pid, started_at)
VALUES (:update_id, :attempt, :claim_id, :pid, :started_at)

-- chaos_insert_domain --
-- Write one domain row (the handler's fenced write).
INSERT INTO {domain} (update_id, attempt, claim_id, pid, path, written_at)
VALUES (:update_id, :attempt, :claim_id, :pid, :path, :written_at)

-- chaos_count_domain --
-- How many domain rows one update has (an idempotent plain-transaction write checks first).
SELECT count(*) FROM {domain} WHERE update_id = :update_id

-- chaos_insert_event --
-- Record what a worker reports (fenced_out, skip, tx_error, exhaustion_failed).
INSERT INTO {events} (kind, update_id, attempt, claim_id, pid, at, detail)
VALUES (:kind, :update_id, :attempt, :claim_id, :pid, :at, :detail)

-- chaos_insert_exhaustion --
-- Record one exhaustion delivered to handle_exhaustion.
INSERT INTO {exhaustions} (update_id, attempt, claim_id, error, pid, delivered_at)
VALUES (:update_id, :attempt, :claim_id, :error, :pid, :delivered_at)

-- chaos_latest_run_pid --
-- The worker that started a handler most recently.
SELECT pid FROM {runs} ORDER BY started_at DESC LIMIT 1

-- chaos_domain_writes --
-- Every domain write (a double write is a second row of its update).
SELECT update_id, attempt, claim_id FROM {domain}

-- chaos_runs --
-- The attempts whose handler started.
SELECT DISTINCT update_id, attempt, claim_id FROM {runs}

-- chaos_exhaustions --
-- The attempts whose exhaustion was delivered.
SELECT DISTINCT update_id, attempt, claim_id FROM {exhaustions}

-- chaos_claims --
-- Every claim of the update table with its lease's end.
SELECT update_id, attempt, claim_id, due_at FROM {claims}

-- chaos_events --
-- Every event the workers reported.
SELECT kind, update_id, attempt, claim_id FROM {events}
