-- review_unlimited_escrow: escrow's fast path serves an unlimited account
-- as it serves a limited one.
--
-- The fast path uses a slot only while GREATEST(limit - recorded, 0) IS NOT
-- DISTINCT FROM budget.slot_lim.  For an unlimited account the limit is
-- NULL and slot_lim is NULL, but GREATEST ignores NULLs: it gives 0, which
-- is distinct from NULL, so every reserve of an unlimited escrow account
-- takes the slow path and queues on the budget row (what escrow exists to
-- avoid).  Account "lim" (limit 1,000) is the control: its second reserve
-- comes from a slot.
SET client_min_messages = warning;
SET earmark.rate_limit = 0;
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.evidence, earmark.ledger_entry,
         earmark.job, earmark.budget_slot, earmark.budget, earmark.usage_shard, earmark.account_limit,
         earmark.account RESTART IDENTITY CASCADE;

SELECT earmark_set_limit('unl', NULL);
SELECT earmark_set_escrow('unl', 2);
SELECT earmark_set_limit('lim', 1000);
SELECT earmark_set_escrow('lim', 2);

-- the first reserve of each cuts the slots (slow path), the second takes a slot
SELECT admitted, remaining FROM earmark_reserve('unl', 10, 'a');
SELECT admitted, remaining FROM earmark_reserve('unl', 10, 'b');
SELECT admitted, remaining FROM earmark_reserve('lim', 10, 'a');
SELECT admitted, remaining FROM earmark_reserve('lim', 10, 'b');
SELECT account, idempotency_key, slot IS NOT NULL AS from_a_slot
  FROM earmark.job ORDER BY account, idempotency_key;
SELECT invariant, account FROM earmark_check() ORDER BY invariant, account;
