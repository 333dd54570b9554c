-- test/pgtap/search_path.sql: earmark resolves no name through the
-- caller's search_path.  A schema "evil" plants operators and functions
-- with the names earmark's statements use; each one writes to evil.calls
-- when it runs (and then behaves like the real one).  The gate then runs
-- under search_path = evil, public (pg_catalog implicitly first) and
-- evil, pg_catalog, public (evil wins over pg_catalog): it must give the
-- right answers and evil.calls must stay empty.  Variant C: reserve,
-- charge, heartbeat and settle pin their search path in C rather than
-- with a SET clause (spi.c); views named like earmark's tables, in evil
-- and in the session's temporary schema (searched last by earmark), log
-- any read, and errors of earmark's caught by a PL/pgSQL EXCEPTION block
-- must leave the caller's own search_path in force afterwards.
BEGIN;
SELECT plan(19);

CREATE SCHEMA evil;
CREATE TABLE evil.calls (what text NOT NULL);

CREATE FUNCTION evil.log(what text) RETURNS void LANGUAGE plpgsql AS
$$BEGIN INSERT INTO evil.calls (what) VALUES (what); END$$;

CREATE FUNCTION evil.text_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('=(text,text)'); RETURN pg_catalog.texteq($1, $2); END$$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.text_eq);

CREATE FUNCTION evil.int8_eq(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('=(bigint,bigint)'); RETURN pg_catalog.int8eq($1, $2); END$$;
CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.int8_eq);

CREATE FUNCTION evil.tstz_eq(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('=(timestamptz,timestamptz)'); RETURN pg_catalog.timestamptz_eq($1, $2); END$$;
CREATE OPERATOR evil.= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.tstz_eq);

CREATE FUNCTION evil.tstz_lt(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('<(timestamptz,timestamptz)'); RETURN pg_catalog.timestamptz_lt($1, $2); END$$;
CREATE OPERATOR evil.< (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.tstz_lt);

CREATE FUNCTION evil.tstz_ge(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('>=(timestamptz,timestamptz)'); RETURN pg_catalog.timestamptz_ge($1, $2); END$$;
CREATE OPERATOR evil.>= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.tstz_ge);

CREATE FUNCTION evil.tstz_pl(timestamptz, interval) RETURNS timestamptz LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('+(timestamptz,interval)'); RETURN pg_catalog.timestamptz_pl_interval($1, $2); END$$;
CREATE OPERATOR evil.+ (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = evil.tstz_pl);

CREATE FUNCTION evil.int84_gt(bigint, integer) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('>(bigint,integer)'); RETURN pg_catalog.int84gt($1, $2); END$$;
CREATE OPERATOR evil.> (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = evil.int84_gt);

CREATE FUNCTION evil.int84_ne(bigint, integer) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('<>(bigint,integer)'); RETURN pg_catalog.int84ne($1, $2); END$$;
CREATE OPERATOR evil.<> (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = evil.int84_ne);

CREATE FUNCTION evil.int8_pl(bigint, bigint) RETURNS bigint LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('+(bigint,bigint)'); RETURN pg_catalog.int8pl($1, $2); END$$;
CREATE OPERATOR evil.+ (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.int8_pl);

CREATE FUNCTION evil.int8_mi(bigint, bigint) RETURNS bigint LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('-(bigint,bigint)'); RETURN pg_catalog.int8mi($1, $2); END$$;
CREATE OPERATOR evil.- (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.int8_mi);

CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('now()'); RETURN pg_catalog.now(); END$$;
CREATE FUNCTION evil.hashtext(text) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('hashtext(text)'); RETURN pg_catalog.hashtext($1); END$$;
CREATE FUNCTION evil.pg_advisory_xact_lock(integer, integer) RETURNS void LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('pg_advisory_xact_lock(int,int)'); PERFORM pg_catalog.pg_advisory_xact_lock($1, $2); END$$;
CREATE FUNCTION evil.pg_advisory_xact_lock_shared(integer, integer) RETURNS void LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('pg_advisory_xact_lock_shared(int,int)'); PERFORM pg_catalog.pg_advisory_xact_lock_shared($1, $2); END$$;
CREATE FUNCTION evil.count(anyelement) RETURNS bigint LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('count(any)'); RETURN 0; END$$;

-- what the gate answered, recorded without evaluating any operator of ours
CREATE TEMP TABLE out (seq serial, variant text, step text, r text);
CREATE TEMP TABLE sweeps (variant text, n int);
-- a job's lease has passed: written into its row (a moment before the wall
-- clock), not waited for; with a search_path of its own, so that it uses
-- nothing of evil's
CREATE FUNCTION pg_temp.pass_lease(j bigint) RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    UPDATE earmark.job SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE job_id = j
$$;

