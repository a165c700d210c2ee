-- ptb_fence: the PostgreSQL statements on broadcasts (the declared part broadcasts).
--
-- One row per broadcast, one row per recipient. A recipient is claimable when it is pending
-- and due, or sending under a lease that ended, and its broadcast is active. A claim locks
-- the rows it takes FOR UPDATE SKIP LOCKED, so concurrent senders take different recipients
-- and never wait on each other.

-- broadcasts_exists --
-- Whether the recipients table exists (parameter recipients: its double-quoted name).
SELECT to_regclass(%(recipients)s) IS NOT NULL

-- broadcast_start --
-- Start a broadcast, unless one of its name exists.
INSERT INTO {broadcasts} (name, method, params, state, created_at)
VALUES (%(name)s, %(method)s, %(params)s, 'active', %(at)s)
ON CONFLICT (name) DO NOTHING

-- broadcast_add_recipients --
-- Add recipients (parameter chats: a bigint array), leaving those there alone.
INSERT INTO {recipients} (broadcast_id, chat_id, state, due_at)
SELECT %(broadcast_id)s, c, 'pending', %(at)s FROM unnest(%(chats)s::BIGINT[]) AS c
ON CONFLICT (broadcast_id, chat_id) DO NOTHING

-- broadcast_add_named --
-- Add recipients to the broadcast of a name, only while its call is the one given.
INSERT INTO {recipients} (broadcast_id, chat_id, state, due_at)
SELECT b.broadcast_id, c, 'pending', %(at)s
FROM {broadcasts} AS b, unnest(%(chats)s::BIGINT[]) AS c
WHERE b.name = %(name)s AND b.method = %(method)s AND b.params = %(params)s
ON CONFLICT (broadcast_id, chat_id) DO NOTHING

-- broadcast_claim --
-- Claim the recipients to send to now, by broadcast and chat id, for a sender under a lease.
WITH taken AS (
    SELECT r.broadcast_id, r.chat_id FROM {recipients} AS r
    JOIN {broadcasts} AS b ON b.broadcast_id = r.broadcast_id AND b.state = 'active'
    WHERE r.state IN ('pending', 'sending') AND r.due_at <= %(now)s
      AND (r.state = 'pending' OR r.due_at < %(now)s)
    ORDER BY r.broadcast_id, r.chat_id
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE {recipients} AS r
SET state = 'sending', due_at = %(lease_until)s, tries = r.tries + 1, sender = %(sender)s
FROM taken WHERE r.broadcast_id = taken.broadcast_id AND r.chat_id = taken.chat_id
RETURNING r.broadcast_id, r.chat_id, r.tries

-- broadcast_calls --
-- The method and parameters of some broadcasts (parameter ids: a bigint array).
SELECT broadcast_id, method, params FROM {broadcasts} WHERE broadcast_id = ANY(%(ids)s::BIGINT[])

-- broadcast_settle --
-- Record outcomes of recipients their sender still holds (parameters: arrays of one length).
UPDATE {recipients} AS r
SET state = v.state, due_at = v.due_at, error = v.error, sender = NULL
FROM unnest(%(ids)s::BIGINT[], %(chats)s::BIGINT[], %(states)s::TEXT[], %(dues)s::BIGINT[],
            %(errors)s::TEXT[]) AS v(broadcast_id, chat_id, state, due_at, error)
WHERE r.broadcast_id = v.broadcast_id AND r.chat_id = v.chat_id AND r.state = 'sending'
  AND r.sender = %(sender)s
RETURNING r.broadcast_id, r.chat_id

-- broadcast_set_state --
-- Set a broadcast's state, unless it was cancelled.
UPDATE {broadcasts} SET state = %(state)s WHERE name = %(name)s AND state <> 'cancelled'

-- broadcast_cancel_pending --
-- Leave out the pending recipients of a cancelled broadcast.
UPDATE {recipients} SET state = 'cancelled', due_at = %(at)s
WHERE state = 'pending'
  AND broadcast_id = (SELECT broadcast_id FROM {broadcasts} WHERE name = %(name)s AND state = 'cancelled')

-- broadcast_list --
-- The broadcasts by id, each with its recipients counted per state (parameter name: one, or NULL for all).
SELECT b.broadcast_id, b.name, b.method, b.params, b.state, b.created_at,
       count(*) FILTER (WHERE r.state = 'pending'), count(*) FILTER (WHERE r.state = 'sending'),
       count(*) FILTER (WHERE r.state = 'sent'), count(*) FILTER (WHERE r.state = 'failed'),
       count(*) FILTER (WHERE r.state = 'blocked'), count(*) FILTER (WHERE r.state = 'cancelled')
FROM {broadcasts} AS b LEFT JOIN {recipients} AS r ON r.broadcast_id = b.broadcast_id
WHERE %(name)s::TEXT IS NULL OR b.name = %(name)s
GROUP BY b.broadcast_id ORDER BY b.broadcast_id

-- broadcast_prune --
-- Delete the broadcasts started before a time that nobody is sent to any more, with their recipients.
WITH done AS (
    DELETE FROM {broadcasts} AS b WHERE b.created_at < %(before)s
      AND NOT EXISTS (SELECT 1 FROM {recipients} AS r WHERE r.broadcast_id = b.broadcast_id
                      AND r.state IN ('pending', 'sending'))
    RETURNING b.broadcast_id
)
DELETE FROM {recipients} WHERE broadcast_id IN (SELECT broadcast_id FROM done)
