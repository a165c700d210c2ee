-- ptb_fence: the statements of `python -m ptb_fence demo` (ptb_fence/_demo.py): its bots'
-- domain table, the ledger of bookings, and its report read from the store's own tables.

-- demo_create_ledger --
-- The ledger of bookings, one row per fenced write (no unique key: a double write shows).
CREATE TABLE {ledger} (update_id INTEGER NOT NULL, chat_id INTEGER, attempt INTEGER,
    claim_id TEXT, pid INTEGER)

-- demo_book --
-- A booking, written in the attempt's fenced transaction.
INSERT INTO {ledger} (update_id, chat_id, attempt, claim_id, pid)
VALUES (:update_id, :chat_id, :attempt, :claim_id, :pid)

-- demo_ledger_counts --
-- The bookings and the updates they are for.
SELECT COUNT(*), COUNT(DISTINCT update_id) FROM {ledger}

-- demo_booked --
-- Whether an update was booked.
SELECT 1 FROM {ledger} WHERE update_id = :update_id

-- demo_bookings --
-- The attempt of each booking.
SELECT update_id, attempt FROM {ledger}

-- demo_booking_count --
-- How many bookings.
SELECT COUNT(*) FROM {ledger}

-- demo_attempts --
-- How many attempts the store's table counts in all.
SELECT COALESCE(SUM(attempts), 0) FROM {table}

-- demo_reply_tries --
-- How often each update's reply was claimed by a sender.
SELECT update_id, SUM(tries) FROM {outbox} GROUP BY update_id
