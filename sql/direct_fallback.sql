-- The calls' reads and writes by index from C (direct.c) leave a write to
-- the SQL statement when an operator's trigger is on the table, so that
-- the executor runs it: a charge past the hold, a heartbeat, a settle of
-- a settled job, a slot job's release into the budget row, with
-- statement triggers on earmark.job and earmark.budget that count the
-- rows each call wrote.  A BEFORE trigger that skips a write: the cycle is
-- marked only for a budget row that was written (under READ COMMITTED and
-- under SERIALIZABLE alike), and a settlement, a charge or a heartbeat
-- that a trigger keeps from the job row fails with 09000 instead of
-- answering as if it had been written, or as if the job had closed (a
-- settle would otherwise try for ever).  Then a repeated key's and a
-- rate-limited reserve's remaining room, the tables a rate-limited reserve
-- reads whole under SERIALIZABLE (none), a correction's check of the
-- cycle's total, which sums what its SQL summed, and a refused reserve's
-- search for dead holds without job_open.
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget_slot,
         earmark.budget, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;
SELECT earmark_set_limit('fb', 1000) IS NOT NULL AS made,
       earmark_set_limit('fe', 1000) IS NOT NULL AS made_escrow,
       earmark_set_escrow('fe', 2) IS NOT NULL AS escrow;
SELECT admitted FROM earmark_reserve('fe', 1, 'fe-warm');
SELECT admitted FROM earmark_reserve('fb', 100, 'fb-1', lease => '1 hour');
SELECT admitted FROM earmark_reserve('fb', 100, 'fb-2', lease => '1 hour');
SELECT admitted FROM earmark_reserve('fe', 10, 'fe-1', lease => '1 hour');
SELECT admitted FROM earmark_reserve('fe', 10, 'fe-2', lease => '1 hour');
SELECT idempotency_key, slot IS NOT NULL AS from_slot, gen FROM earmark.job ORDER BY job_id;

CREATE TABLE pg_temp.audit (tbl text, op text, n bigint);
CREATE FUNCTION pg_temp.audit_ins() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pg_temp.audit SELECT TG_TABLE_NAME, TG_OP, count(*) FROM new_rows;
    RETURN NULL;
END
$$;
CREATE TRIGGER em_test_job_upd AFTER UPDATE ON earmark.job
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.audit_ins();
CREATE TRIGGER em_test_budget_upd AFTER UPDATE ON earmark.budget
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.audit_ins();
CREATE FUNCTION pg_temp.seen() RETURNS TABLE (tbl text, op text, rows numeric) LANGUAGE sql AS $$
    SELECT tbl, op, sum(n) FROM pg_temp.audit WHERE n > 0 GROUP BY tbl, op ORDER BY tbl, op
$$;

