-- ptb_fence: the PostgreSQL statements on an update table (psycopg2 %(name)s parameters).
--
-- Every rule is one conditional statement on one row. The WHERE clause is the rule.
-- Claimable at now: pending, failed with due_at <= now, or processing with due_at < now (a
-- lease is held while due_at >= t). Live at t: processing, same attempt (and same claim id
-- when fenced), due_at >= t. A take (attempts < max_attempts) makes the row processing with
-- the next attempt and the lease. A spend abandons it, settled now. With durable it is an
-- unacknowledged exhaustion instead (settled_at NULL), keeping its last claim id. SET
-- expressions see the row as it was. RETURNING sees it as it is now.
--
-- The seed's legacy table (no claim_id, fingerprint, instance, isolated_claim nor chat_key)
-- runs the statements whose names end in _legacy, and those that mention none of these
-- columns. Every other statement fails there with undefined_column, which the store turns
-- into SchemaError naming the migration.
--
-- A row's suspicion read back by a claim: 0 (isolated_claim NULL: never held by a process
-- that died), 1 ('' given back, or '~' probation over: its handler starts on probation), 2
-- (anything else: '*' suspect again, or a claim id: its handler runs alone).

-- add --
-- Insert one pending row (due_at = received_at) unless the id exists.
INSERT INTO {table} (update_id, body, state, attempts, due_at, received_at)
VALUES (%(update_id)s, %(body)s, 'pending', 0, %(received_at)s, %(received_at)s)
ON CONFLICT (update_id) DO NOTHING
RETURNING update_id

-- add_many --
-- Insert pending rows (distinct ids), replacing a settled row that holds a different update.
-- An existing id: a different update (another fingerprint) replaces a settled row (completed,
-- or abandoned with settled_at set) exactly like a fresh insert. The same update, a row
-- without a fingerprint, or a live row is left alone (nothing returned).
INSERT INTO {table} AS t
       (update_id, body, state, attempts, due_at, received_at, fingerprint)
SELECT v.update_id, v.body, 'pending', 0, v.received_at, v.received_at, v.fingerprint
FROM unnest(%(update_ids)s::BIGINT[], %(bodies)s::TEXT[], %(received_ats)s::BIGINT[],
            %(fingerprints)s::TEXT[]) AS v(update_id, body, received_at, fingerprint)
ON CONFLICT (update_id) DO UPDATE SET
    body = EXCLUDED.body, state = EXCLUDED.state, attempts = EXCLUDED.attempts,
    due_at = EXCLUDED.due_at, received_at = EXCLUDED.received_at, settled_at = NULL,
    error = NULL, claim_id = EXCLUDED.claim_id, fingerprint = EXCLUDED.fingerprint
WHERE (t.state = 'completed' OR (t.state = 'abandoned' AND t.settled_at IS NOT NULL))
  AND t.fingerprint IS NOT NULL AND t.fingerprint <> EXCLUDED.fingerprint
RETURNING update_id

-- add_many_legacy --
-- Insert pending rows (distinct ids) into the legacy table: an existing id is left alone.
INSERT INTO {table} (update_id, body, state, attempts, due_at, received_at)
SELECT v.update_id, v.body, 'pending', 0, v.received_at, v.received_at
FROM unnest(%(update_ids)s::BIGINT[], %(bodies)s::TEXT[], %(received_ats)s::BIGINT[])
     AS v(update_id, body, received_at)
ON CONFLICT (update_id) DO NOTHING
RETURNING update_id

-- add_claimed --
-- Record fresh updates already claimed for attempt 1 by the instance, replacing settled rows as add_many does.
INSERT INTO {table} AS t
       (update_id, body, state, attempts, due_at, received_at, claim_id, fingerprint, instance)
SELECT v.update_id, v.body, 'processing', 1, %(lease_until)s::BIGINT, v.received_at,
       v.claim_id, v.fingerprint, %(instance)s::TEXT
FROM unnest(%(update_ids)s::BIGINT[], %(bodies)s::TEXT[], %(received_ats)s::BIGINT[],
            %(claim_ids)s::TEXT[], %(fingerprints)s::TEXT[])
     AS v(update_id, body, received_at, claim_id, fingerprint)
