-- review_upgrade_room: ALTER EXTENSION earmark UPDATE from 0.2.0 must not
-- leave room that 0.2.0 released into the slots of a budget that is over
-- its limit usable by 0.3.0's fast path.
--
-- The 0.2.0 state is the outside review's sequence (sql/overspend.sql,
-- part 1a), written as 0.2.0 left it: limit 100 and 2 slots; holds of 1
-- (outside the slots) and 10 and 10 (both from slot 1, generation 1); the
-- limit lowered to 15; a rebalance cut generation 2 with no room; then
-- 0.2.0 settled one 10 at zero use into the free slot 0 of generation 2,
-- which got its 10 as room.  11 are held against 15 after the update, so
-- 4 are left: a reserve of 10 must be refused, whichever path it takes.
-- (The rows are written as the superuser, as test/integration/upgrade.sh
-- does: the installed library is 0.3.0's.  In a database of its own, which
-- it drops at the end.)
-- Its rows are written with now() and read back through the current cycle:
-- at a faked month's end (scripts/test.sh's dates layer) it waits out a month
-- boundary less than a minute away, so that all of it runs in one cycle.
DO $$
BEGIN
    IF date_trunc('month', (clock_timestamp() + interval '1 minute') AT TIME ZONE 'UTC')
       > date_trunc('month', clock_timestamp() AT TIME ZONE 'UTC') THEN
        PERFORM pg_sleep(70);
    END IF;
END $$;
SELECT current_database() AS regress_db \gset
CREATE DATABASE review_upgrade_room;
\c review_upgrade_room
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
CREATE EXTENSION earmark VERSION '0.2.0';

INSERT INTO earmark.account (account, escrow_slots) VALUES ('hot', 2);
INSERT INTO earmark.account_limit (account, feature, lim) VALUES ('hot', 'default', 15);
INSERT INTO earmark.budget (account, feature, cycle_start, cycle_end, used, held, slots, slot_lim, slot_gen)
SELECT 'hot', 'default', s, s + interval '1 month', 0, 1, 2, 15, 2
  FROM (SELECT date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS s) c;
-- slot 0 got the released 10; slot 1 still holds both 10s it gave out
INSERT INTO earmark.budget_slot (budget_id, slot, gen, room, held, used)
SELECT b.budget_id, s.*
  FROM earmark.budget b, (VALUES (0, 2, 10, -10, 0), (1, 2, 0, 20, 0)) AS s (slot, gen, room, held, used);
INSERT INTO earmark.job (budget_id, account, feature, idempotency_key, amount, status, slot, lease, lease_until)
SELECT b.budget_id, 'hot', 'default', j.k, j.amount, 'running', j.slot, '1 hour', now() + interval '1 hour'
  FROM earmark.budget b, (VALUES ('a', 1, NULL::int), ('c', 10, 1)) AS j (k, amount, slot);
INSERT INTO earmark.job (budget_id, account, feature, idempotency_key, amount, status, slot, lease, lease_until,
                         settled_at, charged, released)
SELECT b.budget_id, 'hot', 'default', 'b', 10, 'cancelled', 1, '1 hour', now() + interval '1 hour', now(), 0, 10
  FROM earmark.budget b;

ALTER EXTENSION earmark UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'earmark';
-- 0.2.0's books hold: 11 held, nothing else wrong
SELECT invariant, account FROM earmark_check() ORDER BY invariant, account;
SELECT lim, used, held, remaining FROM earmark_budget('hot');

-- a reserve of 10 with 4 left: refused
SELECT admitted, remaining, reason FROM earmark_reserve('hot', 10, 'e');
SELECT lim, used, held, remaining FROM earmark_budget('hot');
SELECT invariant, account FROM earmark_check() ORDER BY invariant, account;

\c :regress_db
DROP DATABASE review_upgrade_room;
