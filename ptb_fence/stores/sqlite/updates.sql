-- ptb_fence: the SQLite statements on an update table (sqlite3 :name parameters).
--
-- Every rule of the store contract is ONE conditional statement on one row: the WHERE clause
-- is the rule's precondition, and RETURNING reads back what the statement wrote, so there is
-- never a read-then-write window between checking a row and changing it. Claimable at now:
-- pending, failed with due_at <= now, or processing with due_at < now (a lease is held while
-- due_at >= t, inclusive). A take (attempts < max_attempts) makes the row processing with the
-- next attempt, the lease, the fresh claim id and the claiming instance. A spend abandons it,
-- settled now. With durable it is an unacknowledged exhaustion, keeping its last claim id. SET
-- expressions see the row as it was. Batches are one JSON array parameter (json_each), so
-- their text does not depend on their size. Their WHERE clauses write +t.state: the planner
-- then finds each row of a batch by its update_id, not every row of that state through the
-- (state, due_at) index with the whole batch scanned for each.
--
-- A row's suspicion read back by a claim: 0 (isolated_claim NULL: never held by a process
-- that died), 1 ('' given back, or '~' probation over: its handler starts on probation), 2
-- (anything else: '*' suspect again, or a claim id: its handler runs alone).

-- add --
-- Insert one pending row (due_at = received_at), replacing a settled row that holds a different update.
-- An existing id: a different update (another fingerprint) replaces a settled row (completed,
-- or abandoned with settled_at set) exactly like a fresh insert. The same update, a row
-- without a fingerprint, or a live row stays as it is.
INSERT INTO {table} (update_id, body, state, attempts, due_at, received_at, fingerprint)
VALUES (:update_id, :body, 'pending', 0, :received_at, :received_at, :fingerprint)
ON CONFLICT (update_id) DO UPDATE SET
    body = excluded.body, state = excluded.state, attempts = excluded.attempts,
    due_at = excluded.due_at, received_at = excluded.received_at,
    settled_at = NULL, error = NULL, claim_id = excluded.claim_id,
    fingerprint = excluded.fingerprint, instance = excluded.instance,
    chat_key = NULL, isolated_claim = NULL
WHERE ({table}.state = 'completed'
       OR ({table}.state = 'abandoned' AND {table}.settled_at IS NOT NULL))
  AND {table}.fingerprint IS NOT NULL AND {table}.fingerprint <> excluded.fingerprint

-- stored_fingerprint --
-- Read only when an insert did not happen: is it a different update (WARNING)?
SELECT fingerprint, state, settled_at FROM {table} WHERE update_id = :update_id

