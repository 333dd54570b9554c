-- test/pgtap/batch.sql: the batch forms of the gate and the ledger
-- (src/batch.c, docs/api.md "Batches"):
--   1. the three functions' signatures, grants and SECURITY DEFINER;
--   2. earmark_record_usage_many: a result per event, idempotency across
--      single and batch calls and inside one batch, features and
--      occurred_at per event, corrections in array order, bad input with
--      its SQLSTATE and nothing changed;
--   3. earmark_reserve_many: admission in array order, the limit exact,
--      the same answers as the same single calls one after another in one
--      transaction, idempotency, bad input;
--   4. earmark_settle_many: a result per job, settles once, outcomes per
--      job, bad input and an unknown job with nothing changed.
-- Concurrent batches are in test/isolation/specs/batch_race.spec.
BEGIN;
SELECT plan(110);

SET LOCAL earmark.rate_limit = 0;

-- =====================================================================
-- 1. contract
-- =====================================================================
CREATE TEMP TABLE batch_api (fname text, args text, result text, ord int);
INSERT INTO batch_api VALUES
('earmark_record_usage_many',
 $$account text, units bigint[], idempotency_keys text[], features text[] DEFAULT NULL::text[], occurred_at timestamp with time zone[] DEFAULT NULL::timestamp with time zone[]$$,
 'TABLE(ord integer, idempotency_key text, recorded boolean)', 1),
('earmark_reserve_many',
 $$account text, amounts bigint[], idempotency_keys text[], features text[] DEFAULT NULL::text[], lease interval DEFAULT NULL::interval$$,
 'TABLE(ord integer, idempotency_key text, job_id bigint, admitted boolean, remaining bigint, reason text)', 2),
('earmark_settle_many',
 $$account text, job_ids bigint[], used bigint[] DEFAULT NULL::bigint[], outcomes text[] DEFAULT NULL::text[]$$,
 'TABLE(ord integer, job_id bigint, charged bigint, released bigint, status text)', 3);

-- 3: one function per name, with these arguments and columns
SELECT is((SELECT string_agg(pg_get_function_arguments(p.oid), ' | ') FROM pg_proc p
            WHERE p.proname = a.fname), a.args, a.fname || ': one function, its arguments')
  FROM batch_api a ORDER BY ord;
-- 3
SELECT is((SELECT pg_get_function_result(p.oid) FROM pg_proc p WHERE p.proname = a.fname),
          a.result, a.fname || ': its columns')
  FROM batch_api a ORDER BY ord;
-- 3: SECURITY DEFINER, volatile, not strict, pinned search_path
SELECT ok((SELECT p.prosecdef AND p.provolatile = 'v' AND NOT p.proisstrict AND p.proretset
                  AND p.proconfig = ARRAY['search_path=pg_catalog, pg_temp']
             FROM pg_proc p WHERE p.proname = a.fname),
          a.fname || ': SECURITY DEFINER, VOLATILE, not STRICT, a set, search_path pinned')
  FROM batch_api a ORDER BY ord;
-- 3: earmark_user may call them, PUBLIC may not
SELECT ok((SELECT has_function_privilege('earmark_user', p.oid, 'EXECUTE')
                  AND NOT EXISTS (SELECT 1 FROM aclexplode(p.proacl) x WHERE x.grantee = 0)
             FROM pg_proc p WHERE p.proname = a.fname),
          a.fname || ': earmark_user may EXECUTE it, PUBLIC may not')
  FROM batch_api a ORDER BY ord;
-- 3: members of the extension
SELECT ok(EXISTS (SELECT 1 FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
                   WHERE p.proname = a.fname AND d.deptype = 'e'
                     AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'earmark')),
          a.fname || ' belongs to extension earmark')
  FROM batch_api a ORDER BY ord;

-- =====================================================================
-- 2. earmark_record_usage_many
-- =====================================================================
SELECT earmark_set_limit('bu', 1000);

SELECT results_eq(
    $$SELECT ord, idempotency_key, recorded
        FROM earmark_record_usage_many('bu', ARRAY[10, 20, 30], ARRAY['k1', 'k2', 'k3'])$$,
    $$VALUES (1, 'k1', true), (2, 'k2', true), (3, 'k3', true)$$,
    'record_usage_many: a row per event, in array order');
SELECT is((SELECT used FROM earmark_budget('bu')), 60::bigint, 'the three events count');
SELECT is((SELECT count(*) FROM earmark.ledger WHERE account = 'bu'), 3::bigint, 'a ledger row each');
SELECT is((SELECT sum(units) FROM earmark.usage_shard WHERE account = 'bu'), 60::numeric,
          'the counters equal the ledger');
