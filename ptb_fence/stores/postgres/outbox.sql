-- ptb_fence: the PostgreSQL statements on the outbox, the Bot API calls an attempt queued.
--
-- Claimable at now: pending with due_at <= now, or sending with due_at < now (a sender's
-- lease is held while due_at >= now). In turn in its chat: no other call of the chat pending
-- or sending with a smaller call_id, and none sending under a live lease. A call without a
-- chat key always is. A sender's writes (sent, retry, fail, release) need state sending and
-- its token. The claim picks the rows FOR UPDATE SKIP LOCKED and updates them in the same
-- statement, so concurrent claimers never get one call twice.

-- outbox_claim --
-- Claim the calls to send now, in call_id order, for a sender under a lease.
WITH picked AS (
    SELECT c.call_id FROM {outbox} AS c
    WHERE ((c.state = 'pending' AND c.due_at <= %(now)s)
           OR (c.state = 'sending' AND c.due_at < %(now)s))
      AND (c.chat_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {outbox} AS e
            WHERE e.chat_key = c.chat_key AND e.state IN ('pending', 'sending')
              AND e.call_id <> c.call_id
              AND (e.call_id < c.call_id OR (e.state = 'sending' AND e.due_at >= %(now)s))))
    ORDER BY c.call_id
    LIMIT %(limit)s
    FOR UPDATE OF c SKIP LOCKED
)
UPDATE {outbox} AS u
SET state = 'sending', due_at = %(lease_until)s, tries = tries + 1, sender = %(sender)s
FROM picked WHERE u.call_id = picked.call_id
RETURNING u.call_id, u.update_id, u.attempt, u.claim_id, u.seq, u.chat_key, u.method,
          u.params, u.at_most_once, u.state, u.tries, u.due_at, u.created_at, u.sent_at,
          u.error, u.result, u.acknowledged

-- outbox_insert --
-- Queue one call, claimed at once by its sender when asked and its chat has no call pending or sending.
-- The chat's earlier calls (this transaction's earlier inserts included) keep it, in call_id
-- order, as outbox_claim would.
INSERT INTO {outbox} (update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
                      state, tries, due_at, created_at, sender, acknowledged)
SELECT %(update_id)s, %(attempt)s, %(claim_id)s, %(seq)s, CAST(%(chat_key)s AS BIGINT),
       %(method)s, %(params)s, %(at_most_once)s,
       CASE WHEN t.go THEN 'sending' ELSE 'pending' END,
       CASE WHEN t.go THEN 1 ELSE 0 END,
       CASE WHEN t.go THEN %(lease_until)s ELSE %(at)s END,
       %(at)s,
       CASE WHEN t.go THEN %(sender)s ELSE NULL END,
       FALSE
FROM (SELECT (CAST(%(claim)s AS BOOLEAN) AND (
            CAST(%(chat_key)s AS BIGINT) IS NULL OR NOT EXISTS (
                SELECT 1 FROM {outbox} AS e
                WHERE e.chat_key = %(chat_key)s AND e.state IN ('pending', 'sending')))) AS go) AS t
RETURNING call_id, state

-- outbox_lock_chat --
-- Serialise one chat's claimed inserts of concurrent transactions (parameter outbox: the outbox's name).
-- The second's NOT EXISTS then sees the first's committed call (READ COMMITTED).
SELECT pg_advisory_xact_lock(hashtext(%(outbox)s), hashint8(%(chat_key)s))

-- outbox_claimed --
-- The calls a sender holds, by call_id.
SELECT call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
       state, tries, due_at, created_at, sent_at, error, result, acknowledged
FROM {outbox} WHERE state = 'sending' AND sender = %(sender)s
ORDER BY call_id LIMIT %(limit)s

-- outbox_record_sent --
-- Record a held call sent, with its result.
UPDATE {outbox} SET state = 'sent', sent_at = %(at)s, result = %(result)s
WHERE call_id = %(call_id)s AND state = 'sending' AND sender = %(sender)s RETURNING call_id

