-- On a single node a reserve, a charge, a settlement and an expiry write
-- the budget row's numbers and the job row by index from C (direct.c,
-- em_direct_update), without the executor: the new version as the UPDATE
-- would make it, and its index entries when it is not HOT (a partial
-- index's predicate and an index's expressions evaluated on it).  Where an
-- operator added something the executor would run, the write goes through
-- SQL.  Each case fails if the write from C skipped or got it wrong:
-- 1. an operator's index on a column the write changes (held): no update
--    is HOT, so every write must add an entry in each index (amcheck's
--    heapallindexed finds a row version without one);
-- 2. an index with an expression, and a partial one: entries for the
--    versions they take, none for one a partial index's predicate leaves
--    out (an index scan would return it);
-- 3. a trigger on the budget row: it fires;
-- 4. a CHECK constraint: checked (23514), nothing written;
-- 5. a foreign key made deferrable: the write still works;
-- 6. the job row's partial indexes after charges and settlements;
-- 7. an index expression evaluated under the statement's snapshot;
-- 8. a row written many times in one transaction: found where the
--    transaction last wrote it, not by an index walk past every version
--    it made, and found by the index again when that place is gone (a
--    savepoint rolled back, the table truncated).
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
SET earmark.lease = '1h';
CREATE EXTENSION IF NOT EXISTS amcheck;
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SELECT earmark_set_limit('acme', 1000) IS NULL AS set;

-- every index of earmark.budget holds every row version it should
CREATE FUNCTION pg_temp.budget_indexes_whole() RETURNS TABLE (index text, whole boolean)
LANGUAGE sql AS $$
  SELECT i.indexrelid::regclass::text, bt_index_check(i.indexrelid, true)::text = ''
    FROM pg_index i WHERE i.indrelid = 'earmark.budget'::regclass ORDER BY 1
$$;

-- 1. an index on held: every write of the numbers is a non-HOT update
CREATE INDEX direct_write_held ON earmark.budget (held);
SELECT pg_stat_force_next_flush();
SELECT n_tup_hot_upd AS hot_before FROM pg_stat_user_tables WHERE relid = 'earmark.budget'::regclass \gset
SELECT admitted, remaining FROM earmark_reserve('acme', 10, 'a');
SELECT admitted, remaining FROM earmark_reserve('acme', 20, 'b');
SELECT status, charged FROM earmark_settle('acme', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'a'), 7);
SELECT used, held FROM earmark.budget WHERE account = 'acme';
SELECT pg_stat_force_next_flush();
SELECT n_tup_hot_upd - :hot_before AS hot_updates FROM pg_stat_user_tables WHERE relid = 'earmark.budget'::regclass;
SELECT * FROM pg_temp.budget_indexes_whole();
-- each index finds the row by what it holds now
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT count(*) AS by_held FROM earmark.budget WHERE held = 20;
SELECT count(*) AS by_key FROM earmark.budget WHERE account = 'acme' AND budget_id = 1;
SELECT count(*) AS by_cycle FROM earmark.budget WHERE account = 'acme' AND feature = 'default';
RESET enable_seqscan;
RESET enable_bitmapscan;
DROP INDEX earmark.direct_write_held;

-- 2. an index with an expression, and a partial one
CREATE INDEX direct_write_expr ON earmark.budget ((used + held));
CREATE INDEX direct_write_partial ON earmark.budget (account) WHERE held > 25;
SELECT admitted, remaining FROM earmark_reserve('acme', 30, 'c');
SELECT * FROM pg_temp.budget_indexes_whole();
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT count(*) AS by_expr FROM earmark.budget WHERE used + held = 57;
SELECT count(*) AS by_partial FROM earmark.budget WHERE account = 'acme' AND held > 25;
RESET enable_seqscan;
RESET enable_bitmapscan;
-- a write that takes the row out of the partial index: no entry for it
SELECT status, charged FROM earmark_settle('acme', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'c'), 0);
SELECT * FROM pg_temp.budget_indexes_whole();
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT count(*) AS by_expr FROM earmark.budget WHERE used + held = 27;
SELECT count(*) AS by_partial_after FROM earmark.budget WHERE account = 'acme' AND held > 25;
RESET enable_seqscan;
RESET enable_bitmapscan;
DROP INDEX earmark.direct_write_expr;
DROP INDEX earmark.direct_write_partial;

-- 3. a trigger on the budget row fires for each write
CREATE TABLE direct_write_log (op text, used bigint, held bigint);
CREATE FUNCTION direct_write_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.direct_write_log VALUES (TG_OP, NEW.used, NEW.held);
  RETURN NEW;
END
$$;
CREATE TRIGGER direct_write_seen BEFORE UPDATE ON earmark.budget
  FOR EACH ROW EXECUTE FUNCTION direct_write_seen();
