-- Two receipt-trigger cases with nothing concurrent:
-- 1. a trigger on earmark.inbox_receipt that moves the event id it names
--    (allowed: the event follows it) together with one on
--    earmark.inbox_event that skips the event's insert: 09000.  This
--    round's receipt is told by the command id it was written at
--    (key_is_ours), not by the event id it names, so free_stale_key does
--    not free this round's own receipt round after round (40001).
-- 2. a trigger that skips a copy's receipt insert and writes the receipt
--    its own way: store_copy returns no row, the key's receipt is an
--    earlier one whose event carries the key, and each round counts the
--    copy again: 40001 after three rounds, which docs/inbox.md lists as
--    one a retry will not clear; the copies' counts roll back with it.
SET client_min_messages = warning;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 1.
CREATE FUNCTION pg_temp.shift_receipt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.event_id := NEW.event_id + 1000;
    RETURN NEW;
END $$;
CREATE FUNCTION pg_temp.skip_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END $$;
CREATE TRIGGER shift_receipt BEFORE INSERT ON earmark.inbox_receipt
    FOR EACH ROW EXECUTE FUNCTION pg_temp.shift_receipt();
CREATE TRIGGER skip_event BEFORE INSERT ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION pg_temp.skip_event();
\set VERBOSITY sqlstate
SELECT * FROM earmark_inbox_receive('src', 'moved-skip-1', 'note', '{}');
\set VERBOSITY default
DROP TRIGGER skip_event ON earmark.inbox_event;
DROP TRIGGER shift_receipt ON earmark.inbox_receipt;
SELECT (SELECT count(*) FROM earmark.inbox_event) AS events,
       (SELECT count(*) FROM earmark.inbox_receipt) AS receipts;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 2.
SELECT inserted FROM earmark_inbox_receive('src', 'copy-own-1', 'note', '{}');
CREATE FUNCTION pg_temp.copy_receipt_own_way() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() = 1 AND NOT NEW.inserted THEN
        INSERT INTO earmark.inbox_receipt (event_id, inserted) VALUES (NEW.event_id, NEW.inserted);
        RETURN NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER copy_receipt_own_way BEFORE INSERT ON earmark.inbox_receipt
    FOR EACH ROW EXECUTE FUNCTION pg_temp.copy_receipt_own_way();
\set VERBOSITY sqlstate
SELECT * FROM earmark_inbox_receive('src', 'copy-own-1', 'note', '{}');
\set VERBOSITY default
DROP TRIGGER copy_receipt_own_way ON earmark.inbox_receipt;
SELECT seen_count FROM earmark.inbox_event WHERE dedupe_key = 'copy-own-1';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
