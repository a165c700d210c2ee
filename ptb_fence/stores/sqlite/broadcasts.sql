-- ptb_fence: the SQLite statements on broadcasts (the declared part broadcasts).
--
-- One row per broadcast, one row per recipient. A recipient is claimable when it is pending
-- and due, or sending under a lease that ended, and its broadcast is active. Claims and
-- settlements run under the write lock (BEGIN IMMEDIATE), so two senders never hold one
-- recipient.

-- create_broadcasts --
-- Create the broadcasts table: one row per broadcast, its call kept once.
CREATE TABLE IF NOT EXISTS {broadcasts} (
    broadcast_id INTEGER PRIMARY KEY AUTOINCREMENT,
    name         TEXT    NOT NULL UNIQUE,
    method       TEXT    NOT NULL,
    params       TEXT    NOT NULL,     -- a JSON object, without chat_id
    state        TEXT    NOT NULL,     -- active, paused, cancelled
    created_at   INTEGER NOT NULL
)

-- create_recipients --
-- Create the recipients table: one row per chat of a broadcast.
CREATE TABLE IF NOT EXISTS {recipients} (
    broadcast_id INTEGER NOT NULL,
    chat_id      INTEGER NOT NULL,
    state        TEXT    NOT NULL,     -- pending, sending, sent, failed, blocked, cancelled
    due_at       INTEGER NOT NULL,     -- pending: when due, sending: the lease, else: when settled
    tries        INT     NOT NULL DEFAULT 0,
    sender       TEXT,
    error        TEXT,
    PRIMARY KEY (broadcast_id, chat_id)
)

-- create_recipients_due_index --
-- The unsettled recipients by due time.
CREATE INDEX IF NOT EXISTS {recipients_due_idx} ON {recipients} (due_at)
WHERE state IN ('pending', 'sending')

-- broadcasts_exists --
-- Whether the broadcasts tables exist (parameter recipients: the recipients table's name).
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :recipients

-- broadcast_start --
-- Start a broadcast, unless one of its name exists.
INSERT INTO {broadcasts} (name, method, params, state, created_at)
VALUES (:name, :method, :params, 'active', :at)
ON CONFLICT (name) DO NOTHING

-- broadcast_add_recipients --
-- Add recipients (parameter chats: a JSON array of chat ids), leaving those there alone.
INSERT INTO {recipients} (broadcast_id, chat_id, state, due_at)
SELECT :broadcast_id, CAST(value AS INTEGER), 'pending', :at FROM json_each(:chats) WHERE true
ON CONFLICT (broadcast_id, chat_id) DO NOTHING

-- broadcast_add_named --
-- Add recipients to the broadcast of a name, only while its call is the one given.
INSERT INTO {recipients} (broadcast_id, chat_id, state, due_at)
SELECT b.broadcast_id, CAST(c.value AS INTEGER), 'pending', :at
FROM {broadcasts} AS b, json_each(:chats) AS c
WHERE b.name = :name AND b.method = :method AND b.params = :params
ON CONFLICT (broadcast_id, chat_id) DO NOTHING

-- broadcast_claim --
-- Claim the recipients to send to now, by broadcast and chat id, for a sender under a lease.
UPDATE {recipients}
SET state = 'sending', due_at = :lease_until, tries = tries + 1, sender = :sender
WHERE (broadcast_id, chat_id) IN (
    SELECT r.broadcast_id, r.chat_id FROM {recipients} AS r
    JOIN {broadcasts} AS b ON b.broadcast_id = r.broadcast_id AND b.state = 'active'
    WHERE r.state IN ('pending', 'sending') AND r.due_at <= :now
      AND (r.state = 'pending' OR r.due_at < :now)
    ORDER BY r.broadcast_id, r.chat_id
    LIMIT :limit
)
RETURNING broadcast_id, chat_id, tries

-- broadcast_calls --
-- The method and parameters of some broadcasts (parameter ids: a JSON array of ids).
SELECT broadcast_id, method, params FROM {broadcasts}
WHERE broadcast_id IN (SELECT value FROM json_each(:ids))

-- broadcast_settle --
-- Record a recipient's outcome, if its sender still holds it.
UPDATE {recipients} SET state = :state, due_at = :due_at, error = :error, sender = NULL
WHERE broadcast_id = :broadcast_id AND chat_id = :chat_id AND state = 'sending'
  AND sender = :sender
RETURNING chat_id

-- broadcast_set_state --
-- Set a broadcast's state, unless it was cancelled.
UPDATE {broadcasts} SET state = :state WHERE name = :name AND state <> 'cancelled'

-- broadcast_cancel_pending --
-- Leave out the pending recipients of a cancelled broadcast.
UPDATE {recipients} SET state = 'cancelled', due_at = :at
WHERE state = 'pending'
  AND broadcast_id = (SELECT broadcast_id FROM {broadcasts} WHERE name = :name AND state = 'cancelled')

-- broadcast_list --
-- The broadcasts by id, each with its recipients counted per state (parameter name: one, or NULL for all).
SELECT b.broadcast_id, b.name, b.method, b.params, b.state, b.created_at,
       COALESCE(SUM(r.state = 'pending'), 0), COALESCE(SUM(r.state = 'sending'), 0),
       COALESCE(SUM(r.state = 'sent'), 0), COALESCE(SUM(r.state = 'failed'), 0),
       COALESCE(SUM(r.state = 'blocked'), 0), COALESCE(SUM(r.state = 'cancelled'), 0)
FROM {broadcasts} AS b LEFT JOIN {recipients} AS r ON r.broadcast_id = b.broadcast_id
WHERE :name IS NULL OR b.name = :name
GROUP BY b.broadcast_id ORDER BY b.broadcast_id

-- broadcast_prune_recipients --
-- Delete the recipients of the broadcasts started before a time that nobody is sent to any more.
DELETE FROM {recipients} WHERE broadcast_id IN (
    SELECT b.broadcast_id FROM {broadcasts} AS b WHERE b.created_at < :before
      AND NOT EXISTS (SELECT 1 FROM {recipients} AS r WHERE r.broadcast_id = b.broadcast_id
                      AND r.state IN ('pending', 'sending')))

-- broadcast_prune --
-- Delete the broadcasts started before a time that have no recipient left.
DELETE FROM {broadcasts} WHERE created_at < :before
  AND NOT EXISTS (SELECT 1 FROM {recipients} AS r WHERE r.broadcast_id = {broadcasts}.broadcast_id)
