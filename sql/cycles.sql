-- Billing cycles: a month from the anchor's day and time (UTC), calendar
-- months without an anchor; anchors on day 29-31 are refused; an anchor
-- cannot move once the account has usage or holds.
SET client_min_messages = warning;
SET timezone = 'UTC';
\pset null '<null>'
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

-- An agreement that started on 20 October at 15:29 UTC.
SELECT earmark_set_account('anchored', '2026-10-20 15:29:00+00', 'customer_0198', 'agreement_1');
SELECT earmark_set_limit('anchored', 1000);
SELECT account, cycle_anchor, provider_customer, provider_agreement FROM earmark.account;
-- usage on 19 November falls in the cycle that began on 20 October ...
SELECT cycle_start, cycle_end FROM earmark_budget('anchored', at => '2026-11-19 12:00:00+00');
-- ... usage on 21 November in the next one
SELECT cycle_start, cycle_end FROM earmark_budget('anchored', at => '2026-11-21 00:00:00+00');
-- the boundary itself belongs to the new cycle
SELECT cycle_start FROM earmark_budget('anchored', at => '2026-11-20 15:28:59.999999+00');
SELECT cycle_start FROM earmark_budget('anchored', at => '2026-11-20 15:29:00+00');
-- across a year, and through February
SELECT cycle_start, cycle_end FROM earmark_budget('anchored', at => '2027-01-05 00:00:00+00');
SELECT cycle_start, cycle_end FROM earmark_budget('anchored', at => '2028-02-25 00:00:00+00');

-- An anchor given with an offset is read in UTC: 02:29 on the 21st at +11
-- is 15:29 on the 20th.
SELECT earmark_set_account('offset', '2026-10-21 02:29:23+11');
SELECT cycle_anchor FROM earmark.account WHERE account = 'offset';
SELECT cycle_start, cycle_end FROM earmark_budget('offset', at => '2026-11-19 00:00:00+00');

-- No anchor: the UTC calendar month.
SELECT earmark_set_limit('calendar', 1000);
SELECT cycle_start, cycle_end FROM earmark_budget('calendar', at => '2026-11-19 12:00:00+00');
SELECT cycle_start, cycle_end FROM earmark_budget('calendar', at => '2026-12-31 23:59:59+00');

-- Day 29 to 31 is refused (SQLSTATE 22023), and nothing is written.
\set VERBOSITY default
SELECT earmark_set_account('late-anchor', '2026-01-29 00:00:00+00');
SELECT earmark_set_account('late-anchor', '2026-03-31 12:00:00+00');
\set VERBOSITY sqlstate
SELECT earmark_set_account('late-anchor', '2026-05-30 00:00:00+00');
SELECT earmark_set_account('late-anchor', 'infinity');
\set VERBOSITY default
SELECT count(*) FROM earmark.account WHERE account = 'late-anchor';
-- 31 October at 23:00 in New York is 1 November in UTC: accepted
SELECT earmark_set_account('late-anchor', '2026-10-31 23:00:00-04');
SELECT cycle_anchor FROM earmark.account WHERE account = 'late-anchor';

-- The anchor may change while the account has no usage and no holds ...
SELECT earmark_set_account('anchored', '2026-10-05 00:00:00+00');
SELECT cycle_anchor FROM earmark.account WHERE account = 'anchored';
-- ... a cancelled job that used nothing is neither ...
SELECT job_id AS j FROM earmark_reserve('anchored', 10, 'nothing') \gset
SELECT status FROM earmark_settle('anchored', :j, 0, 'cancelled');
SELECT earmark_set_account('anchored', '2026-10-20 15:29:00+00');
-- ... but a hold is: refused with EM002, and the anchor stays.
SELECT admitted FROM earmark_reserve('anchored', 10, 'held');
SELECT earmark_set_account('anchored', '2026-10-06 00:00:00+00');
\set VERBOSITY sqlstate
SELECT earmark_set_account('anchored', '2026-10-06 00:00:00+00');
\set VERBOSITY default
-- setting the same anchor again, or only the provider ids, is fine
SELECT earmark_set_account('anchored', '2026-10-20 15:29:00+00');
SELECT earmark_set_account('anchored', provider_customer => 'customer_0199');
SELECT cycle_anchor, provider_customer, provider_agreement FROM earmark.account WHERE account = 'anchored';
-- usage (a settled job) also locks the anchor after the holds are gone
SELECT charged FROM earmark_settle('anchored', (SELECT job_id FROM earmark.job WHERE account = 'anchored' AND idempotency_key = 'held'), 7);
-- (the job's own budget, not the current cycle's: a cycle of this anchor ends
-- on the 20th at 15:29 UTC, maybe during the run)
SELECT b.held, b.used FROM earmark.budget b JOIN earmark.job j USING (budget_id)
WHERE j.idempotency_key = 'held';
\set VERBOSITY sqlstate
SELECT earmark_set_account('anchored', '2026-10-06 00:00:00+00');
\set VERBOSITY default
SELECT cycle_anchor FROM earmark.account WHERE account = 'anchored';

-- A reserve lands in the cycle of the anchor.
SELECT earmark_set_account('fresh', '2020-01-01 06:00:00+00');
SELECT earmark_set_limit('fresh', 100);
SELECT admitted FROM earmark_reserve('fresh', 5, 'f1');
SELECT extract(day FROM cycle_start) AS day, extract(hour FROM cycle_start) AS hour,
       cycle_end = cycle_start + interval '1 month' AS one_month
FROM earmark.budget WHERE account = 'fresh';
