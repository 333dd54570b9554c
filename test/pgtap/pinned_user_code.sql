-- test/pgtap/pinned_user_code.sql: code of the user's that runs inside a
-- call whose search path earmark pins in C (em_call_pinned, src/spi.c: the
-- inbox's receive, claim, complete, ignore and fail, the gate's reserve)
-- gets the search path it would get under a SET clause: a function with
-- its own SET search_path (a trigger a superuser put on earmark's tables,
-- and what it calls) runs with that path, not earmark's pinned one.
-- Without that, an unqualified name in a SECURITY DEFINER trigger function
-- declared "SET search_path = app, pg_catalog, pg_temp", the safe way,
-- resolves through earmark's pg_catalog, pg_temp: to nothing (an error in
-- every earmark call), or to a table the caller planted in its own
-- temporary schema.  The caller's own path is back after each call, also
-- after errors caught inside the trigger and by the caller.
BEGIN;
SELECT plan(13);

CREATE SCHEMA app;
CREATE TABLE app.outbox (seq serial, what text NOT NULL, path text NOT NULL);
CREATE SCHEMA audit;
CREATE TABLE audit.notes (what text NOT NULL, path text NOT NULL);

-- the active search path, temporary schema spelled pg_temp
CREATE FUNCTION public.path_now() RETURNS text LANGUAGE sql AS
$$SELECT pg_catalog.regexp_replace(pg_catalog.array_to_string(pg_catalog.current_schemas(true), ','),
                                   'pg_temp_[0-9]+', 'pg_temp', 'g')$$;

-- called from the trigger: a search path of its own again
CREATE FUNCTION audit.note(what text) RETURNS void LANGUAGE plpgsql
SET search_path = audit, pg_catalog, pg_temp AS
$$BEGIN INSERT INTO notes VALUES (what, public.path_now()); END$$;
-- one that fails, caught inside the trigger
CREATE FUNCTION audit.fails() RETURNS void LANGUAGE plpgsql
SET search_path = audit, pg_catalog, pg_temp AS
$$BEGIN INSERT INTO notes VALUES ('fails', public.path_now()); RAISE EXCEPTION 'audit fails'; END$$;

CREATE FUNCTION app.on_row() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = app, pg_catalog, pg_temp AS
$$
BEGIN
    BEGIN
        PERFORM audit.fails();
    EXCEPTION WHEN OTHERS THEN
        NULL;
    END;
    INSERT INTO outbox (what, path) VALUES (TG_TABLE_NAME || ' ' || TG_OP, public.path_now());
    PERFORM audit.note(TG_TABLE_NAME || ' ' || TG_OP);
    RETURN NULL;
END
$$;
CREATE TRIGGER user_outbox AFTER INSERT OR UPDATE ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION app.on_row();
CREATE TRIGGER user_outbox AFTER INSERT ON earmark.job
    FOR EACH ROW EXECUTE FUNCTION app.on_row();

-- run sql as the current role: 'ok', or the error's message (pgTAP's own
-- functions cannot run under SET ROLE: their temporary tables are the
-- superuser's)
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS
$$BEGIN EXECUTE sql; RETURN 'ok'; EXCEPTION WHEN OTHERS THEN RETURN SQLERRM; END$$;

CREATE ROLE em_tap_pu_app IN ROLE earmark_user;
GRANT USAGE ON SCHEMA public TO em_tap_pu_app;

-- 2: as a superuser, every pinned call runs the trigger with its own path
SELECT lives_ok($$
    SELECT earmark_set_limit('em_tap_pu', 1000);
    SELECT * FROM earmark_reserve('em_tap_pu', 10, 'pu-1');
$$, 'reserve runs a trigger whose function has its own search_path');
SELECT lives_ok($$
    SELECT * FROM earmark_inbox_receive('pu', 'e1', 'pu.thing', '{}', '2001-01-01 00:00:01+00');
    SELECT * FROM earmark_inbox_receive('pu', 'e2', 'pu.thing', '{}', '2001-01-01 00:00:02+00');
    SELECT * FROM earmark_inbox_receive('pu', 'e3', 'pu.thing', '{}', '2001-01-01 00:00:03+00');
    SELECT count(*) FROM earmark_inbox_claim(10, '1 hour');
    SELECT earmark_inbox_complete(event_id) FROM earmark.inbox_event WHERE dedupe_key = 'e1';
    SELECT earmark_inbox_ignore(event_id, 'no') FROM earmark.inbox_event WHERE dedupe_key = 'e2';
    SELECT earmark_inbox_fail(event_id, 'boom') FROM earmark.inbox_event WHERE dedupe_key = 'e3';
$$, 'receive, claim, complete, ignore and fail run a trigger whose function has its own search_path');

