-- the floor (test/bench/floor.sql), 10,000 accounts: three transactions a
-- job, each one prepared one-row update and its commit, nothing else
\set a random(1, 10000)
UPDATE floor.acct SET n = n + 1 WHERE account = 'a' || :a::text;
UPDATE floor.acct SET n = n + 1 WHERE account = 'a' || :a::text;
UPDATE floor.acct SET n = n + 1 WHERE account = 'a' || :a::text;
