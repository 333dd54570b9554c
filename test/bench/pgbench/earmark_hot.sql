-- earmark, one hot account: reserve + charge + settle, three transactions
-- a job.  :account is set with pgbench -D account=...
\set k random(1, 9000000000000000000)
SELECT job_id FROM earmark_reserve(:account, 10, :client_id::text || '-' || :k::text) \gset
SELECT charged FROM earmark_charge(:account, :job_id, 5) \gset
SELECT charged FROM earmark_settle(:account, :job_id, 5) \gset
