-- direct.c's row hint (where the transaction last found or wrote a row by
-- a unique index) is kept for the transaction (lxid) and the table's file
-- (relfilenode), and its block must still be in the file.  A
-- TRUNCATE of a table whose file was made in the same (sub)transaction
-- truncates that file in place (ExecuteTruncateGuts: rd_newRelfilenodeSubid
-- or rd_createSubid is the current subtransaction): same relfilenode, no
-- blocks.  A look-up of the same keys after that must find the row by its
-- index, as it would without the hint, not fail with "could not read
-- block N" (XX001) from a fetch past the end of the file.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
SET earmark.lease = '1h';
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SELECT earmark_set_limit('inplace', 1000000) IS NULL AS set;
-- shows an error's SQLSTATE and message without its numbers
CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
  r text;
BEGIN
  EXECUTE q INTO r;
  RETURN r;
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '[0-9]+', 'N', 'g');
END
$f$;

-- 1. the budget row: TRUNCATE (a new file), 300 reserves of one account
-- (its versions, none prunable, go on past block 0), TRUNCATE again (the
-- same file, in place), and a reserve of the same account
BEGIN;
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard CASCADE;
SELECT pg_relation_filenode('earmark.budget') AS node \gset
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 300) i, LATERAL earmark_reserve('inplace', 1, 'ip' || i);
SELECT (ctid::text::point)[0] > 0 AS past_block_0 FROM earmark.budget WHERE account = 'inplace';
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard CASCADE;
SELECT pg_relation_filenode('earmark.budget') = :node AS same_file,
       pg_relation_size('earmark.budget') AS size;
SELECT pg_temp.try($$SELECT admitted::text FROM earmark_reserve('inplace', 1, 'again')$$) AS reserve;
SELECT held FROM earmark.budget WHERE account = 'inplace';
COMMIT;
SELECT held FROM earmark.budget WHERE account = 'inplace';

-- 2. the job row: the same with the identities restarted, so that the
-- job made after the second TRUNCATE has the job_id of one settled before
-- it (same keys of the job's primary key); a reserve of another account
-- moves the budget row's hints away from this account's keys first, so
-- that the reserve after the TRUNCATE takes the index and the settlement
-- is the look-up that meets the job row's hint
BEGIN;
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard RESTART IDENTITY CASCADE;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 300) i, LATERAL earmark_reserve('inplace', 1, 'jp' || i);
SELECT count(*) AS settled FROM earmark.job j, LATERAL earmark_settle('inplace', j.job_id, 1)
 WHERE j.account = 'inplace' AND j.job_id = 300;
SELECT (ctid::text::point)[0] > 0 AS past_block_0 FROM earmark.job WHERE job_id = 300;
SELECT earmark_set_limit('inplace-other', 10) IS NULL AS set;
SELECT admitted FROM earmark_reserve('inplace-other', 1, 'o1');
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard RESTART IDENTITY CASCADE;
SELECT setval(pg_get_serial_sequence('earmark.job', 'job_id'), 299) > 0 AS restarted;
SELECT admitted FROM earmark_reserve('inplace', 1, 'job-300');
SELECT pg_temp.try($$SELECT status FROM earmark_settle('inplace', 300, 1)$$) AS settle;
COMMIT;
SELECT job_id, status FROM earmark.job WHERE account = 'inplace';

TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
