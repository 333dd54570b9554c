-- The gate: the four ways a limit breaks (docs/design.md, "The four ways a limit breaks") and the rules of
-- reserve, charge, heartbeat, settle and sweep.  The worker sweeps another
-- database, so nothing here is settled unless a statement does it.
SET client_min_messages = warning;
-- holds outlive the slowest run (valgrind): a lease passes only where a
-- test says so
SET earmark.lease = '1h';
\pset null '<null>'
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

-- Every account here starts its cycle 14 to 17 days ago (midnight UTC, day
-- 28 at the latest), so that no cycle ends while the file runs, on any
-- date: a cycle that ended between two calls would split their holds and
-- usage over two budgets.
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset
SELECT count(*) AS anchored
FROM unnest(ARRAY['five', 'overrun', 'halfway', 'vanish', 'settle', 'steps', 'idem', 'idem-2', 'plan', 'free', 'reclaim', 'rated', 'rated-2', 'edge']) a, LATERAL earmark_set_account(a, :'anchor');

-- 1. Many jobs pass the same check: with a hold, five jobs of 40,000 on a
--    plan of 100,000 admit two and refuse three with the amount left.
SELECT earmark_set_limit('five', 100000);
SELECT n, r.admitted, r.remaining, r.reason
FROM generate_series(1, 5) n, LATERAL earmark_reserve('five', 40000, 'job-' || n) r
ORDER BY n;
SELECT lim, used, held, remaining, limit_state FROM earmark_budget('five');

-- 2. A job costs more than its estimate: it is capped at its hold.
SELECT earmark_set_limit('overrun', 100000);
SELECT job_id AS overrun FROM earmark_reserve('overrun', 10000, 'est-10k') \gset
SELECT * FROM earmark_charge('overrun', :overrun, 6000);
SELECT * FROM earmark_charge('overrun', :overrun, 9000);   -- would pass the hold: capped
SELECT * FROM earmark_charge('overrun', :overrun, 1);      -- a capped job charges nothing more
SELECT * FROM earmark_settle('overrun', :overrun, 15000);  -- settle charges at most the hold
SELECT used, held FROM earmark_budget('overrun');

-- 3. A job fails at 60%: charged 60%, the rest released.
SELECT earmark_set_limit('halfway', 100000);
SELECT job_id AS halfway FROM earmark_reserve('halfway', 40000, 'fails') \gset
SELECT * FROM earmark_charge('halfway', :halfway, 24000);
SELECT * FROM earmark_settle('halfway', :halfway, NULL, 'failed');  -- recorded use: 24000
SELECT used, held FROM earmark_budget('halfway');

-- 4. A worker disappears: the lease passes, the job is dead before the
--    sweep, the sweep settles it at its recorded use, and the late settle
--    is ignored.  "The lease has passed" is written into the job row
--    (lease_until a moment before the wall clock) instead of waited for, so
--    that a slow machine cannot pass a lease early or late.
SELECT earmark_set_limit('vanish', 100000);
SELECT job_id AS vanish FROM earmark_reserve('vanish', 40000, 'lost', lease => '1 hour') \gset
SELECT * FROM earmark_charge('vanish', :vanish, 7000);
UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = :vanish;
SELECT * FROM earmark_charge('vanish', :vanish, 1000);    -- dead already: nothing charged
SELECT earmark_heartbeat('vanish', :vanish);              -- cannot be revived
SELECT earmark_sweep();
SELECT status, charged, released FROM earmark.job WHERE job_id = :vanish;
SELECT * FROM earmark_settle('vanish', :vanish, 40000);   -- late: ignored
SELECT used, held FROM earmark_budget('vanish');

-- A late settle that arrives before the sweep ends the job 'expired' at
-- its recorded use too, exactly as the sweeper would.
SELECT job_id AS late FROM earmark_reserve('vanish', 1000, 'late', lease => '1 hour') \gset
SELECT * FROM earmark_charge('vanish', :late, 300);
UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = :late;
SELECT * FROM earmark_settle('vanish', :late, 900, 'completed');
SELECT earmark_sweep();                         -- nothing left to sweep
SELECT used, held FROM earmark_budget('vanish');

-- Settle: charged = min(coalesce(used, recorded), held); settles once.
SELECT earmark_set_limit('settle', 100000);
SELECT job_id AS s1 FROM earmark_reserve('settle', 40000, 's1') \gset
SELECT * FROM earmark_charge('settle', :s1, 5000);
SELECT * FROM earmark_settle('settle', :s1, 31200);
SELECT * FROM earmark_settle('settle', :s1, 100);         -- second settle: nothing
SELECT * FROM earmark_settle('settle', :s1, NULL, 'cancelled');
SELECT * FROM earmark_charge('settle', :s1, 10);          -- a settled job charges nothing
SELECT job_id AS s2 FROM earmark_reserve('settle', 1000, 's2') \gset
SELECT * FROM earmark_settle('settle', :s2, NULL, 'cancelled');   -- nothing used
SELECT used, held, remaining FROM earmark_budget('settle');

