-- key_is_ours asks whether this round wrote the visible version of the
-- key's receipt: this transaction's xmin (em_direct_inserted_here, frozen-
-- aware) and a command id at or after the round's start.  Not merely this
-- transaction's xmin: with the event's id dealt again (the identity
-- restarted, as review_inbox_copy_id_reuse.sql does), an old key receipt
-- this transaction only updated, or one an earlier delivery in the same
-- transaction wrote, names this round's id and has this transaction's
-- xmin; a stale key must then be freed, not refused with 09000 (as
-- inbox_xid_reuse.sh requires at a reused xid).
SET client_min_messages = warning;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 1. a stale key receipt (its event deleted alone), the identity
-- restarted, and the receipt updated (HOT) earlier in the transaction
SELECT event_id, inserted FROM earmark_inbox_receive('src', 'hot-1', 'note', '{}');
DELETE FROM earmark.inbox_event WHERE dedupe_key = 'hot-1';
ALTER TABLE earmark.inbox_event ALTER COLUMN event_id RESTART WITH 1;
BEGIN;
UPDATE earmark.inbox_receipt SET received_at = received_at WHERE dedupe_key = 'hot-1';
\set VERBOSITY sqlstate
SELECT event_id, inserted FROM earmark_inbox_receive('src', 'hot-1', 'note', '{}');
\set VERBOSITY default
ROLLBACK;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 2. the same in one transaction: a delivery, its event deleted alone,
-- the identity restarted, the delivery again
BEGIN;
SELECT event_id, inserted FROM earmark_inbox_receive('src', 'again-1', 'note', '{}');
DELETE FROM earmark.inbox_event WHERE dedupe_key = 'again-1';
ALTER TABLE earmark.inbox_event ALTER COLUMN event_id RESTART WITH 1;
\set VERBOSITY sqlstate
SELECT event_id, inserted FROM earmark_inbox_receive('src', 'again-1', 'note', '{}');
\set VERBOSITY default
ROLLBACK;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 3. (passes) the same key in one transaction without a restart: a
-- delivery, its event deleted alone, the delivery again (the earlier
-- delivery's receipt names another id: freed, stored), again (a copy), in
-- a savepoint rolled back (a copy, undone), and once more
BEGIN;
SELECT event_id, inserted FROM earmark_inbox_receive('src', 'twice-1', 'note', '{}');
DELETE FROM earmark.inbox_event WHERE dedupe_key = 'twice-1';
SELECT event_id, inserted FROM earmark_inbox_receive('src', 'twice-1', 'note', '{}');
SELECT event_id, inserted FROM earmark_inbox_receive('src', 'twice-1', 'note', '{}');
SAVEPOINT s;
SELECT event_id, inserted FROM earmark_inbox_receive('src', 'twice-1', 'note', '{}');
ROLLBACK TO s;
SELECT event_id, inserted FROM earmark_inbox_receive('src', 'twice-1', 'note', '{}');
SELECT event_id, seen_count FROM earmark.inbox_event WHERE dedupe_key = 'twice-1';
SELECT event_id, inserted, dedupe_key IS NOT NULL AS keyed FROM earmark.inbox_receipt ORDER BY receipt_id;
COMMIT;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