ON CONFLICT (update_id) DO UPDATE SET
    body = EXCLUDED.body, state = EXCLUDED.state, attempts = EXCLUDED.attempts,
    due_at = EXCLUDED.due_at, received_at = EXCLUDED.received_at, settled_at = NULL,
    error = NULL, claim_id = EXCLUDED.claim_id, fingerprint = EXCLUDED.fingerprint,
    instance = EXCLUDED.instance
WHERE (t.state = 'completed' OR (t.state = 'abandoned' AND t.settled_at IS NOT NULL))
  AND t.fingerprint IS NOT NULL AND t.fingerprint <> EXCLUDED.fingerprint
RETURNING update_id, attempts, claim_id

-- conflicts --
-- The stored rows of ids not inserted that hold a different update (for the WARNING).
SELECT t.update_id, t.fingerprint, t.state, t.settled_at, v.fingerprint
FROM unnest(%(update_ids)s::BIGINT[], %(fingerprints)s::TEXT[]) AS v(update_id, fingerprint)
JOIN {table} AS t ON t.update_id = v.update_id
WHERE t.fingerprint IS NOT NULL AND t.fingerprint <> v.fingerprint

-- claim_legacy --
-- The base claim on the legacy table: take or spend, claim_id untouched.
UPDATE {table} SET
    state      = CASE WHEN attempts < %(max_attempts)s THEN 'processing' ELSE 'abandoned' END,
    attempts   = CASE WHEN attempts < %(max_attempts)s THEN attempts + 1 ELSE attempts END,
    due_at     = CASE WHEN attempts < %(max_attempts)s THEN %(lease_until)s ELSE %(now)s END,
    error      = CASE WHEN attempts < %(max_attempts)s THEN NULL ELSE 'attempts spent' END,
    settled_at = CASE WHEN attempts < %(max_attempts)s THEN settled_at ELSE %(now)s END
WHERE update_id = %(update_id)s
  AND (state = 'pending'
       OR (state = 'failed' AND due_at <= %(now)s)
       OR (state = 'processing' AND due_at < %(now)s))
RETURNING state, attempts

-- claim --
-- The base claim: take or spend, claim_id untouched, the instance recorded and the take marked isolated.
-- Its attempt never runs alone (the runtime claims with claim_owned wherever it isolates), so
-- the take is marked isolated at once and a crash during it counts as it always did (claim id
-- NULL, a claim that never wrote one: isolated_claim NULL matches it).
UPDATE {table} SET
    state      = CASE WHEN attempts < %(max_attempts)s THEN 'processing' ELSE 'abandoned' END,
    attempts   = CASE WHEN attempts < %(max_attempts)s THEN attempts + 1 ELSE attempts END,
    due_at     = CASE WHEN attempts < %(max_attempts)s THEN %(lease_until)s ELSE %(now)s END,
    error      = CASE WHEN attempts < %(max_attempts)s THEN NULL ELSE 'attempts spent' END,
    settled_at = CASE WHEN attempts < %(max_attempts)s THEN settled_at ELSE %(now)s END,
    instance   = CASE WHEN attempts < %(max_attempts)s THEN %(instance)s::TEXT ELSE NULL END,
    isolated_claim = CASE WHEN attempts < %(max_attempts)s THEN claim_id ELSE isolated_claim END
WHERE update_id = %(update_id)s
  AND (state = 'pending'
       OR (state = 'failed' AND due_at <= %(now)s)
       OR (state = 'processing' AND due_at < %(now)s))
RETURNING state, attempts

-- claim_durable --
-- The base claim with durable_exhaustion: as claim_owned, the take marked isolated, no suspicion read back.
UPDATE {table} SET
    state      = CASE WHEN attempts < %(max_attempts)s THEN 'processing' ELSE 'abandoned' END,
    attempts   = CASE WHEN attempts < %(max_attempts)s THEN attempts + 1 ELSE attempts END,
    due_at     = CASE WHEN attempts < %(max_attempts)s THEN %(lease_until)s ELSE %(now)s END,
    error      = CASE WHEN attempts < %(max_attempts)s THEN NULL ELSE 'attempts spent' END,
    settled_at = CASE WHEN attempts < %(max_attempts)s THEN settled_at
                      WHEN %(durable)s THEN NULL
                      ELSE %(now)s END,
    claim_id   = CASE WHEN attempts < %(max_attempts)s THEN %(claim_id)s
                      WHEN %(durable)s THEN COALESCE(claim_id, %(claim_id)s)
                      ELSE claim_id END,
    instance   = CASE WHEN attempts < %(max_attempts)s THEN %(instance)s::TEXT ELSE NULL END,
    isolated_claim = CASE WHEN attempts < %(max_attempts)s THEN %(claim_id)s::TEXT
                          ELSE isolated_claim END
