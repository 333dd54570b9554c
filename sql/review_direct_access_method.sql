-- The readers of the tuple header in direct.c (em_direct_inserted_here:
-- the inbox's "is this round's receipt the key's?"; em_direct_unclaimed:
-- escrow's look at the budget row) need heap tuples.  A table an operator
-- moved to another access method gives them the answer that is safe for
-- their callers (false), by the table's access routine, not the access
-- method's name: here an alias of heap's, whose rows are heap tuples and
-- are read as such.  Deliveries, copies and admissions go on.
SET client_min_messages = warning;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget_slot,
         earmark.budget, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;
CREATE ACCESS METHOD heap_alias TYPE TABLE HANDLER heap_tableam_handler;
ALTER TABLE earmark.inbox_receipt SET ACCESS METHOD heap_alias;
ALTER TABLE earmark.budget SET ACCESS METHOD heap_alias;

-- a first delivery, a copy (key_is_ours reads the receipt), and a trigger
-- that skips the event's insert (09000: this round's receipt, read as a
-- heap tuple through the alias)
SELECT inserted FROM earmark_inbox_receive('src', 'am-1', 'note', '{}');
SELECT inserted FROM earmark_inbox_receive('src', 'am-1', 'note', '{}');
SELECT seen_count FROM earmark.inbox_event WHERE dedupe_key = 'am-1';
CREATE FUNCTION pg_temp.skip_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END $$;
CREATE TRIGGER skip_insert BEFORE INSERT ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION pg_temp.skip_row();
\set VERBOSITY sqlstate
SELECT * FROM earmark_inbox_receive('src', 'am-2', 'note', '{}');
\set VERBOSITY default
DROP TRIGGER skip_insert ON earmark.inbox_event;

-- admissions through escrow slots (the fast path's look at the budget row)
SELECT earmark_set_limit('am', 1000) IS NOT NULL AS made,
       earmark_set_escrow('am', 2) IS NOT NULL AS escrow;
SELECT count(*) FILTER (WHERE r.admitted) AS admitted
  FROM generate_series(1, 5) g CROSS JOIN LATERAL earmark_reserve('am', 10, 'am-' || g) r;
SELECT used, held FROM earmark_budget('am');

ALTER TABLE earmark.inbox_receipt SET ACCESS METHOD heap;
ALTER TABLE earmark.budget SET ACCESS METHOD heap;
DROP ACCESS METHOD heap_alias;
SELECT count(*) AS check_rows FROM earmark_check();
