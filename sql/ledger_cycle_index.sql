-- A settled job is its own ledger entry (the view earmark.ledger).  A
-- cycle's ledger total (earmark_reconcile's cycle_numbers and
-- page_of_cycles, earmark_check per cycle, the account's in-use check)
-- must reach the cycle's settled jobs through an index on the cycle
-- (job_entry), as the ledger's primary key (budget_id, entry_id, account)
-- serves its own rows: not by reading every job of the account, of every
-- cycle and feature, through job's primary key (account, job_id).
SET client_min_messages = warning;
TRUNCATE earmark.meter_mark, earmark.ledger_entry, earmark.job, earmark.budget_slot, earmark.budget,
         earmark.usage_shard, earmark.account_limit, earmark.account RESTART IDENTITY CASCADE;
SELECT earmark_set_limit('ci', 100000, 'big');
SELECT earmark_set_limit('ci', 100000, 'small');
SELECT job_id AS b FROM earmark_reserve('ci', 100, 'ci-b', 'big') \gset
SELECT charged FROM earmark_settle('ci', :b, 30);
SELECT job_id AS s FROM earmark_reserve('ci', 100, 'ci-s', 'small') \gset
SELECT charged FROM earmark_settle('ci', :s, 40);
SELECT budget_id AS small FROM earmark.budget WHERE account = 'ci' AND feature = 'small' \gset
SELECT budget_id AS big FROM earmark.budget WHERE account = 'ci' AND feature = 'big' \gset
-- 3,000 more settled jobs in the other cycle, then ANALYZE: with two jobs
-- in all, reading every job of the account costs the planner about what
-- the cycle's index does, and which it picks then depends on whether
-- autovacuum analyzed the table meanwhile (it did once, under valgrind).
-- With these, only the cycle's index reads few rows, whatever the timing.
INSERT INTO earmark.job (budget_id, account, feature, idempotency_key, amount, used, status,
                         lease, lease_until, settled_at, charged, released)
SELECT :big, 'ci', 'big', 'ci-fill-' || g, 10, 5, 'completed',
       '1 minute', '2026-01-01 00:00:00+00', '2026-01-01 00:00:00+00', 5, 5
  FROM generate_series(1, 3000) g;
ANALYZE earmark.job;
ANALYZE earmark.ledger_entry;

-- every scan of a table under the plan of a query: its relation and
-- whether budget_id is in its index condition
CREATE FUNCTION pg_temp.scans(q text)
RETURNS TABLE (rel text, budget_in_index_cond boolean)
LANGUAGE plpgsql AS $$
DECLARE p jsonb;
BEGIN
    EXECUTE 'EXPLAIN (FORMAT JSON, COSTS OFF) ' || q INTO p;
    RETURN QUERY
    WITH RECURSIVE n(node) AS (
        SELECT p -> 0 -> 'Plan'
        UNION ALL
        SELECT c FROM n, jsonb_array_elements(n.node -> 'Plans') c)
    SELECT node ->> 'Relation Name',
           coalesce(node ->> 'Index Cond', '') LIKE '%budget_id%'
      FROM n WHERE node ? 'Relation Name';
END $$;

SET enable_seqscan = off;
SET enable_bitmapscan = off;
-- one cycle's ledger total, as reconcile.c's cycle_numbers reads it: the
-- settled jobs are reached through the cycle (budget_id in an index
-- condition), not by reading all of the account's jobs
SELECT rel, bool_and(budget_in_index_cond) AS by_cycle
  FROM pg_temp.scans(format('SELECT coalesce(sum(units), 0) FROM earmark.ledger '
                            'WHERE account = %L AND budget_id = %s', 'ci', :small))
 WHERE rel = 'job'
 GROUP BY rel ORDER BY rel;
-- the total itself is right
SELECT coalesce(sum(units), 0) AS small_total FROM earmark.ledger WHERE account = 'ci' AND budget_id = :small;
RESET enable_seqscan;
RESET enable_bitmapscan;
