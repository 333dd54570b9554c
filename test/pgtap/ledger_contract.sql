-- test/pgtap/ledger_contract.sql: the SQL contract of docs/api.md "Usage
-- ledger and meter" as the install script's last section defines it:
--   1. the four functions (earmark_record_usage, earmark_reconcile,
--      earmark_report, earmark_refresh_limits): arguments, defaults, return
--      types, volatility, NULL handling, SECURITY DEFINER with a pinned
--      search_path; the columns of earmark.evidence and its verdicts; the
--      columns of the monitoring views;
--   2. who may call and read what (PUBLIC, earmark_user, earmark_admin),
--      checked in the catalogs and by calls as a role that is only an
--      earmark_user;
--   3. the settings of the reporter, the limit cache and the provider: their
--      defaults and contexts, and that secrets are not settings (the secrets
--      file's path is hidden from roles without pg_read_all_settings);
--   4. the behaviour of earmark_record_usage that belongs to the contract: a
--      repeated key returns false, and the SQLSTATEs of bad arguments.
--
-- Not here: earmark_report and earmark_reconcile refuse to run inside a
-- REPEATABLE READ or SERIALIZABLE transaction (25000, em_require_read_committed
-- in earmark.c).  That cannot be tested inside the one transaction pgTAP runs
-- in: its isolation level is fixed by the first query.  It belongs to
-- test/isolation/specs/ledger_repeatable_read.spec, whose step "brep" calls
-- earmark_report in a REPEATABLE READ transaction.  Note: as that spec
-- stands, brep swallows any error (em_try(...) IS NOT NULL), so it does not
-- pin 25000, and no test calls earmark_reconcile under REPEATABLE READ.
BEGIN;
SELECT plan(114);

-- the schema the extension was created in (its functions live there)
SELECT n.nspname AS emschema
  FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'earmark' \gset

-- a call's result as text, or its SQLSTATE and message: a call that should
-- work and raises fails one assertion instead of ending the file
CREATE FUNCTION pg_temp.em_tap_try(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r text;
BEGIN
    EXECUTE q INTO r;
    RETURN r;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

-- =====================================================================
-- 1. contract
-- =====================================================================

CREATE TEMP TABLE ledger_api (
    fname    text NOT NULL,
    argtypes text[] NOT NULL,
    args     text NOT NULL,     -- pg_get_function_arguments
    result   text NOT NULL,     -- pg_get_function_result
    ord      int NOT NULL
);
INSERT INTO ledger_api VALUES
('earmark_record_usage', '{text,bigint,text,text,timestamp with time zone}',
 $$account text, units bigint, idempotency_key text, feature text DEFAULT 'default'::text, occurred_at timestamp with time zone DEFAULT now()$$,
 'boolean', 1),
('earmark_reconcile', '{text,text}',
 $$account text DEFAULT NULL::text, feature text DEFAULT NULL::text$$,
 'SETOF earmark.evidence', 2),
('earmark_report', '{integer}',
 $$max_cycles integer DEFAULT NULL::integer$$,
 'integer', 3),
('earmark_refresh_limits', '{text}',
 $$account text$$,
 'integer', 4);

CREATE TEMP VIEW ledger_api_oid AS
SELECT a.*, pg_catalog.to_regprocedure(
           pg_catalog.format('%I.%I(%s)', :'emschema', a.fname, pg_catalog.array_to_string(a.argtypes, ','))
       ) AS oid
  FROM ledger_api a;

-- 4: each function exists in the extension's schema with these argument types
SELECT has_function(:'emschema', fname, argtypes,
                    fname || '(' || array_to_string(argtypes, ', ') || ') exists in the extension schema')
  FROM ledger_api ORDER BY ord;

-- 4: argument names, types and defaults
SELECT is(pg_get_function_arguments(oid), args, fname || ': argument names, types and defaults')
  FROM ledger_api_oid ORDER BY ord;

-- 4: return type
SELECT is(pg_get_function_result(oid), result, fname || ': return type')
  FROM ledger_api_oid ORDER BY ord;

-- 4: volatile
SELECT volatility_is(:'emschema', fname, argtypes, 'volatile', fname || ' is volatile')
  FROM ledger_api ORDER BY ord;

-- 4: CALLED ON NULL INPUT (a NULL argument raises 22004 or means "all")
SELECT is((SELECT p.proisstrict FROM pg_proc p WHERE p.oid = a.oid), false,
          fname || ' is CALLED ON NULL INPUT (not STRICT)')
  FROM ledger_api_oid a ORDER BY ord;

-- 4: SECURITY DEFINER
SELECT is_definer(:'emschema', fname, argtypes, fname || ' is SECURITY DEFINER')
  FROM ledger_api ORDER BY ord;

-- 4: pinned search_path, and no other search_path entry
SELECT ok((SELECT p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp']
              AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) c
                               WHERE c LIKE 'search\_path=%' AND c <> 'search_path=pg_catalog, pg_temp')
             FROM pg_proc p WHERE p.oid = a.oid),
          fname || ' has SET search_path = pg_catalog, pg_temp')
  FROM ledger_api_oid a ORDER BY ord;