-- 1. charge past the hold (the general path's write)
SELECT charged, capped, room, status FROM earmark_charge('fb', 1, 150, 1);
SELECT * FROM pg_temp.seen();
TRUNCATE pg_temp.audit;
-- 2. a repeated step on a capped job: nothing written
SELECT charged, capped, room, status FROM earmark_charge('fb', 1, 5, 1);
SELECT * FROM pg_temp.seen();
TRUNCATE pg_temp.audit;
-- 3. heartbeat of the capped job, then of a settled job, then of no job
SELECT earmark_heartbeat('fb', 1) IS NOT NULL AS renewed;
SELECT * FROM pg_temp.seen();
TRUNCATE pg_temp.audit;
SELECT charged, released, status FROM earmark_settle('fb', 2, 3);
TRUNCATE pg_temp.audit;
SELECT earmark_heartbeat('fb', 2) IS NOT NULL AS renewed;
SELECT * FROM pg_temp.seen();
SELECT earmark_heartbeat('fb', 999) IS NOT NULL AS renewed;
-- 4. settle of a settled job; charge of a settled job; of no job
SELECT charged, released, status FROM earmark_settle('fb', 2, 3);
SELECT charged, capped, room, status FROM earmark_charge('fb', 2, 500);
SELECT charged, capped, room, status FROM earmark_charge('fb', 999, 500);
SELECT * FROM pg_temp.seen();
TRUNCATE pg_temp.audit;
-- 5. a slot job whose generation has no slot (its gen moved by hand): its
-- release goes into the budget row, which the trigger sees
UPDATE earmark.job SET gen = 99 WHERE idempotency_key IN ('fe-1', 'fe-2');
SELECT idempotency_key, slot IS NOT NULL AS from_slot, gen FROM earmark.job WHERE account = 'fe' ORDER BY job_id;
SELECT gen, count(*) FROM earmark.budget_slot WHERE account = 'fe' GROUP BY gen ORDER BY gen;
TRUNCATE pg_temp.audit;
SELECT charged, released, status FROM earmark_settle('fe', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'fe-1'), 4);
SELECT * FROM pg_temp.seen();
SELECT used, held FROM earmark.budget WHERE account = 'fe';
SELECT count(*) AS marks FROM earmark.meter_mark;
TRUNCATE pg_temp.audit;
-- 6. the same with a BEFORE trigger that skips the budget row's update:
-- whether the cycle is marked for a row not written
CREATE FUNCTION pg_temp.skip() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER em_test_budget_skip BEFORE UPDATE ON earmark.budget FOR EACH ROW EXECUTE FUNCTION pg_temp.skip();
DELETE FROM earmark.meter_mark;
SELECT charged, released, status FROM earmark_settle('fe', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'fe-2'), 4);
SELECT used, held FROM earmark.budget WHERE account = 'fe';
SELECT count(*) AS marks_fe_slot FROM earmark.meter_mark;
-- ... and a budget-row job under SERIALIZABLE (write_settlement's branch)
SELECT admitted FROM earmark_reserve('fb', 10, 'fb-3', lease => '1 hour');
DELETE FROM earmark.meter_mark;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT charged, released, status FROM earmark_settle('fb', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'fb-3'), 4);
COMMIT;
SELECT count(*) AS marks_fb_serializable FROM earmark.meter_mark;
-- ... and READ COMMITTED (em_entry_settle_local: no mark without the row)
SELECT admitted FROM earmark_reserve('fb', 10, 'fb-4', lease => '1 hour');
DELETE FROM earmark.meter_mark;
SELECT charged, released, status FROM earmark_settle('fb', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'fb-4'), 4);
SELECT count(*) AS marks_fb_read_committed FROM earmark.meter_mark;
DROP TRIGGER em_test_budget_skip ON earmark.budget;
DROP TRIGGER em_test_job_upd ON earmark.job;
DROP TRIGGER em_test_budget_upd ON earmark.budget;

-- 7. a repeated key's remaining, and the rate-limited reserve's, with
-- recorded usage and slots
SELECT earmark_record_usage('fe', 7, 'fe-u1');
SELECT admitted, remaining, reason FROM earmark_reserve('fe', 1, 'fe-warm');
SELECT admitted, remaining, reason FROM earmark_reserve('fb', 100, 'fb-1', lease => '1 hour');
ANALYZE earmark.account, earmark.account_limit, earmark.budget, earmark.budget_slot,
        earmark.job, earmark.ledger_entry, earmark.usage_shard, earmark.meter_mark;
CREATE FUNCTION pg_temp.whole_tables() RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(l.relation::regclass::text, ', ' ORDER BY l.relation::regclass::text), 'none')
      FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
     WHERE l.pid = pg_backend_pid() AND l.mode = 'SIReadLock' AND l.locktype = 'relation'
       AND c.relkind = 'r'
$$;
SET earmark.rate_limit = 1;
SELECT admitted, reason FROM earmark_reserve('fb', 1, 'fb-rl-1', lease => '1 hour');
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT admitted, remaining, reason FROM earmark_reserve('fb', 1, 'fb-rl-2', lease => '1 hour');
SELECT pg_temp.whole_tables() AS "reserve, rate limited";
ROLLBACK;
RESET earmark.rate_limit;
SELECT count(*) AS check_rows FROM earmark_check();

