-- When store_first returns no row, a delivery asks whether this round's
-- own receipt holds the key (a trigger of the user's kept the event from
-- coming back) before it counts a copy.  Without a rule or a BEFORE INSERT
-- row trigger on earmark.inbox_event and earmark.inbox_receipt it does not
-- look: each receipt written comes back as an event.  That answer is kept
-- per backend, so what must hold:
-- 1. with no trigger, a first delivery and its copy answer as always;
-- 2. a trigger on the event created in the same session after that answer
--    was kept is seen by the next delivery: 09000, not a copy, not 40001;
-- 3. as 2 for the receipt: a trigger that writes the key's receipt its own
--    way and skips the statement's (the key held by this round's receipt,
--    no event);
-- 4. a trigger that fires only under session_replication_role = replica
--    counts as a trigger, enabled or not;
-- 5. once the triggers are gone the deliveries answer as in 1.
-- Then cases where the answer "both plain" is kept with a copy first, what
-- it depends on changed, and a new key delivered:
-- 6. a rule on the event whose action returns no row: 09000, not 40001;
-- 7. a trigger that fires only under session_replication_role = replica,
--    the answer kept under the origin role (SET sends no invalidation):
--    09000 under replica;
-- 8. DROP TRIGGER in a savepoint, the answer kept, ROLLBACK TO: the
--    trigger is back, 09000;
-- 9. an event table whose index on event_id is gone (an operator's own
--    primary key): a copy is still counted (the answer needs no index);
-- 10. a receipt trigger made after the answer was kept, whose first use
--    is a delivery whose receipt names another id (the receipt is read
--    then, and resolved again before the answer is asked for): the next
--    delivery the trigger skips is 09000.
-- (Another session's CREATE TRIGGER: isolation spec
-- review_inbox_copy_check_other_session.)
SET client_min_messages = warning;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
CREATE FUNCTION pg_temp.deliver(k text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM earmark_inbox_receive('src', k, 'note', '{}');
    RETURN CASE WHEN r.inserted THEN 'stored' ELSE 'copy' END;
EXCEPTION
    WHEN OTHERS THEN
        RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- 1. no trigger: stored, then a copy
SELECT pg_temp.deliver('check-1') AS first, pg_temp.deliver('check-1') AS again;

-- 2. a trigger that skips the event's insert, made after 1 in this session
CREATE FUNCTION pg_temp.skip() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END $$;
CREATE TRIGGER skip_event BEFORE INSERT ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION pg_temp.skip();
SELECT pg_temp.deliver('check-2') AS skipped_event;
SELECT pg_temp.deliver('check-1') AS copy_with_trigger;
DROP TRIGGER skip_event ON earmark.inbox_event;

-- 3. a receipt trigger that writes the receipt itself and skips the
-- statement's row: the key is this round's, the event never stored
CREATE FUNCTION pg_temp.own_receipt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() = 1 AND NEW.dedupe_key IS NOT NULL THEN
        INSERT INTO earmark.inbox_receipt (event_id, inserted, source, dedupe_key)
        VALUES (NEW.event_id, NEW.inserted, NEW.source, NEW.dedupe_key);
        RETURN NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER own_receipt BEFORE INSERT ON earmark.inbox_receipt
    FOR EACH ROW EXECUTE FUNCTION pg_temp.own_receipt();
SELECT pg_temp.deliver('check-3') AS receipt_its_own_way;
DROP TRIGGER own_receipt ON earmark.inbox_receipt;

-- 4. a trigger that fires only for replication
CREATE TRIGGER skip_replica BEFORE INSERT ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION pg_temp.skip();
ALTER TABLE earmark.inbox_event ENABLE REPLICA TRIGGER skip_replica;
SELECT pg_temp.deliver('check-4') AS origin_role;
SET session_replication_role = replica;
SELECT pg_temp.deliver('check-4b') AS replica_role;
RESET session_replication_role;
DROP TRIGGER skip_replica ON earmark.inbox_event;

-- 5. no trigger again
SELECT pg_temp.deliver('check-5') AS first, pg_temp.deliver('check-5') AS again;

CREATE TABLE pg_temp.event_sink (LIKE earmark.inbox_event);

-- 6. a rule
SELECT pg_temp.deliver('rule-1') AS first, pg_temp.deliver('rule-1') AS again;
BEGIN;
CREATE RULE divert AS ON INSERT TO earmark.inbox_event DO INSTEAD
  UPDATE pg_temp.event_sink SET seen_count = 0 WHERE event_id = NEW.event_id
  RETURNING event_sink.*;
SELECT pg_temp.deliver('rule-2') AS with_rule;
ROLLBACK;

-- 7. a replica trigger, the answer kept under the origin role
CREATE TRIGGER skip_replica BEFORE INSERT ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION pg_temp.skip();
ALTER TABLE earmark.inbox_event ENABLE REPLICA TRIGGER skip_replica;
SELECT pg_temp.deliver('rep-1') AS first, pg_temp.deliver('rep-1') AS again;
SET session_replication_role = replica;
SELECT pg_temp.deliver('rep-2') AS replica_role;
RESET session_replication_role;
DROP TRIGGER skip_replica ON earmark.inbox_event;

-- 8. DROP TRIGGER rolled back to a savepoint
CREATE TRIGGER skip_event BEFORE INSERT ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION pg_temp.skip();
BEGIN;
SAVEPOINT s;
DROP TRIGGER skip_event ON earmark.inbox_event;
SELECT pg_temp.deliver('sp-1') AS first, pg_temp.deliver('sp-1') AS again;
ROLLBACK TO s;
SELECT pg_temp.deliver('sp-2') AS trigger_back;
COMMIT;
DROP TRIGGER skip_event ON earmark.inbox_event;

-- 9. no index on the event's id
BEGIN;
ALTER TABLE earmark.inbox_event DROP CONSTRAINT inbox_event_pkey;
CREATE UNIQUE INDEX event_by_source_id ON earmark.inbox_event (source, event_id);
SELECT pg_temp.deliver('pk-1') AS first, pg_temp.deliver('pk-1') AS again;
ROLLBACK;

-- 10. the receipt read by another path first
SELECT pg_temp.deliver('re-1') AS first, pg_temp.deliver('re-1') AS again;
CREATE FUNCTION pg_temp.receipt_rules() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() = 1 AND NEW.dedupe_key LIKE 'move-%' THEN
        NEW.event_id := NEW.event_id + 1000;
    ELSIF pg_trigger_depth() = 1 AND NEW.dedupe_key LIKE 'own-%' THEN
        INSERT INTO earmark.inbox_receipt (event_id, inserted, source, dedupe_key)
        VALUES (NEW.event_id, NEW.inserted, NEW.source, NEW.dedupe_key);
        RETURN NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER receipt_rules BEFORE INSERT ON earmark.inbox_receipt
    FOR EACH ROW EXECUTE FUNCTION pg_temp.receipt_rules();
SELECT pg_temp.deliver('move-1') AS moved;
SELECT pg_temp.deliver('own-1') AS receipt_its_own_way;
DROP TRIGGER receipt_rules ON earmark.inbox_receipt;

SELECT dedupe_key, seen_count FROM earmark.inbox_event ORDER BY event_id;
SELECT count(*) AS receipts_without_event
  FROM earmark.inbox_receipt r
 WHERE r.dedupe_key IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM earmark.inbox_event e WHERE e.event_id = r.event_id);
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
