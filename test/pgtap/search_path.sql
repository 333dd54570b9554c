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
-- must leave the caller's own search_path in force afterwards.  Variant
-- D: the same for the inbox's C-pinned entry points (receive,
-- receive_signed, claim, complete, ignore, fail), with more planted
-- operators (the ones their statements use) and views named like the
-- inbox's tables, as a superuser and as a member of earmark_user, and the
-- caller's path back after a normal return and after caught errors.
BEGIN;
SELECT plan(27);

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
-- a lease passed by hand, which a budget's lease floor does not see
-- (leasefloor.c): this session reads every open hold before a refusal
SET earmark.lease_floors = off;
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

-- ---------------------------------------------------------------------
-- variant D: the inbox's C-pinned entry points (no SET clause) against a
-- hostile caller: planted operators for every comparison and arithmetic
-- of their statements, shadowing views, a member of earmark_user, and
-- the caller's path back after a normal return and after caught errors
-- ---------------------------------------------------------------------
TRUNCATE evil.calls;
SELECT is((SELECT string_agg(proname || CASE WHEN prosecdef THEN ' (definer)' ELSE ' (invoker)' END, ', ' ORDER BY proname)
             FROM pg_catalog.pg_proc
            WHERE proname IN ('earmark_inbox_receive', 'earmark_inbox_receive_signed', 'earmark_inbox_claim',
                              'earmark_inbox_complete', 'earmark_inbox_ignore', 'earmark_inbox_fail')
              AND prolang = (SELECT oid FROM pg_catalog.pg_language WHERE lanname = 'c')
              AND proconfig IS NULL),
          'earmark_inbox_claim (definer), earmark_inbox_complete (invoker), earmark_inbox_fail (invoker), '
          'earmark_inbox_ignore (invoker), earmark_inbox_receive (invoker), earmark_inbox_receive_signed (definer)',
          'variant D: the six inbox entry points are C without a SET clause (claim and receive_signed SECURITY DEFINER, the four that switch to their owner SECURITY INVOKER)');

