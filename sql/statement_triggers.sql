-- An operator's statement-level triggers on earmark's tables (an audit
-- that counts, from the transition tables, the rows each statement
-- wrote) see every write earmark makes in SQL.  With a trigger on the
-- table, the gate writes the job row in SQL rather than from C (direct.c,
-- writable).  SPI stops a top-level INSERT, UPDATE or DELETE ... RETURNING
-- run with a row count after that many rows, before its ModifyTable node
-- sees the end of its input, so such a statement's AFTER STATEMENT
-- triggers would not fire; em_exec (spi.c) runs every statement that
-- writes at its top level to its end.  Cases: a reserve (the job's
-- INSERT), a charge and a settle (its UPDATEs), an escrow admission (the
-- job's INSERT through a slot), a heartbeat, and reconcile's evidence.
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget_slot,
         earmark.budget, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;

SELECT earmark_set_limit('stt', 1000) IS NOT NULL AS made,
       earmark_set_limit('stt_e', 1000) IS NOT NULL AS made_escrow,
       earmark_set_escrow('stt_e', 2) IS NOT NULL AS escrow;
-- the first admission cuts the slots (the budget row's path)
SELECT admitted FROM earmark_reserve('stt_e', 1, 'stt-warm');

CREATE TABLE pg_temp.audit (tbl text, op text, n bigint);
CREATE FUNCTION pg_temp.audit_ins() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pg_temp.audit SELECT TG_TABLE_NAME, TG_OP, count(*) FROM new_rows;
    RETURN NULL;
END
$$;
CREATE TRIGGER stt_job_ins AFTER INSERT ON earmark.job
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.audit_ins();
CREATE TRIGGER stt_job_upd AFTER UPDATE ON earmark.job
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.audit_ins();
CREATE TRIGGER stt_ev_ins AFTER INSERT ON earmark.evidence
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.audit_ins();
-- what each call wrote, by table and operation: rows seen by the triggers
CREATE FUNCTION pg_temp.seen() RETURNS TABLE (tbl text, op text, rows numeric) LANGUAGE sql AS $$
    SELECT tbl, op, sum(n) FROM pg_temp.audit WHERE n > 0 GROUP BY tbl, op ORDER BY tbl, op
$$;

-- 1. a reserve: the job inserted
SELECT admitted FROM earmark_reserve('stt', 10, 'stt-1');
SELECT * FROM pg_temp.seen();
TRUNCATE pg_temp.audit;

-- 2. a charge and a heartbeat: the job updated
SELECT j.job_id AS job FROM earmark.job j WHERE j.idempotency_key = 'stt-1' \gset
SELECT charged FROM earmark_charge('stt', :job, 4);
SELECT * FROM pg_temp.seen();
TRUNCATE pg_temp.audit;
SELECT earmark_heartbeat('stt', :job) IS NOT NULL AS renewed;
SELECT * FROM pg_temp.seen();
TRUNCATE pg_temp.audit;

-- 3. a settle: the job updated
SELECT charged FROM earmark_settle('stt', :job, 6);
SELECT * FROM pg_temp.seen();
TRUNCATE pg_temp.audit;

-- 4. an admission through an escrow slot: the job inserted
SELECT admitted FROM earmark_reserve('stt_e', 10, 'stt-e1');
SELECT slot IS NOT NULL AS in_slot FROM earmark.job WHERE idempotency_key = 'stt-e1';
SELECT * FROM pg_temp.seen();
TRUNCATE pg_temp.audit;

-- 5. reconcile's evidence rows
SELECT count(*) > 0 AS reconciled FROM earmark_reconcile();
SELECT (SELECT count(*) FROM earmark.evidence) AS evidence_rows,
       coalesce((SELECT sum(n) FROM pg_temp.audit WHERE tbl = 'evidence' AND op = 'INSERT'), 0) AS seen_inserted;

DROP TRIGGER stt_job_ins ON earmark.job;
DROP TRIGGER stt_job_upd ON earmark.job;
DROP TRIGGER stt_ev_ins ON earmark.evidence;
SELECT count(*) AS check_rows FROM earmark_check();