-- Step: a retried step is a no-op; a new step charges.
SELECT earmark_set_limit('steps', 100000);
SELECT job_id AS st FROM earmark_reserve('steps', 10000, 'st') \gset
SELECT * FROM earmark_charge('steps', :st, 1000, 1);
SELECT * FROM earmark_charge('steps', :st, 1000, 1);     -- retried
SELECT * FROM earmark_charge('steps', :st, 1000, 0);     -- older step
SELECT * FROM earmark_charge('steps', :st, 1000, 2);
SELECT * FROM earmark_charge('steps', :st, 500);         -- no step: always charges
SELECT used, last_step FROM earmark.job WHERE job_id = :st;

-- Every charge renews the lease; a heartbeat renews it without a charge.
-- The job's lease is an hour; each time it is made to end in a minute
-- first, and a renewal sets its end to the call's time plus the hour (t0 is
-- read before the call).
SELECT job_id AS hb FROM earmark_reserve('steps', 100, 'hb', lease => '1 hour') \gset
UPDATE earmark.job SET lease_until = clock_timestamp() + interval '1 minute' WHERE job_id = :hb;
SELECT clock_timestamp() AS t0 \gset
SELECT charged, status FROM earmark_charge('steps', :hb, 10);
SELECT lease_until >= :'t0'::timestamptz + interval '1 hour' AS renewed_by_charge,
       lease_until <= clock_timestamp() + interval '1 hour' AS by_its_lease
FROM earmark.job WHERE job_id = :hb;
UPDATE earmark.job SET lease_until = clock_timestamp() + interval '1 minute' WHERE job_id = :hb;
SELECT clock_timestamp() AS t0 \gset
SELECT earmark_heartbeat('steps', :hb) >= :'t0'::timestamptz + interval '1 hour' AS renewed;
SELECT used, lease_until >= :'t0'::timestamptz + interval '1 hour' AS renewed_by_heartbeat
FROM earmark.job WHERE job_id = :hb;
SELECT charged, status FROM earmark_charge('steps', :hb, 10);   -- still running
SELECT * FROM earmark_settle('steps', :hb);

-- Idempotency: the same key returns the same job and holds nothing new.
SELECT earmark_set_limit('idem', 50000);
SELECT job_id AS k1 FROM earmark_reserve('idem', 20000, 'key-1') \gset
SELECT job_id = :k1 AS same_job, admitted, remaining, reason
FROM earmark_reserve('idem', 20000, 'key-1');
SELECT held FROM earmark_budget('idem');
-- ... also after it settled
SELECT charged FROM earmark_settle('idem', :k1, 100);
SELECT job_id = :k1 AS same_job, admitted, reason FROM earmark_reserve('idem', 20000, 'key-1');
SELECT used, held FROM earmark_budget('idem');
-- the same key with another amount or feature is an error (EM001)
\set VERBOSITY sqlstate
SELECT * FROM earmark_reserve('idem', 20001, 'key-1');
SELECT * FROM earmark_reserve('idem', 20000, 'key-1', 'images');
\set VERBOSITY default
SELECT * FROM earmark_reserve('idem', 20001, 'key-1');
-- the same key on another account is another job
SELECT earmark_set_limit('idem-2', 50000);
SELECT job_id <> :k1 AS other_job, admitted FROM earmark_reserve('idem-2', 20000, 'key-1');
-- a refused key may be tried again once there is room
SELECT admitted, reason FROM earmark_reserve('idem', 60000, 'big');
SELECT earmark_set_limit('idem', 200000);
SELECT admitted, remaining FROM earmark_reserve('idem', 60000, 'big');

-- A limit change applies to the next admission; running holds stay.
SELECT earmark_set_limit('plan', 100000);
SELECT admitted FROM earmark_reserve('plan', 70000, 'p1');
SELECT earmark_set_limit('plan', 50000);
SELECT lim, used, held, remaining FROM earmark_budget('plan');
SELECT admitted, remaining, reason FROM earmark_reserve('plan', 1, 'p2');
SELECT status FROM earmark.job WHERE idempotency_key = 'p1';

-- NULL limit: unlimited.  No limit: refused, fail closed.
SELECT earmark_set_limit('free', NULL);
SELECT admitted, remaining, reason FROM earmark_reserve('free', 9000000000000000000, 'huge');
SELECT lim, held, remaining, limit_state FROM earmark_budget('free');
SELECT * FROM earmark_reserve('free', 9000000000000000000, 'huge-2');   -- held would overflow
SELECT * FROM earmark_reserve('nobody', 1, 'k');
SELECT lim, used, held, remaining, limit_state FROM earmark_budget('nobody');
SELECT count(*) AS accounts_created FROM earmark.account WHERE account = 'nobody';
SELECT earmark_set_account('unset');
SELECT admitted, reason FROM earmark_reserve('unset', 1, 'k');