-- 2
SELECT results_eq(
    $$SELECT what, path FROM app.outbox ORDER BY seq$$,
    $$VALUES ('job INSERT', 'app,pg_catalog,pg_temp'),
             ('inbox_event INSERT', 'app,pg_catalog,pg_temp'),
             ('inbox_event INSERT', 'app,pg_catalog,pg_temp'),
             ('inbox_event INSERT', 'app,pg_catalog,pg_temp'),
             ('inbox_event UPDATE', 'app,pg_catalog,pg_temp'),
             ('inbox_event UPDATE', 'app,pg_catalog,pg_temp'),
             ('inbox_event UPDATE', 'app,pg_catalog,pg_temp'),
             ('inbox_event UPDATE', 'app,pg_catalog,pg_temp'),
             ('inbox_event UPDATE', 'app,pg_catalog,pg_temp'),
             ('inbox_event UPDATE', 'app,pg_catalog,pg_temp')$$,
    'the trigger function ran under its own search path (app, pg_catalog, pg_temp) in every call');
-- 3
SELECT is((SELECT string_agg(DISTINCT path, '; ') FROM audit.notes), 'audit,pg_catalog,pg_temp',
          'so did the function it called (audit.note), also after another one (audit.fails) failed inside the trigger');
-- 4
SELECT is((SELECT count(*)::int FROM audit.notes WHERE what <> 'fails'), 10,
          'audit.note ran once a row');

-- a member of earmark_user with a table outbox of its own, in its
-- temporary schema, where the pinned path (pg_catalog, pg_temp) would
-- find it
TRUNCATE app.outbox, audit.notes;
SET ROLE em_tap_pu_app;
CREATE TEMP TABLE outbox (seq serial, what text, path text);
CREATE TEMP TABLE notes (what text, path text);
SELECT public.path_now() AS before \gset
SELECT pg_temp.try($$
    SELECT * FROM earmark_reserve('em_tap_pu', 10, 'pu-2');
    SELECT * FROM earmark_inbox_receive('pu-app', 'a1', 'pu.thing', '{}', '2001-01-01 00:00:04+00');
    SELECT count(*) FROM earmark_inbox_claim(10, '1 hour');
$$) AS app_calls \gset
SELECT public.path_now() AS after \gset
SELECT (SELECT count(*) FROM pg_temp.outbox) + (SELECT count(*) FROM pg_temp.notes) AS planted \gset
RESET ROLE;
-- 5
SELECT is(:'app_calls'::text, 'ok', 'an application''s reserve, receive and claim run the trigger');
-- 6
SELECT is(:'after'::text, :'before'::text, 'the application''s own search path is back after the calls');
-- 7
SELECT is(:planted::int, 0,
          'nothing went into the tables the application planted in its temporary schema');
RESET ROLE;
-- 8
SELECT results_eq(
    $$SELECT what, path FROM app.outbox ORDER BY seq$$,
    $$VALUES ('job INSERT', 'app,pg_catalog,pg_temp'),
             ('inbox_event INSERT', 'app,pg_catalog,pg_temp'),
             ('inbox_event UPDATE', 'app,pg_catalog,pg_temp')$$,
    'the trigger wrote to app.outbox, under its own path');
-- 9
SELECT is((SELECT count(*)::int FROM audit.notes WHERE what <> 'fails'), 3, 'and to audit.notes');

-- errors: the trigger fails the call, the caller catches it; then the
-- caller's own path, and earmark's pin in the next call
CREATE OR REPLACE FUNCTION audit.note(what text) RETURNS void LANGUAGE plpgsql
SET search_path = audit, pg_catalog, pg_temp AS
$$BEGIN IF what LIKE '%INSERT' THEN RAISE EXCEPTION 'no inserts today'; END IF;
        INSERT INTO notes VALUES (what, public.path_now()); END$$;
CREATE FUNCTION pg_temp.caught() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r text := '';
BEGIN
    BEGIN
        PERFORM * FROM earmark_inbox_receive('pu', 'e9', 'pu.thing', '{}', '2001-01-01 00:00:09+00');
    EXCEPTION WHEN OTHERS THEN
        r := r || 'receive: ' || SQLERRM || '; ';
    END;
    RETURN r || public.path_now();
END
$$;
SET search_path = public, pg_catalog;
SELECT pg_temp.caught() AS caught \gset
RESET search_path;
-- 10
SELECT is(:'caught'::text, 'receive: no inserts today; pg_temp,public,pg_catalog',
          'a failing trigger''s error was caught by the caller, whose own path was back');
-- 11
SELECT lives_ok($$SELECT earmark_inbox_complete(event_id) FROM earmark.inbox_event WHERE dedupe_key = 'a1'$$,
                'a call after the caught error');
-- 12
SELECT is((SELECT path FROM app.outbox ORDER BY seq DESC LIMIT 1), 'app,pg_catalog,pg_temp',
          'its trigger ran under its own path again');

SELECT * FROM finish();
ROLLBACK;