-- 2: the trap works: with evil before pg_catalog, plain SQL does pick the
-- planted objects (so an empty log below means earmark did not)
SET search_path = evil, pg_catalog, public;
CREATE TEMP TABLE trap AS SELECT 'a'::text = 'b'::text AS eq, 1::bigint + 2::bigint AS pl, now() AS t;
RESET search_path;
SELECT ok((SELECT count(DISTINCT what) FROM evil.calls) = 3,
          'the planted =, + and now() are picked up by unqualified SQL under search_path = evil, pg_catalog');
SELECT results_eq($$SELECT eq, pl FROM trap$$, $$VALUES (false, 3::bigint)$$,
                  'the planted objects behave like the real ones (only their use is logged)');
TRUNCATE evil.calls;

-- the accounts' cycle anchor: 14 to 17 days ago (midnight UTC, day 28 at
-- the latest), so that no cycle ends during the run, on any date
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC') AS anchor
FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC') - interval '14 days' AS a) t \gset sp_

-- ---------------------------------------------------------------------
-- variant A: search_path = evil, public
-- ---------------------------------------------------------------------
SET search_path = evil, public;
SELECT earmark_set_account('em_tap_sp_A', :'sp_anchor', 'cus_A', 'agr_A') \gset sp_
SELECT earmark_set_limit('em_tap_sp_A', 1000) \gset sp_
WITH r AS (SELECT * FROM earmark_reserve('em_tap_sp_A', 600, 'sp-k1')),
     o AS (INSERT INTO pg_temp.out (variant, step, r) SELECT 'A', 'reserve 600', ROW(admitted, remaining, reason)::text FROM r)
SELECT job_id AS j1 FROM r \gset A_
WITH r AS (SELECT * FROM earmark_reserve('em_tap_sp_A', 600, 'sp-k1')),
     o AS (INSERT INTO pg_temp.out (variant, step, r) SELECT 'A', 'reserve 600 again', ROW(admitted, remaining)::text FROM r)
SELECT job_id AS j1_again FROM r \gset A_
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'A', 'reserve 500', ROW(job_id, admitted, remaining, reason)::text FROM earmark_reserve('em_tap_sp_A', 500, 'sp-k2');
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'A', 'charge 100 step 1', ROW(c.*)::text FROM earmark_charge('em_tap_sp_A', :A_j1, 100, 1) c;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'A', 'charge 100 step 1 again', ROW(c.*)::text FROM earmark_charge('em_tap_sp_A', :A_j1, 100, 1) c;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'A', 'heartbeat is set', ROW(earmark_heartbeat('em_tap_sp_A', :A_j1) IS NOT NULL)::text;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'A', 'settle 250', ROW(s.*)::text FROM earmark_settle('em_tap_sp_A', :A_j1, 250) s;
WITH r AS (SELECT * FROM earmark_reserve('em_tap_sp_A', 700, 'sp-k3', lease => '1 hour')),
     o AS (INSERT INTO pg_temp.out (variant, step, r) SELECT 'A', 'reserve 700 lease to pass', ROW(admitted, remaining, reason)::text FROM r)
SELECT job_id AS j3 FROM r \gset A_
SELECT pg_temp.pass_lease(:A_j3) \gset sp_
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'A', 'charge after lease', ROW(c.*)::text FROM earmark_charge('em_tap_sp_A', :A_j3, 5) c;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'A', 'reserve 300 reclaims', ROW(admitted, remaining, reason)::text FROM earmark_reserve('em_tap_sp_A', 300, 'sp-k4');
WITH r AS (SELECT * FROM earmark_reserve('em_tap_sp_A', 100, 'sp-k5', lease => '1 hour')),
     o AS (INSERT INTO pg_temp.out (variant, step, r) SELECT 'A', 'reserve 100 lease to pass', ROW(admitted, remaining, reason)::text FROM r)
