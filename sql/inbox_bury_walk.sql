-- A claim that meets events abandoned on their last attempt buries them
-- (marks them dead) and, when its whole batch was buried, runs again
-- after them (docs/inbox.md#earmark_inbox_claim).  Burying a backlog of
-- n such events must cost about n index tuples of inbox_event_due, not
-- n squared: each run starts where the last one stopped, not at the
-- beginning of the index, whose entries for the events this transaction
-- buried are still walked.  Counted as the index tuples this backend's
-- claim read (pg_stat_get_xact_tuples_returned: this transaction's own
-- counts), with 200 and 2,000 abandoned events ahead of 10 due ones.
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;

CREATE TEMP TABLE walk (n int, claim_size int, claimed bigint, dead bigint,
                        index_tuples_read bigint);

-- n events abandoned on their 6th attempt (lease passed an hour ago),
-- then 10 due ones, in event time
CREATE FUNCTION pg_temp.backlog(n int) RETURNS void LANGUAGE sql AS $$
    TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY;
    INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at,
                                     status, attempts, next_attempt_at, locked_until,
                                     verified_by)
    SELECT 'walk', 'buried' || g, 'invoice.paid', '{}',
           '2026-10-01 00:00+00'::timestamptz + g * interval '1 s',
           'processing', 6, now(), now() - interval '1 hour', 'admin'
      FROM generate_series(1, n) g;
    INSERT INTO earmark.inbox_event (source, dedupe_key, event_type, payload, occurred_at,
                                     verified_by)
    SELECT 'walk', 'due' || g, 'invoice.paid', '{}',
           '2026-11-01 00:00+00'::timestamptz + g * interval '1 s', 'admin'
      FROM generate_series(1, 10) g;
    ANALYZE earmark.inbox_event;
$$;

-- one claim, in a transaction of its own, and the index tuples it read
CREATE FUNCTION pg_temp.one_claim(n int, claim_size int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    before bigint := pg_stat_get_xact_tuples_returned('earmark.inbox_event_due'::regclass);
    got bigint;
BEGIN
    SELECT count(*) INTO got FROM earmark_inbox_claim(claim_size, '1 minute');
    INSERT INTO walk
    SELECT n, claim_size, got, count(*) FILTER (WHERE status = 'dead' AND finished),
           pg_stat_get_xact_tuples_returned('earmark.inbox_event_due'::regclass) - before
      FROM earmark.inbox_event;
END $$;

SELECT pg_temp.backlog(200);
SELECT pg_temp.one_claim(200, 1);
SELECT pg_temp.backlog(2000);
SELECT pg_temp.one_claim(2000, 1);
SELECT pg_temp.backlog(2000);
SELECT pg_temp.one_claim(2000, 10);

-- each claim returned due events (one batch), buried every abandoned one,
-- and read about as many index tuples as it buried and claimed
SELECT n, claim_size, claimed, dead,
       index_tuples_read <= n + claim_size + 20 AS walk_is_linear
  FROM walk ORDER BY n, claim_size;
-- the counts themselves, when the line above says f
SELECT n, claim_size, index_tuples_read FROM walk
 WHERE index_tuples_read > n + claim_size + 20 ORDER BY n, claim_size;

TRUNCATE earmark.inbox_receipt, earmark.inbox_event RESTART IDENTITY CASCADE;
