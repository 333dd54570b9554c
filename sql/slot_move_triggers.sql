-- An escrow slot's move, written in SQL when the executor would do more
-- than the write from C (here: an operator's triggers on
-- earmark.budget_slot; src/escrow.c, slot_write).  An admission through a
-- slot moves room to held and sets no other column, so a trigger
-- "UPDATE OF used" does not fire for it; a settlement into the slot
-- charges, and does.  (Before the move was written from C the admission's
-- statement set room and held only; its SQL fallback then set used too.)
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget_slot,
         earmark.budget, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SET earmark.rate_limit = 0;

SELECT earmark_set_limit('st', 1000) IS NOT NULL AS made,
       earmark_set_escrow('st', 2) IS NOT NULL AS escrow;
-- the first admission cuts the slots (the budget row's path)
SELECT admitted FROM earmark_reserve('st', 1, 'st-warm');

CREATE TABLE pg_temp.fired (what text, slot int);
CREATE FUNCTION pg_temp.note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pg_temp.fired VALUES (TG_ARGV[0], NEW.slot);
    RETURN NEW;
END
$$;
CREATE TRIGGER st_used AFTER UPDATE OF used ON earmark.budget_slot
    FOR EACH ROW EXECUTE FUNCTION pg_temp.note('update of used');
CREATE TRIGGER st_any AFTER UPDATE ON earmark.budget_slot
    FOR EACH ROW EXECUTE FUNCTION pg_temp.note('update');

-- an admission through a slot: the slot updated once, used not named
SELECT admitted FROM earmark_reserve('st', 10, 'st-1');
SELECT slot IS NOT NULL AS in_slot FROM earmark.job WHERE idempotency_key = 'st-1';
SELECT what, count(*) FROM pg_temp.fired GROUP BY what ORDER BY what;
TRUNCATE pg_temp.fired;

-- its settlement into the slot: used named
SELECT s.charged FROM earmark.job j CROSS JOIN LATERAL earmark_settle('st', j.job_id, 4) s
 WHERE j.idempotency_key = 'st-1';
SELECT what, count(*) FROM pg_temp.fired GROUP BY what ORDER BY what;

DROP TRIGGER st_used ON earmark.budget_slot;
DROP TRIGGER st_any ON earmark.budget_slot;
SELECT used, held FROM earmark_budget('st');
SELECT count(*) AS check_rows FROM earmark_check();