SELECT job_id AS j5 FROM r \gset A_
SELECT pg_temp.pass_lease(:A_j5) \gset sp_
INSERT INTO pg_temp.sweeps SELECT 'A', earmark_sweep();
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'A', 'settle after sweep', ROW(s.*)::text FROM earmark_settle('em_tap_sp_A', :A_j5, 50) s;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'A', 'budget', ROW(lim, used, held, remaining)::text FROM earmark_budget('em_tap_sp_A');
RESET search_path;

SELECT results_eq(
    $$SELECT step, r FROM out WHERE variant = 'A' ORDER BY seq$$,
    $$VALUES ('reserve 600', '(t,400,)'),
             ('reserve 600 again', '(t,400)'),
             ('reserve 500', '(,f,400,"the job needs 500 and 400 is left")'),
             ('charge 100 step 1', '(100,f,500,running)'),
             ('charge 100 step 1 again', '(0,f,500,running)'),
             ('heartbeat is set', '(t)'),
             ('settle 250', '(250,350,completed)'),
             ('reserve 700 lease to pass', '(t,50,)'),
             ('charge after lease', '(0,f,700,expired)'),
             ('reserve 300 reclaims', '(t,450,)'),
             ('reserve 100 lease to pass', '(t,350,)'),
             ('settle after sweep', '(0,0,expired)'),
             ('budget', '(1000,250,300,450)')$$,
    'variant A (evil, public): the gate gives its normal answers');
SELECT cmp_ok((SELECT n FROM sweeps WHERE variant = 'A'), '>=', 1,
              'variant A: earmark_sweep settled the expired hold');
SELECT results_eq(
    $$SELECT idempotency_key, status, charged, released FROM earmark.job WHERE account = 'em_tap_sp_A' ORDER BY job_id$$,
    $$VALUES ('sp-k1', 'completed', 250::bigint, 350::bigint),
             ('sp-k3', 'expired', 0::bigint, 700::bigint),
             ('sp-k4', 'running', NULL, NULL),
             ('sp-k5', 'expired', 0::bigint, 100::bigint)$$,
    'variant A: the jobs ended as they should');
SELECT results_eq(
    $$SELECT cycle_anchor, provider_customer, provider_agreement FROM earmark.account WHERE account = 'em_tap_sp_A'$$,
    format('VALUES (%L::timestamptz,', :'sp_anchor') || $$ 'cus_A'::text, 'agr_A'::text)$$,
    'variant A: earmark_set_account stored the account');
SELECT is(:A_j1_again::bigint, :A_j1::bigint, 'variant A: the repeated key returned the same job');
SELECT is((SELECT string_agg(DISTINCT what, ', ') FROM evil.calls), NULL,
          'variant A: no planted operator or function was called');

-- ---------------------------------------------------------------------
-- variant B: search_path = evil, pg_catalog, public
-- ---------------------------------------------------------------------
SET search_path = evil, pg_catalog, public;
SELECT earmark_set_account('em_tap_sp_B', :'sp_anchor', 'cus_B', 'agr_B') \gset sp_
SELECT earmark_set_limit('em_tap_sp_B', 1000) \gset sp_
WITH r AS (SELECT * FROM earmark_reserve('em_tap_sp_B', 600, 'sp-k1')),
     o AS (INSERT INTO pg_temp.out (variant, step, r) SELECT 'B', 'reserve 600', ROW(admitted, remaining, reason)::text FROM r)
SELECT job_id AS j1 FROM r \gset B_
WITH r AS (SELECT * FROM earmark_reserve('em_tap_sp_B', 600, 'sp-k1')),
     o AS (INSERT INTO pg_temp.out (variant, step, r) SELECT 'B', 'reserve 600 again', ROW(admitted, remaining)::text FROM r)
