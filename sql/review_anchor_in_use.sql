-- review_anchor_in_use: earmark_set_account may move the anchor of an
-- account that has no usage and no holds, also when its escrow rows'
-- own held are not zero (only their sums are: escrow.c's books).
--
-- Account "hot" (limit 100, 2 slots): a hold of 1 outside the slots (the
-- first reserve cuts the slots), a hold of 10 from a slot (generation 1);
-- the limit goes to 40, under the 49 allocated (the hold of 1 and the
-- slots' 2 x 24), and a reserve of 1 re-cuts the slots (generation 2).  All three holds are then cancelled at zero use; the one of
-- generation 1 finds no free slot of its generation and settles into the
-- budget row, whose held goes to -10 while its slot's stays at +10.
-- Nothing is used or held (earmark_budget says 0 and 0, the ledger is
-- empty), so the anchor may still change.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.evidence, earmark.ledger_entry,
         earmark.job, earmark.budget_slot, earmark.budget, earmark.usage_shard, earmark.account_limit,
         earmark.account RESTART IDENTITY CASCADE;

SELECT earmark_set_limit('hot', 100);
SELECT earmark_set_escrow('hot', 2);
SELECT admitted FROM earmark_reserve('hot', 1, 'w');
SELECT admitted FROM earmark_reserve('hot', 10, 'a');
SELECT earmark_set_limit('hot', 40);
SELECT admitted FROM earmark_reserve('hot', 1, 'x');
SELECT idempotency_key, slot IS NOT NULL AS from_a_slot, gen FROM earmark.job ORDER BY job_id;
SELECT s.status FROM earmark.job j, earmark_settle('hot', j.job_id, 0, 'cancelled') s
WHERE j.account = 'hot' ORDER BY j.job_id;

-- nothing used, nothing held, no ledger row
SELECT used, held FROM earmark_budget('hot');
SELECT count(*) AS ledger_rows FROM earmark.ledger;
SELECT count(*) AS open_jobs FROM earmark.job WHERE status IN ('running', 'capped');
SELECT invariant, account FROM earmark_check() ORDER BY invariant, account;

-- so the anchor may move
SELECT 'anchor set' FROM earmark_set_account('hot', '2024-01-15 00:00:00+00');
SELECT cycle_anchor IS NOT NULL AS anchored FROM earmark.account WHERE account = 'hot';
