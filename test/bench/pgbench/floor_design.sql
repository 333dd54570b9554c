-- the design floor (test/bench/floor.sql), 10,000 accounts: the writes the
-- gate's design asks for, without any check, three transactions a job
\set a random(1, 10000)
\set k random(1, 9000000000000000000)
WITH j AS (INSERT INTO floor.job (account, idempotency_key, amount)
           VALUES ('a' || :a::text, :client_id::text || '-' || :k::text, 10) RETURNING job_id),
     b AS (UPDATE floor.acct SET held = held + 10 WHERE account = 'a' || :a::text)
SELECT job_id FROM j \gset
UPDATE floor.job SET used = used + 5 WHERE job_id = :job_id;
WITH j AS (UPDATE floor.job SET status = 'completed' WHERE job_id = :job_id RETURNING account, amount),
     b AS (UPDATE floor.acct a SET held = a.held - j.amount, used = a.used + 5 FROM j WHERE a.account = j.account),
     l AS (INSERT INTO floor.ledger (job_id, units) VALUES (:job_id, 5))
SELECT 1 AS done \gset
