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
-- 7. an index expression evaluated under the statement's snapshot.
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

DROP TABLE direct_write_log;
DROP FUNCTION direct_write_seen();
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