-- outbox_retry --
-- Put a held call back, due again at due_at.
UPDATE {outbox} SET state = 'pending', due_at = %(due_at)s, error = %(error)s, sender = NULL
WHERE call_id = %(call_id)s AND state = 'sending' AND sender = %(sender)s RETURNING call_id

-- outbox_fail --
-- Record a held call failed (unacknowledged).
UPDATE {outbox} SET state = 'failed', due_at = %(at)s, error = %(error)s, acknowledged = FALSE,
                    sent_at = NULL
WHERE call_id = %(call_id)s AND state = 'sending' AND sender = %(sender)s RETURNING call_id

-- outbox_release --
-- Give a held call back unsent (its try not counted).
UPDATE {outbox} SET state = 'pending', due_at = %(at)s, tries = tries - 1, sender = NULL
WHERE call_id = %(call_id)s AND state = 'sending' AND sender = %(sender)s RETURNING call_id

-- outbox_due_failures --
-- The unacknowledged failures after a call id.
SELECT call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
       state, tries, due_at, created_at, sent_at, error, result, acknowledged
FROM {outbox}
WHERE state = 'failed' AND NOT acknowledged AND call_id > %(after)s
ORDER BY call_id LIMIT %(limit)s

-- outbox_acknowledge --
-- Acknowledge a failure (due_at becomes the time of the acknowledgement).
UPDATE {outbox} SET acknowledged = TRUE, due_at = %(at)s
WHERE call_id = %(call_id)s AND state = 'failed' AND NOT acknowledged RETURNING call_id

-- outbox_get --
-- One call by id.
SELECT call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
       state, tries, due_at, created_at, sent_at, error, result, acknowledged
FROM {outbox} WHERE call_id = %(call_id)s

-- outbox_list_all --
-- The calls after a call id.
SELECT call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
       state, tries, due_at, created_at, sent_at, error, result, acknowledged
FROM {outbox} WHERE call_id > %(after)s ORDER BY call_id LIMIT %(limit)s

-- outbox_list_state --
-- The calls of one state after a call id.
SELECT call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
       state, tries, due_at, created_at, sent_at, error, result, acknowledged
FROM {outbox} WHERE call_id > %(after)s AND state = %(state)s
ORDER BY call_id LIMIT %(limit)s

-- outbox_counts --
-- How many calls per state and acknowledgement.
SELECT state, acknowledged, COUNT(*) FROM {outbox} GROUP BY state, acknowledged

-- outbox_retry_failed --
-- Send a failed call again.
UPDATE {outbox} SET state = 'pending', due_at = %(at)s, acknowledged = FALSE, sender = NULL
WHERE call_id = %(call_id)s AND state = 'failed' RETURNING call_id

-- outbox_drop --
-- Delete a call that is pending or failed.
DELETE FROM {outbox} WHERE call_id = %(call_id)s AND state IN ('pending', 'failed')
RETURNING call_id

-- outbox_prune --
-- Delete the history before a time: sent calls, and acknowledged failures.
DELETE FROM {outbox}
WHERE (state = 'sent' AND sent_at < %(before)s)
   OR (state = 'failed' AND acknowledged AND due_at < %(before)s)

-- outbox_take_over --
-- The calls a dead instance's sender holds (token ending in @instance): their lease lapses now.
-- A row another session still locks is skipped (the next takeover check, or its lease, takes it).
UPDATE {outbox} SET due_at = %(now)s - 1
WHERE call_id IN (
    SELECT call_id FROM {outbox}
    WHERE state = 'sending' AND due_at >= %(now)s - 1 AND sender LIKE %(pattern)s ESCAPE '!'
    FOR UPDATE SKIP LOCKED
)
RETURNING call_id

-- outbox_exists --
-- Whether the outbox table exists (parameter outbox: its double-quoted name).
SELECT to_regclass(%(outbox)s) IS NOT NULL