-- 4: one function per name (an overload would make calls with defaults ambiguous)
SELECT is((SELECT count(*) FROM pg_proc p WHERE p.proname = a.fname),
          1::bigint, fname || ' has no overloads')
  FROM ledger_api a ORDER BY ord;

-- 1: all of them belong to the extension
SELECT bag_eq(
    $$SELECT p.oid::regprocedure::text FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
       WHERE d.classid = 'pg_proc'::regclass AND d.refclassid = 'pg_extension'::regclass
         AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'earmark')
         AND d.deptype = 'e' AND p.oid IN (SELECT oid FROM ledger_api_oid)$$,
    $$SELECT oid::regprocedure::text FROM ledger_api_oid WHERE oid IS NOT NULL$$,
    'the ledger functions are members of extension earmark');

-- 1: earmark.evidence, the row type earmark_reconcile returns: columns in order
SELECT results_eq(
    $$SELECT attname::text COLLATE "default", format_type(atttypid, atttypmod) FROM pg_attribute
       WHERE attrelid = 'earmark.evidence'::regclass AND attnum > 0 AND NOT attisdropped
       ORDER BY attnum$$,
    $$VALUES ('evidence_id'::text, 'bigint'::text),
             ('budget_id', 'bigint'),
             ('account', 'text'),
             ('feature', 'text'),
             ('cycle_start', 'timestamp with time zone'),
             ('cycle_end', 'timestamp with time zone'),
             ('closed', 'boolean'),
             ('ledger_total', 'bigint'),
             ('counter_total', 'bigint'),
             ('counters_rebuilt', 'boolean'),
             ('last_sent', 'bigint'),
             ('provider_total', 'bigint'),
             ('verdict', 'text'),
             ('cause', 'text'),
             ('repaired_to', 'bigint'),
             ('read_back', 'bigint'),
             ('checked_at', 'timestamp with time zone'),
             ('last_checked_at', 'timestamp with time zone')$$,
    'earmark.evidence has the contract''s columns, names and types in order');

-- 1: the verdicts the CHECK constraints on evidence.verdict name
SELECT set_eq(
    $$SELECT (regexp_matches(pg_get_constraintdef(c.oid), '''([^'']*)''', 'g'))[1]
        FROM pg_constraint c
       WHERE c.conrelid = 'earmark.evidence'::regclass AND c.contype = 'c'
         AND c.conkey @> ARRAY[(SELECT attnum FROM pg_attribute
                                 WHERE attrelid = 'earmark.evidence'::regclass AND attname = 'verdict')]$$,
    $$VALUES ('match'), ('unreadable'), ('closed_cycle_drift'), ('over_billed'), ('under_billed'), ('repaired')$$,
    'the CHECK on earmark.evidence.verdict names exactly the six verdicts');

-- 2: and the CHECK takes each of them and refuses another word
SELECT lives_ok(
    $$INSERT INTO earmark.evidence (budget_id, account, feature, cycle_start, cycle_end, closed,
                                    ledger_total, counter_total, counters_rebuilt, verdict)
      SELECT -1, 'em_tap_lc_check', 'default', now(), now() + interval '1 month', false, 0, 0, false, v
        FROM unnest(ARRAY['match', 'unreadable', 'closed_cycle_drift', 'over_billed', 'under_billed', 'repaired']) v$$,
    'earmark.evidence accepts each of the six verdicts');
