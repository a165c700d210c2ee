-- ptb_fence: the SQLite statements on the outbox, the Bot API calls an attempt queued.
--
-- Claimable at now: pending with due_at <= now, or sending with due_at < now. In turn in its
-- chat: no other call of the chat pending or sending with a smaller call_id, and none sending
-- under a live lease. A call without a chat key always is. A sender's writes (sent, retry,
-- fail, release) need state sending and its token. The claim is one statement, run under the
-- write lock (BEGIN IMMEDIATE).

-- outbox_claim --
-- Claim the calls to send now, in call_id order, for a sender under a lease.
UPDATE {outbox}
SET state = 'sending', due_at = :lease_until, tries = tries + 1, sender = :sender
WHERE call_id IN (
    SELECT c.call_id FROM {outbox} AS c
    WHERE ((c.state = 'pending' AND c.due_at <= :now)
           OR (c.state = 'sending' AND c.due_at < :now))
      AND (c.chat_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {outbox} AS e
            WHERE e.chat_key = c.chat_key AND e.state IN ('pending', 'sending')
              AND e.call_id <> c.call_id
              AND (e.call_id < c.call_id OR (e.state = 'sending' AND e.due_at >= :now))))
    ORDER BY c.call_id
    LIMIT :limit
)
RETURNING call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
          state, tries, due_at, created_at, sent_at, error, result, acknowledged

-- outbox_insert --
-- Queue one call, claimed at once by its sender when asked and its chat has no call pending or sending.
-- The chat's earlier calls (this transaction's earlier inserts included) keep it, in call_id
-- order, as outbox_claim would.
INSERT INTO {outbox} (update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
                      state, tries, due_at, created_at, sender, acknowledged)
SELECT :update_id, :attempt, :claim_id, :seq, CAST(:chat_key AS INTEGER), :method, :params,
       :at_most_once,
       CASE WHEN t.go THEN 'sending' ELSE 'pending' END,
       CASE WHEN t.go THEN 1 ELSE 0 END,
       CASE WHEN t.go THEN :lease_until ELSE :at END,
       :at,
       CASE WHEN t.go THEN :sender ELSE NULL END,
       FALSE
FROM (SELECT (:claim AND (
            CAST(:chat_key AS INTEGER) IS NULL OR NOT EXISTS (
                SELECT 1 FROM {outbox} AS e
                WHERE e.chat_key = :chat_key AND e.state IN ('pending', 'sending')))) AS go) AS t
RETURNING call_id, state

-- outbox_claimed --
-- The calls a sender holds, by call_id.
SELECT call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
       state, tries, due_at, created_at, sent_at, error, result, acknowledged
FROM {outbox} WHERE state = 'sending' AND sender = :sender
ORDER BY call_id LIMIT :limit

-- outbox_record_sent --
-- Record a held call sent, with its result.
UPDATE {outbox} SET state = 'sent', sent_at = :at, result = :result
WHERE call_id = :call_id AND state = 'sending' AND sender = :sender RETURNING call_id

-- outbox_retry --
-- Put a held call back, due again at due_at.
UPDATE {outbox} SET state = 'pending', due_at = :due_at, error = :error, sender = NULL
WHERE call_id = :call_id AND state = 'sending' AND sender = :sender RETURNING call_id

-- outbox_fail --
-- Record a held call failed (unacknowledged).
UPDATE {outbox} SET state = 'failed', due_at = :at, error = :error, acknowledged = FALSE,
                    sent_at = NULL
WHERE call_id = :call_id AND state = 'sending' AND sender = :sender RETURNING call_id

-- outbox_release --
-- Give a held call back unsent (its try not counted).
UPDATE {outbox} SET state = 'pending', due_at = :at, tries = tries - 1, sender = NULL
WHERE call_id = :call_id AND state = 'sending' AND sender = :sender RETURNING call_id

-- outbox_due_failures --
-- The unacknowledged failures after a call id.
SELECT call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
       state, tries, due_at, created_at, sent_at, error, result, acknowledged
FROM {outbox}
WHERE state = 'failed' AND NOT acknowledged AND call_id > :after
ORDER BY call_id LIMIT :limit

-- outbox_acknowledge --
-- Acknowledge a failure (due_at becomes the time of the acknowledgement).
UPDATE {outbox} SET acknowledged = TRUE, due_at = :at
WHERE call_id = :call_id AND state = 'failed' AND NOT acknowledged RETURNING call_id

-- outbox_get --
-- One call by id.
SELECT call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
       state, tries, due_at, created_at, sent_at, error, result, acknowledged
FROM {outbox} WHERE call_id = :call_id

-- outbox_list_all --
-- The calls after a call id.
SELECT call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
       state, tries, due_at, created_at, sent_at, error, result, acknowledged
FROM {outbox} WHERE call_id > :after ORDER BY call_id LIMIT :limit

-- outbox_list_state --
-- The calls of one state after a call id.
SELECT call_id, update_id, attempt, claim_id, seq, chat_key, method, params, at_most_once,
       state, tries, due_at, created_at, sent_at, error, result, acknowledged
FROM {outbox} WHERE call_id > :after AND state = :state
ORDER BY call_id LIMIT :limit

-- outbox_counts --
-- How many calls per state and acknowledgement.
SELECT state, acknowledged, COUNT(*) FROM {outbox} GROUP BY state, acknowledged

-- outbox_retry_failed --
-- Send a failed call again.
UPDATE {outbox} SET state = 'pending', due_at = :at, acknowledged = FALSE, sender = NULL
WHERE call_id = :call_id AND state = 'failed' RETURNING call_id

-- outbox_drop --
-- Delete a call that is pending or failed.
DELETE FROM {outbox} WHERE call_id = :call_id AND state IN ('pending', 'failed')
RETURNING call_id

-- outbox_prune --
-- Delete the history before a time: sent calls, and acknowledged failures.
DELETE FROM {outbox}
WHERE (state = 'sent' AND sent_at < :before)
   OR (state = 'failed' AND acknowledged AND due_at < :before)

-- outbox_take_over --
-- The calls a dead instance's sender holds (token ending in @instance): their lease lapses now.
UPDATE {outbox} SET due_at = :now - 1
WHERE call_id IN (
    SELECT call_id FROM {outbox}
    WHERE state = 'sending' AND due_at >= :now - 1 AND sender LIKE :pattern ESCAPE '!'
)
RETURNING call_id

-- outbox_sent_by --
-- Whether a call is recorded sent by this sender (a fold of the sent journal may have recorded it).
SELECT 1 FROM {outbox} WHERE call_id = :call_id AND state = 'sent' AND sender = :sender
