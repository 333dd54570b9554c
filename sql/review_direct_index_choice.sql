-- The gate's reads by index from C (direct.c) must compare keys as the SQL
-- statement they replace does: `account = $1` and `idempotency_key = $2`
-- with the columns' own collation and the type's default equality.  An
-- operator's extra index on the same leading columns with another
-- collation (here a case-insensitive ICU one, for support look-ups) must
-- not be the one they read by.  REINDEX ... CONCURRENTLY gives earmark's
-- own index a newer oid than the operator's, so that the operator's comes
-- first in the table's index list.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
SET earmark.lease = '1h';
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

SELECT earmark_set_limit('acme', 1000) IS NULL AS set;
SELECT job_id, admitted, remaining, reason FROM earmark_reserve('acme', 10, 'Key-1');

CREATE COLLATION review_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
CREATE INDEX review_job_ci ON earmark.job (account COLLATE review_ci, idempotency_key COLLATE review_ci);
CREATE INDEX review_account_ci ON earmark.account (account COLLATE review_ci);
REINDEX INDEX CONCURRENTLY earmark.job_account_idempotency_key_key;
REINDEX INDEX CONCURRENTLY earmark.account_pkey;

-- another key of the same account: a hold of its own
SELECT job_id, admitted, remaining, reason FROM earmark_reserve('acme', 10, 'key-1');
-- an account that does not exist: no limit, and never another account's job
SELECT job_id, admitted, reason FROM earmark_reserve('ACME', 10, 'KEY-1');
SELECT account, idempotency_key, amount FROM earmark.job ORDER BY job_id;
SELECT account, used, held FROM earmark.budget ORDER BY budget_id;

DROP INDEX earmark.review_job_ci;
DROP INDEX earmark.review_account_ci;
DROP COLLATION review_ci;
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
