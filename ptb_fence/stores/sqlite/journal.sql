-- ptb_fence: the statements of the sent journal, a database file of its own next to the
-- store's (<database>.sent) that records every Bot API call answered at once, whatever
-- transaction holds the store's write lock, until the record lands in the outbox.

-- journal_create --
-- Create the journal's table.
CREATE TABLE IF NOT EXISTS sent (
    outbox  TEXT    NOT NULL,  -- the outbox table of the call
    call_id INTEGER NOT NULL,
    sender  TEXT    NOT NULL,  -- the sender token that sent it
    result  TEXT    NOT NULL,  -- the Bot API's result, JSON
    at      INTEGER NOT NULL,  -- epoch ms of the answer
    PRIMARY KEY (outbox, call_id)
)

-- journal_note --
-- Journal one answered call.
INSERT OR REPLACE INTO sent (outbox, call_id, sender, result, at)
VALUES (:outbox, :call_id, :sender, :result, :at)

-- journal_read --
-- Every call journaled for an outbox and not forgotten.
SELECT call_id, sender, result, at FROM sent WHERE outbox = :outbox

-- journal_forget --
-- Forget a call whose record landed in the database.
DELETE FROM sent WHERE outbox = :outbox AND call_id = :call_id

-- outbox_sending --
-- Of the call ids of a JSON array, those still sending in the store's outbox, with their sender.
SELECT call_id, sender FROM {outbox}
WHERE state = 'sending' AND call_id IN (SELECT value FROM json_each(:call_ids))