SELECT job_id AS j1_again FROM r \gset B_
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'B', 'reserve 500', ROW(job_id, admitted, remaining, reason)::text FROM earmark_reserve('em_tap_sp_B', 500, 'sp-k2');
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'B', 'charge 100 step 1', ROW(c.*)::text FROM earmark_charge('em_tap_sp_B', :B_j1, 100, 1) c;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'B', 'charge 100 step 1 again', ROW(c.*)::text FROM earmark_charge('em_tap_sp_B', :B_j1, 100, 1) c;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'B', 'heartbeat is set', ROW(earmark_heartbeat('em_tap_sp_B', :B_j1) IS NOT NULL)::text;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'B', 'settle 250', ROW(s.*)::text FROM earmark_settle('em_tap_sp_B', :B_j1, 250) s;
WITH r AS (SELECT * FROM earmark_reserve('em_tap_sp_B', 700, 'sp-k3', lease => '1 hour')),
     o AS (INSERT INTO pg_temp.out (variant, step, r) SELECT 'B', 'reserve 700 lease to pass', ROW(admitted, remaining, reason)::text FROM r)
SELECT job_id AS j3 FROM r \gset B_
SELECT pg_temp.pass_lease(:B_j3) \gset sp_
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'B', 'charge after lease', ROW(c.*)::text FROM earmark_charge('em_tap_sp_B', :B_j3, 5) c;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'B', 'reserve 300 reclaims', ROW(admitted, remaining, reason)::text FROM earmark_reserve('em_tap_sp_B', 300, 'sp-k4');
WITH r AS (SELECT * FROM earmark_reserve('em_tap_sp_B', 100, 'sp-k5', lease => '1 hour')),
     o AS (INSERT INTO pg_temp.out (variant, step, r) SELECT 'B', 'reserve 100 lease to pass', ROW(admitted, remaining, reason)::text FROM r)
SELECT job_id AS j5 FROM r \gset B_
SELECT pg_temp.pass_lease(:B_j5) \gset sp_
INSERT INTO pg_temp.sweeps SELECT 'B', earmark_sweep();
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'B', 'settle after sweep', ROW(s.*)::text FROM earmark_settle('em_tap_sp_B', :B_j5, 50) s;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'B', 'budget', ROW(lim, used, held, remaining)::text FROM earmark_budget('em_tap_sp_B');
RESET search_path;

SELECT results_eq(
    $$SELECT step, r FROM out WHERE variant = 'B' ORDER BY seq$$,
    $$VALUES ('reserve 600', '(t,400,)'),
             ('reserve 600 again', '(t,400)'),
             ('reserve 500', '(,f,400,"the job needs 500 and 400 is left")'),
             ('charge 100 step 1', '(100,f,500,running)'),
             ('charge 100 step 1 again', '(0,f,500,running)'),
             ('heartbeat is set', '(t)'),
             ('settle 250', '(250,350,completed)'),
             ('reserve 700 lease to pass', '(t,50,)'),
             ('charge after lease', '(0,f,700,expired)'),
             ('reserve 300 reclaims', '(t,450,)'),
             ('reserve 100 lease to pass', '(t,350,)'),
             ('settle after sweep', '(0,0,expired)'),
             ('budget', '(1000,250,300,450)')$$,
    'variant B (evil, pg_catalog, public): the gate gives its normal answers');
SELECT cmp_ok((SELECT n FROM sweeps WHERE variant = 'B'), '>=', 1,
              'variant B: earmark_sweep settled the expired hold');
SELECT results_eq(
    $$SELECT idempotency_key, status, charged, released FROM earmark.job WHERE account = 'em_tap_sp_B' ORDER BY job_id$$,
    $$VALUES ('sp-k1', 'completed', 250::bigint, 350::bigint),
             ('sp-k3', 'expired', 0::bigint, 700::bigint),
             ('sp-k4', 'running', NULL, NULL),
             ('sp-k5', 'expired', 0::bigint, 100::bigint)$$,
    'variant B: the jobs ended as they should');
SELECT results_eq(
    $$SELECT cycle_anchor, provider_customer, provider_agreement FROM earmark.account WHERE account = 'em_tap_sp_B'$$,
    format('VALUES (%L::timestamptz,', :'sp_anchor') || $$ 'cus_B'::text, 'agr_B'::text)$$,
    'variant B: earmark_set_account stored the account');
SELECT is(:B_j1_again::bigint, :B_j1::bigint, 'variant B: the repeated key returned the same job');
SELECT is((SELECT string_agg(DISTINCT what, ', ') FROM evil.calls), NULL,
          'variant B: no planted operator or function was called');

