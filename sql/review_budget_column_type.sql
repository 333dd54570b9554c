-- earmark_budget after an operator changed the type of a column it sums
-- (earmark.usage_shard.units, earmark.budget_slot.used and held to
-- numeric).  Its SQL (03b3dad) summed them and cast the sum to bigint, and
-- answered right; a read by key from C that takes the datum as a bigint
-- reads a numeric's pointer as the number.  The report must answer right
-- (used 7 + 3, held 5 + 2) or fail cleanly (42804), never another number.
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget_slot,
         earmark.budget, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;
SELECT earmark_set_limit('ty', 300) IS NOT NULL AS made;
SELECT admitted FROM earmark_reserve('ty', 5, 'ty1', lease => '1 hour');
SELECT earmark_record_usage('ty', 7, 'tyu');
INSERT INTO earmark.budget_slot (account, budget_id, slot, used, held)
  SELECT 'ty', budget_id, 1, 3, 2 FROM earmark.budget WHERE account = 'ty';
SELECT lim, used, held, remaining FROM earmark_budget('ty');
CREATE FUNCTION pg_temp.report_is_right() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT used, held INTO r FROM earmark_budget('ty');
    IF r.used = 10 AND r.held = 7 THEN
        RETURN 'right';
    END IF;
    RETURN format('wrong: used %s, held %s', r.used, r.held);
EXCEPTION WHEN datatype_mismatch THEN
    RETURN 'refused (42804)';
END
$$;
BEGIN;
ALTER TABLE earmark.usage_shard ALTER units TYPE numeric;
SELECT pg_temp.report_is_right() IN ('right', 'refused (42804)') AS units_numeric_ok;
ROLLBACK;
BEGIN;
ALTER TABLE earmark.budget_slot ALTER used TYPE numeric, ALTER held TYPE numeric;
SELECT pg_temp.report_is_right() IN ('right', 'refused (42804)') AS slots_numeric_ok;
ROLLBACK;
SELECT pg_temp.report_is_right() AS after;
