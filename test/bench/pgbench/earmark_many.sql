-- earmark, 10,000 accounts (a1 .. a10000), one picked at random a job:
-- reserve + charge + settle, three transactions a job.
\set a random(1, 10000)
\set k random(1, 9000000000000000000)
SELECT job_id FROM earmark_reserve('a' || :a::text, 10, :client_id::text || '-' || :k::text) \gset
SELECT charged FROM earmark_charge('a' || :a::text, :job_id, 5) \gset
SELECT charged FROM earmark_settle('a' || :a::text, :job_id, 5) \gset