SELECT is((SELECT count(*) FROM earmark.meter_mark WHERE account = 'bu'), 1::bigint,
          'the cycle is marked for the meter once');

SELECT results_eq(
    $$SELECT ord, recorded FROM earmark_record_usage_many('bu', ARRAY[20, 5], ARRAY['k2', 'k4'])$$,
    $$VALUES (1, false), (2, true)$$,
    'a key already recorded returns false; a new one true');
SELECT is(earmark_record_usage('bu', 5, 'k4'), false, 'a single call repeats a key a batch recorded');
SELECT is(earmark_record_usage('bu', 7, 'k5'), true, 'a single call records k5');
SELECT results_eq(
    $$SELECT ord, recorded FROM earmark_record_usage_many('bu', ARRAY[7], ARRAY['k5'])$$,
    $$VALUES (1, false)$$,
    'a batch repeats a key a single call recorded');
SELECT results_eq(
    $$SELECT ord, recorded FROM earmark_record_usage_many('bu', ARRAY[3, 3, 4], ARRAY['d1', 'd1', 'd2'])$$,
    $$VALUES (1, true), (2, false), (3, true)$$,
    'the same key twice in one batch: recorded once, the second false');
SELECT is((SELECT used FROM earmark_budget('bu')), 79::bigint, 'used: 60 + 5 + 7 + 3 + 4');

SELECT count(*) AS ledger_rows FROM earmark.ledger \gset
SELECT throws_ok(
    $$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, 21], ARRAY['n1', 'k2'])$$,
    'EM001', 'idempotency key "k2" was already used for other usage',
    'a key recorded with other units: EM001 for the whole call');
SELECT throws_ok(
    $$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, 2], ARRAY['n2', 'n2'])$$,
    'EM001', 'idempotency key "n2" was already used for other usage',
    'the same key twice in a batch with other units: EM001');
SELECT throws_ok(
    $$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, 1], ARRAY['n3', 'n3'], ARRAY['default', 'images'])$$,
    'EM001', NULL, 'the same key twice in a batch with another feature: EM001');
SELECT is((SELECT count(*) FROM earmark.ledger), :'ledger_rows'::bigint,
          'the refused calls wrote nothing, not even their good events');

SELECT results_eq(
    $$SELECT ord, recorded FROM earmark_record_usage_many('bu', ARRAY[2, 9], ARRAY['f1', 'f2'],
                                                          ARRAY['images', 'default'])$$,
    $$VALUES (1, true), (2, true)$$,
    'features per event');
SELECT is((SELECT used FROM earmark_budget('bu', 'images')), 2::bigint, 'the images event went to images');
SELECT results_eq(
    $$SELECT ord, recorded FROM earmark_record_usage_many('bu', ARRAY[4, 6], ARRAY['t1', 't2'], NULL,
          ARRAY[now() - interval '40 days', now()])$$,
    $$VALUES (1, true), (2, true)$$,
    'occurred_at per event');
SELECT is((SELECT used FROM earmark_budget('bu', at => now() - interval '40 days')), 4::bigint,
          'the old event went to its own cycle');
SELECT is((SELECT used FROM earmark_budget('bu')), 94::bigint, 'the other to this cycle (79 + 9 + 6)');

-- corrections are checked in array order, as single calls would be
SELECT earmark_set_limit('bc', 1000);
SELECT results_eq(
    $$SELECT ord, recorded FROM earmark_record_usage_many('bc', ARRAY[50, -40, 5], ARRAY['c1', 'c2', 'c3'])$$,
    $$VALUES (1, true), (2, true), (3, true)$$,
    'a correction after usage in the same batch');
SELECT is((SELECT used FROM earmark_budget('bc')), 15::bigint, 'used 50 - 40 + 5');
SELECT throws_ok(
    $$SELECT * FROM earmark_record_usage_many('bc', ARRAY[10, -30, 100], ARRAY['c4', 'c5', 'c6'])$$,
    '22023', 'the correction is larger than the cycle''s usage',
    'a correction larger than the usage before it (15 + 10 < 30): 22023, although later usage would cover it');
SELECT results_eq(
    $$SELECT ord, recorded FROM earmark_record_usage_many('bc', ARRAY[15, -30], ARRAY['c7', 'c8'])$$,
    $$VALUES (1, true), (2, true)$$,
    'a correction that usage earlier in the batch covers');
