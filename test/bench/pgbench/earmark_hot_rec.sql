-- earmark, one hot account whose jobs also record usage without a hold:
-- a usage of 1 (earmark_record_usage), then reserve 10 and settle 5, three
-- transactions a job.  Recorded usage goes to the cycle's counter rows,
-- which the escrow fast path's fit check reads.  :account is set with
-- pgbench -D account=...
\set k random(1, 9000000000000000000)
SELECT earmark_record_usage(:account, 1, 'u-' || :client_id::text || '-' || :k::text);
SELECT job_id FROM earmark_reserve(:account, 10, :client_id::text || '-' || :k::text) \gset
SELECT charged FROM earmark_settle(:account, :job_id, 5) \gset
