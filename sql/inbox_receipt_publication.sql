-- inbox_receipt_publication: in a publication that publishes updates and
-- deletes (FOR ALL TABLES, as change-data-capture tools set up) every
-- table of earmark has a replica identity, so that its rows can still be
-- updated and deleted: for earmark.inbox_receipt, earmark's own clearing
-- of a stale key and an operator's pruning of receipts (docs/inbox.md).
-- The receipts' identity is their primary key, receipt_id: REPLICA
-- IDENTITY FULL without a key (tried, not merged) makes a subscriber read
-- the whole table for each changed receipt
-- (test/integration/review_receipt_logical_apply.sh) and breaks a
-- publication with a column list (review_receipt_publication_columns).
SET client_min_messages = error;
CREATE PUBLICATION earmark_test_all FOR ALL TABLES;
RESET client_min_messages;

-- every table of earmark has a replica identity: a primary key, or FULL
SELECT c.relname, c.relreplident
  FROM pg_class c
 WHERE c.relnamespace = 'earmark'::regnamespace AND c.relkind = 'r'
   AND NOT (c.relreplident = 'f'
            OR c.relreplident = 'd' AND EXISTS (SELECT 1 FROM pg_index i
                                                 WHERE i.indrelid = c.oid AND i.indisprimary))
 ORDER BY c.relname;
SELECT relreplident FROM pg_class WHERE oid = 'earmark.inbox_receipt'::regclass;
SELECT string_agg(a.attname, ', ' ORDER BY a.attnum) AS receipt_columns
  FROM pg_attribute a
 WHERE a.attrelid = 'earmark.inbox_receipt'::regclass AND a.attnum > 0 AND NOT a.attisdropped;
SELECT string_agg(c.relname, ', ' ORDER BY c.relname) AS receipt_indexes
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = 'earmark.inbox_receipt'::regclass;

-- a first delivery and a copy
SELECT event_id AS first_id FROM earmark_inbox_receive('pub', 'pub-1', 'pub.test', '{}') \gset
SELECT inserted FROM earmark_inbox_receive('pub', 'pub-1', 'pub.test', '{}');
-- the event deleted without its receipts (docs/inbox.md asks not to): the
-- next delivery of its key clears the key off the old receipt (an UPDATE
-- of earmark.inbox_receipt) and is stored as a new event
DELETE FROM earmark.inbox_event WHERE event_id = :first_id;
SELECT event_id AS second_id, inserted FROM earmark_inbox_receive('pub', 'pub-1', 'pub.test', '{}') \gset
SELECT :'inserted' AS stored_again, :second_id <> :first_id AS new_event;
SELECT event_id = :first_id AS old_event, inserted, coalesce(dedupe_key, '(none)') AS dedupe_key
  FROM earmark.inbox_receipt WHERE event_id IN (:first_id, :second_id)
 ORDER BY received_at;
-- an operator prunes the receipts of the deleted event
DELETE FROM earmark.inbox_receipt WHERE event_id = :first_id;
SELECT count(*) AS left_of_old_event FROM earmark.inbox_receipt WHERE event_id = :first_id;

DELETE FROM earmark.inbox_receipt WHERE event_id = :second_id;
DELETE FROM earmark.inbox_event WHERE event_id = :second_id;
DROP PUBLICATION earmark_test_all;