WHERE update_id = %(update_id)s
  AND (state = 'pending'
       OR (state = 'failed' AND due_at <= %(now)s)
       OR (state = 'processing' AND due_at < %(now)s))
RETURNING state, attempts, claim_id

-- claim_owned --
-- Take one row for a new attempt with a fresh claim id (or spend it), read back its suspicion.
-- A take writes the fresh claim id. A durable spend keeps the last claim id, or writes the
-- fresh one if there is none. It leaves settled_at NULL: an unacknowledged exhaustion.
UPDATE {table} SET
    state      = CASE WHEN attempts < %(max_attempts)s THEN 'processing' ELSE 'abandoned' END,
    attempts   = CASE WHEN attempts < %(max_attempts)s THEN attempts + 1 ELSE attempts END,
    due_at     = CASE WHEN attempts < %(max_attempts)s THEN %(lease_until)s ELSE %(now)s END,
    error      = CASE WHEN attempts < %(max_attempts)s THEN NULL ELSE 'attempts spent' END,
    settled_at = CASE WHEN attempts < %(max_attempts)s THEN settled_at
                      WHEN %(durable)s THEN NULL
                      ELSE %(now)s END,
    claim_id   = CASE WHEN attempts < %(max_attempts)s THEN %(claim_id)s
                      WHEN %(durable)s THEN COALESCE(claim_id, %(claim_id)s)
                      ELSE claim_id END,
    instance   = CASE WHEN attempts < %(max_attempts)s THEN %(instance)s::TEXT ELSE NULL END
WHERE update_id = %(update_id)s
  AND (state = 'pending'
       OR (state = 'failed' AND due_at <= %(now)s)
       OR (state = 'processing' AND due_at < %(now)s))
RETURNING state, attempts, claim_id,
          CASE WHEN isolated_claim IS NULL THEN 0
               WHEN isolated_claim IN ('', '~') THEN 1 ELSE 2 END

-- claim_many --
-- claim_owned for the distinct ids of update_ids with the fresh claim_ids, the rows locked in update_id order.
-- Locking in one order means two calls over overlapping ids never deadlock. Returns every
-- row it changed (state abandoned: spent, not taken) with its suspicion.
WITH v(update_id, new_claim_id) AS (
    SELECT * FROM unnest(%(update_ids)s::BIGINT[], %(claim_ids)s::TEXT[])
),
locked AS MATERIALIZED (
    SELECT r.update_id FROM {table} AS r JOIN v ON r.update_id = v.update_id
    WHERE (state = 'pending'
       OR (state = 'failed' AND due_at <= %(now)s)
       OR (state = 'processing' AND due_at < %(now)s))
    ORDER BY r.update_id
    FOR UPDATE OF r
)
UPDATE {table} AS t SET
    state      = CASE WHEN attempts < %(max_attempts)s THEN 'processing' ELSE 'abandoned' END,
    attempts   = CASE WHEN attempts < %(max_attempts)s THEN attempts + 1 ELSE attempts END,
    due_at     = CASE WHEN attempts < %(max_attempts)s THEN %(lease_until)s::BIGINT
                      ELSE %(now)s::BIGINT END,
    error      = CASE WHEN attempts < %(max_attempts)s THEN NULL ELSE 'attempts spent' END,
    settled_at = CASE WHEN attempts < %(max_attempts)s THEN settled_at
                      WHEN %(durable)s THEN NULL
                      ELSE %(now)s::BIGINT END,
    claim_id   = CASE WHEN attempts < %(max_attempts)s THEN v.new_claim_id
                      WHEN %(durable)s THEN COALESCE(claim_id, v.new_claim_id)
                      ELSE claim_id END,
    instance   = CASE WHEN attempts < %(max_attempts)s THEN %(instance)s::TEXT ELSE NULL END
FROM locked JOIN v ON v.update_id = locked.update_id
WHERE t.update_id = locked.update_id AND (state = 'pending'
       OR (state = 'failed' AND due_at <= %(now)s)
       OR (state = 'processing' AND due_at < %(now)s))
