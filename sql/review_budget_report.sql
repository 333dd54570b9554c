-- earmark_budget's report by key from C (ledger.c report_direct) against
-- what its two SQL statements answered (03b3dad): an unknown account, no
-- limit row for the feature, a NULL limit, the provider's source, an
-- anchor's cycles in the past and the future, escrow slots, recorded usage
-- and corrections, a lowered limit, own writes of the same transaction and
-- of the same statement, REPEATABLE READ, and sums past a bigint (22003,
-- only when a total is past it).  Every answer here is 03b3dad's too
-- (its errors had a CONTEXT line, the SQL statement).
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget_slot,
         earmark.budget, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;
SELECT * FROM earmark_budget('nobody', at => '2026-11-19 12:00+00');
SELECT earmark_set_limit('a1', 1000, 'f1') IS NOT NULL AS made;
SELECT * FROM earmark_budget('a1', 'f2', '2026-11-19 12:00+00');
SELECT * FROM earmark_budget('a1', 'f1', '2026-11-19 12:00+00');
SELECT earmark_set_limit('a2', NULL) IS NOT NULL AS made;
SELECT * FROM earmark_budget('a2', at => '2026-11-19 12:00+00');
SELECT earmark_set_limit('a3', 500) IS NOT NULL AS made;
UPDATE earmark.account_limit SET source = 'provider' WHERE account = 'a3';
SELECT * FROM earmark_budget('a3', at => '2026-11-19 12:00+00');
SELECT earmark_set_account('a3', '2026-10-06 07:30:00+00') IS NOT NULL AS anchored;
SELECT * FROM earmark_budget('a3', at => '2026-11-19 12:00+00');
SELECT * FROM earmark_budget('a3', at => '2026-01-01 00:00+00');
SELECT * FROM earmark_budget('a3', at => '2099-01-31 00:00+00');
\set VERBOSITY terse
SELECT * FROM earmark_budget('a3', at => 'infinity');
SELECT * FROM earmark_budget('nobody', at => '-infinity');
SELECT * FROM earmark_budget(NULL);
SELECT * FROM earmark_budget('a3', NULL);
\set VERBOSITY default
-- holds, escrow slots, a settle, recorded usage and a correction
SELECT admitted FROM earmark_reserve('a1', 100, 'k1', 'f1', '1 hour');
SELECT lim, used, held, remaining, limit_state FROM earmark_budget('a1', 'f1');
SELECT earmark_set_escrow('a1', 3) IS NOT NULL AS escrow;
SELECT admitted FROM earmark_reserve('a1', 10, 'k2', 'f1', '1 hour');
SELECT admitted FROM earmark_reserve('a1', 10, 'k3', 'f1', '1 hour');
SELECT count(*) AS slots, sum(held) AS slots_held FROM earmark.budget_slot WHERE account = 'a1';
SELECT lim, used, held, remaining, limit_state FROM earmark_budget('a1', 'f1');
SELECT charged FROM earmark_settle('a1', 2, 7);
SELECT lim, used, held, remaining, limit_state FROM earmark_budget('a1', 'f1');
SELECT earmark_record_usage('a1', 33, 'u1', 'f1');
SELECT earmark_record_usage('a1', -5, 'u2', 'f1');
SELECT lim, used, held, remaining, limit_state FROM earmark_budget('a1', 'f1');
-- the same statement's reserve (run first: the outer side of the join)
SELECT r.admitted, b.used, b.held FROM earmark_reserve('a1', 4, 'k4', 'f1', '1 hour') r,
       LATERAL earmark_budget('a1', 'f1') b;
-- the same transaction's
BEGIN;
SELECT admitted FROM earmark_reserve('a1', 5, 'k5', 'f1', '1 hour');
SELECT lim, used, held, remaining FROM earmark_budget('a1', 'f1');
SELECT earmark_record_usage('a1', 2, 'u3', 'f1');
SELECT lim, used, held, remaining FROM earmark_budget('a1', 'f1');
ROLLBACK;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT lim, used, held, remaining FROM earmark_budget('a1', 'f1');
SELECT admitted FROM earmark_reserve('a1', 5, 'k6', 'f1', '1 hour');
SELECT lim, used, held, remaining FROM earmark_budget('a1', 'f1');
ROLLBACK;
-- a limit below what is used and held: remaining 0
SELECT earmark_set_limit('a1', 10, 'f1') IS NOT NULL AS lowered;
SELECT lim, used, held, remaining FROM earmark_budget('a1', 'f1');
-- sums past a bigint: an error only when a total is past it
SELECT earmark_set_limit('big', 9223372036854775807) IS NOT NULL AS made;
SELECT admitted FROM earmark_reserve('big', 1, 'b1', lease => '1 hour');
UPDATE earmark.budget SET used = 9223372036854775000 WHERE account = 'big';
SELECT used, held FROM earmark_budget('big');
INSERT INTO earmark.usage_shard (account, budget_id, shard, units)
  SELECT 'big', budget_id, 99, 1000 FROM earmark.budget WHERE account = 'big';
\set VERBOSITY terse
SELECT used, held FROM earmark_budget('big');
\set VERBOSITY default
INSERT INTO earmark.usage_shard (account, budget_id, shard, units)
  SELECT 'big', budget_id, 98, -2000 FROM earmark.budget WHERE account = 'big';
SELECT lim, used, held, remaining FROM earmark_budget('big');