SELECT throws_ok(
    $$INSERT INTO earmark.evidence (budget_id, account, feature, cycle_start, cycle_end, closed,
                                    ledger_total, counter_total, counters_rebuilt, verdict)
      VALUES (-1, 'em_tap_lc_check', 'default', now(), now() + interval '1 month', false, 0, 0, false, 'drift')$$,
    '23514', NULL, 'earmark.evidence refuses a verdict outside the five (23514)');

-- 3: the monitoring views' columns, names and types in order
SELECT results_eq(
    $$SELECT attname::text COLLATE "default", format_type(atttypid, atttypmod) FROM pg_attribute
       WHERE attrelid = 'earmark.review_list'::regclass AND attnum > 0 AND NOT attisdropped
       ORDER BY attnum$$,
    $$VALUES ('account'::text, 'text'::text),
             ('feature', 'text'),
             ('cycle_start', 'timestamp with time zone'),
             ('cycle_end', 'timestamp with time zone'),
             ('ledger_total', 'bigint'),
             ('last_sent', 'bigint'),
             ('unreported', 'bigint'),
             ('reason', 'text'),
             ('first_noted', 'timestamp with time zone'),
             ('last_noted', 'timestamp with time zone'),
             ('budget_id', 'bigint')$$,
    'earmark.review_list has its columns, names and types in order');
SELECT results_eq(
    $$SELECT attname::text COLLATE "default", format_type(atttypid, atttypmod) FROM pg_attribute
       WHERE attrelid = 'earmark.send_log'::regclass AND attnum > 0 AND NOT attisdropped
       ORDER BY attnum$$,
    $$VALUES ('send_id'::text, 'bigint'::text),
             ('account', 'text'),
             ('feature', 'text'),
             ('cycle_start', 'timestamp with time zone'),
             ('total', 'bigint'),
             ('origin', 'text'),
             ('ok', 'boolean'),
             ('http_status', 'integer'),
             ('error', 'text'),
             ('duration_ms', 'double precision'),
             ('sent_at', 'timestamp with time zone'),
             ('budget_id', 'bigint')$$,
    'earmark.send_log has its columns, names and types in order');
SELECT results_eq(
    $$SELECT attname::text COLLATE "default", format_type(atttypid, atttypmod) FROM pg_attribute
       WHERE attrelid = 'earmark.worker_status'::regclass AND attnum > 0 AND NOT attisdropped
       ORDER BY attnum$$,
    $$VALUES ('marked_cycles'::text, 'bigint'::text),
             ('oldest_mark', 'timestamp with time zone'),
             ('last_report_at', 'timestamp with time zone'),
             ('last_report_sent', 'integer'),
             ('last_report_failed', 'integer'),
             ('last_report_error', 'text'),
             ('report_blocked_until', 'timestamp with time zone'),
             ('cycles_to_review', 'bigint'),
             ('limits_wanted', 'bigint'),
             ('dead_events', 'bigint'),
             ('workers_running', 'bigint')$$,
    'earmark.worker_status has its columns, names and types in order');

-- =====================================================================
-- 2. privileges
-- =====================================================================

-- 4: PUBLIC may execute none of the four
SELECT is(has_function_privilege('public', oid, 'EXECUTE'), false,
          'PUBLIC has no EXECUTE on ' || fname)
  FROM ledger_api_oid ORDER BY ord;

-- 4: earmark_user: record_usage and refresh_limits, not report or reconcile
SELECT is(has_function_privilege('earmark_user', oid, 'EXECUTE'),
          fname IN ('earmark_record_usage', 'earmark_refresh_limits'),
          'earmark_user ' || CASE WHEN fname IN ('earmark_record_usage', 'earmark_refresh_limits')
                                  THEN 'may' ELSE 'may not' END || ' EXECUTE ' || fname)
  FROM ledger_api_oid ORDER BY ord;