RETURNING t.update_id, t.state, t.attempts, t.claim_id,
          CASE WHEN t.isolated_claim IS NULL THEN 0
               WHEN t.isolated_claim IN ('', '~') THEN 1 ELSE 2 END

-- renew --
-- Extend a lease: never shortens one and, with now, never revives an expired one.
UPDATE {table} SET due_at = GREATEST(due_at, %(lease_until)s)
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND (%(now)s::BIGINT IS NULL OR due_at >= %(now)s)
RETURNING update_id

-- renew_owned --
-- renew, and the claim id must match.
UPDATE {table} SET due_at = GREATEST(due_at, %(lease_until)s)
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s
  AND (%(now)s::BIGINT IS NULL OR due_at >= %(now)s)
RETURNING update_id

-- renew_many --
-- Renew (position, update_id, attempt) leases in one statement, never waiting on a row lock.
-- A handler's fenced transaction holds its row FOR UPDATE for as long as it is open, and one
-- waiting statement would stop the renewals of every other attempt of the process. lockable
-- locks the candidate rows SKIP LOCKED. renewed extends exactly those. A renewed position
-- gives true. For the others a plain read of the statement's snapshot tells whether the row
-- still matches with an unexpired lease. Then it was only locked right now (undecided, NULL
-- to the caller). Otherwise the renewal is refused (false).
WITH v(pos, update_id, attempt) AS (
    SELECT * FROM unnest(%(positions)s::INT[], %(update_ids)s::BIGINT[], %(attempts)s::INT[])
),
lockable AS (
    SELECT t.update_id FROM {table} AS t JOIN v ON t.update_id = v.update_id
    WHERE t.state = 'processing' AND t.attempts = v.attempt AND t.due_at >= %(now)s
    FOR UPDATE OF t SKIP LOCKED
),
renewed AS (
    UPDATE {table} AS t SET due_at = GREATEST(t.due_at, %(lease_until)s)
    FROM lockable AS l
    WHERE t.update_id = l.update_id
    RETURNING t.update_id, t.attempts
)
SELECT v.pos,
       EXISTS (SELECT 1 FROM renewed AS r
                WHERE r.update_id = v.update_id AND r.attempts = v.attempt),
       EXISTS (SELECT 1 FROM {table} AS c
                WHERE c.update_id = v.update_id AND c.state = 'processing'
                  AND c.attempts = v.attempt AND c.due_at >= %(now)s)
FROM v ORDER BY v.pos

-- renew_owned_many --
-- renew_many for (position, update_id, attempt, claim_id) fenced leases.
WITH v(pos, update_id, attempt, claim_id) AS (
    SELECT * FROM unnest(%(positions)s::INT[], %(update_ids)s::BIGINT[], %(attempts)s::INT[],
                         %(claim_ids)s::TEXT[])
),
lockable AS (
    SELECT t.update_id FROM {table} AS t JOIN v ON t.update_id = v.update_id
    WHERE t.state = 'processing' AND t.attempts = v.attempt AND t.claim_id = v.claim_id
      AND t.due_at >= %(now)s
    FOR UPDATE OF t SKIP LOCKED
),
renewed AS (
    UPDATE {table} AS t SET due_at = GREATEST(t.due_at, %(lease_until)s)
    FROM lockable AS l
    WHERE t.update_id = l.update_id
    RETURNING t.update_id, t.attempts, t.claim_id
)
SELECT v.pos,
       EXISTS (SELECT 1 FROM renewed AS r
                WHERE r.update_id = v.update_id AND r.attempts = v.attempt
                  AND r.claim_id = v.claim_id),
       EXISTS (SELECT 1 FROM {table} AS c
                WHERE c.update_id = v.update_id AND c.state = 'processing'
                  AND c.attempts = v.attempt AND c.claim_id = v.claim_id AND c.due_at >= %(now)s)
FROM v ORDER BY v.pos

-- settle_completed --
-- Complete the attempt whose lease holds at the settlement's time.
UPDATE {table} SET state = 'completed', settled_at = %(at)s, error = NULL
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND due_at >= %(at)s
RETURNING update_id

-- settle_failed --
-- Fail the attempt whose lease holds at the settlement's time, due again at retry_at.
UPDATE {table} SET state = 'failed', due_at = %(retry_at)s, settled_at = NULL, error = %(error)s
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND due_at >= %(at)s
RETURNING update_id

