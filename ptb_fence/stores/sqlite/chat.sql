-- ptb_fence: the SQLite statements of strict chat order (BatchStore).
--
-- A row is in turn at now when no other row of its chat (same chat_key) is unsettled
-- (pending, processing, failed) with a smaller update_id, and none is processing with a live
-- lease (due_at >= now). A row without chat_key always is. The predicate runs on the partial
-- index of the unsettled rows (chat_key, update_id), so it reads only one chat's waiting rows.

-- record_chat_key --
-- Record the chat key of the row an insert just landed (inside that insert's transaction).
UPDATE {table} SET chat_key = :chat_key WHERE update_id = :update_id

-- claim_in_chat_order --
-- claim_owned, in the same one UPDATE, only when the row is its chat's turn at now.
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
  AND ({table}.chat_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {table} AS o
        WHERE o.chat_key = {table}.chat_key AND o.state IN ('pending', 'processing', 'failed')
          AND o.update_id <> {table}.update_id
          AND (o.update_id < {table}.update_id
               OR (o.state = 'processing' AND o.due_at >= :now))))
  AND (state = 'pending'
       OR (state = 'failed' AND due_at <= :now)
       OR (state = 'processing' AND due_at < :now))
RETURNING state, attempts, claim_id,
          CASE WHEN isolated_claim IS NULL THEN 0
               WHEN isolated_claim IN ('', '~') THEN 1 ELSE 2 END

-- due_in_chat_order --
-- due, listing only the rows that are their chat's turn at now.
SELECT r.update_id, r.body FROM {table} AS r
WHERE ((r.state = 'pending' AND (r.received_at <= :pending_before
                                 OR r.claim_id IS NOT NULL))
        OR (r.state = 'failed' AND r.due_at <= :now)
        OR (r.state = 'processing' AND r.due_at < :now))
  AND (r.chat_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {table} AS o
        WHERE o.chat_key = r.chat_key AND o.state IN ('pending', 'processing', 'failed')
          AND o.update_id <> r.update_id
          AND (o.update_id < r.update_id
               OR (o.state = 'processing' AND o.due_at >= :now))))
ORDER BY r.update_id
LIMIT :limit

-- due_of_chat --
-- due_in_chat_order for one chat.
SELECT r.update_id, r.body FROM {table} AS r
WHERE r.chat_key = :chat_key AND r.state IN ('pending', 'processing', 'failed')
  AND ((r.state = 'pending' AND (r.received_at <= :pending_before
                                 OR r.claim_id IS NOT NULL))
        OR (r.state = 'failed' AND r.due_at <= :now)
        OR (r.state = 'processing' AND r.due_at < :now))
  AND (r.chat_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {table} AS o
        WHERE o.chat_key = r.chat_key AND o.state IN ('pending', 'processing', 'failed')
          AND o.update_id <> r.update_id
          AND (o.update_id < r.update_id
               OR (o.state = 'processing' AND o.due_at >= :now))))
ORDER BY r.update_id
LIMIT :limit

-- unkeyed_in_chats --
-- Unsettled rows recorded without a chat key, by id, read on the partial chat index.
SELECT update_id, body FROM {table}
WHERE chat_key IS NULL AND state IN ('pending', 'processing', 'failed') AND update_id > :after
ORDER BY update_id
LIMIT :limit

-- set_chat_key --
-- Record the chat key of an unsettled row that has none and holds exactly this body.
UPDATE {table} SET chat_key = :chat_key
WHERE update_id = :update_id AND chat_key IS NULL AND state IN ('pending', 'processing', 'failed')
  AND body = :body