-- ---------------------------------------------------------------------
-- variant C: the C-pinned search path (reserve, charge, heartbeat and
-- settle have no SET clause) against shadowing relations, and errors
-- caught by the caller
-- ---------------------------------------------------------------------
SELECT is((SELECT count(*)::int FROM pg_catalog.pg_proc
            WHERE proname IN ('earmark_reserve', 'earmark_charge', 'earmark_heartbeat', 'earmark_settle')
              AND prolang = (SELECT oid FROM pg_catalog.pg_language WHERE lanname = 'c')
              AND prosecdef AND proconfig IS NULL), 4,
          'variant C: the four C entry points are SECURITY DEFINER without a SET clause (their C code pins the path)');
CREATE FUNCTION evil.logged(what text) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log(what); RETURN true; END$$;
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['account', 'account_limit', 'budget', 'budget_slot', 'job',
                             'ledger', 'ledger_entry', 'usage_shard', 'meter_mark', 'plan_limit'] LOOP
        EXECUTE format('CREATE VIEW evil.%I AS SELECT * FROM earmark.%I WHERE evil.logged(%L)',
                       t, t, 'view evil.' || t);
        EXECUTE format('CREATE TEMP VIEW %I AS SELECT * FROM earmark.%I WHERE evil.logged(%L)',
                       t, t, 'view pg_temp.' || t);
    END LOOP;
END
$$;
-- an earmark error caught by the caller, then an unqualified comparison of
-- the caller's own: it must use the caller's search_path (evil.=), not
-- earmark's, which the error must not have left in force
CREATE FUNCTION pg_temp.caught(account text, job bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r text := '';
BEGIN
    BEGIN
        PERFORM * FROM earmark_settle(account, job + 1000000, 1);
    EXCEPTION WHEN OTHERS THEN
        r := r || 'settle: ' || SQLSTATE || '; ';
    END;
    BEGIN
        PERFORM * FROM earmark_charge(account, job, -1);
    EXCEPTION WHEN OTHERS THEN
        r := r || 'charge: ' || SQLSTATE || '; ';
    END;
    RETURN r || 'eq: ' || ('x'::text = 'x'::text);
END
$$;
SET search_path = evil, pg_catalog, public;
SELECT earmark_set_limit('em_tap_sp_C', 1000) \gset sp_
WITH r AS (SELECT * FROM earmark_reserve('em_tap_sp_C', 600, 'sp-k1')),
     o AS (INSERT INTO pg_temp.out (variant, step, r) SELECT 'C', 'reserve 600', ROW(admitted, remaining, reason)::text FROM r)
SELECT job_id AS j1 FROM r \gset C_
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'C', 'charge 100 step 1', ROW(c.*)::text FROM earmark_charge('em_tap_sp_C', :C_j1, 100, 1) c;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'C', 'heartbeat is set', ROW(earmark_heartbeat('em_tap_sp_C', :C_j1) IS NOT NULL)::text;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'C', 'settle 250', ROW(s.*)::text FROM earmark_settle('em_tap_sp_C', :C_j1, 250) s;
SELECT pg_temp.caught('em_tap_sp_C', :C_j1) AS caught \gset C_
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'C', 'reserve 900', ROW(admitted, remaining, reason)::text FROM earmark_reserve('em_tap_sp_C', 900, 'sp-k2');
RESET search_path;

SELECT results_eq(
    $$SELECT step, r FROM out WHERE variant = 'C' ORDER BY seq$$,
    $$VALUES ('reserve 600', '(t,400,)'),
             ('charge 100 step 1', '(100,f,500,running)'),
             ('heartbeat is set', '(t)'),
             ('settle 250', '(250,350,completed)'),
             ('reserve 900', '(f,750,"the job needs 900 and 750 is left")')$$,
    'variant C (evil, pg_catalog, public; shadowing views): the gate gives its normal answers');
SELECT is(:'C_caught'::text, 'settle: EM003; charge: 22023; eq: true',
          'variant C: earmark''s errors were caught by the caller''s EXCEPTION blocks');
SELECT is((SELECT string_agg(DISTINCT what, ', ') FROM evil.calls WHERE what <> '=(text,text)'), NULL,
          'variant C: no planted operator, function or view was used by earmark');
SELECT is((SELECT count(*)::int FROM evil.calls WHERE what = '=(text,text)'), 1,
          'variant C: after the caught errors the caller''s own search_path was back in force (its = is evil.=)');

SELECT * FROM finish();
ROLLBACK;
