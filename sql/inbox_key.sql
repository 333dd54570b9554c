-- The inbox's dedupe key (source, dedupe_key) lives on the first delivery's
-- receipt (earmark.inbox_receipt, unique index inbox_receipt_key), not on
-- the event: the first delivery writes a keyed receipt and the event, a
-- copy a keyless receipt and one more on seen_count; a key whose event is
-- gone (deleted with or without its receipts, or truncated away) is free
-- again, and never counts a copy on another event; the completion of an
-- event writes no entry in a key index.
SET client_min_messages = warning;
SET timezone = 'UTC';
\pset null '<null>'
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
DELETE FROM earmark.inbox_handler WHERE event_type <> 'customer.plan_changed';

-- the first delivery: one receipt, with the key, and the event
SELECT event_id AS e1, inserted AS ins FROM earmark_inbox_receive('src', 'k1', 'note', '{"n": 1}',
    '2026-10-01 00:00+00') \gset
SELECT :'ins' AS inserted;
SELECT event_id = :e1 AS same_event, source, dedupe_key, seen_count, payload FROM earmark.inbox_event;
SELECT event_id = :e1 AS same_event, inserted, source, dedupe_key FROM earmark.inbox_receipt ORDER BY receipt_id;

-- a copy: the same event, one more seen, a receipt without the key
SELECT event_id = :e1 AS same_event, inserted FROM earmark_inbox_receive('src', 'k1', 'note', '{"n": 2}');
SELECT event_id = :e1 AS same_event, seen_count, payload FROM earmark.inbox_event;
SELECT event_id = :e1 AS same_event, inserted, source, dedupe_key FROM earmark.inbox_receipt ORDER BY receipt_id;
-- the key is the pair: another source's k1 is another event
SELECT event_id <> :e1 AS other_event, inserted FROM earmark_inbox_receive('other', 'k1', 'note', '{}');
SELECT source, dedupe_key, seen_count FROM earmark.inbox_event ORDER BY source;

-- the same key twice in one transaction: the second is a copy
BEGIN;
SELECT event_id AS e2, inserted AS ins FROM earmark_inbox_receive('src', 'k2', 'note', '{}') \gset
SELECT :'ins' AS inserted;
SELECT event_id = :e2 AS same_event, inserted FROM earmark_inbox_receive('src', 'k2', 'note', '{}');
SELECT seen_count FROM earmark.inbox_event WHERE event_id = :e2;
COMMIT;
SELECT seen_count, (SELECT count(*) FROM earmark.inbox_receipt r WHERE r.event_id = e.event_id) AS receipts,
       (SELECT count(*) FROM earmark.inbox_receipt r WHERE r.source = 'src' AND r.dedupe_key = 'k2') AS keyed
FROM earmark.inbox_event e WHERE event_id = :e2;

-- a copy under a savepoint rolled back counts nothing
BEGIN;
SAVEPOINT s;
SELECT event_id = :e1 AS same_event, inserted FROM earmark_inbox_receive('src', 'k1', 'note', '{}');
ROLLBACK TO SAVEPOINT s;
SELECT seen_count FROM earmark.inbox_event WHERE event_id = :e1;
COMMIT;
SELECT seen_count, (SELECT count(*) FROM earmark.inbox_receipt r WHERE r.event_id = e.event_id) AS receipts
FROM earmark.inbox_event e WHERE event_id = :e1;
-- a first delivery rolled back to a savepoint frees its key in the same
-- transaction: the next delivery is stored
BEGIN;
SAVEPOINT s;
SELECT event_id AS e3 FROM earmark_inbox_receive('src', 'k3', 'note', '{}') \gset
ROLLBACK TO SAVEPOINT s;
SELECT event_id <> :e3 AS new_event, inserted FROM earmark_inbox_receive('src', 'k3', 'note', '{}');
COMMIT;
SELECT e.seen_count, count(r.*) AS keyed_receipts
FROM earmark.inbox_event e JOIN earmark.inbox_receipt r ON r.source = e.source AND r.dedupe_key = e.dedupe_key
WHERE e.dedupe_key = 'k3' GROUP BY e.seen_count;

