-- Escrow (docs/design.md, "Escrow for hot accounts"): a hot budget's free room split into slots.  The
-- limit stays exact: admissions take room from a slot (fast path) or from
-- the whole budget under its lock (slow path, which re-cuts the slots); a
-- refusal names what the whole budget has left; a lowered limit stops the
-- slots cut for the old one.  The rate limit is off here: this file is
-- about room, not rate.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
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
FROM unnest(ARRAY['hot', 'sweepy']) a, LATERAL earmark_set_account(a, :'anchor');

CREATE FUNCTION books(acct text) RETURNS TABLE (lim bigint, used bigint, held bigint, remaining bigint,
                                                open_holds bigint, ledger bigint, within boolean)
LANGUAGE sql AS $$
    SELECT b.lim, b.used, b.held, b.remaining,
           (SELECT coalesce(sum(amount), 0) FROM earmark.job j
             WHERE j.account = acct AND j.status IN ('running', 'capped'))::bigint,
           (SELECT coalesce(sum(units), 0) FROM earmark.ledger l JOIN earmark.budget x USING (budget_id)
             WHERE x.account = acct)::bigint,
           b.used + b.held <= b.lim
    FROM earmark_budget(acct) b
$$;
-- the slots of a budget, summed: admissions and settlements pick a free
-- slot at random (and top-ups follow), so only these sums are fixed
CREATE FUNCTION slots(acct text DEFAULT 'hot') RETURNS TABLE (slots bigint, held bigint, used bigint, gens text)
LANGUAGE sql AS $$
    SELECT count(*), sum(s.held), sum(s.used), min(s.gen) || '-' || max(s.gen)
    FROM earmark.budget_slot s JOIN earmark.budget b USING (budget_id) WHERE b.account = acct
$$;
-- the rooms right after a rebalance that gathered every slot cut them:
-- half of the free room, evenly (slot order)
CREATE FUNCTION rooms(acct text DEFAULT 'hot') RETURNS bigint[] LANGUAGE sql AS $$
    SELECT array_agg(room ORDER BY slot) FROM earmark.budget_slot s JOIN earmark.budget b USING (budget_id)
    WHERE b.account = acct
$$;

SELECT earmark_set_limit('hot', 1000);
SELECT earmark_set_escrow('hot', 4);
-- the first admission takes the slow path and cuts the rest into 4 slots
SELECT * FROM earmark_reserve('hot', 100, 'a');
SELECT rooms();
SELECT used, held, slots, slot_lim, slot_gen FROM earmark.budget;
-- the next ones take room from a slot, without the budget row
SELECT * FROM earmark_reserve('hot', 100, 'b');
SELECT * FROM earmark_reserve('hot', 100, 'c');
SELECT job_id, slot IS NOT NULL AS in_a_slot, amount FROM earmark.job ORDER BY job_id;
SELECT * FROM slots();
-- a settle gives its released room back to a slot
SELECT * FROM earmark_settle('hot', 2, 30);
SELECT * FROM slots();
SELECT * FROM books('hot');
-- idempotency holds on both paths
SELECT job_id, admitted, reason FROM earmark_reserve('hot', 100, 'b');
SELECT job_id, admitted, reason FROM earmark_reserve('hot', 100, 'a');
-- a job bigger than any slot's room: the slow path finds it in the whole budget
SELECT job_id, slot IS NOT NULL AS in_a_slot, admitted, remaining FROM earmark_reserve('hot', 400, 'big') r
    LEFT JOIN earmark.job USING (job_id);
SELECT * FROM slots();
-- fill it: exactly up to the limit, then refusals with what is left
SELECT n, r.admitted, r.remaining, r.reason
FROM generate_series(1, 6) n, LATERAL earmark_reserve('hot', 100, 'x' || n) r ORDER BY n;
SELECT * FROM books('hot');
SELECT admitted, remaining, reason FROM earmark_reserve('hot', 70, 'last-70');
SELECT admitted, remaining, reason FROM earmark_reserve('hot', 1, 'one-more');
SELECT * FROM books('hot');

-- a lower limit: the next admission re-cuts, the old slots stop admitting
SELECT earmark_settle('hot', job_id, 0, 'cancelled') IS NOT NULL FROM earmark.job
WHERE account = 'hot' AND idempotency_key IN ('x1', 'x2', 'x3');
SELECT earmark_set_limit('hot', 800);
SELECT admitted, remaining, reason FROM earmark_reserve('hot', 1, 'after-lower');
SELECT * FROM slots();
SELECT rooms();
SELECT used, held, slot_lim, slot_gen FROM earmark.budget;
SELECT * FROM books('hot');

-- expired holds in slots: reserve's reclaim and the sweeper settle them
SELECT earmark_set_limit('sweepy', 1000);
SELECT earmark_set_escrow('sweepy', 2);
SELECT count(*) FILTER (WHERE admitted) AS admitted
FROM generate_series(1, 5) n, LATERAL earmark_reserve('sweepy', 200, 's' || n, lease => '1 hour');
SELECT charged FROM earmark_charge('sweepy', (SELECT job_id FROM earmark.job WHERE account = 'sweepy' AND idempotency_key = 's2'), 50);
-- their leases pass (written into the job rows, not waited for)
UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE account = 'sweepy';
SELECT earmark_sweep();
SELECT status, count(*), sum(charged) FROM earmark.job WHERE account = 'sweepy' GROUP BY 1;
SELECT * FROM books('sweepy');
SELECT admitted FROM earmark_reserve('sweepy', 950, 'whole');
SELECT * FROM books('sweepy');

-- escrow off: the slots are drained into the budget at the next rebalance
SELECT earmark_set_escrow('hot', 0);
SELECT admitted, remaining FROM earmark_reserve('hot', 10, 'plain');
SELECT sum(room) AS room_left_in_slots FROM earmark.budget_slot s JOIN earmark.budget b USING (budget_id)
WHERE b.account = 'hot';
SELECT * FROM books('hot');

-- bad input
\set VERBOSITY sqlstate
SELECT earmark_set_escrow('hot', -1);
SELECT earmark_set_escrow('hot', 257);
SELECT earmark_set_escrow('nobody', 4);
SELECT earmark_set_escrow(NULL, 4);
SELECT earmark_set_escrow('hot', NULL);
