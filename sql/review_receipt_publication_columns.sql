-- review_receipt_publication_columns: an operator publishes the receipts
-- without the dedupe keys (they are the provider's event ids; a change
-- feed of deliveries needs the event, the time and whether it was the
-- first), with a column list, as PostgreSQL 15 allows: every column but
-- source and dedupe_key.  The inbox must keep working under it: the next
-- delivery of a key whose event was deleted without its receipts frees
-- the key (free_stale_key, an UPDATE of the receipt), and an operator's
-- pruning of receipts (docs/inbox.md) deletes them.
--
-- With a primary key (receipt_id, the replica identity) the column list
-- covers the identity and both work.  With REPLICA IDENTITY FULL (tried, not merged)
-- no column list short of every column covers it: both fail with 42P10
-- ("Column list used by the publication does not cover the replica
-- identity"), and a redelivery of such a key fails for good.
SET client_min_messages = warning;
\pset null '<null>'
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) AS cols
  FROM pg_attribute a
 WHERE a.attrelid = 'earmark.inbox_receipt'::regclass AND a.attnum > 0 AND NOT a.attisdropped
   AND a.attname NOT IN ('source', 'dedupe_key') \gset
-- (error: not the warning of a cluster whose wal_level is not logical)
SET client_min_messages = error;
CREATE PUBLICATION review_receipts_no_keys FOR TABLE earmark.inbox_receipt (:cols);
SET client_min_messages = warning;

-- a first delivery and a copy
SELECT event_id AS first_id FROM earmark_inbox_receive('pubcol', 'pc-1', 'pc.test', '{}') \gset
SELECT inserted FROM earmark_inbox_receive('pubcol', 'pc-1', 'pc.test', '{}');
-- the event deleted without its receipts: its redelivery frees the key
-- and is stored as a new event
DELETE FROM earmark.inbox_event WHERE event_id = :first_id;
\set VERBOSITY sqlstate
SELECT inserted AS stored_again FROM earmark_inbox_receive('pubcol', 'pc-1', 'pc.test', '{}');
\set VERBOSITY default
SELECT count(*) AS events_with_key FROM earmark.inbox_event WHERE dedupe_key = 'pc-1';
-- an operator prunes the deleted event's receipts
\set VERBOSITY sqlstate
DELETE FROM earmark.inbox_receipt WHERE event_id = :first_id;
\set VERBOSITY default
SELECT count(*) AS left_of_old_event FROM earmark.inbox_receipt WHERE event_id = :first_id;

DROP PUBLICATION review_receipts_no_keys;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
