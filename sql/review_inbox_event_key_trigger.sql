-- Triggers that move the event away from what its key's receipt names: a
-- BEFORE INSERT trigger on earmark.inbox_event that changes the event's id
-- or its key, or one on earmark.inbox_receipt that changes the event id
-- the receipt carries (the event follows it: r.event_id) or the key it
-- holds (source or dedupe_key).
-- 1, 2: an event stored under another id or key than its receipt names
-- would leave a key that leads to no event: the next copy would free the
-- key (free_stale_key) and store the event a second time.  Refused (09000).
-- 3: stored as the receipt names it; each delivery returns the event's id
-- (not this round's id from before the move, nor a copy receipt's moved
-- column).
-- 4, 5: the receipt's key changed or dropped.  Stored as it is, the event
-- would carry the delivery's key and the key receipt another (or none): a
-- copy would find no receipt by its key (40001 after three rounds, at every
-- retry), a delivery of the receipt's key would free it and store a second
-- event, and a receipt without a key keeps nothing unique.  The event takes
-- its key from the receipt's row, so such a delivery is refused (09000).
-- What must hold: a delivery fails with 09000 or returns the id of an
-- event that carries the key, never 40001 with nothing concurrent, and no
-- key has two events.  (A delivery whose key a receipt trigger maps onto a
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

-- 1. the event's id moved
CREATE FUNCTION pg_temp.shift_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.event_id := NEW.event_id + 1000;
    RETURN NEW;
END $$;
CREATE TRIGGER shift_id BEFORE INSERT ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION pg_temp.shift_id();
SELECT pg_temp.deliver('shift-1') AS first, pg_temp.deliver('shift-1') AS again;
DROP TRIGGER shift_id ON earmark.inbox_event;
SELECT count(*) <= 1 AS at_most_one_event FROM earmark.inbox_event WHERE dedupe_key = 'shift-1';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 2. the event's key normalised (lower case)
CREATE FUNCTION pg_temp.lower_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.dedupe_key := lower(NEW.dedupe_key);
    RETURN NEW;
END $$;
CREATE TRIGGER lower_key BEFORE INSERT ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION pg_temp.lower_key();
SELECT pg_temp.deliver('Lower-1') AS first, pg_temp.deliver('Lower-1') AS again;
DROP TRIGGER lower_key ON earmark.inbox_event;
SELECT count(*) <= 1 AS at_most_one_event FROM earmark.inbox_event WHERE lower(dedupe_key) = 'lower-1';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 3. the event id the receipt carries moved (the event follows it: r.event_id)
CREATE FUNCTION pg_temp.shift_receipt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.event_id := NEW.event_id + 1000;
    RETURN NEW;
END $$;
CREATE TRIGGER shift_receipt BEFORE INSERT ON earmark.inbox_receipt
    FOR EACH ROW EXECUTE FUNCTION pg_temp.shift_receipt();
SELECT pg_temp.deliver('shift-r-1') AS first, pg_temp.deliver('shift-r-1') AS again;
DROP TRIGGER shift_receipt ON earmark.inbox_receipt;
SELECT count(*) <= 1 AS at_most_one_event FROM earmark.inbox_event WHERE dedupe_key = 'shift-r-1';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 4. the receipt's key normalised (lower case)
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

-- 5. the receipt's key dropped (NULL: outside inbox_receipt_key's predicate)
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