-- 1 + 4: earmark_admin is an earmark_user and may execute all four
SELECT ok(pg_has_role('earmark_admin', 'earmark_user', 'MEMBER'), 'earmark_admin is a member of earmark_user');
SELECT is(has_function_privilege('earmark_admin', oid, 'EXECUTE'), true,
          'earmark_admin may EXECUTE ' || fname)
  FROM ledger_api_oid ORDER BY ord;

CREATE TEMP TABLE ledger_readable (rel text PRIMARY KEY);
INSERT INTO ledger_readable VALUES ('earmark.review_list'), ('earmark.send_log'),
                                   ('earmark.worker_status'), ('earmark.evidence');
CREATE TEMP TABLE ledger_tables (rel text PRIMARY KEY);
INSERT INTO ledger_tables VALUES ('earmark.ledger'), ('earmark.usage_shard'), ('earmark.meter_mark'),
                                 ('earmark.meter_send'), ('earmark.meter_review'), ('earmark.local_meter'),
                                 ('earmark.reporter_state');

-- 4: earmark_admin may SELECT the views and the evidence, and write none of them
SELECT ok(has_table_privilege('earmark_admin', rel, 'SELECT')
          AND NOT has_table_privilege('earmark_admin', rel, 'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
          AND NOT has_any_column_privilege('earmark_admin', rel, 'INSERT, UPDATE, REFERENCES'),
          'earmark_admin may SELECT ' || rel || ', and only SELECT')
  FROM ledger_readable ORDER BY rel;

-- 8: earmark_user and PUBLIC have no privilege on them at all (table or column)
SELECT ok(NOT has_table_privilege(r, rel, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
          AND NOT has_any_column_privilege(r, rel, 'SELECT, INSERT, UPDATE, REFERENCES'),
          r || ' has no privilege on ' || rel)
  FROM ledger_readable, (VALUES ('earmark_user'), ('public')) AS who(r) ORDER BY r, rel;

-- 14: nor on the tables of the ledger and the meter
SELECT ok(NOT has_table_privilege(r, rel, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
          AND NOT has_any_column_privilege(r, rel, 'SELECT, INSERT, UPDATE, REFERENCES'),
          r || ' has no privilege on ' || rel)
  FROM ledger_tables, (VALUES ('earmark_user'), ('public')) AS who(r) ORDER BY r, rel;

-- set-up as the superuser: a role that is only an earmark_user, an account
CREATE ROLE em_tap_lc_user IN ROLE earmark_user;

-- 1
SELECT lives_ok($$SELECT earmark_set_limit('em_tap_lc', 1000)$$, 'superuser sets up account em_tap_lc');

SET ROLE em_tap_lc_user;

-- 2: not the admin's functions
SELECT throws_ok($$SELECT earmark_report()$$, '42501', NULL,
                 'an earmark_user cannot call earmark_report (42501)');
SELECT throws_ok($$SELECT * FROM earmark_reconcile()$$, '42501', NULL,
                 'an earmark_user cannot call earmark_reconcile (42501)');

-- 2: its own
SELECT is(pg_temp.em_tap_try($$SELECT earmark_record_usage('em_tap_lc', 3, 'lc-user-1')::text$$), 'true',
          'an earmark_user can call earmark_record_usage, and it writes');
SELECT is(pg_temp.em_tap_try($$SELECT earmark_refresh_limits('em_tap_lc')::text$$), '0',
          'an earmark_user can call earmark_refresh_limits (the local provider reads 0 limits)');

-- 1: nor read the evidence
SELECT throws_ok($$SELECT * FROM earmark.evidence$$, '42501', NULL,
                 'an earmark_user cannot read earmark.evidence (42501)');
RESET ROLE;

-- =====================================================================
-- 3. settings
-- =====================================================================

-- 10: built-in defaults, units, types and contexts (read by the superuser,
-- who sees the superuser-only setting too)
SELECT results_eq(
    $$SELECT boot_val, unit, vartype, context FROM pg_settings WHERE name = 'earmark.provider'$$,
    $$VALUES ('local'::text, NULL::text, 'enum'::text, 'sighup'::text)$$,
    'earmark.provider: enum, defaults to local, sighup');
SELECT results_eq(
    $$SELECT enumvals FROM pg_settings WHERE name = 'earmark.provider'$$,
    $$VALUES ('{local,kinde,http}'::text[])$$,
    'earmark.provider takes local, kinde, http');
SELECT results_eq(
    $$SELECT boot_val, unit, vartype, context FROM pg_settings WHERE name = 'earmark.report_interval'$$,
    $$VALUES ('60'::text, 's'::text, 'integer'::text, 'sighup'::text)$$,
    'earmark.report_interval: defaults to 60 s, sighup');
SELECT results_eq(
    $$SELECT boot_val, unit, vartype, context FROM pg_settings WHERE name = 'earmark.report_batch'$$,
    $$VALUES ('100'::text, NULL::text, 'integer'::text, 'sighup'::text)$$,
    'earmark.report_batch: defaults to 100 cycles a pass, sighup');
SELECT results_eq(
    $$SELECT boot_val, unit, vartype, context FROM pg_settings WHERE name = 'earmark.report_parallel'$$,
    $$VALUES ('10'::text, NULL::text, 'integer'::text, 'sighup'::text)$$,
    'earmark.report_parallel: defaults to 10 requests at once, sighup');
SELECT results_eq(
    $$SELECT boot_val, unit, vartype, context FROM pg_settings WHERE name = 'earmark.limit_fresh'$$,
    $$VALUES ('60'::text, 's'::text, 'integer'::text, 'sighup'::text)$$,
    'earmark.limit_fresh: defaults to 60 s, sighup');
SELECT results_eq(
    $$SELECT boot_val, unit, vartype, context FROM pg_settings WHERE name = 'earmark.limit_stale'$$,
    $$VALUES ('600'::text, 's'::text, 'integer'::text, 'sighup'::text)$$,
    'earmark.limit_stale: defaults to 600 s (10 minutes), sighup');
SELECT results_eq(
    $$SELECT boot_val, vartype, context FROM pg_settings WHERE name = 'earmark.provider_url'$$,
    $$VALUES (''::text, 'string'::text, 'sighup'::text)$$,
    'earmark.provider_url: empty by default, sighup');
SELECT results_eq(
    $$SELECT boot_val, vartype, context FROM pg_settings WHERE name = 'earmark.provider_client_id'$$,
    $$VALUES (''::text, 'string'::text, 'sighup'::text)$$,
    'earmark.provider_client_id: empty by default, sighup');
SELECT results_eq(
    $$SELECT boot_val, vartype, context FROM pg_settings WHERE name = 'earmark.provider_secrets_file'$$,
    $$VALUES (''::text, 'string'::text, 'sighup'::text)$$,
    'earmark.provider_secrets_file: empty by default, sighup');

-- 2: secrets are not settings: the only earmark.* setting named like a
-- secret or a token is the path of the secrets file, and none of the
-- secrets the file holds (client_secret, token, hmac_secret) is a setting
-- under another name
SELECT is((SELECT array_agg(name::text ORDER BY name) FROM pg_settings
            WHERE name LIKE 'earmark.%' AND (name LIKE '%secret%' OR name LIKE '%token%')),
          ARRAY['earmark.provider_secrets_file'],
          'no earmark.* setting is named like a secret or token except the secrets file''s path');
SELECT is((SELECT array_agg(n ORDER BY n) FROM unnest(ARRAY[
              'earmark.secret', 'earmark.client_secret', 'earmark.token', 'earmark.hmac_secret',
              'earmark.provider_secret', 'earmark.provider_client_secret', 'earmark.provider_token',
              'earmark.provider_hmac_secret', 'earmark.webhook_secret']) n
            WHERE current_setting(n, true) IS NOT NULL),
          NULL::text[],
          'no hidden setting carries a secret (client_secret, token, hmac_secret)');

-- 1: the fresh role has no pg_read_all_settings (else the next tests prove nothing)
SELECT ok(NOT pg_has_role('em_tap_lc_user', 'pg_read_all_settings', 'USAGE')
          AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = 'em_tap_lc_user'),
          'em_tap_lc_user is no superuser and lacks pg_read_all_settings');

SET ROLE em_tap_lc_user;

-- 3: the secrets file's path is hidden from it
SELECT throws_ok($$SHOW earmark.provider_secrets_file$$, '42501', NULL,
                 'SHOW earmark.provider_secrets_file is refused to a role without pg_read_all_settings (42501)');
SELECT throws_ok($$SELECT current_setting('earmark.provider_secrets_file')$$, '42501', NULL,
                 'current_setting(''earmark.provider_secrets_file'') is refused to it (42501)');
SELECT is((SELECT count(*) FROM pg_settings WHERE name = 'earmark.provider_secrets_file'), 0::bigint,
          'pg_settings shows it no row for earmark.provider_secrets_file');

-- 2: which provider runs is not a secret
SELECT lives_ok($$SHOW earmark.provider$$, 'SHOW earmark.provider works for it');
SELECT is((SELECT count(*) FROM pg_settings WHERE name = 'earmark.provider'), 1::bigint,
          'pg_settings shows it earmark.provider');
RESET ROLE;

-- =====================================================================
-- 4. behaviour of earmark_record_usage that belongs to the contract
-- =====================================================================

-- 3: a key writes once; a repeat returns false and adds no row
SELECT is(pg_temp.em_tap_try($$SELECT earmark_record_usage('em_tap_lc', 7, 'lc-1')::text$$), 'true',
          'earmark_record_usage returns true for a new key');
SELECT is(pg_temp.em_tap_try($$SELECT earmark_record_usage('em_tap_lc', 7, 'lc-1')::text$$), 'false',
          'earmark_record_usage returns false for a repeated key');
SELECT is((SELECT count(*) FROM earmark.ledger WHERE account = 'em_tap_lc' AND entry_key = 'lc-1'), 1::bigint,
          'the repeated key wrote one ledger row');

-- 5: SQLSTATEs
SELECT throws_ok($$SELECT earmark_record_usage('em_tap_lc_nobody', 1, 'lc-2')$$, 'EM007', NULL,
                 'an unknown account raises EM007');
SELECT throws_ok($$SELECT earmark_record_usage('em_tap_lc', NULL, 'lc-3')$$, '22004', NULL,
                 'NULL units raise 22004');
SELECT throws_ok($$SELECT earmark_record_usage('em_tap_lc', 0, 'lc-4')$$, '22023', NULL,
                 'zero units raise 22023');
SELECT throws_ok($$SELECT earmark_record_usage('em_tap_lc', 1000000000000001::bigint, 'lc-5')$$, '22003', NULL,
                 'units of 10^15 + 1 raise 22003');
SELECT is(pg_temp.em_tap_try($$SELECT earmark_record_usage('em_tap_lc', 1000000000000000::bigint, 'lc-6')::text$$), 'true',
          'units of 10^15, the most one call records, are accepted');

-- 6: recorded usage goes to the cycle's 64 counter rows, each backend to
-- its own (its PGPROC number mod 64), so that writers of one account
-- rarely meet on one row (isolation marks_together: two open writers do
-- not wait for each other); one session's usages are on one row; their
-- sum is the ledger's
-- (its cycle began 14 to 17 days ago: none ends during the run, on any date)
SELECT earmark_set_account('em_tap_shards', make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC'))
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t;
SELECT earmark_set_limit('em_tap_shards', NULL);
SELECT count(*) FROM generate_series(1, 300) i, LATERAL earmark_record_usage('em_tap_shards', 2, 'sh-' || i) r;
SELECT is((SELECT count(DISTINCT u.shard) FROM earmark.usage_shard u JOIN earmark.budget b USING (budget_id)
            WHERE b.account = 'em_tap_shards'), 1::bigint,
          '300 recorded usages of one session land on one counter row, the session''s own');
SELECT is((SELECT min(u.shard) >= 0 AND max(u.shard) <= 63 FROM earmark.usage_shard u JOIN earmark.budget b USING (budget_id)
            WHERE b.account = 'em_tap_shards'), true, '... all of them rows 0 to 63');
SELECT is((SELECT used FROM earmark_budget('em_tap_shards')), 600::bigint,
          '... and the cycle reads their sum, 600');

SELECT * FROM finish();
ROLLBACK;
