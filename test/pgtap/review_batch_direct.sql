-- test/pgtap/review_batch_direct.sql: review of 0ddf408 (earmark_record_usage_many
-- without keys_known).  The rule (batch.c): a batch does exactly what the
-- same single calls would do one after another in one transaction, in
-- array order, with the same errors.  A key the ledger has, with other
-- units or another feature, is EM001 at its own element; the batch must
-- not report a later element's error first.
BEGIN;
SELECT plan(8);
SET LOCAL earmark.rate_limit = 0;

CREATE FUNCTION pg_temp.first_error(q text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    st text;
    ctx text;
    msg text;
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, ctx = PG_EXCEPTION_CONTEXT, msg = MESSAGE_TEXT;
    RETURN st || ' at ' || coalesce(substring(ctx from 'element [0-9]+'), 'no element')
        || ' (key ' || coalesce(substring(msg from 'key "([^"]*)"'), '?') || ')';
END
$f$;

SELECT earmark_set_limit('ro', 1000);
-- 'cur': this cycle's default budget row exists; 'old': a key of 40 days ago
SELECT is(earmark_record_usage('ro', 3, 'cur', 'default', now()), true, 'ro: cur recorded now');
SELECT is(earmark_record_usage('ro', 5, 'old', 'default', now() - interval '40 days'), true,
          'ro: old recorded 40 days ago');
SELECT count(*) AS budgets FROM earmark.budget WHERE account = 'ro' \gset

-- the single calls, one after another in one statement: cur (other units) fails first
SELECT is(pg_temp.first_error($$SELECT earmark_record_usage('ro', 4, 'cur'),
                                       earmark_record_usage('ro', 9, 'old', 'video')$$),
          'EM001 at no element (key cur)',
          'single calls in order: cur''s EM001 comes first');

-- 1. the same events as a batch: element 2 ('old', for feature video, whose
--    cycle has no budget row) is looked up before element 1 ('cur', waiting
--    in the pending write) is checked
SELECT is(pg_temp.first_error($$SELECT * FROM earmark_record_usage_many('ro', ARRAY[4, 9], ARRAY['cur', 'old'],
                                                                         ARRAY['default', 'video'])$$),
          'EM001 at element 1 (key cur)',
          'batch [cur other units, old for video in a cycle without a budget row]: element 1''s EM001 first, as the single calls');

-- 2. the same with element 2 in the default feature 80 days back (no budget row either)
SELECT is(pg_temp.first_error($$SELECT * FROM earmark_record_usage_many('ro', ARRAY[4, 9], ARRAY['cur', 'old'],
                                        NULL, ARRAY[now(), now() - interval '80 days'])$$),
          'EM001 at element 1 (key cur)',
          'batch [cur other units, old other units 80 days back]: element 1''s EM001 first');

-- controls (these pass before and after 0ddf408): a later correction or an
-- in-batch repeat flushes first; a later new key only goes to the write
SELECT is(pg_temp.first_error($$SELECT * FROM earmark_record_usage_many('ro', ARRAY[4, -1], ARRAY['cur', 'c1'])$$),
          'EM001 at element 1 (key cur)', 'control: cur then a correction: element 1');
SELECT is(pg_temp.first_error($$SELECT * FROM earmark_record_usage_many('ro', ARRAY[4, 2], ARRAY['cur', 'n1'],
                                        ARRAY['default', 'video'])$$),
          'EM001 at element 1 (key cur)', 'control: cur then a new key of a new cycle: element 1');
SELECT is((SELECT count(*) FROM earmark.budget WHERE account = 'ro'), :budgets::bigint,
          'the refused batches left no budget row');

SELECT * FROM finish();
ROLLBACK;
