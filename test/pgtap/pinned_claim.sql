-- test/pgtap/pinned_claim.sql: earmark_inbox_claim pins its search path
-- in C for exactly its call (em_call_pinned, src/spi.c), and returns its
-- rows from a tuplestore filled in that one call, so that statements of
-- the caller's that run while its rows are being read (between a
-- cursor's fetches, in a PL/pgSQL loop's body, beside it in a select
-- list) resolve names through the caller's own search_path, never
-- earmark's: a leaked or too-early-popped override would change what
-- they resolve.  A planted = for text in schema pu_evil, first on the
-- caller's path, logs each call; the caller's own comparisons must call
-- it, earmark's statements never.
BEGIN;
SELECT plan(8);

CREATE SCHEMA pu_evil;
CREATE TABLE pu_evil.calls (what text NOT NULL);
CREATE FUNCTION pu_evil.text_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
$$BEGIN INSERT INTO pu_evil.calls VALUES ('=(text,text)'); RETURN pg_catalog.texteq($1, $2); END$$;
CREATE OPERATOR pu_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = pu_evil.text_eq);

SELECT count(*) AS received
  FROM pg_catalog.generate_series(1, 10) g,
       LATERAL earmark_inbox_receive('pc', 'pc-' || g, 'pc.thing', '{}',
                                     '2001-01-01 00:00:00+00'::timestamptz + g * interval '1 second') \gset

-- the claimed event ids, in the order they came, and the planted ='s calls
CREATE TEMP TABLE got (seq serial, how text, event_id bigint, eq boolean);
SELECT n.nspname AS emschema
  FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'earmark' \gset
SELECT pg_catalog.format('pu_evil, pg_catalog, %I, pg_temp', :'emschema') AS hostile \gset

SET search_path = :hostile;
-- a PL/pgSQL loop over a claim, with a comparison of the caller's in its body
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT * FROM earmark_inbox_claim(3, '1 hour') LOOP
        INSERT INTO got (how, event_id, eq) VALUES ('loop', r.event_id, 'x'::text = 'x'::text);
    END LOOP;
END
$$;
SELECT pg_catalog.count(*) AS after_loop FROM pu_evil.calls \gset
-- a cursor over a claim, fetched a row at a time, with the caller's
-- comparisons between the fetches
DECLARE c CURSOR FOR SELECT event_id FROM earmark_inbox_claim(3, '1 hour');
FETCH 1 FROM c \gset c1_
INSERT INTO got (how, event_id, eq) VALUES ('cursor', :c1_event_id, 'x'::text = 'x'::text);
FETCH 1 FROM c \gset c2_
INSERT INTO got (how, event_id, eq) VALUES ('cursor', :c2_event_id, 'x'::text = 'x'::text);
FETCH 1 FROM c \gset c3_
INSERT INTO got (how, event_id, eq) VALUES ('cursor', :c3_event_id, 'x'::text = 'x'::text);
CLOSE c;
SELECT pg_catalog.count(*) AS after_cursor FROM pu_evil.calls \gset
-- the claim in a select list, beside a comparison of the caller's
INSERT INTO got (how, event_id, eq)
SELECT 'select list', (earmark_inbox_claim(2, '1 hour')).event_id, 'x'::text = 'x'::text;
SELECT pg_catalog.count(*) AS after_select_list FROM pu_evil.calls \gset
RESET search_path;

-- 1
SELECT is(:received::int, 10, 'ten events stored');
-- 2
SELECT is((SELECT count(*)::int FROM got WHERE how = 'loop'), 3, 'the loop went over a claim of 3');
-- 3
SELECT is(:after_loop::int, 3,
          'each pass of the loop''s body compared with the caller''s own = (pu_evil.=), and the claim never did');
-- 4
SELECT is((SELECT count(*)::int FROM got WHERE how = 'cursor'), 3, 'the cursor fetched a claim of 3, a row at a time');
-- 5
SELECT is(:after_cursor::int - :after_loop::int, 3,
          'each statement between the fetches compared with the caller''s own =');
-- 6
SELECT is((SELECT count(*)::int FROM got WHERE how = 'select list'), 2, 'the claim in a select list gave 2 rows');
-- 7
SELECT is(:after_select_list::int - :after_cursor::int, 2,
          'the comparison beside it was the caller''s own, on each row');
-- 8
SELECT is((SELECT count(DISTINCT event_id)::int FROM got), 8, 'no event was claimed twice');

SELECT * FROM finish();
ROLLBACK;
