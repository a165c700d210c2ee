-- ptb_fence: the PostgreSQL statements of strict chat order (BatchStore).
--
-- A row is in turn at now when no other row of its chat (same chat_key) is unsettled
-- (pending, processing, failed) with a smaller update_id, and none is processing with a live
-- lease (due_at >= now). A row without chat_key always is. The predicate is part of the one
-- statement that claims or lists, and runs on the partial index of the unsettled rows
-- (chat_key, update_id), so it reads only the waiting rows of one chat.

-- add_many_in_chats --
-- add_many recording each row's chat key (a settled row replaced takes the new key).
INSERT INTO {table} AS t
       (update_id, body, state, attempts, due_at, received_at, fingerprint, chat_key)
SELECT v.update_id, v.body, 'pending', 0, v.received_at, v.received_at, v.fingerprint,
       v.chat_key
FROM unnest(%(update_ids)s::BIGINT[], %(bodies)s::TEXT[], %(received_ats)s::BIGINT[],
            %(fingerprints)s::TEXT[], %(chat_keys)s::BIGINT[])
     AS v(update_id, body, received_at, fingerprint, chat_key)
ON CONFLICT (update_id) DO UPDATE SET
    body = EXCLUDED.body, state = EXCLUDED.state, attempts = EXCLUDED.attempts,
    due_at = EXCLUDED.due_at, received_at = EXCLUDED.received_at, settled_at = NULL,
    error = NULL, claim_id = EXCLUDED.claim_id, fingerprint = EXCLUDED.fingerprint,
    chat_key = EXCLUDED.chat_key
WHERE (t.state = 'completed' OR (t.state = 'abandoned' AND t.settled_at IS NOT NULL))
  AND t.fingerprint IS NOT NULL AND t.fingerprint <> EXCLUDED.fingerprint
RETURNING update_id

-- claim_in_chat_order --
-- claim_owned, in the same one UPDATE, only when the row is its chat's turn at now.
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
  AND ({table}.chat_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {table} AS o
        WHERE o.chat_key = {table}.chat_key AND o.state IN ('pending', 'processing', 'failed')
          AND o.update_id <> {table}.update_id
          AND (o.update_id < {table}.update_id
               OR (o.state = 'processing' AND o.due_at >= %(now)s))))
  AND (state = 'pending'
       OR (state = 'failed' AND due_at <= %(now)s)
       OR (state = 'processing' AND due_at < %(now)s))
RETURNING state, attempts, claim_id,
          CASE WHEN isolated_claim IS NULL THEN 0
               WHEN isolated_claim IN ('', '~') THEN 1 ELSE 2 END

-- due_in_chat_order --
-- due, listing only the rows that are their chat's turn at now.
SELECT r.update_id, r.body FROM {table} AS r
WHERE ((r.state = 'pending' AND (r.received_at <= %(pending_before)s
                                 OR r.claim_id IS NOT NULL))
        OR (r.state = 'failed' AND r.due_at <= %(now)s)
        OR (r.state = 'processing' AND r.due_at < %(now)s))
  AND (r.chat_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {table} AS o
        WHERE o.chat_key = r.chat_key AND o.state IN ('pending', 'processing', 'failed')
          AND o.update_id <> r.update_id
          AND (o.update_id < r.update_id
               OR (o.state = 'processing' AND o.due_at >= %(now)s))))
ORDER BY r.update_id
LIMIT %(limit)s

-- due_of_chat --
-- due_in_chat_order for one chat.
SELECT r.update_id, r.body FROM {table} AS r
WHERE r.chat_key = %(chat_key)s AND r.state IN ('pending', 'processing', 'failed')
  AND ((r.state = 'pending' AND (r.received_at <= %(pending_before)s
                                 OR r.claim_id IS NOT NULL))
        OR (r.state = 'failed' AND r.due_at <= %(now)s)
        OR (r.state = 'processing' AND r.due_at < %(now)s))
  AND (r.chat_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {table} AS o
        WHERE o.chat_key = r.chat_key AND o.state IN ('pending', 'processing', 'failed')
          AND o.update_id <> r.update_id
          AND (o.update_id < r.update_id
               OR (o.state = 'processing' AND o.due_at >= %(now)s))))
ORDER BY r.update_id
LIMIT %(limit)s

-- unkeyed_in_chats --
-- Unsettled rows recorded without a chat key, by id, read on the partial chat index.
SELECT update_id, body FROM {table}
WHERE chat_key IS NULL AND state IN ('pending', 'processing', 'failed') AND update_id > %(after)s
ORDER BY update_id
LIMIT %(limit)s

-- set_chat_key --
-- Record the chat key of an unsettled row that has none and holds exactly this body.
UPDATE {table} SET chat_key = %(chat_key)s
WHERE update_id = %(update_id)s AND chat_key IS NULL AND state IN ('pending', 'processing', 'failed')
  AND body = %(body)s
