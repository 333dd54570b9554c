-- review_reclaim_index_choice: a refused reserve's search for dead holds
-- (budget.c lock_dead, EmDirect dead_holds with .pred) goes by job_open,
-- the partial index of open holds, not by another index that also leads
-- with (account, budget_id) but has every job, open or settled.
-- direct.c index_rank ranks both 1 (neither is unique) and takes the
-- lower OID; job_open gets a higher one than an operator's index made
-- before it by REINDEX INDEX CONCURRENTLY, or on an install upgraded
-- from 0.2.0 (earmark--0.2.0--0.3.0.sql drops and creates job_open).
-- Through the wide index the search reads every job of the budget (its
-- whole history, each heap row predicate-locked under SERIALIZABLE); the
-- statement it replaces is planned through job_open.
SET client_min_messages = warning;
-- holds are made dead here by hand (an UPDATE of lease_until), which a
-- budget's lease floor does not see (leasefloor.c): read every open hold
-- before a refusal
SET earmark.lease_floors = off;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget_slot,
         earmark.budget, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;
SELECT earmark_set_limit('ic', 100) IS NOT NULL AS lim;
-- the budget's history: 30 settled jobs; then one dead hold
SELECT count(*) FILTER (WHERE admitted) AS holds
  FROM generate_series(1, 30) i, earmark_reserve('ic', 1, 'ic-h' || i, lease => '1 hour');
SELECT count(*) AS settled
  FROM earmark.job j, earmark_settle('ic', j.job_id, 1) s WHERE j.account = 'ic';
SELECT admitted FROM earmark_reserve('ic', 60, 'ic-dead', lease => '1 hour');
UPDATE earmark.job SET lease_until = now() - interval '1 minute' WHERE idempotency_key = 'ic-dead';
-- an operator's index that leads with the same columns
CREATE INDEX review_job_by_budget ON earmark.job (account, budget_id, created_at);
REINDEX INDEX CONCURRENTLY earmark.job_open;
SELECT 'earmark.job_open'::regclass::oid > 'earmark.review_job_by_budget'::regclass::oid AS job_open_newer;
-- a reserve that fits reads neither index
BEGIN;
SELECT admitted, remaining FROM earmark_reserve('ic', 5, 'ic-small', lease => '1 hour');
SELECT pg_stat_get_xact_numscans('earmark.review_job_by_budget'::regclass) AS wide_scans;
ROLLBACK;
-- the search: expected through job_open, no entry of the wide index read
BEGIN;
SELECT admitted, remaining FROM earmark_reserve('ic', 60, 'ic-2', lease => '1 hour');
SELECT pg_stat_get_xact_numscans('earmark.review_job_by_budget'::regclass) AS wide_scans,
       pg_stat_get_xact_tuples_returned('earmark.review_job_by_budget'::regclass) AS wide_entries_read;
SELECT idempotency_key, status FROM earmark.job WHERE account = 'ic' AND status <> 'completed' ORDER BY job_id;
ROLLBACK;
DROP INDEX earmark.review_job_by_budget;
