-- The inbox claim's plan: a walk of the partial index inbox_event_due in
-- claim order (occurred_at, event_id), cut by LIMIT under FOR UPDATE SKIP
-- LOCKED, with no sort of the waiting events, so that a claim costs the
-- same with 20 events waiting or 200,000.  earmark_inbox_claim_plan
-- explains the very statement (and the plan) the claim runs.  A change
-- that brings back a sort or a scan of the backlog changes this output.
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
DELETE FROM earmark.inbox_handler WHERE event_type <> 'customer.plan_changed';

-- a backlog: 5,000 events waiting (3 types, one with a handler, out of
-- arrival order), next to 5,000 finished ones
INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at, status, finished, verified_by)
SELECT 'plan', 'k' || g,
       (ARRAY['invoice.paid', 'customer.plan_changed', 'user.created'])[g % 3 + 1], '{}',
       '2026-10-01 00:00+00'::timestamptz + ((g * 7919) % 10000) * interval '1 s',
       CASE WHEN g % 2 = 0 THEN 'received' ELSE 'applied' END, g % 2 = 1, 'admin'
  FROM generate_series(1, 10000) g;
ANALYZE earmark.inbox_event;

-- an application's claim (events of types without a handler)
SELECT * FROM earmark_inbox_claim_plan(10);
-- the worker's claim (events of types with a handler), another batch size:
-- per handled type, a walk of that type's part of inbox_event_typed_due
-- (its Index Cond on event_type), never of the others' events, in order
-- and cut by LIMIT: no Sort and no Bitmap under the LockRows, which would
-- read all of a type's due events at each claim (both claims are planned
-- to read by index only, inbox.c claim_settings_begin;
-- test/integration/review_worker_claim_sort.sh counts what the worker reads)
SELECT * FROM earmark_inbox_claim_plan(25, true);

-- the plan is what runs: a claim takes the oldest due events of its
-- types, in order, and the next claim the ones after them
CREATE TEMP TABLE claimed AS
SELECT 1 AS claim, row_number() OVER () AS n, dedupe_key FROM earmark_inbox_claim(10, '1 minute');
INSERT INTO claimed SELECT 2, row_number() OVER (), dedupe_key FROM earmark_inbox_claim(3, '1 minute');
SELECT (SELECT array_agg(dedupe_key ORDER BY claim, n) FROM claimed) =
       (SELECT array_agg(dedupe_key ORDER BY occurred_at, event_id) FROM (
            SELECT dedupe_key, occurred_at, event_id FROM earmark.inbox_event
             WHERE (status = 'received' OR dedupe_key IN (SELECT dedupe_key FROM claimed))
               AND event_type <> 'customer.plan_changed'
             ORDER BY occurred_at, event_id LIMIT 13) o) AS oldest_first_in_order,
       (SELECT count(*) FROM claimed) AS claimed;

-- bad arguments
SELECT * FROM earmark_inbox_claim_plan(0);
SELECT * FROM earmark_inbox_claim_plan(NULL);
-- for admins only
SET ROLE earmark_user;
SELECT * FROM earmark_inbox_claim_plan(10);
RESET ROLE;

TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
