-- test/pgtap/contract.sql: the SQL contract of docs/api.md for the API
-- functions the install script defines: names, argument names, types and
-- defaults, return types and OUT/TABLE columns, volatility, NULL handling,
-- SECURITY DEFINER with a pinned search_path; and the GUCs' defaults.
BEGIN;
SELECT plan(78);

-- the schema the extension was created in (its functions live there)
SELECT n.nspname AS emschema
  FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'earmark' \gset

CREATE TEMP TABLE api (
    fname   text NOT NULL,
    argtypes text[] NOT NULL,
    args    text NOT NULL,      -- pg_get_function_arguments
    result  text NOT NULL,      -- pg_get_function_result
    vol     text NOT NULL,
    ord     int NOT NULL
);
INSERT INTO api VALUES
('earmark_set_limit', '{text,bigint,text}',
 $$account text, lim bigint, feature text DEFAULT 'default'::text$$,
 'void', 'volatile', 1),
('earmark_set_account', '{text,timestamp with time zone,text,text}',
 $$account text, cycle_anchor timestamp with time zone DEFAULT NULL::timestamp with time zone, provider_customer text DEFAULT NULL::text, provider_agreement text DEFAULT NULL::text$$,
 'void', 'volatile', 2),
('earmark_budget', '{text,text,timestamp with time zone}',
 $$account text, feature text DEFAULT 'default'::text, at timestamp with time zone DEFAULT NULL::timestamp with time zone$$,
 'TABLE(cycle_start timestamp with time zone, cycle_end timestamp with time zone, lim bigint, used bigint, held bigint, remaining bigint, limit_state text)',
 'stable', 3),
('earmark_reserve', '{text,bigint,text,text,interval}',
 $$account text, amount bigint, idempotency_key text, feature text DEFAULT 'default'::text, lease interval DEFAULT NULL::interval$$,
 'TABLE(job_id bigint, admitted boolean, remaining bigint, reason text)',
 'volatile', 4),
('earmark_charge', '{text,bigint,bigint,bigint}',
 $$account text, job_id bigint, tokens bigint, step bigint DEFAULT NULL::bigint$$,
 'TABLE(charged bigint, capped boolean, room bigint, status text)',
 'volatile', 5),
('earmark_heartbeat', '{text,bigint}',
 $$account text, job_id bigint$$,
 'timestamp with time zone', 'volatile', 6),
('earmark_settle', '{text,bigint,bigint,text}',
 $$account text, job_id bigint, used bigint DEFAULT NULL::bigint, outcome text DEFAULT 'completed'::text$$,
 'TABLE(charged bigint, released bigint, status text)',
 'volatile', 7),
('earmark_sweep', '{integer}',
 $$max_jobs integer DEFAULT 1000$$,
 'integer', 'volatile', 8);

CREATE TEMP VIEW api_oid AS
SELECT a.*, pg_catalog.to_regprocedure(
           pg_catalog.format('%I.%I(%s)', :'emschema', a.fname, pg_catalog.array_to_string(a.argtypes, ','))
       ) AS oid
  FROM api a;

-- 8: each function exists in the extension's schema with these argument types
SELECT has_function(:'emschema', fname, argtypes,
                    fname || '(' || array_to_string(argtypes, ', ') || ') exists in the extension schema')
  FROM api ORDER BY ord;

-- 8: argument names, types and defaults
SELECT is(pg_get_function_arguments(oid), args, fname || ': argument names, types and defaults')
  FROM api_oid ORDER BY ord;

-- 8: return type and TABLE column names and types
SELECT is(pg_get_function_result(oid), result, fname || ': return type and output columns')
  FROM api_oid ORDER BY ord;

-- 8: volatility
SELECT volatility_is(:'emschema', fname, argtypes, vol, fname || ' is ' || vol)
  FROM api ORDER BY ord;

-- 8: SECURITY DEFINER
SELECT is_definer(:'emschema', fname, argtypes, fname || ' is SECURITY DEFINER')
  FROM api ORDER BY ord;

-- 8: pinned search_path: a SET clause, or, for reserve, charge, heartbeat
-- and settle, none, because their C code pins the same path for the call
-- (spi.c; search_path.sql proves it holds against a hostile caller)
SELECT ok((SELECT CASE WHEN a.fname IN ('earmark_reserve', 'earmark_charge', 'earmark_heartbeat', 'earmark_settle')
                       THEN p.proconfig IS NULL
                       ELSE p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp']
                            AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) c
                                             WHERE c LIKE 'search\_path=%' AND c <> 'search_path=pg_catalog, pg_temp')
                  END
             FROM pg_proc p WHERE p.oid = a.oid),
          fname || CASE WHEN a.fname IN ('earmark_reserve', 'earmark_charge', 'earmark_heartbeat', 'earmark_settle')
                        THEN ' pins its search_path in C (no SET clause)'
                        ELSE ' has SET search_path = pg_catalog, pg_temp' END)
  FROM api_oid a ORDER BY ord;

