-- The cycle's meter mark (docs/design.md, "The mark and the reporter"):
-- earmark.meter_mark has no unique key, so a writer inserts a mark only
-- when it sees none committed or of its own transaction (em_mark_seen,
-- SnapshotSelf, src/budget.c); the batch skips the cycles its caller saw
-- marked ($9 of key_rows, src/entries.c).  Here, one session at a time:
-- however many writes, in however many transactions, at any isolation
-- level, a cycle gets one mark; a savepoint rolled back takes its mark
-- with it and the next write marks again; worker_status counts cycles;
-- a pass sends a cycle with several marks once and deletes them all.
-- (What writers that run together do: isolation spec marks_together.)
SET client_min_messages = warning;
SET timezone = 'UTC';
TRUNCATE earmark.meter_mark, earmark.meter_send, earmark.meter_review, earmark.local_meter,
         earmark.evidence, earmark.usage_shard, earmark.ledger_entry, earmark.job, earmark.budget,
         earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
UPDATE earmark.reporter_state SET blocked_until = NULL;
SET earmark.rate_limit = 0;

CREATE FUNCTION pg_temp.mid_anchor() RETURNS timestamptz LANGUAGE sql AS $$
SELECT make_timestamptz(extract(year FROM a)::int, extract(month FROM a)::int,
                        least(extract(day FROM a)::int, 28), 0, 0, 0, 'UTC')
FROM (SELECT (now() AT TIME ZONE 'UTC') - interval '14 days' AS a) s
$$;
CREATE FUNCTION pg_temp.marks(acct text) RETURNS bigint LANGUAGE sql AS $$
SELECT count(*) FROM earmark.meter_mark WHERE account = acct
$$;

SELECT earmark_set_account(a, pg_temp.mid_anchor()), earmark_set_limit(a, 100000)
  FROM unnest(ARRAY['rc', 'rr', 'ser', 'many', 'sp', 'jobs']) a;

-- READ COMMITTED: three usages, one transaction each; then three in one
SELECT earmark_record_usage('rc', 1, 'rc-' || g) FROM generate_series(1, 3) g;
BEGIN;
SELECT earmark_record_usage('rc', 1, 'rc-b' || g) FROM generate_series(1, 3) g;
COMMIT;
SELECT pg_temp.marks('rc') AS rc_marks;

-- REPEATABLE READ: the transaction's snapshot, taken before its first write
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM earmark.budget;
SELECT earmark_record_usage('rr', 1, 'rr-' || g) FROM generate_series(1, 3) g;
COMMIT;
SELECT pg_temp.marks('rr') AS rr_marks;

-- SERIALIZABLE: in one transaction, and in three
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT earmark_record_usage('ser', 1, 'ser-' || g) FROM generate_series(1, 3) g;
COMMIT;
SET default_transaction_isolation = 'serializable';
SELECT earmark_record_usage('ser', 1, 'ser-b1');
SELECT earmark_record_usage('ser', 1, 'ser-b2');
RESET default_transaction_isolation;
SELECT pg_temp.marks('ser') AS ser_marks;

-- earmark_record_usage_many under REPEATABLE READ and SERIALIZABLE: two
-- calls in one transaction, then one in another (the cycle marked)
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM earmark_record_usage_many('many', ARRAY[1, 2], ARRAY['m-1', 'm-2']);
SELECT count(*) FROM earmark_record_usage_many('many', ARRAY[1, 2], ARRAY['m-3', 'm-4']);
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT count(*) FROM earmark_record_usage_many('many', ARRAY[1], ARRAY['m-5']);
COMMIT;
SELECT pg_temp.marks('many') AS many_marks;

-- settles that charge, under SERIALIZABLE: one by one, and in a batch
SELECT count(*) FROM (SELECT earmark_reserve('jobs', 10, 'j-' || g) FROM generate_series(1, 6) g) r;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT charged FROM earmark_settle('jobs', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'j-1'), 2);
SELECT charged FROM earmark_settle('jobs', (SELECT job_id FROM earmark.job WHERE idempotency_key = 'j-2'), 2);
SELECT ord, charged FROM earmark_settle_many('jobs',
    (SELECT array_agg(job_id ORDER BY job_id) FROM earmark.job WHERE idempotency_key IN ('j-3', 'j-4', 'j-5')),
    ARRAY[3, 3, 3]::bigint[]) ORDER BY ord;
COMMIT;
SELECT pg_temp.marks('jobs') AS jobs_marks;

-- a savepoint rolled back takes its usage and its mark; the next write
-- marks the cycle again (its own rolled-back mark is not seen)
BEGIN;
SAVEPOINT s;
SELECT earmark_record_usage('sp', 5, 'sp-1');
SELECT pg_temp.marks('sp') AS sp_marks_in_savepoint;
ROLLBACK TO SAVEPOINT s;
SELECT pg_temp.marks('sp') AS sp_marks_rolled_back;
SELECT earmark_record_usage('sp', 7, 'sp-2');
COMMIT;
SELECT pg_temp.marks('sp') AS sp_marks;

-- marks that writers running together would leave (each saw none): a
-- cycle counts once, and a pass sends it once and deletes its marks
INSERT INTO earmark.meter_mark (account, budget_id, marked_at)
SELECT account, budget_id, marked_at + g * interval '1 second'
  FROM earmark.meter_mark, generate_series(1, 3) g WHERE account = 'rc';
SELECT pg_temp.marks('rc') AS rc_marks, (SELECT marked_cycles FROM earmark.worker_status) AS cycles;
SELECT earmark_report(100) AS sent;
SELECT account, count(*) AS sends, max(total) AS total
  FROM earmark.meter_send GROUP BY account ORDER BY account;
SELECT count(*) AS marks_left, (SELECT marked_cycles FROM earmark.worker_status) AS cycles
  FROM earmark.meter_mark;
SELECT account, total FROM earmark.local_meter ORDER BY account;

-- a report in a transaction that has written refuses (its totals would
-- count usage that may still roll back): 25001, and nothing changes
SELECT earmark_set_account('own', pg_temp.mid_anchor()), earmark_set_limit('own', 1000);
\set VERBOSITY default
DO $$
BEGIN
    PERFORM earmark_record_usage('own', 7, 'own-1');
    PERFORM earmark_report();
END
$$;
\echo :LAST_ERROR_SQLSTATE
SELECT (SELECT count(*) FROM earmark.ledger WHERE account = 'own') AS own_entries,
       (SELECT count(*) FROM earmark.local_meter WHERE account = 'own') AS own_sent,
       pg_temp.marks('own') AS own_marks;
-- so does a reconcile (its repair would write the uncommitted 7), and a
-- second reconcile in one transaction (the first one's writes count)
DO $$
BEGIN
    PERFORM earmark_record_usage('own', 7, 'own-2');
    PERFORM earmark_reconcile('own');
END
$$;
\echo :LAST_ERROR_SQLSTATE
SELECT earmark_record_usage('own', 3, 'own-committed');
DO $$
BEGIN
    PERFORM earmark_reconcile('own');
    PERFORM earmark_reconcile('own');
END
$$;
\echo :LAST_ERROR_SQLSTATE
SELECT (SELECT count(*) FROM earmark.ledger WHERE account = 'own') AS own_entries,
       (SELECT count(*) FROM earmark.local_meter WHERE account = 'own') AS own_sent,
       (SELECT count(*) FROM earmark.evidence WHERE account = 'own') AS own_evidence,
       pg_temp.marks('own') AS own_marks;