SELECT is((SELECT used FROM earmark_budget('bc')), 0::bigint, 'used 15 + 15 - 30');
SELECT results_eq(
    $$SELECT ord, recorded FROM earmark_record_usage_many('bc', ARRAY[-30, 5], ARRAY['c8', 'c9'])$$,
    $$VALUES (1, false), (2, true)$$,
    'a repeated correction is a repeat, not checked again');

-- a key the ledger has is found by the batch's write; where the single
-- call's later steps would write for a repeat, the batch looks it up first
CREATE FUNCTION pg_temp.batch_error(q text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    st text;
    ctx text;
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, ctx = PG_EXCEPTION_CONTEXT;
    RETURN st || ' at ' || coalesce(substring(ctx from 'element [0-9]+'), 'no element');
END
$f$;
SELECT earmark_set_limit('bn', 1000);
SELECT is(earmark_record_usage('bn', 3, 'o1', 'default', now() - interval '40 days'), true,
          'bn: o1 recorded in the cycle of 40 days ago');
SELECT is((SELECT count(*) FROM earmark.budget WHERE account = 'bn'), 1::bigint, 'bn: one cycle''s budget row');
SELECT results_eq(
    $$SELECT ord, recorded FROM earmark_record_usage_many('bn', ARRAY[3, 3], ARRAY['o1', 'o1'])$$,
    $$VALUES (1, false), (2, false)$$,
    'o1 again, now (a cycle without a budget row): a repeat, twice');
SELECT is((SELECT count(*) FROM earmark.budget WHERE account = 'bn'), 1::bigint,
          '... and the repeats created no budget row for this cycle (nor does a single call''s repeat)');
SELECT is(pg_temp.batch_error($$SELECT * FROM earmark_record_usage_many('bn', ARRAY[3], ARRAY['o1'],
                                                                         ARRAY['video'])$$),
          'EM001 at element 1', 'o1 for another feature, whose cycle has no budget row: EM001');
SELECT is(pg_temp.batch_error($$SELECT * FROM earmark_record_usage_many('bn', ARRAY[2, 4, -50], ARRAY['o2', 'o1', 'o3'])$$),
          'EM001 at element 2',
          'o1 with other units after new usage of this cycle, then a correction larger than the cycle: element 2''s EM001 first, as single calls in order');
SELECT is(pg_temp.batch_error($$SELECT * FROM earmark_record_usage_many('bn', ARRAY[2, 3, -50], ARRAY['o2', 'o1', 'o3'])$$),
          '22023 at element 3', '... with o1 a true repeat: the correction''s 22023 at element 3');
SELECT is((SELECT count(*) FROM earmark.budget WHERE account = 'bn'), 1::bigint,
          '... the refused calls left no budget row');
SELECT results_eq(
    $$SELECT ord, recorded FROM earmark_record_usage_many('bn', ARRAY[2, 3, -1, 3], ARRAY['o2', 'o1', 'o3', 'o1'])$$,
    $$VALUES (1, true), (2, false), (3, true), (4, false)$$,
    'new usage, a repeat, a correction it covers, the repeat again');
SELECT is((SELECT used FROM earmark_budget('bn')), 1::bigint, 'bn this cycle: 2 - 1 (the repeats count nothing)');
SELECT is((SELECT used FROM earmark_budget('bn', at => now() - interval '40 days')), 3::bigint,
          'bn 40 days ago: o1''s 3, once');

-- bad input: the whole call fails, with the single call's SQLSTATE, and writes nothing
SELECT count(*) AS ledger_rows FROM earmark.ledger \gset
SELECT count(*) AS budgets FROM earmark.budget \gset
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many(NULL, ARRAY[1], ARRAY['x'])$$,
                 '22004', 'account must not be NULL', 'NULL account: 22004');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', NULL, ARRAY['x'])$$,
                 '22004', 'units must not be NULL', 'NULL units array: 22004');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1], NULL)$$,
                 '22004', 'idempotency_keys must not be NULL', 'NULL keys array: 22004');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, NULL], ARRAY['x1', 'x2'])$$,
                 '22004', 'units must not be NULL', 'a NULL element of units: 22004');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, 2], ARRAY['x1', NULL])$$,
                 '22004', 'idempotency_key must not be NULL', 'a NULL key: 22004');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, 2], ARRAY['x1', 'x2'], ARRAY['default', NULL])$$,
                 '22004', 'feature must not be NULL', 'a NULL feature: 22004');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, 2], ARRAY['x1', 'x2'], NULL,
                       ARRAY[now(), NULL])$$,
                 '22004', 'occurred_at must not be NULL', 'a NULL occurred_at: 22004');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, 2], ARRAY['x1'])$$,
                 '22023', 'units and idempotency_keys must have the same length',
                 'arrays of different lengths: 22023');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1], ARRAY['x1'], ARRAY['a', 'b'])$$,
                 '22023', 'units and features must have the same length', 'features of another length: 22023');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1], ARRAY['x1'], NULL, ARRAY[now(), now()])$$,
                 '22023', 'units and occurred_at must have the same length', 'occurred_at of another length: 22023');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[[1, 2]], ARRAY[['x1', 'x2']])$$,
                 '22023', 'units must be a one-dimensional array', 'a two-dimensional array: 22023');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, 0], ARRAY['x1', 'x2'])$$,
                 '22023', 'units must not be zero', 'units 0: 22023');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, 1000000000000001], ARRAY['x1', 'x2'])$$,
                 '22003', 'units is out of range', 'units past 10^15: 22003');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, 2], ARRAY['x1', repeat('k', 256)])$$,
                 '22001', 'idempotency_key is too long', 'a key of 256 characters: 22001');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, 2], ARRAY['x1', ''])$$,
                 '22023', 'idempotency_key must not be empty', 'an empty key: 22023');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('bu', ARRAY[1, 2], ARRAY['x1', 'x2'], NULL,
                       ARRAY[now(), now() + interval '1 hour'])$$,
                 '22023', 'occurred_at is in the future', 'an event in the future: 22023');
