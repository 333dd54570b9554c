-- test/pgtap/privileges.sql: who may do what.  The tables of schema
-- earmark are reachable only through the SECURITY DEFINER API; earmark_user
-- runs the gate, earmark_admin also sets limits and accounts and sweeps;
-- nothing is granted to PUBLIC.
BEGIN;
SELECT plan(70);

SELECT n.nspname AS emschema
  FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'earmark' \gset

CREATE TEMP TABLE em_tables (t text PRIMARY KEY);
INSERT INTO em_tables VALUES ('account'), ('account_limit'), ('budget'), ('job'), ('ledger'), ('meter_mark');
GRANT SELECT ON em_tables TO PUBLIC;

-- ---------------------------------------------------------------------
-- nothing for PUBLIC
-- ---------------------------------------------------------------------

-- 6: each table has no PUBLIC privilege at all
SELECT is((SELECT count(*) FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
            WHERE c.oid = ('earmark.' || t)::regclass AND a.grantee = 0),
          0::bigint, 'PUBLIC has no privilege on earmark.' || t)
  FROM em_tables ORDER BY t;

-- 1: nor on any other relation of the schema (sequences, views, future tables)
SELECT is((SELECT count(*) FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace,
             aclexplode(coalesce(c.relacl, acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char", c.relowner))) a
            WHERE n.nspname = 'earmark' AND a.grantee = 0),
          0::bigint, 'PUBLIC has no privilege on any relation of schema earmark');

-- 1: nor on the schema
SELECT is((SELECT count(*) FROM pg_namespace n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
            WHERE n.nspname = 'earmark' AND a.grantee = 0),
          0::bigint, 'PUBLIC has no USAGE or CREATE on schema earmark');

-- 1: nor EXECUTE on an API function
SELECT is((SELECT array_agg(p.proname::text ORDER BY p.proname)
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace,
                  aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
            WHERE n.nspname = :'emschema' AND p.proname LIKE 'earmark\_%'
              AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'),
          NULL::text[], 'PUBLIC has no EXECUTE on any earmark_* function');

-- ---------------------------------------------------------------------
-- set-up as the superuser: roles, an account with a limit, a running job
-- ---------------------------------------------------------------------
CREATE ROLE em_tap_plain;
CREATE ROLE em_tap_user IN ROLE earmark_user;
CREATE ROLE em_tap_admin IN ROLE earmark_admin;

SELECT lives_ok($$SELECT earmark_set_limit('em_tap_priv', 1000)$$, 'superuser sets a limit for the set-up');

CREATE TEMP TABLE priv_job (who text PRIMARY KEY, job_id bigint);
GRANT ALL ON priv_job TO PUBLIC;
INSERT INTO priv_job SELECT 'setup', job_id FROM earmark_reserve('em_tap_priv', 10, 'priv-setup');

-- ---------------------------------------------------------------------
-- a plain role: no table, no function
-- ---------------------------------------------------------------------
SET ROLE em_tap_plain;

-- 24: no SELECT, INSERT, UPDATE, DELETE on any table
SELECT throws_ok(format('SELECT * FROM earmark.%I', t), '42501', NULL,
                 'plain role cannot SELECT earmark.' || t) FROM em_tables ORDER BY t;
SELECT throws_ok(format('INSERT INTO earmark.%I DEFAULT VALUES', t), '42501', NULL,
                 'plain role cannot INSERT into earmark.' || t) FROM em_tables ORDER BY t;
SELECT throws_ok(format('UPDATE earmark.%I SET %I = NULL', t,
                        CASE t WHEN 'meter_mark' THEN 'marked_at' WHEN 'ledger' THEN 'entry_key'
                               WHEN 'job' THEN 'settled_at' WHEN 'budget' THEN 'rate_tat'
                               WHEN 'account_limit' THEN 'lim' ELSE 'cycle_anchor' END),
                 '42501', NULL, 'plain role cannot UPDATE earmark.' || t) FROM em_tables ORDER BY t;
SELECT throws_ok(format('DELETE FROM earmark.%I', t), '42501', NULL,
                 'plain role cannot DELETE from earmark.' || t) FROM em_tables ORDER BY t;

-- 8: no API function
SELECT throws_ok($$SELECT earmark_set_limit('em_tap_priv', 5)$$, '42501', NULL,
                 'plain role cannot EXECUTE earmark_set_limit');
SELECT throws_ok($$SELECT earmark_set_account('em_tap_priv')$$, '42501', NULL,
                 'plain role cannot EXECUTE earmark_set_account');
SELECT throws_ok($$SELECT * FROM earmark_budget('em_tap_priv')$$, '42501', NULL,
                 'plain role cannot EXECUTE earmark_budget');
SELECT throws_ok($$SELECT * FROM earmark_reserve('em_tap_priv', 1, 'priv-plain')$$, '42501', NULL,
                 'plain role cannot EXECUTE earmark_reserve');
SELECT throws_ok(format('SELECT * FROM earmark_charge(%s, 1)', (SELECT job_id FROM priv_job WHERE who = 'setup')),
                 '42501', NULL, 'plain role cannot EXECUTE earmark_charge');
SELECT throws_ok(format('SELECT earmark_heartbeat(%s)', (SELECT job_id FROM priv_job WHERE who = 'setup')),
                 '42501', NULL, 'plain role cannot EXECUTE earmark_heartbeat');
SELECT throws_ok(format('SELECT * FROM earmark_settle(%s, 1)', (SELECT job_id FROM priv_job WHERE who = 'setup')),
                 '42501', NULL, 'plain role cannot EXECUTE earmark_settle');
SELECT throws_ok($$SELECT earmark_sweep()$$, '42501', NULL,
                 'plain role cannot EXECUTE earmark_sweep');

-- 1: and cannot put objects into schema earmark
SELECT throws_ok($$CREATE TABLE earmark.em_tap_intruder (x int)$$, '42501', NULL,
                 'plain role cannot CREATE in schema earmark');
RESET ROLE;

-- ---------------------------------------------------------------------
-- earmark_user: the gate, nothing else
-- ---------------------------------------------------------------------
SET ROLE em_tap_user;

-- 6: the gate functions
SELECT lives_ok($$INSERT INTO priv_job SELECT 'user', job_id FROM earmark_reserve('em_tap_priv', 100, 'priv-user')$$,
                'earmark_user can EXECUTE earmark_reserve');
SELECT isnt((SELECT job_id FROM priv_job WHERE who = 'user'), NULL, 'earmark_user''s reserve was admitted');
SELECT results_eq(format('SELECT charged, capped, status FROM earmark_charge(%s, 30)',
                         (SELECT job_id FROM priv_job WHERE who = 'user')),
                  $$VALUES (30::bigint, false, 'running'::text)$$,
                  'earmark_user can EXECUTE earmark_charge');
SELECT isnt(earmark_heartbeat((SELECT job_id FROM priv_job WHERE who = 'user')), NULL,
            'earmark_user can EXECUTE earmark_heartbeat');
SELECT results_eq(format('SELECT charged, released, status FROM earmark_settle(%s, 40)',
                         (SELECT job_id FROM priv_job WHERE who = 'user')),
                  $$VALUES (40::bigint, 60::bigint, 'completed'::text)$$,
                  'earmark_user can EXECUTE earmark_settle');
SELECT results_eq($$SELECT lim, used, held, remaining FROM earmark_budget('em_tap_priv')$$,
                  $$VALUES (1000::bigint, 40::bigint, 10::bigint, 950::bigint)$$,
                  'earmark_user can EXECUTE earmark_budget');

-- 3: not the admin functions
SELECT throws_ok($$SELECT earmark_set_limit('em_tap_priv', 1000000)$$, '42501', NULL,
                 'earmark_user cannot EXECUTE earmark_set_limit');
SELECT throws_ok($$SELECT earmark_set_account('em_tap_priv', provider_customer => 'x')$$, '42501', NULL,
                 'earmark_user cannot EXECUTE earmark_set_account');
SELECT throws_ok($$SELECT earmark_sweep()$$, '42501', NULL,
                 'earmark_user cannot EXECUTE earmark_sweep');

-- 8: not the tables (6 SELECTs, an UPDATE, a DELETE)
SELECT throws_ok(format('SELECT * FROM earmark.%I', t), '42501', NULL,
                 'earmark_user cannot SELECT earmark.' || t) FROM em_tables ORDER BY t;
SELECT throws_ok($$UPDATE earmark.budget SET held = 0$$, '42501', NULL,
                 'earmark_user cannot UPDATE earmark.budget');
SELECT throws_ok($$DELETE FROM earmark.job$$, '42501', NULL,
                 'earmark_user cannot DELETE from earmark.job');
RESET ROLE;

-- ---------------------------------------------------------------------
-- earmark_admin: limits, accounts, sweep (and the gate)
-- ---------------------------------------------------------------------
SET ROLE em_tap_admin;

-- 7
SELECT lives_ok($$SELECT earmark_set_limit('em_tap_priv', 2000)$$,
                'earmark_admin can EXECUTE earmark_set_limit');
SELECT lives_ok($$SELECT earmark_set_account('em_tap_priv', provider_customer => 'cus_tap')$$,
                'earmark_admin can EXECUTE earmark_set_account');
SELECT lives_ok($$SELECT earmark_set_account('em_tap_priv_new', '2024-03-05 10:00+00')$$,
                'earmark_admin can set the anchor of a new account');
SELECT lives_ok($$SELECT earmark_sweep()$$, 'earmark_admin can EXECUTE earmark_sweep');
SELECT results_eq($$SELECT lim, remaining FROM earmark_budget('em_tap_priv')$$,
                  $$VALUES (2000::bigint, 1950::bigint)$$,
                  'earmark_admin''s new limit is in effect');
SELECT lives_ok($$INSERT INTO priv_job SELECT 'admin', job_id FROM earmark_reserve('em_tap_priv', 5, 'priv-admin')$$,
                'earmark_admin is also an earmark_user and can reserve');
SELECT throws_ok($$SELECT * FROM earmark.account_limit$$, '42501', NULL,
                 'earmark_admin cannot read the tables directly either');
RESET ROLE;

-- 2: what the admin wrote, seen by the superuser
SELECT results_eq($$SELECT provider_customer FROM earmark.account WHERE account = 'em_tap_priv'$$,
                  $$VALUES ('cus_tap'::text)$$, 'set_account by earmark_admin stored the provider id');
SELECT results_eq($$SELECT cycle_anchor FROM earmark.account WHERE account = 'em_tap_priv_new'$$,
                  $$VALUES ('2024-03-05 10:00+00'::timestamptz)$$, 'set_account by earmark_admin stored the anchor');

-- 1: earmark_admin includes earmark_user
SELECT ok(pg_has_role('earmark_admin', 'earmark_user', 'MEMBER'), 'earmark_admin is a member of earmark_user');

SELECT * FROM finish();
ROLLBACK;
