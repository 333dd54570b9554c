-- The sweep after an account was deleted (DELETE FROM earmark.account: its
-- budget rows go with it, ON DELETE CASCADE; its job rows stay, the hot
-- tables have no foreign keys).  A dead hold of a deleted account has no
-- budget row to be expired into, so the sweep passes it over, every time:
-- it stays the longest dead.  expired_budgets (gate.c) takes the budgets
-- with dead holds the longest dead first, up to max_jobs of them (the
-- worker: SWEEP_BATCH, 1000); a sweep must still reach a live account's
-- dead hold however many deleted accounts' holds are older.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
SET earmark.lease_floors = off;
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;

SELECT count(earmark_set_limit(a, 100)) FROM unnest(ARRAY['gone1', 'gone2', 'live']) a;
SELECT a, r.admitted FROM unnest(ARRAY['gone1', 'gone2', 'live']) a,
       earmark_reserve(a, 10, 'k', lease => '1 hour') r ORDER BY a;
-- the deleted accounts' holds died first
UPDATE earmark.job SET lease_until = clock_timestamp() - CASE account
       WHEN 'gone1' THEN interval '3 minutes' WHEN 'gone2' THEN interval '2 minutes'
       ELSE interval '1 minute' END;
DELETE FROM earmark.account WHERE account IN ('gone1', 'gone2');
SELECT account, count(*) AS budgets FROM earmark.budget GROUP BY account ORDER BY account;

-- two budgets a call: the live account's dead hold is swept
SELECT earmark_sweep(2) AS swept;
SELECT earmark_sweep(2) AS swept_again;
SELECT account, idempotency_key, status FROM earmark.job ORDER BY job_id;
SELECT account, used, held FROM earmark.budget ORDER BY account;

-- the account made again under the same name: its new budget's dead hold
-- is swept by earmark.sweep_account (one budget a call), past the old
-- budget's hold it still has in the job table
SELECT earmark_set_limit('gone1', 100) IS NOT NULL AS made_again;
SELECT admitted FROM earmark_reserve('gone1', 10, 'k2', lease => '1 hour');
UPDATE earmark.job SET lease_until = clock_timestamp() - interval '30 seconds'
 WHERE account = 'gone1' AND idempotency_key = 'k2';
SELECT earmark.sweep_account('gone1', 1) AS swept;
SELECT account, idempotency_key, status FROM earmark.job WHERE account = 'gone1' ORDER BY job_id;
SELECT count(*) AS findings FROM earmark_check() WHERE account = 'live';
