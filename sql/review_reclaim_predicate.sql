-- review_reclaim_predicate: a refused reserve's search for dead holds
-- (budget.c lock_dead) goes by job_open when that index's predicate, as
-- direct.c predicate_is prints it, is EmDirect.pred.  The printed text
-- must not depend on the session: with quote_all_identifiers on (pg_dump
-- sets it; an operator may), pg_get_expr prints "status" and "text" in
-- quotes, the read finds no index and runs its SQL (under SERIALIZABLE on
-- a small installation: the job table read whole), and the backend keeps
-- that answer (EmDirect.resolved) until the job table's next
-- invalidation, after RESET too.  Which way the search went: the planned
-- statement's planner opens every index of the job table with the
-- statement's RowShareLock (job_pkey among them); nothing else of the
-- reserve does (pg_temp.searched_by_sql).
-- Then: a savepoint that dropped job_open and was rolled back; the search
-- with more dead holds than the first ids array (16); a sweep's max below
-- a budget's dead holds; a reserve that reclaimed in a subtransaction that
-- then failed; a read-only transaction.
SET client_min_messages = warning;
-- holds are made dead here by hand (an UPDATE of lease_until), which a
-- budget's lease floor does not see (leasefloor.c): read every open hold
-- before a refusal
SET earmark.lease_floors = off;
SET timezone = 'UTC';
-- first, before this backend resolves the read
SET quote_all_identifiers = on;
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget_slot,
         earmark.budget, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;
CREATE FUNCTION pg_temp.searched_by_sql() RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM pg_locks l
                    WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'
                      AND l.relation = 'earmark.job_pkey'::regclass AND l.mode = 'RowShareLock')
$$;
SELECT earmark_set_limit('qa', 100) IS NOT NULL AS lim;
SELECT admitted FROM earmark_reserve('qa', 60, 'qa-dead', lease => '1 hour');
UPDATE earmark.job SET lease_until = now() - interval '1 minute' WHERE account = 'qa';

-- 1. quote_all_identifiers on: expected by key (not by SQL)
BEGIN;
SELECT admitted, remaining FROM earmark_reserve('qa', 60, 'qa-2', lease => '1 hour');
SELECT pg_temp.searched_by_sql();
ROLLBACK;
-- 2. ... and after RESET, in the same backend
RESET quote_all_identifiers;
BEGIN;
SELECT admitted, remaining FROM earmark_reserve('qa', 60, 'qa-2', lease => '1 hour');
SELECT pg_temp.searched_by_sql();
ROLLBACK;

-- 3. in one transaction: a savepoint that dropped job_open, by SQL;
-- rolled back to the savepoint (its locks with it), by key again
BEGIN;
SAVEPOINT s;
DROP INDEX earmark.job_open;
SELECT admitted, remaining FROM earmark_reserve('qa', 60, 'qa-2', lease => '1 hour');
SELECT pg_temp.searched_by_sql();
ROLLBACK TO SAVEPOINT s;
SELECT pg_temp.searched_by_sql() AS lock_gone;
SELECT admitted, remaining FROM earmark_reserve('qa', 60, 'qa-3', lease => '1 hour');
SELECT pg_temp.searched_by_sql();
SELECT idempotency_key, status FROM earmark.job WHERE account = 'qa' ORDER BY job_id;
ROLLBACK;

-- 4. 40 dead holds of one budget (more than the first ids array's 16):
-- a reserve that needs all their room reclaims all 40
SELECT earmark_set_limit('qm', 40) IS NOT NULL AS lim;
SELECT count(*) FILTER (WHERE admitted) AS holds
  FROM generate_series(1, 40) i, earmark_reserve('qm', 1, 'qm-' || i, lease => '1 hour');
UPDATE earmark.job SET lease_until = now() - interval '1 minute' WHERE account = 'qm';
BEGIN;
SELECT admitted, remaining FROM earmark_reserve('qm', 40, 'qm-all', lease => '1 hour');
SELECT status, count(*) FROM earmark.job WHERE account = 'qm' GROUP BY status ORDER BY status;
ROLLBACK;
-- 5. the sweep's max below a budget's dead holds: 3 (qa's dead hold,
-- the longest dead, and 2 of qm's 40), then qm's other 38
SELECT earmark_sweep(3) AS swept;
SELECT status, count(*) FROM earmark.job WHERE account = 'qm' GROUP BY status ORDER BY status;
SELECT earmark_sweep(100) AS swept;
SELECT status, count(*) FROM earmark.job WHERE account = 'qm' GROUP BY status ORDER BY status;
SELECT used, held FROM earmark_budget('qm');

-- 6. a reserve that reclaimed, in an EXCEPTION block that then fails:
-- the expiry is undone with it; the next reserve reclaims again
SELECT admitted FROM earmark_reserve('qa', 60, 'qa-dead-2', lease => '1 hour');
UPDATE earmark.job SET lease_until = now() - interval '1 minute' WHERE idempotency_key = 'qa-dead-2';
DO $$
BEGIN
    BEGIN
        PERFORM earmark_reserve('qa', 60, 'qa-x', lease => '1 hour');
        RAISE EXCEPTION 'halfway';
    EXCEPTION WHEN raise_exception THEN
        RAISE WARNING 'caught %', SQLERRM;
    END;
END
$$;
SELECT idempotency_key, status FROM earmark.job WHERE account = 'qa' ORDER BY job_id;
SELECT admitted, remaining FROM earmark_reserve('qa', 60, 'qa-y', lease => '1 hour');
SELECT idempotency_key, status FROM earmark.job WHERE account = 'qa' ORDER BY job_id;
-- 7. read only: refused as SELECT ... FOR UPDATE is (whatever comes first)
UPDATE earmark.job SET lease_until = now() - interval '1 minute' WHERE idempotency_key = 'qa-y';
BEGIN READ ONLY;
SELECT admitted FROM earmark_reserve('qa', 60, 'qa-z', lease => '1 hour');
ROLLBACK;