-- deleting an event with its receipts (docs/inbox.md) frees its key: the
-- next delivery is a new event
WITH d AS (DELETE FROM earmark.inbox_event WHERE source = 'src' AND dedupe_key = 'k1' RETURNING event_id)
DELETE FROM earmark.inbox_receipt WHERE event_id IN (SELECT event_id FROM d);
SELECT event_id AS e1b, inserted AS ins FROM earmark_inbox_receive('src', 'k1', 'note', '{"n": 3}') \gset
SELECT :'ins' AS inserted, :e1b <> :e1 AS new_event;
SELECT event_id = :e1b AS new_event, seen_count, payload FROM earmark.inbox_event WHERE source = 'src' AND dedupe_key = 'k1';
SELECT event_id = :e1b AS new_event, inserted FROM earmark.inbox_receipt WHERE source = 'src' AND dedupe_key = 'k1';
SELECT count(*) AS old_receipts FROM earmark.inbox_receipt WHERE event_id = :e1;

-- deleting the event only (its receipts left, which docs/inbox.md asks
-- not to do) frees the key too: the next delivery clears the stale key
-- from the old receipt, which stays, and is stored as a new event
DELETE FROM earmark.inbox_event WHERE event_id = :e2;
SELECT event_id AS e2b, inserted AS ins FROM earmark_inbox_receive('src', 'k2', 'note', '{}') \gset
SELECT :'ins' AS inserted, :e2b <> :e2 AS new_event;
SELECT inserted, source, dedupe_key FROM earmark.inbox_receipt WHERE event_id = :e2 ORDER BY receipt_id;
SELECT event_id = :e2b AS new_event, inserted FROM earmark.inbox_receipt WHERE source = 'src' AND dedupe_key = 'k2';
SELECT event_id = :e2b AS new_event, seen_count FROM earmark.inbox_event WHERE source = 'src' AND dedupe_key = 'k2';
-- ... and a copy now counts on the new event
SELECT event_id = :e2b AS new_event, inserted FROM earmark_inbox_receive('src', 'k2', 'note', '{}');
SELECT seen_count FROM earmark.inbox_event WHERE event_id = :e2b;

-- TRUNCATE earmark.inbox_event RESTART IDENTITY alone (receipts left):
-- a new event takes an old event's id; a redelivery of the old event's
-- key is stored anew, not counted as a copy of the new event
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
SELECT event_id AS old_a FROM earmark_inbox_receive('src', 'old-a', 'note', '{}') \gset
SELECT event_id AS old_b FROM earmark_inbox_receive('src', 'old-b', 'note', '{}') \gset
TRUNCATE earmark.inbox_event RESTART IDENTITY;
SELECT event_id AS new_x, inserted AS ins FROM earmark_inbox_receive('src', 'new-x', 'note', '{}') \gset
SELECT :'ins' AS inserted, :new_x = :old_a AS took_old_a_id;
SELECT event_id AS old_a2, inserted AS ins FROM earmark_inbox_receive('src', 'old-a', 'note', '{}') \gset
SELECT :'ins' AS inserted, :old_a2 <> :new_x AS not_new_x;
SELECT dedupe_key, seen_count, event_id = :new_x AS is_new_x FROM earmark.inbox_event ORDER BY dedupe_key;
-- (old-a's first id, now new-x's: old-a's receipt lost its key to new-x's)
SELECT event_id = :old_a AS shared_id, inserted, source, dedupe_key FROM earmark.inbox_receipt
WHERE event_id IN (:old_a, :old_a2) ORDER BY receipt_id;
-- a copy of new-x counts on new-x; old-b's stale key is freed on its redelivery
SELECT event_id = :new_x AS is_new_x, inserted FROM earmark_inbox_receive('src', 'new-x', 'note', '{}');
SELECT event_id NOT IN (:old_b, :new_x, :old_a2) AS new_event, inserted
FROM earmark_inbox_receive('src', 'old-b', 'note', '{}');
SELECT dedupe_key, seen_count FROM earmark.inbox_event ORDER BY dedupe_key;
SELECT r.dedupe_key, count(*) AS keyed, bool_and(e.dedupe_key = r.dedupe_key) AS own_event
FROM earmark.inbox_receipt r JOIN earmark.inbox_event e USING (event_id)
WHERE r.dedupe_key IS NOT NULL GROUP BY r.dedupe_key ORDER BY r.dedupe_key;