-- 8. a BEFORE trigger that skips the job row's update: the settle, a
-- charge past the hold or within it, and the heartbeat fail with 09000,
-- and nothing changes
SET earmark.rate_limit = 0;
SELECT admitted FROM earmark_reserve('fb', 10, 'fb-5', lease => '1 hour');
SELECT job_id AS skipped_job FROM earmark.job WHERE idempotency_key = 'fb-5' \gset
SELECT used, held FROM earmark.budget WHERE account = 'fb';
CREATE TRIGGER em_test_job_skip BEFORE UPDATE ON earmark.job FOR EACH ROW EXECUTE FUNCTION pg_temp.skip();
\set VERBOSITY sqlstate
SELECT charged, released, status FROM earmark_settle('fb', :skipped_job, 4);
SELECT charged, capped FROM earmark_charge('fb', :skipped_job, 500);
SELECT charged, capped FROM earmark_charge('fb', :skipped_job, 1);
SELECT earmark_heartbeat('fb', :skipped_job);
\set VERBOSITY default
SELECT charged, released, status FROM earmark_settle('fb', :skipped_job, 4);
DROP TRIGGER em_test_job_skip ON earmark.job;
SELECT status, used FROM earmark.job WHERE job_id = :skipped_job;
SELECT used, held FROM earmark.budget WHERE account = 'fb';
SELECT charged, released, status FROM earmark_settle('fb', :skipped_job, 4);
RESET earmark.rate_limit;

-- 9. a correction's check sums the cycle's usage as its SQL does: the
-- budget row's used, the slots' used and the recorded usage; the slots'
-- held is no part of it (rows written by hand: the calls keep held within
-- the limit), so a sum of held past a bigint does not fail it
\set VERBOSITY terse
SELECT earmark_set_limit('ho', 1000) IS NOT NULL AS lim;
SELECT earmark_record_usage('ho', 10, 'ho-u1');
INSERT INTO earmark.budget_slot (account, budget_id, slot, held)
  SELECT 'ho', budget_id, g, 9223372036854775000 FROM earmark.budget, generate_series(1, 2) g
   WHERE account = 'ho';
SELECT earmark_record_usage('ho', -1, 'ho-c1');
-- earmark_budget reports held too, which is past a bigint here: an error,
-- as its SQL's sum gave (ledger.c report_direct)
SELECT used, held FROM earmark_budget('ho');
DELETE FROM earmark.budget_slot WHERE account = 'ho';
SELECT used FROM earmark_budget('ho');
\set VERBOSITY default

-- 10. a refused reserve's search for dead holds goes through job_open by
-- key from C (budget.c lock_dead), and through its SQL when that index is
-- gone or its predicate is another (each in a transaction rolled back):
-- the dead hold is reclaimed either way, and the reserve admitted.  Under
-- SERIALIZABLE the key's read holds no lock on the job table whole; the
-- SQL without an index reads it whole.
SELECT earmark_set_limit('rd', 100) IS NOT NULL AS lim;
SELECT admitted FROM earmark_reserve('rd', 60, 'rd-dead', lease => '1 hour');
UPDATE earmark.job SET lease_until = now() - interval '1 minute' WHERE account = 'rd';
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT admitted, remaining FROM earmark_reserve('rd', 60, 'rd-2', lease => '1 hour');
SELECT 'earmark.job' = ANY (string_to_array(pg_temp.whole_tables(), ', ')) AS job_read_whole;
SELECT idempotency_key, status FROM earmark.job WHERE account = 'rd' ORDER BY job_id;
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
DROP INDEX earmark.job_open;
SELECT admitted, remaining FROM earmark_reserve('rd', 60, 'rd-2', lease => '1 hour');
SELECT 'earmark.job' = ANY (string_to_array(pg_temp.whole_tables(), ', ')) AS job_read_whole;
SELECT idempotency_key, status FROM earmark.job WHERE account = 'rd' ORDER BY job_id;
ROLLBACK;
BEGIN;
DROP INDEX earmark.job_open;
CREATE INDEX job_open ON earmark.job (account, budget_id) WHERE status <> 'completed';
SELECT admitted, remaining FROM earmark_reserve('rd', 60, 'rd-2', lease => '1 hour');
SELECT idempotency_key, status FROM earmark.job WHERE account = 'rd' ORDER BY job_id;
ROLLBACK;
-- and by key again once the index is back as it was
SELECT admitted, remaining FROM earmark_reserve('rd', 60, 'rd-2', lease => '1 hour');
SELECT idempotency_key, status FROM earmark.job WHERE account = 'rd' ORDER BY job_id;
