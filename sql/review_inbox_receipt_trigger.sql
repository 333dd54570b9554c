-- A BEFORE INSERT trigger on earmark.inbox_receipt that writes the key's
-- receipt its own way and skips earmark's insert (the receipt's twin of
-- inbox_key.sql's insert_then_skip).  Nothing stores the event.  The
-- delivery fails with 09000: the receipt holding the key was written by
-- this transaction for this round's event id (key_is_ours).  Not 40001
-- after three rounds of freeing the trigger's receipt, which
-- docs/inbox.md tells senders to retry: a retry loop that never ends.
SET client_min_messages = warning;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
CREATE FUNCTION pg_temp.receipt_insert_then_skip() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() = 1 AND NEW.dedupe_key IS NOT NULL THEN
        INSERT INTO earmark.inbox_receipt (event_id, inserted, source, dedupe_key)
        VALUES (NEW.event_id, NEW.inserted, NEW.source, NEW.dedupe_key);
        RETURN NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER receipt_insert_then_skip BEFORE INSERT ON earmark.inbox_receipt
    FOR EACH ROW EXECUTE FUNCTION pg_temp.receipt_insert_then_skip();
\set VERBOSITY sqlstate
SELECT * FROM earmark_inbox_receive('src', 'rits-1', 'note', '{}');
\set VERBOSITY default
DROP TRIGGER receipt_insert_then_skip ON earmark.inbox_receipt;
SELECT (SELECT count(*) FROM earmark.inbox_event) AS events,
       (SELECT count(*) FROM earmark.inbox_receipt) AS receipts;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
