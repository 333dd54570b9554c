-- A BEFORE INSERT trigger on earmark.inbox_receipt that changes the key
-- the receipt holds (source or dedupe_key): the receipt's twin of
-- review_inbox_event_key_trigger.sql's case 2.  Stored as it is, the event
-- would carry the delivery's key and the key receipt another (or none), so
-- the delivery's key would lead to no event: a copy would find no receipt
-- by its key (40001 after three rounds, at every retry), a delivery of the
-- receipt's key would free it and store a second event, and a receipt
-- without a key keeps nothing unique.  The event takes its key from the
-- receipt's row, so such a delivery is refused (09000).
-- What must hold: a delivery is refused with 09000 or returns the id of an
-- event that carries the key, never 40001 with nothing concurrent, and no
-- key has two events.  (A delivery whose key such a trigger maps onto a
-- key another event holds cannot be told from a concurrent delivery's and
-- may end in 40001; not tested.)
SET client_min_messages = warning;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
CREATE FUNCTION pg_temp.deliver(k text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM earmark_inbox_receive('src', k, 'note', '{}');
    IF EXISTS (SELECT 1 FROM earmark.inbox_event e
                WHERE e.event_id = r.event_id AND e.source = 'src' AND e.dedupe_key = k) THEN
        RETURN 'ok';
    END IF;
    RETURN format('returned event %s (inserted %s), which does not carry the key', r.event_id, r.inserted);
EXCEPTION
    WHEN triggered_action_exception THEN
        RETURN 'ok';
    WHEN OTHERS THEN
        RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- 1. the receipt's key normalised (lower case)
CREATE FUNCTION pg_temp.lower_receipt_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.dedupe_key := lower(NEW.dedupe_key);
    RETURN NEW;
END $$;
CREATE TRIGGER lower_receipt_key BEFORE INSERT ON earmark.inbox_receipt
    FOR EACH ROW EXECUTE FUNCTION pg_temp.lower_receipt_key();
SELECT pg_temp.deliver('Lower-R-1') AS first, pg_temp.deliver('Lower-R-1') AS again;
SELECT pg_temp.deliver('lower-r-1') AS lower_case;
DROP TRIGGER lower_receipt_key ON earmark.inbox_receipt;
SELECT count(*) <= 1 AS at_most_one_event FROM earmark.inbox_event WHERE lower(dedupe_key) = 'lower-r-1';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 2. the receipt's key dropped (NULL: outside inbox_receipt_key's predicate)
CREATE FUNCTION pg_temp.drop_receipt_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.source := NULL;
    NEW.dedupe_key := NULL;
    RETURN NEW;
END $$;
CREATE TRIGGER drop_receipt_key BEFORE INSERT ON earmark.inbox_receipt
    FOR EACH ROW EXECUTE FUNCTION pg_temp.drop_receipt_key();
SELECT pg_temp.deliver('drop-r-1') AS first, pg_temp.deliver('drop-r-1') AS again;
DROP TRIGGER drop_receipt_key ON earmark.inbox_receipt;
SELECT count(*) <= 1 AS at_most_one_event FROM earmark.inbox_event WHERE dedupe_key = 'drop-r-1';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