-- add_claimed --
-- Record a fresh update already claimed for attempt 1 (the receiving process's fast path), leaving an existing id alone unless replaced as by add.
INSERT INTO {table} (update_id, body, state, attempts, due_at, received_at, claim_id,
                     fingerprint, instance)
VALUES (:update_id, :body, 'processing', 1, :lease_until, :received_at, :claim_id,
        :fingerprint, :instance)
ON CONFLICT (update_id) DO UPDATE SET
    body = excluded.body, state = excluded.state, attempts = excluded.attempts,
    due_at = excluded.due_at, received_at = excluded.received_at,
    settled_at = NULL, error = NULL, claim_id = excluded.claim_id,
    fingerprint = excluded.fingerprint, instance = excluded.instance,
    chat_key = NULL, isolated_claim = NULL
WHERE ({table}.state = 'completed'
       OR ({table}.state = 'abandoned' AND {table}.settled_at IS NOT NULL))
  AND {table}.fingerprint IS NOT NULL AND {table}.fingerprint <> excluded.fingerprint
RETURNING attempts, claim_id

-- claim_owned --
-- Take one row for a new attempt with a fresh claim id (or spend it), read back its suspicion.
UPDATE {table} SET
    state = CASE WHEN attempts < :max_attempts THEN 'processing' ELSE 'abandoned' END,
    attempts = CASE WHEN attempts < :max_attempts THEN attempts + 1 ELSE attempts END,
    due_at = CASE WHEN attempts < :max_attempts THEN :lease_until ELSE :now END,
    error = CASE WHEN attempts < :max_attempts THEN NULL ELSE 'attempts spent' END,
    settled_at = CASE WHEN attempts < :max_attempts THEN settled_at
                      WHEN :durable THEN NULL
                      ELSE :now END,
    claim_id = CASE WHEN attempts < :max_attempts THEN :claim_id
                    WHEN :durable THEN COALESCE(claim_id, :claim_id)
                    ELSE claim_id END,
    instance = CASE WHEN attempts < :max_attempts THEN :instance ELSE NULL END
WHERE update_id = :update_id
  AND (state = 'pending'
       OR (state = 'failed' AND due_at <= :now)
       OR (state = 'processing' AND due_at < :now))
RETURNING state, attempts, claim_id,
          CASE WHEN isolated_claim IS NULL THEN 0
               WHEN isolated_claim IN ('', '~') THEN 1 ELSE 2 END

-- claim --
-- The base claim: claim_owned that also marks its take isolated at once.
-- Its attempt never runs alone (the runtime claims with claim_owned wherever it isolates): a
-- crash during it counts (take_over_dead), as it always did.
UPDATE {table} SET
    state = CASE WHEN attempts < :max_attempts THEN 'processing' ELSE 'abandoned' END,
    attempts = CASE WHEN attempts < :max_attempts THEN attempts + 1 ELSE attempts END,
    due_at = CASE WHEN attempts < :max_attempts THEN :lease_until ELSE :now END,
    error = CASE WHEN attempts < :max_attempts THEN NULL ELSE 'attempts spent' END,
    settled_at = CASE WHEN attempts < :max_attempts THEN settled_at
                      WHEN :durable THEN NULL
                      ELSE :now END,
    claim_id = CASE WHEN attempts < :max_attempts THEN :claim_id
                    WHEN :durable THEN COALESCE(claim_id, :claim_id)
                    ELSE claim_id END,
    instance = CASE WHEN attempts < :max_attempts THEN :instance ELSE NULL END,
    isolated_claim = CASE WHEN attempts < :max_attempts THEN :claim_id ELSE isolated_claim END
WHERE update_id = :update_id
  AND (state = 'pending'
       OR (state = 'failed' AND due_at <= :now)
       OR (state = 'processing' AND due_at < :now))
RETURNING state, attempts, claim_id,
          CASE WHEN isolated_claim IS NULL THEN 0
               WHEN isolated_claim IN ('', '~') THEN 1 ELSE 2 END

-- claim_many --
-- claim_owned for the distinct ids of a JSON array, each take a fresh random claim id.
-- The rows are found by their ids (primary key: "+state" keeps the planner off the state index).
UPDATE {table} SET
    state = CASE WHEN attempts < :max_attempts THEN 'processing' ELSE 'abandoned' END,
    attempts = CASE WHEN attempts < :max_attempts THEN attempts + 1 ELSE attempts END,
    due_at = CASE WHEN attempts < :max_attempts THEN :lease_until ELSE :now END,
    error = CASE WHEN attempts < :max_attempts THEN NULL ELSE 'attempts spent' END,
    settled_at = CASE WHEN attempts < :max_attempts THEN settled_at
                      WHEN :durable THEN NULL
                      ELSE :now END,
    claim_id = CASE WHEN attempts < :max_attempts THEN lower(hex(randomblob(16)))
                    WHEN :durable THEN COALESCE(claim_id, lower(hex(randomblob(16))))
                    ELSE claim_id END,
    instance = CASE WHEN attempts < :max_attempts THEN :instance ELSE NULL END
WHERE update_id IN (SELECT value FROM json_each(:ids))
  AND (+state = 'pending'
       OR (+state = 'failed' AND due_at <= :now)
       OR (+state = 'processing' AND due_at < :now))
RETURNING update_id, state, attempts, claim_id,
          CASE WHEN isolated_claim IS NULL THEN 0
               WHEN isolated_claim IN ('', '~') THEN 1 ELSE 2 END

-- renew --
-- Extend a lease: never shortens one and, with now, never revives an expired one.
UPDATE {table} SET due_at = MAX(COALESCE(due_at, :lease_until), :lease_until)
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt
  AND (:now IS NULL OR due_at >= :now)
RETURNING update_id

-- renew_owned --
-- renew, and the claim id must match.
UPDATE {table} SET due_at = MAX(COALESCE(due_at, :lease_until), :lease_until)
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt
  AND claim_id = :claim_id
  AND (:now IS NULL OR due_at >= :now)
RETURNING update_id

-- renew_many --
-- renew for the [update_id, attempt] pairs of a JSON array, returning those that matched.
UPDATE {table} AS t
SET due_at = MAX(COALESCE(t.due_at, :lease_until), :lease_until)
FROM (SELECT json_extract(value, '$[0]') AS update_id, json_extract(value, '$[1]') AS attempt
      FROM json_each(:leases)) AS v
WHERE t.update_id = v.update_id AND t.attempts = v.attempt
  AND +t.state = 'processing' AND t.due_at >= :now
RETURNING update_id, attempts

-- renew_owned_many --
-- renew_owned for the [update_id, attempt, claim_id] triples of a JSON array, returning those that matched.
UPDATE {table} AS t
SET due_at = MAX(COALESCE(t.due_at, :lease_until), :lease_until)
FROM (SELECT json_extract(value, '$[0]') AS update_id, json_extract(value, '$[1]') AS attempt,
             json_extract(value, '$[2]') AS claim_id
      FROM json_each(:identities)) AS v
WHERE t.update_id = v.update_id AND t.attempts = v.attempt AND t.claim_id = v.claim_id
  AND +t.state = 'processing' AND t.due_at >= :now
RETURNING update_id, attempts, claim_id

-- settle_completed --
-- Complete the attempt whose lease holds at the settlement's time.
UPDATE {table} SET state = 'completed', settled_at = :at, error = NULL
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt AND due_at >= :at
RETURNING update_id

-- settle_failed --
-- Fail the attempt whose lease holds at the settlement's time, due again at retry_at.
UPDATE {table} SET state = 'failed', due_at = :retry_at, settled_at = NULL, error = :error
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt AND due_at >= :at
RETURNING update_id

-- settle_abandoned --
-- Abandon the attempt whose lease holds at the settlement's time.
UPDATE {table} SET state = 'abandoned', settled_at = :at, error = :error
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt AND due_at >= :at
RETURNING update_id

-- settle_completed_owned --
-- settle_completed, and the claim id must match.
UPDATE {table} SET state = 'completed', settled_at = :at, error = NULL
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt AND due_at >= :at
  AND claim_id = :claim_id
RETURNING update_id

-- settle_failed_owned --
-- settle_failed, and the claim id must match.
UPDATE {table} SET state = 'failed', due_at = :retry_at, settled_at = NULL, error = :error
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt AND due_at >= :at
  AND claim_id = :claim_id
RETURNING update_id

-- settle_abandoned_owned --
-- settle_abandoned, and the claim id must match.
UPDATE {table} SET state = 'abandoned', settled_at = :at, error = :error
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt AND due_at >= :at
  AND claim_id = :claim_id
RETURNING update_id

-- complete_owned_many --
-- Complete the distinct fenced attempts of a JSON array of [update_id, attempt, claim_id, at], returning those that matched.
UPDATE {table} AS t
SET state = 'completed', settled_at = v.at, error = NULL
FROM (SELECT json_extract(value, '$[0]') AS update_id, json_extract(value, '$[1]') AS attempt,
             json_extract(value, '$[2]') AS claim_id, json_extract(value, '$[3]') AS at
      FROM json_each(:completions)) AS v
WHERE t.update_id = v.update_id AND +t.state = 'processing'
  AND t.attempts = v.attempt AND t.due_at >= v.at AND t.claim_id = v.claim_id
RETURNING update_id, attempts, claim_id

-- due --
-- Rows to claim: pending after the grace period, released (a claim id: add never writes one) at once, failed and due, lapsed leases.
SELECT update_id, body FROM {table}
WHERE (state = 'pending' AND (received_at <= :pending_before OR claim_id IS NOT NULL))
   OR (state = 'failed' AND due_at <= :now)
   OR (state = 'processing' AND due_at < :now)
ORDER BY update_id
LIMIT :limit

-- prune --
-- Delete settled history before a time (unacknowledged exhaustions, settled_at NULL, stay).
DELETE FROM {table}
WHERE state IN ('completed', 'abandoned') AND settled_at < :before

-- owns --
-- Whether the fenced claim is live at a time.
SELECT 1 FROM {table}
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt AND due_at >= :at
  AND claim_id = :claim_id

-- reopen_completed --
-- Undo a completion that the caller's own commit landed by mistake (complete_owned).
UPDATE {table} SET state = 'processing', settled_at = NULL
WHERE update_id = :update_id AND state = 'completed' AND attempts = :attempt
  AND claim_id = :claim_id AND settled_at = :at
RETURNING update_id

-- write_lock --
-- Changes nothing, but takes the database's write lock inside the caller's transaction.
UPDATE {table} SET state = state WHERE 0

-- exhaust --
-- Abandon a live fenced claim as an unacknowledged exhaustion.
UPDATE {table} SET state = 'abandoned', due_at = :at, settled_at = NULL, error = :error
WHERE update_id = :update_id AND state = 'processing' AND attempts = :attempt AND due_at >= :at
  AND claim_id = :claim_id
RETURNING update_id

-- due_exhaustions --
-- The unacknowledged exhaustions after an id, by id.
SELECT update_id, attempts, claim_id, body, due_at, error FROM {table}
WHERE state = 'abandoned' AND settled_at IS NULL
  AND (:after IS NULL OR update_id > :after)
ORDER BY update_id
LIMIT :limit

-- acknowledge_exhaustion --
-- Settle an exhaustion once its handler was told.
UPDATE {table} SET settled_at = :at
WHERE update_id = :update_id AND state = 'abandoned' AND settled_at IS NULL
  AND attempts = :attempt AND claim_id = :claim_id
RETURNING update_id

-- figures --
-- What waits in the table, one SELECT on the indexes: unsettled rows, exhaustions, the chat held longest.
-- Of the chats with two or more unsettled rows, the one whose oldest unsettled row is the
-- oldest (ties: the smaller chat key).
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
