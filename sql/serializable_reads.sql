-- Under SERIALIZABLE, PostgreSQL records what a transaction read as
-- predicate locks: a tuple, an index page, or a whole table after a
-- sequential scan.  A whole table read by one account's call conflicts
-- with any other account's write to that table, so two transactions on
-- accounts that share no row fail each other with 40001
-- (isolation spec serializable_accounts).  The calls of the gate read
-- their rows by key, from C, not through a plan that a small table's
-- statistics turn into a sequential scan: here, on an installation of
-- three accounts with every earmark table analyzed (the planner would
-- scan each table whole), each call runs in a SERIALIZABLE transaction of
-- its own and lists the tables it holds a predicate lock on whole.
-- Expected: none, for every call: a refused reserve's reclaim of dead
-- holds too (budget.c, lock_dead: every dead hold of the budget, skipping
-- locked ones, through job_open's partial index; it expires sra's job 2
-- here), and earmark_budget's report (ledger.c report_direct).
-- (Index-wide locks are not listed: a scan of an empty index locks it
-- whole, which on a small installation is the one leaf page every account
-- shares anyway.)
SET client_min_messages = warning;
-- holds are made dead here by hand (an UPDATE of lease_until), which a
-- budget's lease floor does not see (leasefloor.c): read every open hold
-- before a refusal
SET earmark.lease_floors = off;
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;

DO $$
DECLARE
    acct text;
BEGIN
    FOREACH acct IN ARRAY ARRAY['sra', 'srab', 'srb'] LOOP
        PERFORM earmark_set_limit(acct, 1000);
        FOR i IN 1 .. 8 LOOP
            PERFORM earmark_reserve(acct, 10, acct || '-' || i, lease => interval '1 hour');
        END LOOP;
        PERFORM earmark_record_usage(acct, 1, acct || '-u0');
    END LOOP;
END
$$;
-- sra's jobs are 1 to 8: 1 settled, 2 past its lease
SELECT charged FROM earmark_settle('sra', 1, 0);
UPDATE earmark.job SET lease_until = now() - interval '1 minute' WHERE job_id = 2;
ANALYZE earmark.account, earmark.account_limit, earmark.budget, earmark.budget_slot,
        earmark.job, earmark.ledger_entry, earmark.usage_shard, earmark.meter_mark;

-- the tables a call of this transaction holds a predicate lock on whole
CREATE FUNCTION pg_temp.whole_tables() RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(l.relation::regclass::text, ', ' ORDER BY l.relation::regclass::text), 'none')
      FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
     WHERE l.pid = pg_backend_pid() AND l.mode = 'SIReadLock' AND l.locktype = 'relation'
       AND c.relkind = 'r'
$$;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT admitted FROM earmark_reserve('sra', 10, 'sra-new', lease => interval '1 hour');
SELECT pg_temp.whole_tables() AS "reserve";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT admitted, remaining, reason FROM earmark_reserve('sra', 10, 'sra-3', lease => interval '1 hour');
SELECT pg_temp.whole_tables() AS "reserve, its key again";
ROLLBACK;

SET earmark.rate_limit = 1;
SELECT admitted FROM earmark_reserve('sra', 10, 'sra-rate-1', lease => interval '1 hour');
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT admitted, remaining, reason FROM earmark_reserve('sra', 10, 'sra-rate-2', lease => interval '1 hour');
SELECT pg_temp.whole_tables() AS "reserve, rate limited";
ROLLBACK;
SET earmark.rate_limit = 0;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT admitted, reason FROM earmark_reserve('sra', 5000, 'sra-big', lease => interval '1 hour');
SELECT pg_temp.whole_tables() AS "reserve, refused";
SELECT status FROM earmark.job WHERE account = 'sra' AND job_id = 2;
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT charged, capped FROM earmark_charge('sra', 3, 1);
SELECT pg_temp.whole_tables() AS "charge that fits";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT charged, capped, status FROM earmark_charge('sra', 3, 100);
SELECT pg_temp.whole_tables() AS "charge past the hold";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT charged, capped, status FROM earmark_charge('sra', 2, 1);
SELECT pg_temp.whole_tables() AS "charge past the lease";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT charged, capped, status FROM earmark_charge('sra', 1, 1);
SELECT pg_temp.whole_tables() AS "charge of a settled job";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT earmark_heartbeat('sra', 3) IS NOT NULL AS renewed;
SELECT pg_temp.whole_tables() AS "heartbeat";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT earmark_heartbeat('sra', 1) IS NOT NULL AS renewed;
SELECT pg_temp.whole_tables() AS "heartbeat of a settled job";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT charged, released, status FROM earmark_settle('sra', 3, 0);
SELECT pg_temp.whole_tables() AS "settle";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT charged, released, status FROM earmark_settle('sra', 3, 5);
SELECT pg_temp.whole_tables() AS "settle that charges";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT charged, released, status FROM earmark_settle('sra', 1, 5);
SELECT pg_temp.whole_tables() AS "settle of a settled job";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT earmark_record_usage('sra', 3, 'sra-u1');
SELECT pg_temp.whole_tables() AS "record_usage";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT earmark_record_usage('sra', 1, 'sra-u0');
SELECT pg_temp.whole_tables() AS "record_usage, its key again";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT earmark_record_usage('sra', -1, 'sra-u2');
SELECT pg_temp.whole_tables() AS "record_usage, a correction";
ROLLBACK;

BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT lim, used, held, remaining, limit_state FROM earmark_budget('sra');
SELECT lim, used, held, remaining, limit_state FROM earmark_budget('nobody');
SELECT pg_temp.whole_tables() AS "budget";
ROLLBACK;

\set VERBOSITY terse
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT earmark_record_usage('sra', -5, 'sra-u3');
ROLLBACK;
\set VERBOSITY default

-- (the correction's check: sra's cycle has 1 unit, of the set-up's usage
-- record; srb's too, which a correction of 1 takes to 0)
SELECT earmark_record_usage('srb', -1, 'srb-u1');
SELECT used FROM earmark_budget('srb');

RESET earmark.rate_limit;