-- settle_abandoned --
-- Abandon the attempt whose lease holds at the settlement's time.
UPDATE {table} SET state = 'abandoned', settled_at = %(at)s, error = %(error)s
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND due_at >= %(at)s
RETURNING update_id

-- settle_completed_owned --
-- settle_completed, and the claim id must match.
UPDATE {table} SET state = 'completed', settled_at = %(at)s, error = NULL
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND due_at >= %(at)s
RETURNING update_id

-- settle_failed_owned --
-- settle_failed, and the claim id must match.
UPDATE {table} SET state = 'failed', due_at = %(retry_at)s, settled_at = NULL, error = %(error)s
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND due_at >= %(at)s
RETURNING update_id

-- settle_abandoned_owned --
-- settle_abandoned, and the claim id must match.
UPDATE {table} SET state = 'abandoned', settled_at = %(at)s, error = %(error)s
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND due_at >= %(at)s
RETURNING update_id

-- complete_owned_many --
-- Complete the fenced attempts of the parallel arrays in one statement, returning those that matched.
UPDATE {table} AS t SET state = 'completed', settled_at = v.at, error = NULL
FROM unnest(%(update_ids)s::BIGINT[], %(attempts)s::INT[], %(claim_ids)s::TEXT[],
            %(ats)s::BIGINT[]) AS v(update_id, attempt, claim_id, at)
WHERE t.update_id = v.update_id AND t.state = 'processing' AND t.attempts = v.attempt
  AND t.claim_id = v.claim_id AND t.due_at >= v.at
RETURNING t.update_id, t.attempts, t.claim_id

-- complete_owned_writing --
-- complete_owned_many and the state writes of the completions that match, in one statement.
-- One round trip instead of three: the store thread waits for the GIL after every one. The
-- writes (w_ arrays) land only with their attempt's completion, and only on the version they
-- read. Version 0 means the row was absent, and it is inserted unless it is there now.
-- Returns per matched completion (update_id, attempts, claim_id, how many writes landed).
WITH done AS (
    UPDATE {table} AS t SET state = 'completed', settled_at = v.at, error = NULL
    FROM unnest(%(update_ids)s::BIGINT[], %(attempts)s::INT[], %(claim_ids)s::TEXT[],
                %(ats)s::BIGINT[]) AS v(update_id, attempt, claim_id, at)
    WHERE t.update_id = v.update_id AND t.state = 'processing' AND t.attempts = v.attempt
      AND t.claim_id = v.claim_id AND t.due_at >= v.at
    RETURNING t.update_id, t.attempts, t.claim_id
), w AS (
    SELECT w.kind, w.name, w.key, w.value, w.at, w.version
    FROM unnest(%(w_update_ids)s::BIGINT[], %(w_attempts)s::INT[], %(w_claim_ids)s::TEXT[],
                %(w_kinds)s::TEXT[], %(w_names)s::TEXT[], %(w_keys)s::TEXT[],
                %(w_values)s::TEXT[], %(w_ats)s::BIGINT[], %(w_versions)s::BIGINT[])
         AS w(update_id, attempt, claim_id, kind, name, key, value, at, version)
    JOIN done AS d ON d.update_id = w.update_id AND d.attempts = w.attempt
      AND d.claim_id = w.claim_id
), inserted AS (
    INSERT INTO {state} (kind, name, key, value, version, updated_at)
    SELECT kind, name, key, value, 1, at FROM w WHERE version = 0
    ON CONFLICT (kind, name, key) DO NOTHING
    RETURNING 1
), updated AS (
    UPDATE {state} AS s SET value = w.value, version = s.version + 1, updated_at = w.at
    FROM w WHERE w.version <> 0 AND s.kind = w.kind AND s.name = w.name AND s.key = w.key
      AND s.version = w.version
    RETURNING 1
)
SELECT d.update_id, d.attempts, d.claim_id,
       (SELECT count(*) FROM inserted) + (SELECT count(*) FROM updated)
FROM done AS d

-- due_legacy --
-- Rows to claim on the legacy table: pending after the grace period, failed and due, lapsed leases.
SELECT update_id, body FROM {table}
WHERE (state = 'pending' AND received_at <= %(pending_before)s)
   OR (state = 'failed' AND due_at <= %(now)s)
   OR (state = 'processing' AND due_at < %(now)s)