SELECT throws_ok($$SELECT * FROM earmark_record_usage_many('nobody', ARRAY[1], ARRAY['x1'])$$,
                 'EM007', 'account "nobody" does not exist', 'an unknown account: EM007');
SELECT is((SELECT count(*) FROM earmark.ledger), :'ledger_rows'::bigint, 'bad input wrote no ledger row');
SELECT is((SELECT count(*) FROM earmark.budget), :'budgets'::bigint, 'bad input created no budget row');
SELECT is_empty($$SELECT * FROM earmark_record_usage_many('bu', '{}', '{}')$$,
                'empty arrays: no rows');
SELECT is((SELECT count(*) FROM earmark.ledger), :'ledger_rows'::bigint, 'empty arrays wrote nothing');

-- =====================================================================
-- 3. earmark_reserve_many
-- =====================================================================
SELECT earmark_set_limit('rm', 100);
SELECT earmark_set_limit('rs', 100);
SELECT earmark_set_limit('rt', 100);

SELECT results_eq(
    $$SELECT ord, idempotency_key, job_id IS NOT NULL, admitted, remaining, reason
        FROM earmark_reserve_many('rm', ARRAY[40, 40, 40, 10, 20, 1], ARRAY['j1', 'j2', 'j3', 'j4', 'j5', 'j6'])$$,
    $$VALUES (1, 'j1', true, true, 60::bigint, NULL::text),
             (2, 'j2', true, true, 20, NULL),
             (3, 'j3', false, false, 20, 'the job needs 40 and 20 is left'),
             (4, 'j4', true, true, 10, NULL),
             (5, 'j5', false, false, 10, 'the job needs 20 and 10 is left'),
             (6, 'j6', true, true, 9, NULL)$$,
    'reserve_many admits in array order; the limit holds exactly');
SELECT is((SELECT held FROM earmark_budget('rm')), 91::bigint, 'held: the admitted jobs');

-- the same single calls one after another give the same answers
CREATE TEMP TABLE single_answers AS
SELECT n.ord, r.admitted, r.remaining, r.reason
  FROM unnest(ARRAY[40, 40, 40, 10, 20, 1]::bigint[]) WITH ORDINALITY AS n (amount, ord),
       LATERAL earmark_reserve('rs', n.amount, 'j' || n.ord) r
 ORDER BY n.ord;
SELECT results_eq(
    $$SELECT ord::int, admitted, remaining, reason FROM single_answers ORDER BY ord$$,
    $$SELECT ord, admitted, remaining, reason FROM earmark_reserve_many('rt', ARRAY[40, 40, 40, 10, 20, 1],
          ARRAY['j1', 'j2', 'j3', 'j4', 'j5', 'j6'])$$,
    'a batch answers as the same single calls one after another do');

