-- A call that names a job (charge, heartbeat, settle) finds it by the
-- primary key (account, job_id), never through job_open: that partial
-- index holds every open hold of the account, and a look-up planned on it
-- reads all of them (a hot account's hundreds) to find one.  A status test
-- in the call's statement must not let the planner match job_open's
-- predicate.  The table is fresh (truncated, not analyzed: the state in
-- which the planner took job_open), and autovacuum stays off for it here.
SET client_min_messages = warning;
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
ALTER TABLE earmark.job SET (autovacuum_enabled = false);

SELECT earmark_set_limit('many', 1000000);
DO $$
BEGIN
    -- (fewer than earmark.rate_limit's 120 admissions a minute)
    FOR i IN 1 .. 100 LOOP
        PERFORM earmark_reserve('many', 10, 'open-' || i, lease => interval '1 day');
    END LOOP;
END
$$;
SELECT count(*) AS open_holds FROM earmark.job WHERE status IN ('running', 'capped');
SELECT job_id AS j1 FROM earmark.job WHERE idempotency_key = 'open-50' \gset
SELECT job_id AS j2 FROM earmark.job WHERE idempotency_key = 'open-51' \gset
SELECT job_id AS j3 FROM earmark.job WHERE idempotency_key = 'open-52' \gset

-- each call in a transaction of its own; the index scans of job_open it
-- made, counted by the statistics (pending in this backend until the
-- transaction block ends)
BEGIN;
SELECT pg_stat_get_xact_numscans('earmark.job_open'::regclass) AS before \gset
SELECT charged, capped, status FROM earmark_charge('many', :j1, 3);
SELECT pg_stat_get_xact_numscans('earmark.job_open'::regclass) - :before AS job_open_scans_charge;
COMMIT;

BEGIN;
SELECT pg_stat_get_xact_numscans('earmark.job_open'::regclass) AS before \gset
SELECT earmark_heartbeat('many', :j2) IS NOT NULL AS renewed;
SELECT pg_stat_get_xact_numscans('earmark.job_open'::regclass) - :before AS job_open_scans_heartbeat;
COMMIT;

BEGIN;
SELECT pg_stat_get_xact_numscans('earmark.job_open'::regclass) AS before \gset
SELECT charged, released, status FROM earmark_settle('many', :j3, 4);
SELECT pg_stat_get_xact_numscans('earmark.job_open'::regclass) - :before AS job_open_scans_settle;
COMMIT;

-- a settled job: the same again
BEGIN;
SELECT pg_stat_get_xact_numscans('earmark.job_open'::regclass) AS before \gset
SELECT charged, released, status FROM earmark_settle('many', :j3, 4);
SELECT charged, capped, status FROM earmark_charge('many', :j3, 1);
SELECT pg_stat_get_xact_numscans('earmark.job_open'::regclass) - :before AS job_open_scans_settled;
COMMIT;

SELECT count(*) AS open_holds FROM earmark.job WHERE status IN ('running', 'capped');
ALTER TABLE earmark.job RESET (autovacuum_enabled);
