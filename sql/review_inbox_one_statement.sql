-- key_is_ours takes the key's receipt for this round's when this
-- transaction wrote its visible version at command id since or later,
-- since taken at the round's start.  An earlier delivery's receipt (cases
-- 1, 2, 4: several deliveries in one statement or one function) is below
-- since, as SPI advances the command counter after each statement.  A
-- write of the statement that calls the delivery (case 3: a writable WITH
-- that touches the key's receipt, then the delivery of that key in the
-- same statement) is at the calling statement's command id, which nothing
-- would advance before an admin's first delivery (no SPI statement runs
-- before it): the round starts with CommandCounterIncrement, so that the
-- delivery is a plain copy, not refused with 09000 "a trigger skipped its
-- insert".
SET client_min_messages = warning;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
CREATE TEMP TABLE batch (n int, key text);
INSERT INTO batch VALUES (1, 'b-1'), (2, 'b-1'), (3, 'b-2');

-- 1. a staging table with a duplicate key, delivered in one statement
\set VERBOSITY sqlstate
SELECT b.n, r.event_id, r.inserted
  FROM batch b,
       LATERAL earmark_inbox_receive('src', b.key, 'note', jsonb_build_object('n', b.n)) r
 ORDER BY b.n;
\set VERBOSITY default
SELECT dedupe_key, seen_count FROM earmark.inbox_event ORDER BY event_id;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 2. the same key twice in one select list
\set VERBOSITY sqlstate
SELECT (SELECT inserted FROM earmark_inbox_receive('src', 'two-1', 'note', '{}')) AS first,
       (SELECT inserted FROM earmark_inbox_receive('src', 'two-1', 'note', '{"again": 1}')) AS second;
\set VERBOSITY default
SELECT dedupe_key, seen_count FROM earmark.inbox_event ORDER BY event_id;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 3. the key's receipt touched by a writable WITH, then the key delivered
-- again in the same statement: a copy
SELECT event_id, inserted FROM earmark_inbox_receive('src', 'cte-1', 'note', '{}');
\set VERBOSITY sqlstate
WITH t AS (UPDATE earmark.inbox_receipt SET received_at = received_at
            WHERE dedupe_key = 'cte-1' RETURNING source, dedupe_key)
SELECT r.event_id, r.inserted
  FROM t, LATERAL earmark_inbox_receive(t.source, t.dedupe_key, 'note', '{}') r;
\set VERBOSITY default
SELECT dedupe_key, seen_count FROM earmark.inbox_event ORDER BY event_id;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;

-- 4. the same key in a plpgsql loop
DO $$
BEGIN
    FOR i IN 1..2 LOOP
        PERFORM earmark_inbox_receive('src', 'loop-1', 'note', '{}');
    END LOOP;
END
$$;
SELECT dedupe_key, seen_count FROM earmark.inbox_event ORDER BY event_id;
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