SELECT results_eq(
    $$SELECT ord, reason FROM earmark_reserve_many('rm', ARRAY[40, 40], ARRAY['j1', 'j3'])$$,
    $$VALUES (1, 'already admitted'), (2, 'the job needs 40 and 9 is left')$$,
    'a repeat is already admitted; a refused key is not used');
SELECT is((SELECT job_id FROM earmark_reserve('rm', 40, 'j1')),
          (SELECT job_id FROM earmark.job WHERE account = 'rm' AND idempotency_key = 'j1'),
          'a single call returns the job a batch admitted');
SELECT results_eq(
    $$SELECT ord, admitted, reason FROM earmark_reserve_many('rm', ARRAY[2, 2], ARRAY['j7', 'j7'])$$,
    $$VALUES (1, true, NULL::text), (2, true, 'already admitted')$$,
    'the same key twice in a batch: admitted once');
SELECT is((SELECT count(DISTINCT job_id) FROM earmark_reserve_many('rm', ARRAY[2, 2], ARRAY['j7', 'j7'])),
          1::bigint, 'both rows name the same job');
SELECT results_eq(
    $$SELECT ord, admitted, remaining, reason FROM earmark_reserve_many('rm-unknown', ARRAY[1], ARRAY['u1'])$$,
    $$VALUES (1, false, 0::bigint, 'limit unknown')$$,
    'an account without a limit: limit unknown, per event');
SELECT earmark_set_limit('rm', NULL, 'unlimited');
SELECT results_eq(
    $$SELECT ord, admitted, remaining FROM earmark_reserve_many('rm', ARRAY[1000, 5000], ARRAY['w1', 'w2'],
          ARRAY['unlimited', 'unlimited'], interval '10 minutes')$$,
    $$VALUES (1, true, NULL::bigint), (2, true, NULL)$$,
    'features per event, an unlimited one, and a lease');
SELECT is((SELECT lease FROM earmark.job WHERE account = 'rm' AND idempotency_key = 'w2'),
          interval '10 minutes', 'the lease applies to every job of the call');

SELECT count(*) AS jobs FROM earmark.job \gset
SELECT held AS rm_held FROM earmark_budget('rm') \gset
SELECT throws_ok($$SELECT * FROM earmark_reserve_many('rm', ARRAY[1, 41], ARRAY['e1', 'j1'])$$,
                 'EM001', 'idempotency key "j1" of account "rm" was used for a different job',
                 'a key used for another amount: EM001 for the whole call');
SELECT throws_ok($$SELECT * FROM earmark_reserve_many('rm', ARRAY[1, 2], ARRAY['e2', 'e2'])$$,
                 'EM001', NULL, 'the same key twice with other amounts: EM001');
SELECT throws_ok($$SELECT * FROM earmark_reserve_many('rm', NULL, ARRAY['e3'])$$,
                 '22004', 'amounts must not be NULL', 'NULL amounts: 22004');
SELECT throws_ok($$SELECT * FROM earmark_reserve_many('rm', ARRAY[1, NULL], ARRAY['e3', 'e4'])$$,
                 '22004', 'amount must not be NULL', 'a NULL amount: 22004');
SELECT throws_ok($$SELECT * FROM earmark_reserve_many('rm', ARRAY[1, 2], ARRAY['e3', 'e4'], ARRAY['default', NULL])$$,
                 '22004', 'feature must not be NULL', 'a NULL feature: 22004');
SELECT throws_ok($$SELECT * FROM earmark_reserve_many('rm', ARRAY[1, 0], ARRAY['e3', 'e4'])$$,
                 '22023', 'amount must be greater than zero', 'amount 0: 22023');
SELECT throws_ok($$SELECT * FROM earmark_reserve_many('rm', ARRAY[1, 2], ARRAY['e3'])$$,
                 '22023', 'amounts and idempotency_keys must have the same length', 'lengths differ: 22023');
SELECT throws_ok($$SELECT * FROM earmark_reserve_many('rm', ARRAY[1], ARRAY[repeat('k', 256)])$$,
                 '22001', 'idempotency_key is too long', 'a key of 256 characters: 22001');
SELECT throws_ok($$SELECT * FROM earmark_reserve_many('rm', ARRAY[1], ARRAY['e3'], NULL, interval '0')$$,
                 '22023', 'lease must be longer than zero', 'a lease of 0: 22023');
SELECT is((SELECT count(*) FROM earmark.job), :'jobs'::bigint, 'bad input wrote no job');
SELECT is((SELECT held FROM earmark_budget('rm')), :'rm_held'::bigint, 'and held nothing');
SELECT is_empty($$SELECT * FROM earmark_reserve_many('rm', '{}', '{}')$$, 'empty arrays: no rows');

