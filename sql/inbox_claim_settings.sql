-- The planner settings a claim is planned under (inbox.c
-- claim_settings_begin: enable_seqscan, enable_bitmapscan,
-- enable_hashjoin, enable_mergejoin off, enable_indexscan and
-- enable_nestloop on) are the claim's own: the caller's
-- settings are the same after a claim, after an error in it that a
-- savepoint or an EXCEPTION block catches, in the rest of the caller's
-- statement, and for SQL of the caller's that runs while the claim runs
-- (an operator's trigger on earmark.inbox_event).
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
DELETE FROM earmark.inbox_handler WHERE event_type <> 'customer.plan_changed';

CREATE TABLE public.seen (n serial, status text, dedupe_key text, settings text);
CREATE FUNCTION public.settings() RETURNS text LANGUAGE sql STABLE
AS $$ SELECT pg_catalog.concat_ws(',', pg_catalog.current_setting('enable_seqscan'),
          pg_catalog.current_setting('enable_bitmapscan'), pg_catalog.current_setting('enable_hashjoin'),
          pg_catalog.current_setting('enable_mergejoin')) $$;
-- an operator's trigger: notes the settings its SQL runs under, and fails
-- the claim of the event 'boom'
CREATE FUNCTION public.note_update() RETURNS trigger LANGUAGE plpgsql
SET search_path = public, pg_catalog AS $$
BEGIN
    INSERT INTO seen (status, dedupe_key, settings) VALUES (NEW.status, NEW.dedupe_key, settings());
    IF NEW.status = 'processing' AND NEW.dedupe_key = 'boom' THEN
        RAISE EXCEPTION 'boom';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER note_update AFTER UPDATE ON earmark.inbox_event
    FOR EACH ROW EXECUTE FUNCTION public.note_update();

SELECT count(*) FROM (
    SELECT earmark_inbox_receive('t', 'k' || g, 'user.created', '{}', '2026-10-01 00:00+00'::timestamptz + g * interval '1 s')
      FROM generate_series(1, 40) g) r;

SELECT settings() AS session;
-- the rest of the caller's statement, and the completes it calls
SELECT e.dedupe_key, settings() AS in_statement, earmark_inbox_complete(e.event_id)
  FROM earmark_inbox_claim(2) e ORDER BY e.occurred_at;
-- an operator's trigger runs under the caller's settings, in the claim
-- (processing) as in the complete (applied)
SELECT status, dedupe_key, settings FROM public.seen ORDER BY n;
TRUNCATE public.seen;
SELECT settings() AS after_claim;

-- the caller's own settings, session and local, set before and after
SET enable_mergejoin = off;
BEGIN;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_hashjoin = off;
SELECT count(*) FROM earmark_inbox_claim(1);
SELECT settings() AS local_before_claim;
SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_seqscan = on;
SELECT count(*) FROM earmark_inbox_claim(1);
SELECT settings() AS local_after_claim;
COMMIT;
SELECT settings() AS after_commit;
RESET enable_mergejoin;

-- a SECURITY DEFINER caller with its own SET clause
CREATE FUNCTION public.claim_with_set() RETURNS text LANGUAGE plpgsql SECURITY DEFINER
SET enable_seqscan = on SET enable_hashjoin = off
AS $$
DECLARE n int;
BEGIN
    SELECT count(*) INTO n FROM earmark_inbox_claim(1);
    RETURN n || ' ' || public.settings();
END $$;
SET enable_seqscan = off;
SELECT public.claim_with_set() AS inside, settings() AS outside;
RESET enable_seqscan;

-- a cursor over a claim
BEGIN;
DECLARE c CURSOR FOR SELECT dedupe_key, settings() FROM earmark_inbox_claim(3) ORDER BY occurred_at;
FETCH 1 FROM c;
SELECT settings() AS between_fetches;
FETCH 1 FROM c;
CLOSE c;
COMMIT;

-- an error in the claim, caught: the claim's settings are gone
UPDATE earmark.inbox_event SET dedupe_key = 'boom'
 WHERE event_id = (SELECT min(event_id) FROM earmark.inbox_event WHERE status = 'received');
TRUNCATE public.seen;
CREATE FUNCTION public.claim_caught() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        PERFORM * FROM earmark_inbox_claim(5);
    EXCEPTION WHEN raise_exception THEN
        RETURN SQLERRM || ' ' || public.settings();
    END;
    RETURN 'not caught';
END $$;
SELECT public.claim_caught() AS caught, settings() AS after;
BEGIN;
SET LOCAL enable_hashjoin = off;
SELECT public.claim_caught() AS caught, settings() AS after;
\set VERBOSITY terse
SAVEPOINT s;
SELECT count(*) FROM earmark_inbox_claim(5);
ROLLBACK TO SAVEPOINT s;
\set VERBOSITY default
SELECT settings() AS after_rollback_to_savepoint;
COMMIT;
SELECT settings() AS after_commit;
-- the claim of the plan shows nothing of its settings either
SELECT count(*) > 0 AS plan_shown, settings() AS after_plan FROM earmark_inbox_claim_plan(10);

UPDATE earmark.inbox_event SET dedupe_key = 'defused' WHERE dedupe_key = 'boom';
-- a session of the caller's with index scans or nested loops off: the
-- claim is still planned as the walk (a new batch size plans it anew)
-- (2,000 more events, later and not due yet; analyzed)
INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, next_attempt_at)
SELECT 'later', 'l' || g, 'user.created', '{}', '2027-01-01'::timestamptz + g * interval '1 s', '2100-01-01'
  FROM generate_series(1, 2000) g;
ANALYZE earmark.inbox_event;
SET enable_indexscan = off;
SET enable_nestloop = off;
SELECT line FROM earmark_inbox_claim_plan(7) AS line
 WHERE line ~ '(Scan|Sort|Join|Loop|Hash)' AND line !~ 'inbox_handler';
-- (pg_stat_xact_* counts since this backend last sent its counts, which
-- may be before the updates above: the claim's reads are a difference)
BEGIN;
SELECT seq_tup_read AS seq0, idx_tup_fetch AS idx0
  FROM pg_stat_xact_user_tables WHERE relid = 'earmark.inbox_event'::regclass \gset
SELECT count(*) FROM earmark_inbox_claim(7);
SELECT seq_tup_read - :seq0 AS read_by_seq_scan, idx_tup_fetch - :idx0 < 30 AS walk_cut_by_limit
  FROM pg_stat_xact_user_tables WHERE relid = 'earmark.inbox_event'::regclass;
ROLLBACK;
SELECT settings() AS after, current_setting('enable_indexscan') AS indexscan,
       current_setting('enable_nestloop') AS nestloop;
RESET enable_indexscan;
RESET enable_nestloop;

DROP TRIGGER note_update ON earmark.inbox_event;
DROP FUNCTION public.note_update(), public.claim_caught(), public.claim_with_set(), public.settings();
DROP TABLE public.seen;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
