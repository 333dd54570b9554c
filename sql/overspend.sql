-- Overspend paths an outside review reproduced (0.2.0), each as it was
-- found, and earmark_check() on the states they left.
--
-- 1. Escrow handed released room back out while the budget was over its
--    limit: a limit lowered under running holds (or recorded usage past
--    the limit) re-cuts the slots at room 0 in a new generation; a settle
--    of a job taken from a slot of the old generation then gave its unused
--    part to a slot of the new one, and the fast path admitted from it.
-- 2. earmark_check() on states the gate must never leave: an admission
--    into a budget that was over its limit (recorded usage included), and
--    holds in two overlapping cycles of one account.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
\pset null '<null>'
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.evidence, earmark.ledger_entry,
         earmark.job, earmark.budget_slot, earmark.budget, earmark.usage_shard, earmark.account_limit,
         earmark.account RESTART IDENTITY CASCADE;

-- Every account here starts its cycle 14 to 17 days ago (midnight UTC, day
-- 28 at the latest), so that no cycle ends while the file runs, on any
-- date: a cycle that ended between two calls would split their holds and
-- usage over two budgets.
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset
SELECT count(*) AS anchored
FROM unnest(ARRAY['low', 'rec']) a, LATERAL earmark_set_account(a, :'anchor');

-- what is open and used in an account's cycle, slots and counters included
CREATE FUNCTION open_total(acct text) RETURNS TABLE (lim bigint, used bigint, held bigint, open_holds bigint)
LANGUAGE sql AS $$
    SELECT b.lim, b.used, b.held,
           (SELECT coalesce(sum(amount), 0) FROM earmark.job j
             WHERE j.account = acct AND j.status IN ('running', 'capped'))::bigint
    FROM earmark_budget(acct) b
$$;

-- 1a. limit 100, 4 slots: 1 (outside the slots), 10 and 10 from slots
SELECT earmark_set_limit('low', 100);
SELECT earmark_set_escrow('low', 4);
SELECT admitted, remaining FROM earmark_reserve('low', 1, 'a');
SELECT admitted, remaining FROM earmark_reserve('low', 10, 'b');
SELECT admitted, remaining FROM earmark_reserve('low', 10, 'c');
SELECT idempotency_key, slot IS NOT NULL AS from_a_slot FROM earmark.job WHERE account = 'low' ORDER BY job_id;
-- the limit is lowered to 15 under 21 of holds; a reserve of 1 is refused
-- (and re-cuts the slots for the new limit)
SELECT earmark_set_limit('low', 15);
SELECT admitted, remaining, reason FROM earmark_reserve('low', 1, 'd');
-- b ends unused: its 10 go back, but the budget is still over (11 of 15
-- held: 4 left), so a reserve of 10 must be refused
SELECT charged, released, status FROM earmark_settle('low', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'b' AND account = 'low'), 0);
SELECT admitted, remaining, reason FROM earmark_reserve('low', 10, 'e');
SELECT admitted, remaining, reason FROM earmark_reserve('low', 4, 'f');
SELECT * FROM open_total('low');
SELECT invariant, account FROM earmark_check() ORDER BY invariant, account;

-- 1b. the same with usage recorded past the limit instead of a lower limit
SELECT earmark_set_limit('rec', 100);
SELECT earmark_set_escrow('rec', 4);
SELECT admitted, remaining FROM earmark_reserve('rec', 1, 'a');
SELECT admitted, remaining FROM earmark_reserve('rec', 10, 'b');
SELECT admitted, remaining FROM earmark_reserve('rec', 10, 'c');
SELECT earmark_record_usage('rec', 95, 'usage-95');
SELECT admitted, remaining, reason FROM earmark_reserve('rec', 1, 'd');
SELECT charged, released, status FROM earmark_settle('rec', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'b' AND account = 'rec'), 0);
SELECT admitted, remaining, reason FROM earmark_reserve('rec', 10, 'e');
SELECT * FROM open_total('rec');