-- =====================================================================
-- 4. earmark_settle_many
-- =====================================================================
SELECT job_id AS j1 FROM earmark.job WHERE account = 'rm' AND idempotency_key = 'j1' \gset
SELECT job_id AS j2 FROM earmark.job WHERE account = 'rm' AND idempotency_key = 'j2' \gset
SELECT job_id AS j4 FROM earmark.job WHERE account = 'rm' AND idempotency_key = 'j4' \gset
SELECT job_id AS j6 FROM earmark.job WHERE account = 'rm' AND idempotency_key = 'j6' \gset
SELECT is((SELECT charged FROM earmark_charge('rm', :j2, 15)), 15::bigint, 'j2 records a use of 15');

SELECT count(*) AS ledger_rows FROM earmark.ledger \gset
SELECT throws_ok(format($$SELECT * FROM earmark_settle_many('rm', ARRAY[%s, 999999999])$$, :j1),
                 'EM003', 'earmark job 999999999 of account "rm" does not exist',
                 'an unknown job: EM003 for the whole call');
SELECT throws_ok(format($$SELECT * FROM earmark_settle_many('rm', ARRAY[%s, %s], NULL, ARRAY['completed', 'exploded'])$$, :j1, :j2),
                 '22023', 'unknown outcome "exploded"', 'an unknown outcome: 22023');
SELECT throws_ok(format($$SELECT * FROM earmark_settle_many('rm', ARRAY[%s, %s], ARRAY[1, -1])$$, :j1, :j2),
                 '22023', 'used must not be negative', 'a negative used: 22023');
SELECT throws_ok(format($$SELECT * FROM earmark_settle_many('rm', ARRAY[%s, NULL])$$, :j1),
                 '22004', 'job_id must not be NULL', 'a NULL job: 22004');
SELECT throws_ok(format($$SELECT * FROM earmark_settle_many('rm', ARRAY[%s], NULL, ARRAY[NULL::text])$$, :j1),
                 '22004', 'outcome must not be NULL', 'a NULL outcome: 22004');
SELECT throws_ok(format($$SELECT * FROM earmark_settle_many('rm', ARRAY[%s], ARRAY[1, 2])$$, :j1),
                 '22023', 'job_ids and used must have the same length', 'used of another length: 22023');
SELECT throws_ok($$SELECT * FROM earmark_settle_many('rm', NULL)$$,
                 '22004', 'job_ids must not be NULL', 'NULL job_ids: 22004');
SELECT is((SELECT count(*) FROM earmark.job WHERE account = 'rm' AND status = 'running'),
          (SELECT count(*) FROM earmark.job WHERE account = 'rm'), 'the refused calls settled nothing');
SELECT is((SELECT count(*) FROM earmark.ledger), :'ledger_rows'::bigint, 'and wrote no ledger row');

SELECT results_eq(
    format($$SELECT ord, job_id, charged, released, status
               FROM earmark_settle_many('rm', ARRAY[%s, %s, %s], ARRAY[10, NULL, 50])$$, :j1, :j2, :j4),
    format($$VALUES (1, %s::bigint, 10::bigint, 30::bigint, 'completed'::text),
                    (2, %s, 15, 25, 'completed'),
                    (3, %s, 10, 0, 'completed')$$, :j1, :j2, :j4),
    'settle_many: a row per job; NULL used settles at the recorded use; used is capped at the hold');
SELECT results_eq(
    format($$SELECT ord, charged, released, status FROM earmark_settle_many('rm', ARRAY[%s, %s], NULL,
               ARRAY['failed', 'cancelled'])$$, :j1, :j6),
    $$VALUES (1, 0::bigint, 0::bigint, 'completed'::text), (2, 0, 1, 'cancelled')$$,
    'a settled job settles once; outcomes per job');
SELECT results_eq(
    format($$SELECT charged, released, status FROM earmark_settle('rm', %s)$$, :j2),
    $$VALUES (0::bigint, 0::bigint, 'completed'::text)$$,
    'a single settle of a job a batch settled: nothing');
SELECT results_eq(
    $$SELECT used, held FROM earmark_budget('rm')$$,
    $$VALUES (35::bigint, 2::bigint)$$,
    'the books: used 10 + 15 + 10, held only j7');
SELECT is_empty($$SELECT * FROM earmark_settle_many('rm', '{}')$$, 'empty job_ids: no rows');

SELECT * FROM finish();
ROLLBACK;