ORDER BY update_id
LIMIT %(limit)s

-- due --
-- Rows to claim: as due_legacy, and released rows (pending with a claim id: add never writes one) at once.
SELECT update_id, body FROM {table}
WHERE (state = 'pending' AND (received_at <= %(pending_before)s OR claim_id IS NOT NULL))
   OR (state = 'failed' AND due_at <= %(now)s)
   OR (state = 'processing' AND due_at < %(now)s)
ORDER BY update_id
LIMIT %(limit)s

-- prune --
-- Delete settled history before a time (unacknowledged exhaustions, settled_at NULL, stay).
DELETE FROM {table}
WHERE state IN ('completed', 'abandoned') AND settled_at < %(before)s

-- owns --
-- Whether the fenced claim is live at a time.
SELECT update_id FROM {table}
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND due_at >= %(at)s

-- owns_for_update --
-- owns on the caller's connection, the row locked so that a competing claim waits for the caller's transaction.
SELECT update_id FROM {table}
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND due_at >= %(at)s
FOR UPDATE

-- reopen_completed --
-- Undo a completion that the caller's own commit landed by mistake (complete_owned).
UPDATE {table} SET state = 'processing', settled_at = NULL
WHERE update_id = %(update_id)s AND state = 'completed' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND settled_at = %(at)s
RETURNING update_id

-- exhaust --
-- Abandon a live fenced claim as an unacknowledged exhaustion.
UPDATE {table} SET state = 'abandoned', due_at = %(at)s, settled_at = NULL, error = %(error)s
WHERE update_id = %(update_id)s AND state = 'processing' AND attempts = %(attempt)s
  AND claim_id = %(claim_id)s AND due_at >= %(at)s
RETURNING update_id

-- due_exhaustions --
-- The unacknowledged exhaustions after an id, by id.
SELECT update_id, attempts, claim_id, body, due_at, error FROM {table}
WHERE state = 'abandoned' AND settled_at IS NULL AND claim_id IS NOT NULL
  AND (%(after_update_id)s::BIGINT IS NULL OR update_id > %(after_update_id)s)
ORDER BY update_id
LIMIT %(limit)s

-- acknowledge_exhaustion --
-- Settle an exhaustion once its handler was told.
UPDATE {table} SET settled_at = %(at)s
WHERE update_id = %(update_id)s AND state = 'abandoned' AND settled_at IS NULL
  AND attempts = %(attempt)s AND claim_id = %(claim_id)s
RETURNING update_id

-- figures --
-- What waits in the table, one read-only SELECT on the indexes: unsettled rows, exhaustions, the chat held longest.
-- Of the chats with two or more unsettled rows, the one whose oldest unsettled row is the
-- oldest (ties: the smaller chat key).
SET TRANSACTION READ ONLY;
SELECT u.n, u.oldest, e.n, e.oldest, h.chat_key, h.since
FROM (
    SELECT COUNT(*) AS n, MIN(received_at) AS oldest FROM {table}
    WHERE state IN ('pending', 'processing', 'failed')
) AS u
CROSS JOIN (
    SELECT COUNT(*) AS n, MIN(due_at) AS oldest FROM {table}
    WHERE state = 'abandoned' AND settled_at IS NULL
) AS e
LEFT JOIN (
    SELECT chat_key, MIN(received_at) AS since FROM {table}
    WHERE chat_key IS NOT NULL AND state IN ('pending', 'processing', 'failed')
    GROUP BY chat_key
    HAVING COUNT(*) >= 2
    ORDER BY since, chat_key
    LIMIT 1
) AS h ON 1 = 1

-- figures_legacy --
-- figures on the legacy table, which has no chat key (no held chat).
SET TRANSACTION READ ONLY;
SELECT u.n, u.oldest, e.n, e.oldest, CAST(NULL AS BIGINT), CAST(NULL AS BIGINT)
FROM (
    SELECT COUNT(*) AS n, MIN(received_at) AS oldest FROM {table}
    WHERE state IN ('pending', 'processing', 'failed')
) AS u
CROSS JOIN (
    SELECT COUNT(*) AS n, MIN(due_at) AS oldest FROM {table}
    WHERE state = 'abandoned' AND settled_at IS NULL
) AS e