SELECT admitted, remaining FROM earmark_reserve('acme', 5, 'd');
SELECT status, charged FROM earmark_settle('acme', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'd'), 5);
SELECT * FROM direct_write_log;
DROP TRIGGER direct_write_seen ON earmark.budget;
-- without it, nothing more is logged
SELECT admitted, remaining FROM earmark_reserve('acme', 5, 'e');
SELECT count(*) AS logged FROM direct_write_log;

-- 4. a CHECK constraint is checked, and the refused write changes nothing
ALTER TABLE earmark.budget ADD CONSTRAINT direct_write_small CHECK (held <= 80);
SELECT used, held FROM earmark.budget WHERE account = 'acme';
\set VERBOSITY sqlstate
SELECT admitted FROM earmark_reserve('acme', 100, 'f');
\set VERBOSITY default
SELECT used, held FROM earmark.budget WHERE account = 'acme';
SELECT count(*) AS job_f FROM earmark.job WHERE idempotency_key = 'f';
ALTER TABLE earmark.budget DROP CONSTRAINT direct_write_small;

-- 5. the account's foreign key deferred: the writes still land
SELECT conname AS fk FROM pg_constraint
 WHERE conrelid = 'earmark.budget'::regclass AND contype = 'f' \gset
ALTER TABLE earmark.budget ALTER CONSTRAINT :"fk" DEFERRABLE INITIALLY DEFERRED;
SELECT admitted, remaining FROM earmark_reserve('acme', 1, 'g');
ALTER TABLE earmark.budget ALTER CONSTRAINT :"fk" NOT DEFERRABLE;
SELECT admitted, remaining FROM earmark_reserve('acme', 1, 'h');
SELECT used, held FROM earmark.budget WHERE account = 'acme';
SELECT * FROM pg_temp.budget_indexes_whole();

-- 6. the job row, charged and settled from C: its partial indexes (job_open
-- for open holds, job_entry for charged ones) hold exactly the versions
-- their predicates take (an index scan counts what a sequential scan does),
-- and every index holds every version it should
SELECT admitted FROM earmark_reserve('acme', 40, 'j1');
SELECT admitted FROM earmark_reserve('acme', 40, 'j2');
SELECT charged, capped FROM earmark_charge('acme', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'j1'), 15);
SELECT charged, capped FROM earmark_charge('acme', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'j2'), 5);
SELECT status, charged FROM earmark_settle('acme', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'j1'), NULL);
SELECT status, charged FROM earmark_settle('acme', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'j2'), 0);
CREATE TEMP TABLE job_counts AS
  SELECT count(*) FILTER (WHERE status IN ('running', 'capped')) AS open,
         count(*) FILTER (WHERE charged > 0) AS charged
    FROM earmark.job WHERE account = 'acme' AND budget_id = 1;
SELECT * FROM job_counts;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM earmark.job WHERE account = 'acme' AND budget_id = 1
   AND status IN ('running', 'capped');
EXPLAIN (COSTS OFF) SELECT count(*) FROM earmark.job WHERE account = 'acme' AND budget_id = 1
   AND charged > 0;
SELECT (SELECT count(*) FROM earmark.job WHERE account = 'acme' AND budget_id = 1
         AND status IN ('running', 'capped')) = open AS job_open_exact,
       (SELECT count(*) FROM earmark.job WHERE account = 'acme' AND budget_id = 1
         AND charged > 0) = charged AS job_entry_exact
  FROM job_counts;
RESET enable_seqscan;
RESET enable_bitmapscan;
SELECT i.indexrelid::regclass::text AS index, bt_index_check(i.indexrelid, true)::text = '' AS whole
  FROM pg_index i WHERE i.indrelid = 'earmark.job'::regclass ORDER BY 1;
SELECT idempotency_key, status, used, charged, released FROM earmark.job
 WHERE idempotency_key IN ('j1', 'j2') ORDER BY 1;

