-- review_batch_key_trigger: earmark_record_usage_many learns which of a
-- run's events its statement wrote from the keys of the rows it inserted
-- (entries.c, key_rows).  A trigger an operator put on
-- earmark.ledger_entry may change a row's entry_key on its way in; the
-- batch then answers as it did when it matched the written rows to the
-- events with a join on the key:
--  1. a key the trigger sets to NULL: the event's row is not found
--     (an error that names the key, not a crash of the backend);
--  2. a key the trigger changes to another: the same error;
--  3. a row the trigger skips (RETURN NULL): the same error;
--  4. two of the run's keys the trigger swaps: both events written.
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget,
         earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
UPDATE earmark.reporter_state SET blocked_until = NULL;
SET earmark.rate_limit = 0;
\set VERBOSITY terse

SELECT earmark_set_limit('kt', 100000) IS NOT NULL AS ok;

CREATE FUNCTION pg_temp.rekey() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.entry_key = 'to-null' THEN
        NEW.entry_key := NULL;
    ELSIF NEW.entry_key = 'to-other' THEN
        NEW.entry_key := 'other';
    ELSIF NEW.entry_key = 'skipped' THEN
        RETURN NULL;
    ELSIF NEW.entry_key = 'swap-a' THEN
        NEW.entry_key := 'swap-b';
    ELSIF NEW.entry_key = 'swap-b' THEN
        NEW.entry_key := 'swap-a';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER review_batch_key_trigger BEFORE INSERT ON earmark.ledger_entry
    FOR EACH ROW EXECUTE FUNCTION pg_temp.rekey();

-- 1. a key set to NULL
SELECT * FROM earmark_record_usage_many('kt', ARRAY[1, 2, 3], ARRAY['n1', 'to-null', 'n3']);
\echo :LAST_ERROR_SQLSTATE
-- 2. a key changed to another
SELECT * FROM earmark_record_usage_many('kt', ARRAY[1, 2], ARRAY['to-other', 'o2']);
\echo :LAST_ERROR_SQLSTATE
-- 3. a row skipped
SELECT * FROM earmark_record_usage_many('kt', ARRAY[1, 2], ARRAY['s1', 'skipped']);
\echo :LAST_ERROR_SQLSTATE
-- 4. two keys swapped
SELECT * FROM earmark_record_usage_many('kt', ARRAY[4, 5, 6], ARRAY['swap-a', 'w', 'swap-b']);

DROP TRIGGER review_batch_key_trigger ON earmark.ledger_entry;
SELECT entry_key, units FROM earmark.ledger_entry WHERE account = 'kt' ORDER BY entry_key;
SELECT sum(units) FROM earmark.usage_shard WHERE account = 'kt';
