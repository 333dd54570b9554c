-- review_batch_plain: earmark_record_usage_many's statement writes like
-- the single calls' (entries.c, key_rows: INSERT ... ON CONFLICT DO
-- NOTHING), and it guards that against a plain insert tried first in a
-- subtransaction and run again with ON CONFLICT on a taken key (measured
-- and not merged, docs/benchmarks.md; each case below fails with it):
--  1. a batch whose keys are all in the ledger (a retry) writes nothing:
--     no XID, no heap row, and a reconcile may follow in the transaction
--     (em_require_no_writes counts any XID, a rolled-back subtransaction's
--     too);
--  2. a 23505 of another unique index than the key's (ledger_pkey, the id
--     sequence set back) fails the batch; it is not a taken key to write
--     around;
--  3. a trigger an operator put on earmark.ledger_entry runs once per row
--     of the statement (BEFORE ROW triggers fire for the taken keys' rows
--     too), not once per try;
--  4. a call's rows are its transaction's, one XID: no subtransaction XID
--     per statement (a call with a flush per repeated key here writes 100
--     statements; past 64 subtransaction XIDs a transaction overflows its
--     PGPROC's subxid cache, and every snapshot taken meanwhile looks XIDs
--     up in pg_subtrans).
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget,
         earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
UPDATE earmark.reporter_state SET blocked_until = NULL;
SET earmark.rate_limit = 0;
\set VERBOSITY terse

SELECT earmark_set_limit(a, 100000) IS NOT NULL AS ok FROM unnest(ARRAY['retry', 'pk', 'trg', 'xid']) a;

-- 1. a retry: every key is a repeat, nothing is written
SELECT * FROM earmark_record_usage_many('retry', ARRAY[5, 5, 5], ARRAY['r1', 'r2', 'r3']);
BEGIN;
SELECT * FROM earmark_record_usage_many('retry', ARRAY[5, 5, 5], ARRAY['r1', 'r2', 'r3']);
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;
-- then a reconcile in the same transaction
DO $$
BEGIN
    PERFORM earmark_record_usage_many('retry', ARRAY[5, 5, 5], ARRAY['r1', 'r2', 'r3']);
    PERFORM earmark_reconcile('retry');
END
$$;
\echo :LAST_ERROR_SQLSTATE

-- 2. another unique index: the next ledger row's id taken (the sequence set
-- back by one: p3's id comes again, the ids after it are free)
SELECT count(*) FROM earmark_record_usage_many('pk', ARRAY[1, 1, 1], ARRAY['p1', 'p2', 'p3']);
SELECT setval('earmark.entry_id_seq',
              (SELECT max(entry_id) FROM earmark.ledger_entry WHERE account = 'pk') - 1) > 0 AS set_back;
SELECT * FROM earmark_record_usage_many('pk', ARRAY[1, 1], ARRAY['p4', 'p5']);
\echo :LAST_ERROR_SQLSTATE
SELECT entry_key FROM earmark.ledger_entry WHERE account = 'pk' ORDER BY entry_key;
SELECT setval('earmark.entry_id_seq', (SELECT max(entry_id) FROM earmark.ledger_entry)) > 0 AS restored;

-- 3. an operator's trigger on the ledger: once per row of the statement
CREATE SEQUENCE pg_temp.fired;
CREATE FUNCTION pg_temp.count_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('pg_temp.fired');
    RETURN NEW;
END
$$;
CREATE TRIGGER review_batch_plain_count BEFORE INSERT ON earmark.ledger_entry
    FOR EACH ROW EXECUTE FUNCTION pg_temp.count_row();
SELECT count(*) FROM earmark_record_usage_many('trg', ARRAY[1], ARRAY['t0']);
SELECT * FROM earmark_record_usage_many('trg', ARRAY[1, 1, 1, 1], ARRAY['t1', 't2', 't0', 't3']);
SELECT last_value AS rows_the_trigger_saw FROM pg_temp.fired;
DROP TRIGGER review_batch_plain_count ON earmark.ledger_entry;

-- 4. one XID: 200 events, each key twice in a row (a statement per pair)
BEGIN;
SELECT count(*) FILTER (WHERE recorded) AS recorded
  FROM earmark_record_usage_many('xid', array_fill(1::bigint, ARRAY[200]),
                                 ARRAY(SELECT 'x' || (i / 2) FROM generate_series(0, 199) i));
SELECT count(DISTINCT xmin::text) AS xids,
       bool_and(xmin::text = (pg_current_xact_id()::text::bigint % 4294967296)::text) AS the_transactions
  FROM earmark.ledger_entry WHERE account = 'xid';
COMMIT;

SELECT account, count(*), sum(units) FROM earmark.ledger_entry GROUP BY account ORDER BY account;
SELECT account, sum(units) FROM earmark.usage_shard GROUP BY account ORDER BY account;