CREATE FUNCTION evil.int4_pl(integer, integer) RETURNS integer LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('+(int,int)'); RETURN pg_catalog.int4pl($1, $2); END$$;
CREATE OPERATOR evil.+ (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.int4_pl);
CREATE FUNCTION evil.int4_lt(integer, integer) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('<(int,int)'); RETURN pg_catalog.int4lt($1, $2); END$$;
CREATE OPERATOR evil.< (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.int4_lt);
CREATE FUNCTION evil.int4_ge(integer, integer) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('>=(int,int)'); RETURN pg_catalog.int4ge($1, $2); END$$;
CREATE OPERATOR evil.>= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.int4_ge);
CREATE FUNCTION evil.tstz_le(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('<=(timestamptz,timestamptz)'); RETURN pg_catalog.timestamptz_le($1, $2); END$$;
CREATE OPERATOR evil.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.tstz_le);
CREATE FUNCTION evil.tstz_gt(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('>(timestamptz,timestamptz)'); RETURN pg_catalog.timestamptz_gt($1, $2); END$$;
CREATE OPERATOR evil.> (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.tstz_gt);
CREATE FUNCTION evil.int8_gt(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('>(bigint,bigint)'); RETURN pg_catalog.int8gt($1, $2); END$$;
CREATE OPERATOR evil.> (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.int8_gt);
CREATE FUNCTION evil.bool_eq(boolean, boolean) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('=(boolean,boolean)'); RETURN pg_catalog.booleq($1, $2); END$$;
CREATE OPERATOR evil.= (LEFTARG = boolean, RIGHTARG = boolean, FUNCTION = evil.bool_eq);
CREATE FUNCTION evil.xid_eq(xid, integer) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN PERFORM evil.log('=(xid,int)'); RETURN pg_catalog.xideqint4($1, $2); END$$;
CREATE OPERATOR evil.= (LEFTARG = xid, RIGHTARG = integer, FUNCTION = evil.xid_eq);
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['inbox_event', 'inbox_receipt', 'inbox_handler', 'webhook_secret'] LOOP
        EXECUTE format('CREATE VIEW evil.%I AS SELECT * FROM earmark.%I WHERE evil.logged(%L)',
                       t, t, 'view evil.' || t);
        EXECUTE format('CREATE TEMP VIEW %I AS SELECT * FROM earmark.%I WHERE evil.logged(%L)',
                       t, t, 'view pg_temp.' || t);
    END LOOP;
END
$$;

-- a member of earmark_user, who may use evil's objects as the caller
CREATE ROLE em_tap_sp_app IN ROLE earmark_user;
GRANT USAGE ON SCHEMA evil TO em_tap_sp_app;
GRANT INSERT ON evil.calls TO em_tap_sp_app;
GRANT INSERT ON pg_temp.out TO em_tap_sp_app;
GRANT USAGE ON SEQUENCE pg_temp.out_seq_seq TO em_tap_sp_app;

-- a signed delivery of source sp-D-signed for the account of customer
-- cus_sp_D (signed here, before the hostile path is set)
SELECT earmark_set_account('em_tap_sp_D', :'sp_anchor', 'cus_sp_D', 'agr_D') \gset sp_
SELECT earmark_inbox_set_secret('sp-D-signed', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw') \gset sp_
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
SELECT round(extract(epoch FROM now()))::bigint::text AS ts,
       '{"type": "sp.thing", "event_timestamp": "2001-01-01T00:00:04Z", "data": {"customer_id": "cus_sp_D"}}' AS body
\gset D_
SELECT 'v1,' || encode(pg_temp.hmac_sha256(decode('MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'base64'),
                                           convert_to('d4.' || :'D_ts' || '.' || :'D_body', 'UTF8')),
                       'base64') AS sig \gset D_

-- an event's id, looked up with a search path of its own (the caller's
-- own lookups must not call evil's = either)
CREATE FUNCTION pg_temp.event_of(src text, key text) RETURNS bigint LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
    SELECT event_id FROM earmark.inbox_event WHERE source = src AND dedupe_key = key
$$;

-- after a normal return of each kind of call, an unqualified comparison of
-- the caller's own must use the caller's search_path (evil.=)
CREATE FUNCTION pg_temp.after_ok(event bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r text;
BEGIN
    r := earmark_inbox_complete(event, 'done');
    RETURN r || '; eq: ' || ('x'::text = 'x'::text);
END
$$;
-- earmark errors caught by the caller, then the caller's own comparison
CREATE FUNCTION pg_temp.caught_inbox(done bigint, ts text, body text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r text := '';
BEGIN
    BEGIN
        PERFORM earmark_inbox_complete(done);
    EXCEPTION WHEN OTHERS THEN
        r := r || 'complete: ' || SQLSTATE || '; ';
    END;
    BEGIN
        PERFORM earmark_inbox_fail(done, 'late');
    EXCEPTION WHEN OTHERS THEN
        r := r || 'fail: ' || SQLSTATE || '; ';
    END;
    BEGIN
        PERFORM earmark_inbox_ignore(-1, 'no such event');
    EXCEPTION WHEN OTHERS THEN
        r := r || 'ignore: ' || SQLSTATE || '; ';
    END;
    BEGIN
        PERFORM * FROM earmark_inbox_claim(0);
    EXCEPTION WHEN OTHERS THEN
        r := r || 'claim: ' || SQLSTATE || '; ';
    END;
    BEGIN
        PERFORM * FROM earmark_inbox_receive('sp-D', 'd9', 'sp.thing', NULL);
    EXCEPTION WHEN OTHERS THEN
        r := r || 'receive: ' || SQLSTATE || '; ';
    END;
    BEGIN
        PERFORM * FROM earmark_inbox_receive_signed('sp-D-signed', 'd9', ts, 'v1,' || encode(sha256('x'), 'base64'), body);
    EXCEPTION WHEN OTHERS THEN
        r := r || 'receive_signed: ' || SQLSTATE || '; ';
    END;
    RETURN r || 'eq: ' || ('x'::text = 'x'::text);
END
$$;

SET search_path = evil, pg_catalog, public;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'D', 'receive d1', ROW(inserted)::text FROM earmark_inbox_receive('sp-D', 'd1', 'sp.thing', '{"n": 1}', '2001-01-01 00:00:01+00');
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'D', 'receive d1 again', ROW(inserted)::text FROM earmark_inbox_receive('sp-D', 'd1', 'sp.thing', '{"n": 1}', '2001-01-01 00:00:01+00');
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'D', 'receive d2', ROW(inserted)::text FROM earmark_inbox_receive('sp-D', 'd2', 'sp.thing', '{"n": 2}', '2001-01-01 00:00:02+00');
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'D', 'receive d3', ROW(inserted)::text FROM earmark_inbox_receive('sp-D', 'd3', 'sp.thing', '{"n": 3}', '2001-01-01 00:00:03+00');
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'D', 'receive_signed d4', ROW(inserted)::text
  FROM earmark_inbox_receive_signed('sp-D-signed', 'd4', :'D_ts', :'D_sig', :'D_body');
SET ROLE em_tap_sp_app;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'D', 'app: receive a5', ROW(inserted)::text FROM earmark_inbox_receive('sp-D-app', 'a5', 'sp.thing', '{"n": 5}', '2001-01-01 00:00:05+00');
RESET ROLE;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'D', 'claim', string_agg(ROW(source, dedupe_key, status, attempts, verified_by, account)::text, ' ' ORDER BY occurred_at)
  FROM earmark_inbox_claim(10, '1 hour');
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'D', 'complete d1', earmark_inbox_complete(pg_temp.event_of('sp-D', 'd1'));
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'D', 'ignore d2', earmark_inbox_ignore(pg_temp.event_of('sp-D', 'd2'), 'not needed');
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'D', 'fail d3', earmark_inbox_fail(pg_temp.event_of('sp-D', 'd3'), 'boom');
SELECT pg_temp.event_of('sp-D-signed', 'd4') AS d4 \gset D_
SELECT pg_temp.after_ok(:D_d4) AS after_ok \gset D_
SELECT pg_temp.event_of('sp-D-app', 'a5') AS a5 \gset D_
SET ROLE em_tap_sp_app;
INSERT INTO pg_temp.out (variant, step, r)
SELECT 'D', 'app: complete a5', earmark_inbox_complete(:D_a5);
RESET ROLE;
SELECT pg_temp.caught_inbox(:D_d4, :'D_ts', :'D_body') AS caught \gset D_
RESET search_path;

SELECT results_eq(
    $$SELECT step, r FROM out WHERE variant = 'D' ORDER BY seq$$,
    $$VALUES ('receive d1', '(t)'),
             ('receive d1 again', '(f)'),
             ('receive d2', '(t)'),
             ('receive d3', '(t)'),
             ('receive_signed d4', '(t)'),
             ('app: receive a5', '(t)'),
             ('claim', '(sp-D,d1,processing,1,admin,) (sp-D,d2,processing,1,admin,) (sp-D,d3,processing,1,admin,) (sp-D-signed,d4,processing,1,standard_webhooks,em_tap_sp_D) (sp-D-app,a5,processing,1,,)'),
             ('complete d1', 'applied'),
             ('ignore d2', 'ignored'),
             ('fail d3', 'failed'),
             ('app: complete a5', 'applied')$$,
    'variant D (evil, pg_catalog, public; shadowing views): the inbox gives its normal answers');
SELECT results_eq(
    $$SELECT source, dedupe_key, status, seen_count FROM earmark.inbox_event
       WHERE source LIKE 'sp-D%' ORDER BY occurred_at$$,
    $$VALUES ('sp-D'::text, 'd1'::text, 'applied'::text, 2),
             ('sp-D', 'd2', 'ignored', 1),
             ('sp-D', 'd3', 'failed', 1),
             ('sp-D-signed', 'd4', 'applied', 1),
             ('sp-D-app', 'a5', 'applied', 1)$$,
    'variant D: the events ended as they should');
SELECT is((SELECT count(*)::int FROM earmark.inbox_receipt r JOIN earmark.inbox_event e USING (event_id)
            WHERE e.source LIKE 'sp-D%'), 6,
          'variant D: every delivery left a receipt');
SELECT is(:'D_after_ok'::text, 'applied; eq: true',
          'variant D: a completion returned normally');
SELECT is(:'D_caught'::text,
          'complete: EM005; fail: EM005; ignore: EM004; claim: 22023; receive: 22004; receive_signed: EM101; eq: true',
          'variant D: the inbox''s errors were caught by the caller''s EXCEPTION blocks');
SELECT is((SELECT string_agg(DISTINCT what, ', ') FROM evil.calls WHERE what <> '=(text,text)'), NULL,
          'variant D: no planted operator, function or view was used by the inbox');
SELECT is((SELECT count(*)::int FROM evil.calls WHERE what = '=(text,text)'), 2,
          'variant D: after a normal return and after the caught errors the caller''s own search_path was back in force (its = is evil.=)');

SELECT * FROM finish();
ROLLBACK;
