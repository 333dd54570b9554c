-- test/pgtap/privileges.sql: who may do what.  The tables of schema
-- earmark are reachable only through the SECURITY DEFINER API; earmark_user
-- runs the gate, earmark_admin also sets limits and accounts and sweeps;
-- nothing is granted to PUBLIC.
BEGIN;
SELECT plan(81);

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

-- 1: the internal functions of schema earmark (the id default, the
-- worker's steps on a distributed install, the distribution lock and the
-- plan change's ignore) are the superuser's alone:
-- each listed with the roles that may EXECUTE it (none)
SELECT is((SELECT array_agg(p.proname || ':' || concat_ws(',',
                      CASE WHEN EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                                         WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE') THEN 'PUBLIC' END,
                      CASE WHEN has_function_privilege('earmark_user', p.oid, 'EXECUTE') THEN 'earmark_user' END,
                      CASE WHEN has_function_privilege('earmark_admin', p.oid, 'EXECUTE') THEN 'earmark_admin' END)
                      ORDER BY p.proname)
             FROM pg_proc p
            WHERE p.pronamespace = 'earmark'::regnamespace
              AND p.proname IN ('next_id', 'sweep_account', 'report_cycle', 'store_limits', 'distribution_lock',
                                'inbox_ignore')),
          ARRAY['distribution_lock:', 'inbox_ignore:', 'next_id:', 'report_cycle:', 'store_limits:', 'sweep_account:'],
          'no role but the superuser may EXECUTE earmark.next_id, report_cycle, store_limits, sweep_account, distribution_lock or inbox_ignore');

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
SELECT throws_ok(format('SELECT * FROM earmark_charge(''em_tap_priv'', %s, 1)', (SELECT job_id FROM priv_job WHERE who = 'setup')),
                 '42501', NULL, 'plain role cannot EXECUTE earmark_charge');
SELECT throws_ok(format('SELECT earmark_heartbeat(''em_tap_priv'', %s)', (SELECT job_id FROM priv_job WHERE who = 'setup')),
                 '42501', NULL, 'plain role cannot EXECUTE earmark_heartbeat');
SELECT throws_ok(format('SELECT * FROM earmark_settle(''em_tap_priv'', %s, 1)', (SELECT job_id FROM priv_job WHERE who = 'setup')),
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
SELECT results_eq(format('SELECT charged, capped, status FROM earmark_charge(''em_tap_priv'', %s, 30)',
                         (SELECT job_id FROM priv_job WHERE who = 'user')),
                  $$VALUES (30::bigint, false, 'running'::text)$$,
                  'earmark_user can EXECUTE earmark_charge');
SELECT isnt(earmark_heartbeat('em_tap_priv', (SELECT job_id FROM priv_job WHERE who = 'user')), NULL,
            'earmark_user can EXECUTE earmark_heartbeat');
SELECT results_eq(format('SELECT charged, released, status FROM earmark_settle(''em_tap_priv'', %s, 40)',
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

-- ---------------------------------------------------------------------
-- the inbox: earmark_user cannot change limits with events it makes up
-- ---------------------------------------------------------------------
-- set-up as the superuser: two accounts with a limit of 1000, plans that
-- would make one unlimited and the other 0, and the secret of a signed
-- billing source whose events name acme's customer id
DO $$
BEGIN
    PERFORM earmark_set_plan_limit('em_tap_unlimited', NULL);
    PERFORM earmark_set_plan_limit('em_tap_zero', 0);
    PERFORM earmark_set_plan_limit('em_tap_team', 20000);
    PERFORM earmark_set_account('em_tap_acme', provider_customer => 'cus_tap_acme');
    PERFORM earmark_set_limit('em_tap_acme', 1000);
    PERFORM earmark_set_limit('em_tap_other', 1000);
    PERFORM earmark_inbox_set_secret('em_tap_billing', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
END $$;

-- HMAC-SHA256 in SQL, to sign a delivery as the billing provider would
CREATE FUNCTION pg_temp.hmac_sha256(key bytea, msg bytea) RETURNS bytea LANGUAGE plpgsql AS $$
DECLARE
    k bytea := key || decode(repeat('00', 64 - length(key)), 'hex');
    ipad bytea := k;
    opad bytea := k;
BEGIN
    FOR i IN 0..63 LOOP
        ipad := set_byte(ipad, i, get_byte(k, i) # 54);
        opad := set_byte(opad, i, get_byte(k, i) # 92);
    END LOOP;
    RETURN sha256(opad || sha256(ipad || msg));
END $$;

-- the worker's part, done here (the worker cannot see this open
-- transaction): claim each pending plan change and run the built-in
-- handler on it, then mark it applied unless the handler ignored it
CREATE FUNCTION pg_temp.apply_plan_changes() RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    e earmark.inbox_event;
BEGIN
    FOR e IN UPDATE earmark.inbox_event SET status = 'processing', attempts = attempts + 1
              WHERE event_type = 'customer.plan_changed' AND status IN ('received', 'failed')
              RETURNING * LOOP
        RETURN NEXT earmark.apply_plan_change(e);
        UPDATE earmark.inbox_event SET status = 'applied', finished = true WHERE event_id = e.event_id AND status = 'processing';
    END LOOP;
END $$;

SET ROLE em_tap_user;
-- 3: made-up plan changes: unlimited for one account, 0 for another, and
-- one dated 2999 that would hold every later change back
SELECT throws_ok($$SELECT earmark_inbox_receive('kinde', 'em-tap-forged-1', 'customer.plan_changed',
                       '{"data": {"plan": {"key": "em_tap_unlimited"}}}', now(), 'em_tap_acme')$$,
                 '42501', NULL, 'earmark_user cannot store an unsigned plan change (unlimited for em_tap_acme)');
SELECT throws_ok($$SELECT earmark_inbox_receive('app', 'em-tap-forged-2', 'customer.plan_changed',
                       '{"data": {"plan": {"key": "em_tap_zero"}}}', now(), 'em_tap_other')$$,
                 '42501', NULL, 'earmark_user cannot store an unsigned plan change (0 for another account)');
SELECT throws_ok($$SELECT earmark_inbox_receive('app', 'em-tap-forged-3', 'customer.plan_changed',
                       '{"data": {"plan": {"key": "em_tap_zero"}}}', '2999-01-01 00:00+00', 'em_tap_acme')$$,
                 '42501', NULL, 'earmark_user cannot store a plan change dated 2999');
RESET ROLE;
CREATE TEMP TABLE em_tap_applied AS SELECT * FROM pg_temp.apply_plan_changes();

-- 3: no limit changed
SELECT results_eq($$SELECT account, lim FROM earmark.account_limit WHERE account IN ('em_tap_acme', 'em_tap_other') ORDER BY account$$,
                  $$VALUES ('em_tap_acme'::text, 1000::bigint), ('em_tap_other', 1000)$$,
                  'the made-up plan changes changed no limit, of either account');
SET ROLE em_tap_user;
SELECT results_eq($$SELECT admitted FROM earmark_reserve('em_tap_acme', 5000000, 'em-tap-5m')$$,
                  $$VALUES (false)$$, 'a reserve of 5,000,000 on em_tap_acme is refused');
SELECT results_eq($$SELECT admitted FROM earmark_reserve('em_tap_other', 100, 'em-tap-other')$$,
                  $$VALUES (true)$$, 'the other account still admits within its limit');

-- 4: a genuine plan change, signed by the billing source, still applies;
-- earmark_user may deliver it but not silence it while it waits
SELECT round(extract(epoch FROM now()))::bigint::text AS em_tap_ts,
       '{"type": "customer.plan_changed", "event_timestamp": "' || to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
       || '", "data": {"customer_id": "cus_tap_acme", "plan": {"key": "em_tap_team"}}}' AS em_tap_body \gset
SELECT 'v1,' || encode(pg_temp.hmac_sha256(decode('MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'base64'),
                                           convert_to('em-tap-signed.' || :'em_tap_ts' || '.' || :'em_tap_body', 'UTF8')),
                       'base64') AS em_tap_sig \gset
SELECT event_id AS em_tap_signed_id, inserted AS em_tap_signed_inserted
  FROM earmark_inbox_receive_signed('em_tap_billing', 'em-tap-signed', :'em_tap_ts', :'em_tap_sig', :'em_tap_body') \gset
SELECT ok(:'em_tap_signed_inserted', 'earmark_user delivers a signed plan change');
SELECT throws_ok(format('SELECT earmark_inbox_ignore(%s, %L)', :em_tap_signed_id, 'silenced'),
                 '42501', NULL, 'earmark_user cannot ignore the plan change the worker is to apply');
RESET ROLE;
INSERT INTO em_tap_applied SELECT * FROM pg_temp.apply_plan_changes();
SELECT results_eq($$SELECT account, lim FROM earmark.account_limit WHERE account IN ('em_tap_acme', 'em_tap_other') ORDER BY account$$,
                  $$VALUES ('em_tap_acme'::text, 20000::bigint), ('em_tap_other', 1000)$$,
                  'the signed plan change moved em_tap_acme to its plan, and only em_tap_acme');
SELECT results_eq($$SELECT plan FROM earmark.account WHERE account = 'em_tap_acme'$$,
                  $$VALUES ('em_tap_team'::text)$$, 'em_tap_acme is on the signed plan');

-- 1: earmark_admin includes earmark_user
SELECT ok(pg_has_role('earmark_admin', 'earmark_user', 'MEMBER'), 'earmark_admin is a member of earmark_user');

SELECT * FROM finish();
ROLLBACK;