-- 7. an index expression runs under the statement's snapshot, as in the
-- executor's UPDATE: a function that reads another table (declared
-- IMMUTABLE, wrongly) sees each earlier settlement's release of the same
-- call (held 3, 2, 1), not the snapshot of the call's caller (3, 3, 3)
SELECT earmark_set_limit('peek', 1000) IS NULL AS set;
CREATE FUNCTION direct_write_peek(s text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $f$
DECLARE
  n bigint;
BEGIN
  IF s = 'completed' THEN
    SELECT held INTO n FROM earmark.budget WHERE account = 'peek';
    RAISE NOTICE 'held seen: %', n;
  END IF;
  RETURN s;
END
$f$;
CREATE INDEX direct_write_peek ON earmark.job (public.direct_write_peek(status));
SELECT array_agg(job_id ORDER BY job_id) AS peek_jobs
  FROM earmark_reserve_many('peek', ARRAY[1, 1, 1]::bigint[], ARRAY['p1', 'p2', 'p3']) \gset
SET client_min_messages = notice;
SELECT status FROM earmark_settle_many('peek', :'peek_jobs') ORDER BY job_id;
SET client_min_messages = warning;
DROP INDEX earmark.direct_write_peek;
DROP FUNCTION direct_write_peek(text);

-- 8. one transaction that writes one budget row many times: each look-up
-- of the row starts at the version the transaction last wrote (direct.c's
-- hint), not with an index scan, which walks every version the
-- transaction made before (they cannot be pruned before it ends): no index
-- scan of the budget table for 50 reserves and 51 settlements after the
-- first reserve (2 a call without the hint).  The hinted version is taken
-- only when the snapshot sees it and it has the keys; otherwise the index
-- is scanned: after a savepoint rolled back, after a TRUNCATE.
SELECT earmark_set_limit('hint', 1000000) IS NULL AS set;
CREATE FUNCTION pg_temp.budget_index_scans() RETURNS bigint LANGUAGE sql AS $$
  SELECT sum(pg_stat_get_xact_numscans(indexrelid))::bigint
    FROM pg_index WHERE indrelid = 'earmark.budget'::regclass
$$;
-- the budget row's held against its open holds
CREATE FUNCTION pg_temp.books(a text) RETURNS TABLE (held bigint, open_holds bigint)
LANGUAGE sql AS $$
  SELECT b.held, (SELECT coalesce(sum(amount), 0) FROM earmark.job j
                   WHERE j.account = b.account AND j.budget_id = b.budget_id
                     AND j.status IN ('running', 'capped'))::bigint
    FROM earmark.budget b WHERE b.account = a
$$;
BEGIN;
SELECT admitted FROM earmark_reserve('hint', 1, 'h0');
SELECT pg_temp.budget_index_scans() AS scans \gset
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 50) i, LATERAL earmark_reserve('hint', 1, 'h' || i);
SELECT pg_temp.budget_index_scans() - :scans AS budget_index_scans;
SELECT * FROM pg_temp.books('hint');
SELECT pg_temp.budget_index_scans() AS scans \gset
SELECT count(*) AS settled FROM earmark.job j, LATERAL earmark_settle('hint', j.job_id, 0)
 WHERE j.account = 'hint';
SELECT pg_temp.budget_index_scans() - :scans AS budget_index_scans;
SELECT * FROM pg_temp.books('hint');
COMMIT;
SELECT * FROM pg_temp.books('hint');

-- a savepoint rolled back: the version it wrote is gone, the one before is found
BEGIN;
SELECT admitted FROM earmark_reserve('hint', 10, 'sp1');
SAVEPOINT s;
SELECT admitted FROM earmark_reserve('hint', 100, 'sp2');
ROLLBACK TO SAVEPOINT s;
SELECT admitted FROM earmark_reserve('hint', 1000, 'sp3');
SELECT * FROM pg_temp.books('hint');
SAVEPOINT t;
SELECT status FROM earmark_settle('hint', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'sp1'), 5);
ROLLBACK TO SAVEPOINT t;
SELECT status FROM earmark_settle('hint', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'sp3'), 5);
COMMIT;
SELECT * FROM pg_temp.books('hint');
SELECT used FROM earmark.budget WHERE account = 'hint';

-- the tables truncated in the transaction (new files): the rows are found again
BEGIN;
SELECT admitted FROM earmark_reserve('hint', 10, 'tr1');
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SELECT earmark_set_limit('hint', 1000) IS NULL AS set;
SELECT admitted FROM earmark_reserve('hint', 10, 'tr2');
SELECT admitted FROM earmark_reserve('hint', 20, 'tr3');
SELECT status FROM earmark_settle('hint', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'tr2'), 4);
COMMIT;
SELECT * FROM pg_temp.books('hint');
SELECT used FROM earmark.budget WHERE account = 'hint';

-- the same under REPEATABLE READ
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FILTER (WHERE admitted) AS admitted
  FROM generate_series(1, 20) i, LATERAL earmark_reserve('hint', 1, 'rr' || i);
SELECT count(*) AS settled FROM earmark.job j, LATERAL earmark_settle('hint', j.job_id, 1)
 WHERE j.account = 'hint' AND j.idempotency_key LIKE 'rr%';
SELECT * FROM pg_temp.books('hint');
COMMIT;
SELECT used FROM earmark.budget WHERE account = 'hint';

DROP TABLE direct_write_log;
DROP FUNCTION direct_write_seen();
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
