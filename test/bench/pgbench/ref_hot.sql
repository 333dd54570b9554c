-- the PL/pgSQL reference (test/bench/reference.sql), one hot account
\set k random(1, 9000000000000000000)
SELECT ref.reserve(:account, 10, :client_id::text || '-' || :k::text) AS job_id \gset
SELECT ref.charge(:job_id, 5) AS charged \gset
SELECT ref.settle(:job_id, 5) AS charged \gset