-- Expired holds never cause a refusal: reserve reclaims them first.
SELECT earmark_set_limit('reclaim', 10000);
SELECT job_id AS r1 FROM earmark_reserve('reclaim', 8000, 'r1', lease => '1 hour') \gset
SELECT * FROM earmark_charge('reclaim', :r1, 2500);
UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = :r1;
SELECT admitted, remaining FROM earmark_reserve('reclaim', 7500, 'r2');
SELECT status, charged, released FROM earmark.job WHERE job_id = :r1;
SELECT used, held FROM earmark_budget('reclaim');

-- Rate limit: at most earmark.rate_limit admissions a minute (GCRA);
-- refusals and repeats do not count.
SET earmark.rate_limit = 3;
SELECT earmark_set_limit('rated', 1000);
SELECT n, r.admitted, r.reason
FROM generate_series(1, 5) n, LATERAL earmark_reserve('rated', 1, 'rate-' || n) r ORDER BY n;
SELECT admitted, reason FROM earmark_reserve('rated', 1, 'rate-1');   -- a repeat
SELECT held FROM earmark_budget('rated');
-- the rate is the account's, over all its features
SELECT earmark_set_limit('rated', 1000, 'images');
SELECT admitted, reason FROM earmark_reserve('rated', 1, 'img-1', 'images');
-- another account has its own
SELECT earmark_set_limit('rated-2', 1000);
SELECT admitted, reason FROM earmark_reserve('rated-2', 1, 'rate-1');
RESET earmark.rate_limit;

-- The ledger: one entry per settled job that used something, keyed by the
-- job (the settled job row itself, no row of earmark.ledger_entry); each
-- changed cycle marked for the meter once.
SELECT b.account, l.units, l.entry_id IS NULL AS job_row
FROM earmark.ledger l JOIN earmark.budget b USING (budget_id)
ORDER BY l.occurred_at, l.job_id;
SELECT count(*) AS ledger_entry_rows FROM earmark.ledger_entry;
SELECT b.account FROM earmark.meter_mark m JOIN earmark.budget b USING (budget_id) ORDER BY 1;
-- invariants: used = ledger sum, held = sum of open holds, used + held <= lim
-- (but for 'plan', whose limit was lowered under a running hold)
SELECT b.account, b.used, coalesce(sum(l.units), 0) AS ledger
FROM earmark.budget b LEFT JOIN earmark.ledger l USING (account, budget_id)
GROUP BY b.account, b.budget_id HAVING b.used <> coalesce(sum(l.units), 0);
SELECT b.account, b.held
FROM earmark.budget b
WHERE b.held <> (SELECT coalesce(sum(amount), 0) FROM earmark.job j
                 WHERE j.budget_id = b.budget_id AND j.status IN ('running', 'capped'));
SELECT b.account FROM earmark.budget b JOIN earmark.account_limit l USING (account, feature)
WHERE b.used + b.held > l.lim;

-- 12. Charges at the edges: the tokens that exactly fill the hold are not
--     capped, one more is; bigint's largest is capped, not an overflow; a
--     charge of nothing on a full job changes nothing; each charge of a
--     running job renews its lease.
SELECT earmark_set_limit('edge', 1000);
SELECT job_id AS edge1 FROM earmark_reserve('edge', 100, 'edge-1', lease => '1 hour') \gset
UPDATE earmark.job SET lease_until = lease_until - interval '30 minutes' WHERE job_id = :edge1;
SELECT * FROM earmark_charge('edge', :edge1, 60);
SELECT lease_until > now() + interval '59 minutes' AS renewed FROM earmark.job WHERE job_id = :edge1;
SELECT * FROM earmark_charge('edge', :edge1, 40);        -- exactly the rest
SELECT * FROM earmark_charge('edge', :edge1, 0);
SELECT job_id AS edge2 FROM earmark_reserve('edge', 100, 'edge-2') \gset
SELECT * FROM earmark_charge('edge', :edge2, 101);       -- one over: capped at 100
SELECT job_id AS edge3 FROM earmark_reserve('edge', 100, 'edge-3') \gset
SELECT * FROM earmark_charge('edge', :edge3, 7, 1);
SELECT * FROM earmark_charge('edge', :edge3, 9223372036854775807, 2);
SELECT * FROM earmark_charge('edge', :edge3, 1, 3);      -- capped: nothing more
SELECT idempotency_key, used, last_step, status FROM earmark.job WHERE account = 'edge' ORDER BY job_id;
