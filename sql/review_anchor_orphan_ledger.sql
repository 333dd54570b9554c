-- review_anchor_orphan_ledger: the ledger rows a deleted account left
-- (DELETE FROM earmark.account takes its budget rows, the ledger and job
-- rows stay: docs/operations.md, "Deleting an account") are in no cycle,
-- and do not keep an account made again under the same name from setting
-- its cycle anchor (docs/api.md, earmark_set_account: "no ledger entry in
-- one of its cycles").  The in-use check (account.c account_in_use) finds
-- the ledger through the account's budget rows, cycle by cycle: the
-- ledger's primary key is led by the cycle.  Deleted by cycle first, as
-- operations.md shows, nothing of the account is left.
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

-- recorded usage, and a settled job that charged something (its own entry)
SELECT earmark_set_limit('gone', 1000);
SELECT earmark_record_usage('gone', 5, 'u-1');
SELECT charged FROM earmark_settle('gone', (SELECT job_id FROM earmark_reserve('gone', 10, 'j-1')), 7);

-- the account row deleted alone
DELETE FROM earmark.account WHERE account = 'gone';
SELECT (SELECT count(*) FROM earmark.budget WHERE account = 'gone') AS budget_rows,
       (SELECT count(*) FROM earmark.ledger WHERE account = 'gone') AS ledger_entries,
       (SELECT sum(units) FROM earmark.ledger WHERE account = 'gone') AS ledger_units;

-- made again under the same name: the two entries are in none of its
-- cycles, and its anchor may move
SELECT earmark_set_limit('gone', 1000);
SELECT count(*) AS ledger_entries FROM earmark.ledger WHERE account = 'gone';
SELECT earmark_set_account('gone', '2026-10-05 00:00:00+00');
SELECT cycle_anchor FROM earmark.account WHERE account = 'gone';
-- its own usage then keeps the anchor where it is
SELECT earmark_record_usage('gone', 3, 'u-2');
\set VERBOSITY sqlstate
SELECT earmark_set_account('gone', '2026-10-06 00:00:00+00');
\set VERBOSITY default

-- deleted as operations.md shows: the ledger rows by cycle first, then the
-- other tables' rows and the account row; nothing of it is left
SELECT earmark_set_limit('whole', 1000);
SELECT earmark_record_usage('whole', 5, 'w-1');
SELECT charged FROM earmark_settle('whole', (SELECT job_id FROM earmark_reserve('whole', 10, 'w-2')), 4);
BEGIN;
DELETE FROM earmark.ledger_entry l USING earmark.budget b
 WHERE b.account = 'whole' AND l.account = 'whole' AND l.budget_id = b.budget_id;
DELETE FROM earmark.ledger_entry WHERE account = 'whole' AND job_id IS NOT NULL;
DELETE FROM earmark.job WHERE account = 'whole';
DELETE FROM earmark.usage_shard WHERE account = 'whole';
DELETE FROM earmark.budget_slot WHERE account = 'whole';
DELETE FROM earmark.meter_mark WHERE account = 'whole';
DELETE FROM earmark.account WHERE account = 'whole';
COMMIT;
SELECT (SELECT count(*) FROM earmark.ledger WHERE account = 'whole') AS ledger_entries,
       (SELECT count(*) FROM earmark.job WHERE account = 'whole') AS jobs;

TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