-- 1c. settles of the new generation's holds still refill its slots, and
-- settles of the old generation's holds free room the next cut hands out
SELECT earmark_set_limit('low', 1000);
SELECT admitted FROM earmark_reserve('low', 100, 'g');
SELECT admitted FROM earmark_reserve('low', 50, 'h');
SELECT j.idempotency_key, s.charged, s.released, s.status
  FROM earmark.job j, earmark_settle('low', j.job_id, 0) s
 WHERE j.account = 'low' AND j.status = 'running' ORDER BY j.job_id;
SELECT * FROM open_total('low');
SELECT admitted, remaining FROM earmark_reserve('low', 1000, 'whole');
SELECT admitted, remaining, reason FROM earmark_reserve('low', 1, 'one-more');
SELECT invariant, account FROM earmark_check() ORDER BY invariant, account;

-- 2. earmark_check() on states the gate must never leave, written by hand
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.evidence, earmark.ledger_entry,
         earmark.job, earmark.budget_slot, earmark.budget, earmark.usage_shard, earmark.account_limit,
         earmark.account RESTART IDENTITY CASCADE;
-- ('moved' keeps the calendar month: its part moves the anchor itself)
SELECT count(*) AS anchored FROM earmark_set_account('over', :'anchor');
SELECT earmark_set_limit('over', 100);
SELECT admitted FROM earmark_reserve('over', 60, 'x');
-- usage recorded past the limit is not an overspend by itself ...
SELECT earmark_record_usage('over', 50, 'late-usage');
SELECT invariant, account, detail FROM earmark_check() ORDER BY invariant;
-- ... but a hold admitted after it is
BEGIN;
INSERT INTO earmark.job (budget_id, account, feature, idempotency_key, amount, lease, lease_until, created_at)
SELECT budget_id, 'over', 'default', 'forged', 10, interval '1 hour', now() + interval '1 hour', clock_timestamp()
  FROM earmark.budget WHERE account = 'over';
UPDATE earmark.budget SET held = held + 10 WHERE account = 'over';
SELECT invariant, account FROM earmark_check() ORDER BY invariant;
ROLLBACK;
-- a lower limit under running holds is not an overspend either ...
SELECT earmark_set_limit('over', 50);
SELECT invariant, account FROM earmark_check() ORDER BY invariant;
-- ... but an admission after it is
BEGIN;
INSERT INTO earmark.job (budget_id, account, feature, idempotency_key, amount, lease, lease_until, created_at)
SELECT budget_id, 'over', 'default', 'forged', 10, interval '1 hour', now() + interval '1 hour', clock_timestamp()
  FROM earmark.budget WHERE account = 'over';
UPDATE earmark.budget SET held = held + 10 WHERE account = 'over';
SELECT invariant, account FROM earmark_check() ORDER BY invariant;
ROLLBACK;
-- holds in two overlapping cycles of one account (the cycle anchor moved
-- under a hold): each cycle alone is within the limit, together they are not
SELECT earmark_set_limit('moved', 100);
SELECT admitted FROM earmark_reserve('moved', 60, 'm1');
BEGIN;
UPDATE earmark.account SET cycle_anchor = date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                                          - interval '1 month' + interval '14 days'
 WHERE account = 'moved';
INSERT INTO earmark.budget (account, feature, cycle_start, cycle_end, held)
SELECT 'moved', 'default', b.cycle_start, b.cycle_end, 60 FROM earmark_budget('moved') b;
INSERT INTO earmark.job (budget_id, account, feature, idempotency_key, amount, lease, lease_until, created_at)
SELECT budget_id, 'moved', 'default', 'm2', 60, interval '1 hour', now() + interval '1 hour', clock_timestamp()
  FROM earmark.budget WHERE account = 'moved' ORDER BY budget_id DESC LIMIT 1;
SELECT invariant, account FROM earmark_check() WHERE account = 'moved' ORDER BY invariant;
ROLLBACK;

-- 3. bad input that used to pass silently: a negative step
SELECT job_id AS j FROM earmark.job WHERE account = 'over' AND idempotency_key = 'x' \gset
SELECT * FROM earmark_charge('over', :j, 1, step => -1);
SELECT used, last_step FROM earmark.job WHERE job_id = :j;

DROP FUNCTION open_total(text);
