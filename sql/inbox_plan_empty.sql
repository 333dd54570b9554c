-- A claim's plan is made once per session and kept (inbox.c claim_plan)
-- until an invalidation plans it again: a TRUNCATE, an ANALYZE, an index
-- change.  Planned while earmark.inbox_event is empty (a new installation,
-- or right after TRUNCATE, until autovacuum analyzes the table), the
-- planner's estimates are those of a table of a few pages, where reading
-- all of it and sorting looks cheapest; that plan then stays while the
-- backlog grows.  Both claims are planned to read by index only and to
-- join row by row (inbox.c claim_settings_begin), so that the plan made on
-- the empty table is the walk that LIMIT cuts, as on a full one.
-- The plans are shown by their nodes (the detail lines, with a colon, and
-- the handler check's subplan, hashed or not by the statistics, left out).
-- Autovacuum is kept off the events table for the test: its analyze would
-- plan the claims again, on the full table.
SET client_min_messages = warning;
SET timezone = 'UTC';
ALTER TABLE earmark.inbox_event SET (autovacuum_enabled = false);
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
DELETE FROM earmark.inbox_handler WHERE event_type <> 'customer.plan_changed';
CREATE FUNCTION pg_temp.nodes(with_handler boolean) RETURNS SETOF text
LANGUAGE sql AS $$
    SELECT p FROM earmark_inbox_claim_plan(10, with_handler) AS p WHERE p !~ ':|SubPlan'
$$;

-- both claims planned now, on the empty table (the plans this session keeps)
SELECT count(*) FROM earmark_inbox_claim(10);
SELECT * FROM pg_temp.nodes(false);
SELECT * FROM pg_temp.nodes(true);

-- 6,000 events arrive (3 types, one with a handler, out of arrival order);
-- no analyze: nothing plans the claims again
INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, verified_by)
SELECT 'empty', 'k' || g,
       (ARRAY['invoice.paid', 'customer.plan_changed', 'user.created'])[g % 3 + 1], '{}',
       '2026-10-01 00:00+00'::timestamptz + ((g * 7919) % 6000) * interval '1 s', 'admin'
  FROM generate_series(1, 6000) g;

-- the kept plans: no Sort, Bitmap, Seq Scan or Hash of the events under
-- the LockRows, nor in the UPDATE's join
SELECT * FROM pg_temp.nodes(false);
SELECT * FROM pg_temp.nodes(true);

-- what a claim reads with 4,000 of its events waiting: the events it
-- passes over on its walk (the worker's) and the ones it takes, not the
-- backlog (pg_stat_xact_user_tables counts what this backend has not sent
-- yet, maybe from before this transaction: the claim's reads are the
-- difference)
BEGIN;
SELECT seq_tup_read AS seq0, idx_tup_fetch AS idx0
  FROM pg_stat_xact_user_tables WHERE relid = 'earmark.inbox_event'::regclass \gset
SELECT count(*) AS claimed FROM earmark_inbox_claim(10);
SELECT seq_tup_read - :seq0 AS read_by_seq_scan, idx_tup_fetch - :idx0 < 100 AS walk_cut_by_limit
  FROM pg_stat_xact_user_tables WHERE relid = 'earmark.inbox_event'::regclass;
ROLLBACK;

-- a new session's plan, on the full table, is the same walk
\c
SET client_min_messages = warning;
SELECT p FROM earmark_inbox_claim_plan(10) AS p WHERE p !~ ':|SubPlan';

TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
ALTER TABLE earmark.inbox_event RESET (autovacuum_enabled);
