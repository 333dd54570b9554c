-- Automatic escrow (docs/design.md, "Escrow for hot accounts"): a budget
-- whose row earmark.auto_escrow_contenders reserves queue on at once gets
-- earmark.auto_escrow_slots slots, unless its account has its own number
-- (earmark_set_escrow, 0 included).  One session cannot queue on a row:
-- contenders = 1 makes every reserve on the budget row's path count as
-- contended, to test the rule; test/isolation/specs/auto_escrow.spec
-- queues real sessions.  The rate limit is off: this file is about room.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
SET earmark.lease = '1h';
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

-- every account's cycle began 14 to 17 days ago: none ends while this runs
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset
SELECT count(*) AS accounts
FROM unnest(ARRAY['cold', 'warm', 'off', 'manual0', 'manual4']) a,
     LATERAL earmark_set_account(a, :'anchor'),
     LATERAL earmark_set_limit(a, 1000);

-- the budget's slots, its generation, its slot rows, and the books over
-- the budget row and the slots (used + held within the limit; held the
-- open holds)
CREATE FUNCTION escrow_of(acct text)
RETURNS TABLE (slots int, cut boolean, slot_rows bigint, held bigint, open_holds bigint, within boolean)
LANGUAGE sql AS $$
    SELECT b.slots, b.slot_gen > 0,
           (SELECT count(*) FROM earmark.budget_slot t WHERE t.budget_id = b.budget_id),
           e.held,
           (SELECT coalesce(sum(amount), 0) FROM earmark.job j
             WHERE j.account = acct AND j.status IN ('running', 'capped'))::bigint,
           e.used + e.held <= e.lim
    FROM earmark.budget b, earmark_budget(acct) e
    WHERE b.account = acct
$$;

SHOW earmark.auto_escrow_slots;
SHOW earmark.auto_escrow_contenders;

-- uncontended (the default threshold, one session): no slots
SELECT admitted, remaining FROM earmark_reserve('cold', 10, 'c1');
SELECT admitted, remaining FROM earmark_reserve('cold', 10, 'c2');
SELECT * FROM escrow_of('cold');

-- contended: the reserve that holds the row gives the budget 64 slots and
-- cuts them (half of what is free); the next reserve admits from a slot
SET earmark.auto_escrow_contenders = 1;
SELECT admitted, remaining FROM earmark_reserve('warm', 600, 'w1');
SELECT * FROM escrow_of('warm');
SELECT admitted, remaining FROM earmark_reserve('warm', 1, 'w2');
SELECT slot IS NOT NULL AS from_a_slot FROM earmark.job WHERE idempotency_key = 'w2';
-- the limit stays exact: 399 are left in all, slots included
SELECT admitted, remaining, reason FROM earmark_reserve('warm', 400, 'w3');
SELECT admitted, remaining, reason FROM earmark_reserve('warm', 399, 'w4');
SELECT admitted, remaining, reason FROM earmark_reserve('warm', 1, 'w5');
SELECT * FROM escrow_of('warm');

-- off: contended, but earmark.auto_escrow_slots = 0 gives none
SET earmark.auto_escrow_slots = 0;
SELECT admitted, remaining FROM earmark_reserve('off', 10, 'o1');
SELECT * FROM escrow_of('off');
RESET earmark.auto_escrow_slots;

-- an account's own number wins: 0 means no slots, 4 means 4
SELECT earmark_set_escrow('manual0', 0);
SELECT earmark_set_escrow('manual4', 4);
SELECT admitted, remaining FROM earmark_reserve('manual0', 10, 'm1');
SELECT admitted, remaining FROM earmark_reserve('manual4', 10, 'm2');
SELECT * FROM escrow_of('manual0');
SELECT * FROM escrow_of('manual4');

-- and after the fact: 0 set on a budget that got slots by itself drains
-- them (the next reserve on the row's path), and they do not come back
SELECT earmark_set_escrow('warm', 0);
SELECT earmark_settle('warm', job_id, 0) FROM earmark.job
 WHERE idempotency_key IN ('w1', 'w4') ORDER BY job_id;
SELECT admitted, remaining FROM earmark_reserve('warm', 5, 'w6');
SELECT admitted, remaining FROM earmark_reserve('warm', 5, 'w7');
SELECT slot IS NOT NULL AS from_a_slot FROM earmark.job WHERE idempotency_key = 'w7';
SELECT * FROM escrow_of('warm');
SELECT sum(room) AS room_in_slots FROM earmark.budget_slot WHERE account = 'warm';

SELECT count(*) AS violations FROM earmark_check();
RESET earmark.auto_escrow_contenders;
DROP FUNCTION escrow_of(text);
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
