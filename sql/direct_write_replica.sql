-- A write of the budget row from C (direct.c, em_direct_update) must refuse
-- what an UPDATE refuses.  The executor checks a published table's replica
-- identity before it updates a row (CheckValidResultRel ->
-- CheckCmdReplicaIdentity): a table that publishes updates without a replica
-- identity, or whose publication's row filter names a column outside the
-- replica identity, cannot be updated.  The budget row's numbers must then
-- stay as they were, and the reserve and the settlement fail as on main.
SET client_min_messages = error;
SET earmark.rate_limit = 0;
SET earmark.lease = '1h';
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SELECT earmark_set_limit('acme', 1000) IS NULL AS set;
SELECT admitted, remaining FROM earmark_reserve('acme', 10, 'a');
SELECT used, held FROM earmark.budget WHERE account = 'acme';

-- 1. updates published, no replica identity
CREATE PUBLICATION direct_write_pub FOR TABLE earmark.budget;
ALTER TABLE earmark.budget REPLICA IDENTITY NOTHING;
\set VERBOSITY terse
-- the executor's own UPDATE refuses
UPDATE earmark.budget SET held = held WHERE account = 'acme';
SELECT admitted FROM earmark_reserve('acme', 10, 'b');
SELECT status FROM earmark_settle('acme', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'a'), 0);
\set VERBOSITY default
SELECT used, held FROM earmark.budget WHERE account = 'acme';
ALTER TABLE earmark.budget REPLICA IDENTITY DEFAULT;
DROP PUBLICATION direct_write_pub;

-- 2. a row filter on held, which the replica identity (the primary key) lacks
CREATE PUBLICATION direct_write_pub FOR TABLE earmark.budget WHERE (held > 0);
\set VERBOSITY terse
UPDATE earmark.budget SET held = held WHERE account = 'acme';
SELECT admitted FROM earmark_reserve('acme', 10, 'c');
SELECT status FROM earmark_settle('acme', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'a'), 0);
\set VERBOSITY default
SELECT used, held FROM earmark.budget WHERE account = 'acme';
DROP PUBLICATION direct_write_pub;

-- without a publication both write again
SELECT admitted, remaining FROM earmark_reserve('acme', 10, 'd');
SELECT used, held FROM earmark.budget WHERE account = 'acme';
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