-- 8: CALLED ON NULL INPUT (NULL means something: unlimited, recorded use, no step...)
SELECT is((SELECT p.proisstrict FROM pg_proc p WHERE p.oid = a.oid), false,
          fname || ' is not STRICT (a NULL argument is meaningful)')
  FROM api_oid a ORDER BY ord;

-- 8: one function per name (an overload would make calls with defaults
-- ambiguous), but for the 0.2.0 forms of charge, heartbeat and settle,
-- which take no account and only fail (42883, below)
CREATE TEMP TABLE api_v020 (fname text NOT NULL, argtypes text NOT NULL);
INSERT INTO api_v020 VALUES ('earmark_charge', 'bigint, bigint, bigint'),
                            ('earmark_heartbeat', 'bigint'),
                            ('earmark_settle', 'bigint, bigint');
SELECT is((SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE p.proname = a.fname AND p.oid IS DISTINCT FROM a.oid
              AND NOT EXISTS (SELECT 1 FROM api_v020 v
                               WHERE v.fname = p.proname
                                 AND v.argtypes = pg_catalog.oidvectortypes(p.proargtypes)::text)),
          0::bigint, fname || ' has no overloads but its 0.2.0 form')
  FROM api_oid a ORDER BY ord;

-- 3: the 0.2.0 forms fail with 42883 and say to pass the account first
SELECT throws_ok($$SELECT earmark_charge(1, 10)$$, '42883',
                 'earmark_charge takes the account first since earmark 0.3.0',
                 'the 0.2.0 form of earmark_charge fails with 42883');
SELECT throws_ok($$SELECT earmark_heartbeat(1)$$, '42883',
                 'earmark_heartbeat takes the account first since earmark 0.3.0',
                 'the 0.2.0 form of earmark_heartbeat fails with 42883');
SELECT throws_ok($$SELECT earmark_settle(1, 10)$$, '42883',
                 'earmark_settle takes the account first since earmark 0.3.0',
                 'the 0.2.0 form of earmark_settle fails with 42883');

-- 3: a call with the account first and its defaults left out is not
-- ambiguous: it reaches the 0.3.0 function (which finds no such job)
SELECT throws_ok($$SELECT earmark_charge('contract-nobody', 1, 10)$$, 'EM003', NULL,
                 'earmark_charge(account, job_id, tokens) resolves to the account-first form');
SELECT throws_ok($$SELECT earmark_heartbeat('contract-nobody', 1)$$, 'EM003', NULL,
                 'earmark_heartbeat(account, job_id) resolves to the account-first form');
SELECT throws_ok($$SELECT earmark_settle('contract-nobody', 1)$$, 'EM003', NULL,
                 'earmark_settle(account, job_id) resolves to the account-first form');
SELECT throws_ok($$SELECT earmark_settle('contract-nobody', 1, NULL)$$, 'EM003', NULL,
                 'earmark_settle(account, job_id, NULL) resolves to the account-first form (not 42725)');

-- 1: all of them belong to the extension
SELECT bag_eq(
    $$SELECT p.oid::regprocedure::text FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
       WHERE d.classid = 'pg_proc'::regclass AND d.refclassid = 'pg_extension'::regclass
         AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'earmark')
         AND d.deptype = 'e' AND p.oid IN (SELECT oid FROM api_oid)$$,
    $$SELECT oid::regprocedure::text FROM api_oid WHERE oid IS NOT NULL$$,
    'the API functions are members of extension earmark');

-- 4: GUCs and their built-in defaults
SELECT results_eq(
    $$SELECT boot_val, unit, vartype FROM pg_settings WHERE name = 'earmark.lease'$$,
    $$VALUES ('120'::text, 's'::text, 'integer'::text)$$,
    'earmark.lease exists and defaults to 120 s (2 minutes)');
SELECT results_eq(
    $$SELECT boot_val, unit, vartype FROM pg_settings WHERE name = 'earmark.sweep_interval'$$,
    $$VALUES ('1000'::text, 'ms'::text, 'integer'::text)$$,
    'earmark.sweep_interval exists and defaults to 1000 ms (1 s)');
SELECT results_eq(
    $$SELECT boot_val, unit, vartype FROM pg_settings WHERE name = 'earmark.rate_limit'$$,
    $$VALUES ('120'::text, NULL::text, 'integer'::text)$$,
    'earmark.rate_limit exists and defaults to 120 admissions a minute');
SELECT results_eq(
    $$SELECT boot_val, vartype FROM pg_settings WHERE name = 'earmark.database'$$,
    $$VALUES (''::text, 'string'::text)$$,
    'earmark.database exists and defaults to empty (a worker in every database with earmark)');

-- 2: the default lease as the gate reads it, and the setting in effect
SELECT is(current_setting('earmark.lease')::interval, interval '2 minutes',
          'earmark.lease reads as 2 minutes');
SELECT is(current_setting('earmark.database'), 'postgres',
          'earmark.database is postgres');

SELECT * FROM finish();
ROLLBACK;