-- the catalog: no index or constraint of inbox_event mentions dedupe_key;
-- the key is inbox_receipt_key
SELECT count(*) AS event_key_indexes FROM pg_index i
WHERE i.indrelid = 'earmark.inbox_event'::regclass
  AND (pg_get_indexdef(i.indexrelid) LIKE '%dedupe_key%'
       OR EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attname = 'dedupe_key'
                     AND a.attnum = ANY (i.indkey::int2[])));
SELECT count(*) AS event_key_constraints FROM pg_constraint
WHERE conrelid = 'earmark.inbox_event'::regclass AND pg_get_constraintdef(oid) LIKE '%dedupe_key%';
SELECT pg_get_indexdef('earmark.inbox_receipt_key'::regclass);

-- a completion writes no entry in a key index: the items on the leaf pages
-- of every index that mentions dedupe_key (pageinspect) are the same
-- before and after ten completions, while the event's primary key takes
-- ten (the completions' updates are not HOT)
CREATE EXTENSION pageinspect;
CREATE FUNCTION pg_temp.index_items(idx regclass) RETURNS bigint LANGUAGE sql AS $$
    SELECT coalesce(sum(s.live_items + s.dead_items), 0)::bigint
      FROM generate_series(1, pg_relation_size(idx) / current_setting('block_size')::bigint - 1) AS b,
           LATERAL bt_page_stats(idx::text, b) AS s
     WHERE s.type = 'l'
$$;
CREATE FUNCTION pg_temp.key_index_items() RETURNS bigint LANGUAGE sql AS $$
    SELECT coalesce(sum(pg_temp.index_items(i.indexrelid)), 0)::bigint
      FROM pg_index i
     WHERE i.indrelid IN ('earmark.inbox_event'::regclass, 'earmark.inbox_receipt'::regclass)
       AND pg_get_indexdef(i.indexrelid) LIKE '%dedupe_key%'
$$;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
SELECT count(*) FILTER (WHERE inserted) AS stored, count(*) FILTER (WHERE NOT inserted) AS copies
FROM generate_series(1, 10) i, generate_series(1, 2) c,
     earmark_inbox_receive('src', 'done-' || i, 'note', jsonb_build_object('copy', c > 1),
                           '2026-10-01 00:00+00'::timestamptz + i * interval '1 minute') r;
SELECT count(*) AS claimed FROM earmark_inbox_claim(10);
SELECT pg_temp.key_index_items() AS key_items_before,
       pg_temp.index_items('earmark.inbox_event_pkey') AS pkey_items_before \gset
SELECT count(*) FILTER (WHERE c = 'applied') AS completed
FROM earmark.inbox_event e, earmark_inbox_complete(e.event_id) c;
SELECT :key_items_before AS key_items_before, pg_temp.key_index_items() AS key_items_after,
       pg_temp.index_items('earmark.inbox_event_pkey') - :pkey_items_before AS pkey_items_added;
SELECT count(*) AS keyed_receipts FROM earmark.inbox_receipt WHERE dedupe_key IS NOT NULL;
-- completed events keep their keys
SELECT count(*) FILTER (WHERE NOT r.inserted) AS copies
FROM generate_series(1, 10) i, earmark_inbox_receive('src', 'done-' || i, 'note', '{}') r;
SELECT status, count(*), sum(seen_count) AS seen FROM earmark.inbox_event GROUP BY status;
DROP EXTENSION pageinspect;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- a trigger of the user's that skips the event's insert is an error (09000)
-- and stores nothing, rather than a key taken and freed again; one that
-- skips a copy's update ends in 40001 after three rounds, storing nothing
CREATE FUNCTION pg_temp.skip_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END $$;
CREATE TRIGGER skip_insert BEFORE INSERT ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION pg_temp.skip_row();
\set VERBOSITY sqlstate
SELECT * FROM earmark_inbox_receive('src', 'trig-1', 'note', '{}');
\set VERBOSITY default
SELECT * FROM earmark_inbox_receive('src', 'trig-1', 'note', '{}');
SELECT (SELECT count(*) FROM earmark.inbox_event) AS events,
       (SELECT count(*) FROM earmark.inbox_receipt) AS receipts;
DROP TRIGGER skip_insert ON earmark.inbox_event;
SELECT inserted FROM earmark_inbox_receive('src', 'trig-1', 'note', '{}');
CREATE TRIGGER skip_update BEFORE UPDATE ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION pg_temp.skip_row();
\set VERBOSITY sqlstate
SELECT * FROM earmark_inbox_receive('src', 'trig-1', 'note', '{}');
\set VERBOSITY default
DROP TRIGGER skip_update ON earmark.inbox_event;
SELECT seen_count, (SELECT count(*) FROM earmark.inbox_receipt) AS receipts,
       (SELECT count(*) FROM earmark.inbox_receipt WHERE dedupe_key IS NOT NULL) AS keyed
FROM earmark.inbox_event;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
-- a trigger that stores the event its own way and skips earmark's insert:
-- an error too, not a first delivery counted as a copy of itself
CREATE FUNCTION pg_temp.insert_then_skip() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() = 1 THEN
        INSERT INTO earmark.inbox_event (event_id, source, dedupe_key, event_type, payload, occurred_at)
        OVERRIDING SYSTEM VALUE
        VALUES (NEW.event_id, NEW.source, NEW.dedupe_key, NEW.event_type, NEW.payload, NEW.occurred_at);
        RETURN NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER insert_then_skip BEFORE INSERT ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION pg_temp.insert_then_skip();
\set VERBOSITY sqlstate
SELECT * FROM earmark_inbox_receive('src', 'trig-2', 'note', '{}');
\set VERBOSITY default
DROP TRIGGER insert_then_skip ON earmark.inbox_event;
SELECT (SELECT count(*) FROM earmark.inbox_event) AS events,
       (SELECT count(*) FROM earmark.inbox_receipt) AS receipts;
-- the id of a key's stale receipt dealt again (the identity restarted after
-- the event was deleted alone) is not this delivery's own receipt: the
-- stale key is freed and the delivery stored, no error
SELECT event_id AS again_id FROM earmark_inbox_receive('src', 'again', 'note', '{}') \gset
DELETE FROM earmark.inbox_event;
ALTER TABLE earmark.inbox_event ALTER COLUMN event_id RESTART WITH :again_id;
SELECT event_id > :again_id AS later_id, inserted
FROM earmark_inbox_receive('src', 'again', 'note', '{}');
SELECT event_id > :again_id AS later_id, dedupe_key FROM earmark.inbox_event;
SELECT event_id = :again_id AS old_id, inserted, dedupe_key FROM earmark.inbox_receipt ORDER BY receipt_id;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- a look-up by key, as a copy's statement and inbox.md's query make it,
-- uses inbox_receipt_key (whose columns are in the other order)
SET enable_seqscan = off;
PREPARE by_key(text, text) AS
SELECT r.event_id FROM earmark.inbox_receipt r WHERE r.source = $1 AND r.dedupe_key = $2;
SET plan_cache_mode = force_generic_plan;
CREATE FUNCTION pg_temp.plan_of(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE 'EXPLAIN (COSTS OFF) ' || q;
END $$;
SELECT p FROM pg_temp.plan_of('EXECUTE by_key(''src'', ''k1'')') p
 WHERE p LIKE '%Scan%';
-- (the receipt's scan by its node alone: the join's shape, and so its
-- depth in the plan, follows the statistics earlier files left)
SELECT ltrim(p, ' ->') AS p FROM pg_temp.plan_of('SELECT e.event_id FROM earmark.inbox_receipt r
                                 JOIN earmark.inbox_event e USING (event_id)
                                WHERE r.source = ''src'' AND r.dedupe_key = ''k1''') p
 WHERE p LIKE '%inbox_receipt%';
DEALLOCATE by_key;
RESET plan_cache_mode;
RESET enable_seqscan;
