-- review_fence_walk: earmark's planner hook (delegation.c) walks the FROM
-- tree of a SELECT where Citus is installed (here it is not: the hook
-- looks at the top level only, and must stay so cheap on every install).
-- CTEs nested in CTEs, each read twice, must not make that
-- walk exponential in the depth: 26 levels would be about 2^26 walks of
-- the innermost CTE if each reference walked its CTE again (minutes
-- or more, and the walk would not see a cancel).  A CTE read twice is
-- never inlined, so the walk stops at it: planned at once, well within the
-- statement_timeout of 30 s.  Without Citus no statement gets the filter.
SET client_min_messages = warning;
SET statement_timeout = '30s';
DO $$
DECLARE
    q text := 'SELECT 1 AS x';
BEGIN
    FOR i IN 1..26 LOOP
        q := format('WITH c AS (%s) SELECT a.x FROM c a, c b', q);
    END LOOP;
    EXECUTE 'EXPLAIN (COSTS OFF) SELECT * FROM (' || q || ') s, generate_series(1, 1) g';
END $$;
RESET statement_timeout;

-- no filter without Citus: the bare call in a subquery plans as it is
EXPLAIN (COSTS OFF) SELECT * FROM (SELECT * FROM earmark_budget('acme')) s;
EXPLAIN (COSTS OFF) SELECT earmark_budget(v.a) FROM (VALUES ('acme')) v (a);
