-- Escrow slots are found and locked from C on a single node
-- (direct.c, em_direct_lock_skip), as "... ORDER BY slot LIMIT 1 FOR
-- UPDATE SKIP LOCKED" locks them.
--
-- 1. A read-only transaction: the executor refuses FOR UPDATE there
--    before it locks anything (ExecCheckXactReadOnly), so the locks from
--    C refuse it too, with the statement's error, before they lock a row
--    or take a transaction id: a reserve through a slot, a reserve into
--    the budget row, and a settlement of a slot's job.
-- 2. An operator's unique index on the slot table's columns in
--    descending order must not be the one a probe walks: the search walks
--    the slots upward from a random start, as ORDER BY slot does.
--    REINDEX ... CONCURRENTLY gives earmark's own key a newer oid, so the
--    operator's comes first in the table's index list.  With 4 slots and
--    the probe's walk upward, 40 admissions meet more than one slot; a
--    walk downward from the random start meets slot 3 first whenever it
--    is free, which it always is between these one-at-a-time calls.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
SET earmark.lease = '1h';
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

SELECT earmark_set_limit('hot', 100000) IS NULL AS set;
SELECT earmark_set_escrow('hot', 4) IS NULL AS set;
SELECT earmark_set_limit('cold', 1000) IS NULL AS set;
SELECT admitted FROM earmark_reserve('hot', 10, 'warm-1');
SELECT admitted FROM earmark_reserve('hot', 10, 'warm-2');
SELECT j.slot IS NOT NULL AS in_slot FROM earmark.job j WHERE idempotency_key = 'warm-2';

-- 1. read-only (terse: the settlement fails in an SQL statement of its own)
\set VERBOSITY terse
BEGIN READ ONLY;
SELECT admitted FROM earmark_reserve('hot', 10, 'ro-slot');
ROLLBACK;
BEGIN READ ONLY;
SELECT admitted FROM earmark_reserve('cold', 10, 'ro-budget');
ROLLBACK;
BEGIN READ ONLY;
SELECT status FROM earmark_settle('hot', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'warm-2'), 5);
ROLLBACK;
SELECT idempotency_key, status FROM earmark.job ORDER BY job_id;

\set VERBOSITY default
-- 2. an operator's descending index
CREATE UNIQUE INDEX review_slot_desc ON earmark.budget_slot (account, budget_id, slot DESC);
REINDEX INDEX CONCURRENTLY earmark.budget_slot_pkey;
SELECT pg_catalog.count(*) AS taken FROM generate_series(1, 40) g,
       LATERAL earmark_reserve('hot', 1, 'd-' || g) r WHERE r.admitted;
SELECT pg_catalog.count(DISTINCT slot) > 1 AS walked_upward
FROM earmark.job WHERE idempotency_key LIKE 'd-%' AND slot IS NOT NULL;
SELECT pg_catalog.count(*) AS outside_slots FROM earmark.job
WHERE idempotency_key LIKE 'd-%' AND slot IS NULL;
DROP INDEX earmark.review_slot_desc;
SELECT count(*) AS violations FROM earmark_check();
